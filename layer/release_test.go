package layer

import (
	"sync/atomic"
	"testing"
	"time"
)

// Jobs ending within the release interval of each other are all released: the first at once,
// the later ones together at the end of the interval, none dropped.
func TestReleaseMemoryTrailing(t *testing.T) {
	var calls atomic.Int32
	e := &env{release: release{free: func() { calls.Add(1) }}}
	e.releaseMemory()
	if got := calls.Load(); got != 1 {
		t.Fatalf("first release: %d calls, want 1 at once", got)
	}
	start := time.Now()
	e.releaseMemory() // within the interval: scheduled
	e.releaseMemory() // joins the scheduled one
	if got := calls.Load(); got != 1 {
		t.Fatalf("releases within the interval ran at once: %d calls", got)
	}
	deadline := time.Now().Add(10 * releaseInterval)
	for calls.Load() < 2 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if got := calls.Load(); got != 2 {
		t.Fatalf("after the interval: %d calls, want 2 (the later jobs' release dropped)", got)
	}
	if d := time.Since(start); d > releaseInterval+500*time.Millisecond {
		t.Errorf("the scheduled release ran %v after the first, want about %v", d, releaseInterval)
	}
	time.Sleep(releaseInterval / 2)
	if got := calls.Load(); got != 2 {
		t.Errorf("%d calls in the end, want 2", got)
	}
}
