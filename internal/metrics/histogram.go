// Package metrics owns the daemon's latency histograms: fixed buckets of durations, observed
// on hot paths (a read waiting for the registry, a layer lookup) and read as snapshots by the
// metrics endpoint, which writes them in the Prometheus text format.
//
// # Concurrency
//
// A [Histogram] is safe for concurrent use without locks: an observation is two atomic adds
// (its bucket's count and the sum) after a search of the bucket bounds, and allocates nothing.
// A [Histogram.Snapshot] taken while observations go on may see an observation's count and not
// yet its duration in the sum (or the reverse); the buckets and the count of one snapshot
// always agree, and every figure only grows from one snapshot to the next.
package metrics

import (
	"fmt"
	"slices"
	"sync/atomic"
	"time"
)

// DefaultBuckets are the upper bounds used for the daemon's latencies, from 5 ms (a lookup
// answered from memory or a record, a read from a registry nearby) to 60 s (the default bound
// of a read's fetch; a lookup's is 30 s).
var DefaultBuckets = []time.Duration{
	5 * time.Millisecond, 10 * time.Millisecond, 25 * time.Millisecond, 50 * time.Millisecond,
	100 * time.Millisecond, 250 * time.Millisecond, 500 * time.Millisecond,
	time.Second, 2500 * time.Millisecond, 5 * time.Second, 10 * time.Second,
	30 * time.Second, 60 * time.Second,
}

// Histogram counts durations in buckets with fixed upper bounds. The zero value is not
// usable: see [NewHistogram].
type Histogram struct {
	bounds []time.Duration // ascending upper bounds (inclusive, as Prometheus' le)
	counts []atomic.Uint64 // per bucket, not cumulative; the last is above every bound (+Inf)
	sum    atomic.Int64    // nanoseconds
}

// NewHistogram returns a histogram with the given ascending upper bounds; a +Inf bucket is
// added above them.
func NewHistogram(bounds []time.Duration) *Histogram {
	ok := len(bounds) > 0 && bounds[0] > 0
	for i := 1; ok && i < len(bounds); i++ {
		ok = bounds[i] > bounds[i-1]
	}
	if !ok {
		panic(fmt.Sprintf("metrics: histogram bounds %v: want ascending, distinct, positive", bounds))
	}
	return &Histogram{bounds: slices.Clone(bounds), counts: make([]atomic.Uint64, len(bounds)+1)}
}

// Observe counts one duration (a negative one as zero).
func (h *Histogram) Observe(d time.Duration) {
	d = max(d, 0)
	// The first bound at or above d; len(bounds) (the +Inf bucket) when d is above them all.
	// A dozen bounds: a linear scan beats a binary search and allocates nothing.
	i := 0
	for i < len(h.bounds) && d > h.bounds[i] {
		i++
	}
	h.counts[i].Add(1)
	h.sum.Add(int64(d))
}

// Since counts the time elapsed since start.
func (h *Histogram) Since(start time.Time) { h.Observe(time.Since(start)) }

// Snapshot is a histogram's state at one time, in Prometheus' terms.
type Snapshot struct {
	// Bounds are the buckets' upper bounds in seconds, without +Inf.
	Bounds []float64
	// Cumulative[i] counts the observations at or below Bounds[i]; Count is the +Inf bucket.
	Cumulative []uint64
	Count      uint64
	// Sum is the sum of the observations, in seconds.
	Sum float64
}

// Snapshot returns the histogram's counts so far.
func (h *Histogram) Snapshot() Snapshot {
	s := Snapshot{Bounds: make([]float64, len(h.bounds)), Cumulative: make([]uint64, len(h.bounds))}
	var n uint64
	for i, b := range h.bounds {
		s.Bounds[i] = b.Seconds()
		n += h.counts[i].Load()
		s.Cumulative[i] = n
	}
	s.Count = n + h.counts[len(h.bounds)].Load()
	s.Sum = time.Duration(h.sum.Load()).Seconds()
	return s
}
