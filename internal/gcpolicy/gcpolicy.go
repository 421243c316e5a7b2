// Package gcpolicy sets the Go garbage collector's pace for the daemon, whose live heap is a
// few megabytes most of the time (indexes are mapped from layer records, not on the heap) and
// large only for moments (a big TOC parsed, a comparison with its tar-split). At Go's default
// pace (GOGC=100) a heap of 5 MB is collected every 5 MB allocated: a container's cold start,
// which allocates a buffer per chunk fetched and decompressed, ran 16 to 25 collections in a
// second, each taking processor time and write barriers from the reads the container waits
// for. The policy keeps the heap target at least a floor (Start's min): small heaps are
// collected only once that much is allocated, while large ones keep the default pace, so the
// peak of a big parse is not multiplied.
//
// It is safe for concurrent use; it runs on the runtime's cleanup goroutine after each
// collection.
package gcpolicy

import (
	"math"
	"os"
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"strconv"
	"sync"
	"sync/atomic"
)

// DefaultMin is the heap target the daemon keeps at least: 64 MiB.
const DefaultMin = 64 << 20

// maxPercent bounds the percent set for a tiny live heap.
const maxPercent = 10000

// policy re-tunes the collector after each collection.
type policy struct {
	min     uint64
	base    int // the percent GOGC asked for (100 by default)
	stopped atomic.Bool
	mu      sync.Mutex // serializes tune with stop's restoring of the base
	sample  []metrics.Sample
}

// sentinel is allocated for each collection to come: its cleanup runs once a collection has
// found it unreachable. It holds a pointer and more than 16 bytes, so that the runtime never
// batches it with other objects (whose liveness would keep its cleanup from running).
type sentinel struct {
	p *byte
	_ [24]byte
}

// Start applies the policy with heap target floor min (DefaultMin when 0) and returns the
// function that stops it and restores GOGC's pace. With GOGC=off in the environment the
// collector is left alone; with a GOGC value, that value is the pace above the floor.
// GOMEMLIMIT keeps its effect: the runtime collects early when the limit nears.
func Start(min uint64) (stop func()) {
	if min == 0 {
		min = DefaultMin
	}
	base := 100
	if v := os.Getenv("GOGC"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 {
			return func() {} // "off", or not a number the runtime takes: its own choice stands
		}
		base = n
	}
	p := &policy{min: min, base: base, sample: []metrics.Sample{{Name: "/gc/heap/live:bytes"}}}
	p.tune()
	p.arm()
	return p.stop
}

func (p *policy) arm() {
	runtime.AddCleanup(&sentinel{}, func(p *policy) {
		if !p.stopped.Load() {
			p.tune()
			p.arm()
		}
	}, p)
}

// tune sets the percent for the heap live after the last collection.
func (p *policy) tune() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.stopped.Load() {
		return
	}
	metrics.Read(p.sample)
	var live uint64
	if p.sample[0].Value.Kind() == metrics.KindUint64 {
		live = p.sample[0].Value.Uint64()
	}
	debug.SetGCPercent(percent(live, p.min, p.base))
}

// percent returns the GC percent that makes the next target max(live*(100+base)/100, min).
func percent(live, min uint64, base int) int {
	if live == 0 {
		live = 1
	}
	if live >= min || float64(live)*float64(100+base)/100 >= float64(min) {
		return base
	}
	pct := float64(min-live) * 100 / float64(live)
	return int(math.Min(math.Ceil(pct), maxPercent))
}

func (p *policy) stop() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.stopped.Swap(true) {
		debug.SetGCPercent(p.base)
	}
}
