package layer

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"
)

// TestSchedulerQuietPeriod checks that background requests wait for the quiet period after a
// layer is looked up or a demand fetch ends, that prioritized (urgent) ones do not, and that
// every background request waits while a demand fetch runs.
func TestSchedulerQuietPeriod(t *testing.T) {
	blocked := func(s *scheduler, u urgency) bool {
		ctx, cancel := context.WithTimeout(t.Context(), 100*time.Millisecond)
		defer cancel()
		release, err := s.acquire(ctx, 1, u)
		if err == nil {
			release()
			return false
		}
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("acquire: %v", err)
		}
		return true
	}

	s := newScheduler(1, 0, time.Hour)
	if blocked(s, deferred) {
		t.Fatal("a background request waited although no layer was ever used")
	}
	s.touch()
	if !blocked(s, deferred) {
		t.Fatal("a background request went out within the quiet period after a lookup")
	}
	if blocked(s, prioritized) {
		t.Fatal("a request for prioritized files waited for the quiet period")
	}
	s.demandStart()
	if !blocked(s, prioritized) {
		t.Fatal("a request for prioritized files went out while a demand fetch was running")
	}
	s.demandEnd()
	if blocked(s, prioritized) {
		t.Fatal("a request for prioritized files still waits after the demand fetch ended")
	}

	// A fetch ahead of the reads in flight (a replay's, a prediction's) holds other background
	// requests, however long it takes, and the quiet period starts again at its end; it holds
	// no urgent request.
	s = newScheduler(2, 0, 30*time.Millisecond)
	s.aheadStart()
	time.Sleep(50 * time.Millisecond) // longer than the quiet period
	if !blocked(s, deferred) {
		t.Fatal("a background request went out while a fetch ahead of the reads was in flight")
	}
	if blocked(s, prioritized) {
		t.Fatal("a request for prioritized files waited for a fetch ahead")
	}
	s.aheadEnd()
	if blocked(s, deferred) { // it waits 100 ms, more than the quiet period
		t.Fatal("a background request still waits after the fetch ahead ended and the quiet period passed")
	}

	// Prioritized requests take at most prioSlots of the slots; a replay's, any.
	s = newScheduler(prioSlots+2, 0, time.Hour)
	for range prioSlots {
		if _, err := s.acquire(t.Context(), 1, prioritized); err != nil {
			t.Fatal(err)
		}
	}
	if !blocked(s, prioritized) {
		t.Fatalf("a request for prioritized files went out with %d of them in flight", prioSlots)
	}
	if blocked(s, replaying) || blocked(s, replaying) {
		t.Fatal("a replay's request waited for the prioritized files' slots")
	}

	s = newScheduler(1, 0, 50*time.Millisecond)
	s.demandStart()
	s.demandEnd()
	start := time.Now()
	release, err := s.acquire(t.Context(), 1, deferred)
	if err != nil {
		t.Fatal(err)
	}
	release()
	if waited := time.Since(start); waited < 40*time.Millisecond {
		t.Fatalf("a background request went out %v after a demand fetch ended, within the 50ms quiet period", waited)
	}
}

// fakeClock is a clock that moves only when the scheduler sleeps on it, recording each sleep.
type fakeClock struct {
	mu     sync.Mutex
	t      time.Time
	sleeps []time.Duration
}

func (c *fakeClock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *fakeClock) sleep(ctx context.Context, d time.Duration) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.sleeps = append(c.sleeps, d)
	c.t = c.t.Add(d)
	return nil
}

func (c *fakeClock) advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

func (c *fakeClock) taken() []time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := c.sleeps
	c.sleeps = nil
	return out
}

// TestSchedulerPacing: with a bandwidth set, background requests start no sooner than their
// bytes allow on average (a burst of three 1 MiB requests at 1 MiB/s starts at 0, 1 and 2 s);
// an idle link gives no credit for a later burst; a request whose context ends while it is
// paced gives its slot back; without a bandwidth nothing waits.
func TestSchedulerPacing(t *testing.T) {
	const mib = 1 << 20
	clock := &fakeClock{t: time.Unix(1000, 0)}
	s := newScheduler(1, mib, 0)
	s.now, s.sleep = clock.now, clock.sleep
	start := clock.now()
	var starts []time.Duration
	for range 3 {
		release, err := s.acquire(t.Context(), mib, deferred)
		if err != nil {
			t.Fatal(err)
		}
		starts = append(starts, clock.now().Sub(start))
		release()
	}
	if want := []time.Duration{0, time.Second, 2 * time.Second}; !slices.Equal(starts, want) {
		t.Fatalf("three 1 MiB requests at 1 MiB/s started at %v, want %v", starts, want)
	}
	clock.taken()

	// Idle for a minute: the next request goes at once, and the one after waits its turn.
	clock.advance(time.Minute)
	for range 2 {
		release, err := s.acquire(t.Context(), mib/2, deferred)
		if err != nil {
			t.Fatal(err)
		}
		release()
	}
	if got, want := clock.taken(), []time.Duration{500 * time.Millisecond}; !slices.Equal(got, want) {
		t.Fatalf("after an idle minute, two 512 KiB requests slept %v, want %v", got, want)
	}

	// Cancelled while paced: the slot is free again.
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	s.next = clock.now().Add(time.Hour)
	if _, err := s.acquire(ctx, mib, deferred); err == nil {
		t.Fatal("a cancelled request was paced and went out")
	}
	if n := len(s.slots); n != 0 {
		t.Fatalf("%d slots held after a cancelled request", n)
	}

	unbounded := newScheduler(1, 0, 0)
	unbounded.now, unbounded.sleep = clock.now, clock.sleep
	for range 3 {
		release, err := unbounded.acquire(t.Context(), 1<<30, deferred)
		if err != nil {
			t.Fatal(err)
		}
		release()
	}
	if got := clock.taken(); len(got) != 0 {
		t.Fatalf("without a bandwidth, requests slept %v", got)
	}
}
