package metrics

import (
	"slices"
	"sync"
	"testing"
	"time"
)

func TestHistogram(t *testing.T) {
	h := NewHistogram([]time.Duration{10 * time.Millisecond, time.Second})
	for _, d := range []time.Duration{-time.Second, 0, 10 * time.Millisecond, 11 * time.Millisecond, time.Second, 2 * time.Second} {
		h.Observe(d)
	}
	s := h.Snapshot()
	if !slices.Equal(s.Bounds, []float64{0.01, 1}) {
		t.Errorf("bounds %v", s.Bounds)
	}
	// A bound is inclusive (Prometheus' le); a negative duration counts as zero.
	if !slices.Equal(s.Cumulative, []uint64{3, 5}) || s.Count != 6 {
		t.Errorf("cumulative %v, count %d; want [3 5], 6", s.Cumulative, s.Count)
	}
	if want := 0.01 + 0.011 + 1 + 2; s.Sum < want-1e-9 || s.Sum > want+1e-9 {
		t.Errorf("sum %v, want %v", s.Sum, want)
	}
}

func TestHistogramConcurrent(t *testing.T) {
	h := NewHistogram(DefaultBuckets)
	var wg sync.WaitGroup
	const workers, each = 8, 10000
	for w := range workers {
		wg.Go(func() {
			for i := range each {
				h.Observe(time.Duration(w*each+i) * time.Microsecond)
			}
		})
	}
	prev := h.Snapshot()
	for range 100 {
		s := h.Snapshot()
		if s.Count < prev.Count || s.Cumulative[len(s.Cumulative)-1] > s.Count {
			t.Fatalf("snapshot went back or disagrees: %+v after %+v", s, prev)
		}
		prev = s
	}
	wg.Wait()
	if s := h.Snapshot(); s.Count != workers*each {
		t.Errorf("count %d, want %d", s.Count, workers*each)
	}
}

func TestHistogramBadBounds(t *testing.T) {
	for _, b := range [][]time.Duration{nil, {0}, {time.Second, time.Second}, {time.Second, time.Millisecond}} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("bounds %v accepted", b)
				}
			}()
			NewHistogram(b)
		}()
	}
}

// TestHistogramObserveAllocs: an observation allocates nothing: observations are on the read path.
func TestHistogramObserveAllocs(t *testing.T) {
	h := NewHistogram(DefaultBuckets)
	if n := testing.AllocsPerRun(1000, func() { h.Observe(3 * time.Second) }); n != 0 {
		t.Errorf("%v allocations per observation", n)
	}
}

func BenchmarkHistogramObserve(b *testing.B) {
	h := NewHistogram(DefaultBuckets)
	b.RunParallel(func(pb *testing.PB) {
		d := 7 * time.Millisecond
		for pb.Next() {
			h.Observe(d)
		}
	})
}
