package layer

import (
	"context"
	"sync"
	"sync/atomic"
	"time"
)

// scheduler shares the registry between reads a runtime waits for and background fetches:
// background requests take one of a fixed number of slots, wait while any demand fetch is in
// progress, and are paced to a bandwidth when one is set.
type scheduler struct {
	slots  chan struct{}
	demand atomic.Int64

	rate int64 // bytes per second; 0: unbounded
	mu   sync.Mutex
	next time.Time // when the bandwidth budget allows the next request to start
}

// yieldPoll is how often waiting background work checks whether demand reads are done.
const yieldPoll = 2 * time.Millisecond

func newScheduler(slots int, rate int64) *scheduler {
	return &scheduler{slots: make(chan struct{}, slots), rate: rate}
}

func (s *scheduler) demandStart() { s.demand.Add(1) }
func (s *scheduler) demandEnd()   { s.demand.Add(-1) }

// acquire waits until no demand fetch is running and a slot is free, then paces a request of
// n bytes. It returns the function that frees the slot.
func (s *scheduler) acquire(ctx context.Context, n int64) (func(), error) {
	if err := s.yield(ctx); err != nil {
		return nil, err
	}
	select {
	case s.slots <- struct{}{}:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	release := func() { <-s.slots }
	if err := s.pace(ctx, n); err != nil {
		release()
		return nil, err
	}
	return release, nil
}

func (s *scheduler) yield(ctx context.Context) error {
	for s.demand.Load() > 0 {
		select {
		case <-time.After(yieldPoll):
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return ctx.Err()
}

// pace delays a request of n bytes so that requests stay within the bandwidth on average.
func (s *scheduler) pace(ctx context.Context, n int64) error {
	if s.rate == 0 {
		return nil
	}
	s.mu.Lock()
	now := time.Now()
	start := now
	if s.next.After(now) {
		start = s.next
	}
	s.next = start.Add(time.Duration(float64(n) / float64(s.rate) * float64(time.Second)))
	s.mu.Unlock()
	if d := start.Sub(now); d > 0 {
		select {
		case <-time.After(d):
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}
