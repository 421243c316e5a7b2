package layer

import (
	"sync/atomic"
	"time"
)

// urgentTime is how long one request of what is fetched at once (eStargz's prioritized files, a
// startup profile's replay) may hold the link, at the rate fetches measure: urgentBatch at
// 100 Mbit/s. On a fast link, requests of a fixed 1 MiB made a start's prioritized files many
// requests, each paying the registry's latency, more than the link's time for the bytes
// (benchmarks/results, 2026-11-28-readybench-linkrate).
const urgentTime = 84 * time.Millisecond

// minRateSample is the smallest fetch whose duration feeds the link's rate: a smaller one
// measures the registry's latency more than the link.
const minRateSample = 512 << 10

// maxLinkRate bounds a fetch's measured rate (a registry may answer faster than any link, or a
// clock step make a fetch seem to take a nanosecond): 1 TB/s.
const maxLinkRate = 1e12

// linkRate is the rate a layer's fetches get from its registry, in bytes per second, as they
// measure it (observe); zero before the first. Each layer measures its own: its registry's,
// or the mirror's serving it, and no other registry, hostile or merely fast, sizes its
// requests. Safe for concurrent use.
type linkRate struct{ v atomic.Int64 }

// observe feeds the rate with a fetch of n bytes that took d (a moving average: each fetch
// weighs a quarter). A fetch sharing the link with others measures less than the link: the
// estimate errs on the side of smaller requests.
func (r *linkRate) observe(n int64, d time.Duration) {
	if n < minRateSample || d <= 0 {
		return
	}
	rate := int64(min(float64(n)/d.Seconds(), maxLinkRate))
	for {
		old := r.v.Load()
		next := rate
		if old > 0 {
			next = old + (rate-old)/4
		}
		if r.v.CompareAndSwap(old, next) {
			return
		}
	}
}

// urgentSpan is the compressed span of one request of what is fetched at once: what the link
// carries in urgentTime at the rate measured, at least urgentBatch, at most limit (the batch
// size).
func (r *linkRate) urgentSpan(limit int64) int64 {
	n := int64(float64(r.v.Load()) * urgentTime.Seconds())
	return min(max(n, urgentBatch), limit)
}
