package layer

import (
	"testing"
	"time"
)

// TestUrgentSpanFollowsLink: a request of what is fetched at once (prioritized files, a
// profile's replay) spans what the link carries in urgentTime at the rate fetches measured,
// within urgentBatch and the batch size. Fetches too small to measure the link, and durations
// that are not, leave the rate alone; a registry answering at once grows the span no further
// than the batch size.
func TestUrgentSpanFollowsLink(t *testing.T) {
	const limit = DefaultPrefetchBatch
	var s linkRate
	if got := s.urgentSpan(limit); got != urgentBatch {
		t.Fatalf("span %d before any fetch, want urgentBatch (%d)", got, urgentBatch)
	}
	s.observe(minRateSample-1, time.Microsecond)
	s.observe(8<<20, 0)
	s.observe(8<<20, -time.Second)
	if got := s.urgentSpan(limit); got != urgentBatch {
		t.Fatalf("span %d after fetches that measure nothing, want urgentBatch (%d)", got, urgentBatch)
	}
	// 100 Mbit/s: 1 MiB in 84 ms, and the registry's latency.
	s.observe(1<<20, 100*time.Millisecond)
	if got := s.urgentSpan(limit); got != urgentBatch {
		t.Errorf("span %d at 100 Mbit/s, want urgentBatch (%d)", got, urgentBatch)
	}
	// 400 Mbit/s, fetch after fetch: the estimate moves there.
	const rate = 50e6
	for range 30 {
		s.observe(4<<20, time.Duration(4<<20/rate*float64(time.Second)))
	}
	want := int64(rate * urgentTime.Seconds())
	if got := s.urgentSpan(limit); got < want*9/10 || got > want*11/10 {
		t.Errorf("span %d at %.0f MB/s, want about %d", got, rate/1e6, want)
	}
	// A registry that answers a large fetch at once.
	s.observe(1<<30, time.Nanosecond)
	if got := s.urgentSpan(limit); got != limit {
		t.Errorf("span %d after a fetch at the speed of light, want the batch size (%d)", got, limit)
	}
	if got := s.urgentSpan(urgentBatch / 2); got != urgentBatch/2 {
		t.Errorf("span %d with a batch size of %d: above it", got, urgentBatch/2)
	}
}
