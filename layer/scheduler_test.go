package layer

import (
	"context"
	"errors"
	"testing"
	"time"
)

// TestSchedulerQuietPeriod checks that background requests wait for the quiet period after a
// layer is looked up or a demand fetch ends, that prioritized (urgent) ones do not, and that
// every background request waits while a demand fetch runs.
func TestSchedulerQuietPeriod(t *testing.T) {
	blocked := func(s *scheduler, urgent bool) bool {
		ctx, cancel := context.WithTimeout(t.Context(), 100*time.Millisecond)
		defer cancel()
		release, err := s.acquire(ctx, 1, urgent)
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
	if blocked(s, false) {
		t.Fatal("a background request waited although no layer was ever used")
	}
	s.touch()
	if !blocked(s, false) {
		t.Fatal("a background request went out within the quiet period after a lookup")
	}
	if blocked(s, true) {
		t.Fatal("a request for prioritized files waited for the quiet period")
	}
	s.demandStart()
	if !blocked(s, true) {
		t.Fatal("a request for prioritized files went out while a demand fetch was running")
	}
	s.demandEnd()
	if blocked(s, true) {
		t.Fatal("a request for prioritized files still waits after the demand fetch ended")
	}

	s = newScheduler(1, 0, 50*time.Millisecond)
	s.demandStart()
	s.demandEnd()
	start := time.Now()
	release, err := s.acquire(t.Context(), 1, false)
	if err != nil {
		t.Fatal(err)
	}
	release()
	if waited := time.Since(start); waited < 40*time.Millisecond {
		t.Fatalf("a background request went out %v after a demand fetch ended, within the 50ms quiet period", waited)
	}
}
