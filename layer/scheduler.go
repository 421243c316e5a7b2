package layer

import (
	"context"
	"sync"
	"sync/atomic"
	"time"
)

// scheduler shares the registry between reads a runtime waits for and background fetches.
// Background requests take one of a fixed number of slots and are paced to a bandwidth when
// one is set. Those not marked urgent also wait until the layers have been quiet for a while:
// no read fetching on demand, and none having ended, nor a layer looked up, within the quiet
// period. A container reads in bursts as it starts; background requests already in flight
// would sit on the link ahead of each of its reads (32 MiB are 2.7 s at 100 Mbit/s).
type scheduler struct {
	slots  chan struct{}
	quiet  time.Duration
	demand atomic.Int64
	last   atomic.Int64 // unix nanoseconds of the last demand fetch's start or end, or touch

	rate int64 // bytes per second; 0: unbounded
	mu   sync.Mutex
	next time.Time // when the bandwidth budget allows the next request to start
}

// yieldPoll is how often waiting background work checks whether demand reads are done.
const yieldPoll = 2 * time.Millisecond

func newScheduler(slots int, rate int64, quiet time.Duration) *scheduler {
	return &scheduler{slots: make(chan struct{}, slots), rate: rate, quiet: quiet}
}

func (s *scheduler) demandStart() { s.demand.Add(1); s.touch() }
func (s *scheduler) demandEnd()   { s.demand.Add(-1); s.touch() }

// touch restarts the quiet period: a runtime is about to use a layer.
func (s *scheduler) touch() { s.last.Store(time.Now().UnixNano()) }

// acquire waits until no demand fetch is running (and, unless urgent, the quiet period has
// passed) and a slot is free, then paces a request of n bytes. It returns the function that
// frees the slot.
func (s *scheduler) acquire(ctx context.Context, n int64, urgent bool) (func(), error) {
	if err := s.wait(ctx, urgent); err != nil {
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

// yield waits while a demand fetch is running: background verification steps aside for the
// CPU.
func (s *scheduler) yield(ctx context.Context) error { return s.wait(ctx, true) }

func (s *scheduler) wait(ctx context.Context, urgent bool) error {
	for {
		d := yieldPoll
		if s.demand.Load() == 0 {
			if urgent {
				return ctx.Err()
			}
			left := s.quiet - time.Since(time.Unix(0, s.last.Load()))
			if left <= 0 {
				return ctx.Err()
			}
			d = left
		}
		select {
		case <-time.After(d):
		case <-ctx.Done():
			return ctx.Err()
		}
	}
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
