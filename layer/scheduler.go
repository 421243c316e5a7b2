package layer

import (
	"context"
	"runtime"
	"sync"
	"sync/atomic"
	"time"
)

// scheduler shares the registry between reads a runtime waits for and background fetches.
// Background requests take one of a fixed number of slots and are paced to a bandwidth when
// one is set. Deferred ones (urgency) also wait until the layers have been quiet for a while:
// no read fetching on demand and no fetch ahead of the reads in flight (a startup profile's
// replay, a prediction's, a region's: a container whose reads they fetched ahead of it starts
// no demand fetch, yet is starting, however long they take), and none of them started or
// ended, nor a layer looked up, within the quiet period. A container reads in bursts as it
// starts; background requests already in flight would sit on the link ahead of each of its
// reads (32 MiB are 2.7 s at 100 Mbit/s).
//
// It shares the processors too: background verification steps aside while a demand fetch
// runs, verifies at most one chunk per processor at a time (cpu), and the background fetch's
// runs at a lower priority than the rest of the machine's work (idle, idlecpu.go).
type scheduler struct {
	slots  chan struct{}
	prio   chan struct{} // prioritized files' requests in flight (prioritized)
	cpu    chan struct{}
	idle   *lowPriority // the threads background verification runs on (idlecpu.go)
	quiet  time.Duration
	demand atomic.Int64
	ahead  atomic.Int64 // fetches ahead of the reads in flight (aheadStart)
	last   atomic.Int64 // unix nanoseconds of the last demand or ahead fetch's start or end, or touch

	rate int64 // bytes per second; 0: unbounded
	mu   sync.Mutex
	next time.Time // when the bandwidth budget allows the next request to start

	now   func() time.Time
	sleep func(context.Context, time.Duration) error // waits d, or until ctx ends
}

// prioSlots bounds the requests of prioritized files (a producer's profile, eStargz's
// prefetch landmark) in flight at once, of the slots: they go out at once, and each sits on the
// link ahead of the reads of the container starting (large eStargz-prio, whose profile names a
// library of which the start reads a little: benchmarks/results,
// 2026-11-28-readybench-prioslots-reduced and -warmfull).
// A startup profile's replay, which names only what the start read, keeps every slot.
const prioSlots = 2

// urgency is how a background request shares the link with the container starting.
type urgency int

const (
	// deferred: the rest of the layer, behind the quiet period.
	deferred urgency = iota
	// prioritized: a producer's prioritized files (eStargz's prefetch landmark), at once but
	// within prioSlots requests in flight.
	prioritized
	// replaying: a startup profile's files, at once, in any slot.
	replaying
)

// yieldPoll is how often waiting background work checks whether demand reads are done.
const yieldPoll = 2 * time.Millisecond

func newScheduler(slots int, rate int64, quiet time.Duration) *scheduler {
	idle := backgroundThreads()
	return &scheduler{
		slots: make(chan struct{}, slots),
		prio:  make(chan struct{}, prioSlots),
		cpu:   make(chan struct{}, idle.threads),
		idle:  idle,
		rate:  rate,
		quiet: quiet,
		now:   time.Now,
		sleep: sleep,
	}
}

// sleep waits d, or until ctx ends.
func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (s *scheduler) demandStart() { s.demand.Add(1); s.touch() }
func (s *scheduler) demandEnd()   { s.demand.Add(-1); s.touch() }

// aheadStart and aheadEnd bracket a fetch ahead of the reads (a startup profile's replay, a
// prediction's, a region's): deferred requests wait for it and for the quiet period after
// it; urgent ones do not.
func (s *scheduler) aheadStart() { s.ahead.Add(1); s.touch() }
func (s *scheduler) aheadEnd()   { s.ahead.Add(-1); s.touch() }

// touch restarts the quiet period: a runtime is about to use a layer.
func (s *scheduler) touch() { s.last.Store(s.now().UnixNano()) }

// acquire waits until no demand fetch is running (and, for deferred requests, the quiet
// period has passed) and a slot is free (for prioritized ones, one of prioSlots too), then
// paces a request of n bytes. It returns the function that frees the slots.
func (s *scheduler) acquire(ctx context.Context, n int64, u urgency) (func(), error) {
	release := func() {}
	if u == prioritized {
		select {
		case s.prio <- struct{}{}:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		release = func() { <-s.prio }
	}
	if err := s.wait(ctx, u != deferred); err != nil {
		release()
		return nil, err
	}
	select {
	case s.slots <- struct{}{}:
	case <-ctx.Done():
		release()
		return nil, ctx.Err()
	}
	freePrio := release
	release = func() { <-s.slots; freePrio() }
	if err := s.pace(ctx, n); err != nil {
		release()
		return nil, err
	}
	return release, nil
}

// verifying waits until no demand fetch is running and a processor is free for background
// verification, and returns the function that frees it. Background decompression would take
// every core: it steps aside, chunk by chunk, while a read a runtime waits for is being
// fetched and verified, and keeps at most one runnable goroutine per core, so that the
// goroutines serving FUSE requests find a processor soon.
func (s *scheduler) verifying(ctx context.Context) func() {
	_ = s.wait(ctx, true) // on cancellation, verify anyway: the fetch is done
	s.cpu <- struct{}{}
	return s.freeCPU
}

// verifyingUntil is verifying for work that must start by a deadline (ctx's): once ctx is
// done it steps aside for nothing more and takes no processor slot.
func (s *scheduler) verifyingUntil(ctx context.Context) func() {
	_ = s.wait(ctx, true)
	select {
	case s.cpu <- struct{}{}:
		return s.freeCPU
	case <-ctx.Done():
		return func() {}
	}
}

// freeCPU frees a processor slot verifying took, and lets a goroutine serving FUSE requests
// run first.
func (s *scheduler) freeCPU() {
	<-s.cpu
	runtime.Gosched()
}

func (s *scheduler) wait(ctx context.Context, urgent bool) error {
	for {
		d := yieldPoll
		if s.demand.Load() == 0 {
			if urgent {
				return ctx.Err()
			}
			left := s.quiet - s.now().Sub(time.Unix(0, s.last.Load()))
			if s.ahead.Load() > 0 {
				left = max(left, yieldPoll)
			}
			if left <= 0 {
				return ctx.Err()
			}
			d = left
		}
		if err := s.sleep(ctx, d); err != nil {
			return err
		}
	}
}

// pace delays a request of n bytes so that requests stay within the bandwidth on average.
func (s *scheduler) pace(ctx context.Context, n int64) error {
	if s.rate == 0 {
		return nil
	}
	s.mu.Lock()
	now := s.now()
	start := now
	if s.next.After(now) {
		start = s.next
	}
	s.next = start.Add(time.Duration(float64(n) / float64(s.rate) * float64(time.Second)))
	s.mu.Unlock()
	if d := start.Sub(now); d > 0 {
		return s.sleep(ctx, d)
	}
	return nil
}
