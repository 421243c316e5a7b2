package layer

import (
	"math/bits"
	"slices"
	"sync/atomic"
	"time"

	"github.com/layerstore/layerstore/chunked"
	"github.com/layerstore/layerstore/internal/byterange"
)

// readSet marks the chunks of a layer the kernel asked for: every chunk a read through FUSE
// covered, whether the cache held it, a read fetched it or the background fetch had, and every
// chunk of a file opened with passthrough (the kernel then reads the cache's copy without
// the daemon, so which parts it reads is unknown: the whole file counts). Benchmarks compare
// what a workload needed with what crossed the link. Marking costs a bit set in an atomic
// word per chunk; the set (a bit per chunk slot of the index) is allocated at the first read.
// It also counts the reads of a runtime that waited for the registry, and how long they waited
// in all: the round trips a workload paid for, which the chunks alone do not tell.
type readSet struct {
	words       atomic.Pointer[[]atomic.Uint64]
	passthrough atomic.Int64 // files opened with passthrough
	waits       atomic.Int64 // reads that waited for the registry
	requested   atomic.Int64 // of them, those that sent a request of their own
	waited      atomic.Int64 // their waits, summed, in nanoseconds
}

// wait counts a read that waited d for the registry, for a request of its own or not.
func (s *readSet) wait(d time.Duration, own bool) {
	s.waits.Add(1)
	if own {
		s.requested.Add(1)
	}
	s.waited.Add(int64(d))
}

// set returns the bit set, allocated for x on first use.
func (s *readSet) set(x *chunked.Index) []atomic.Uint64 {
	if w := s.words.Load(); w != nil {
		return *w
	}
	w := make([]atomic.Uint64, (x.ChunkSlots()+63)/64)
	if !s.words.CompareAndSwap(nil, &w) {
		return *s.words.Load()
	}
	return w
}

// note marks the chunks of file id that hold bytes [off, off+n).
func (s *readSet) note(x *chunked.Index, id chunked.EntryID, off, n int64) {
	if n <= 0 {
		return
	}
	s.mark(x, id, x.ChunkAt(id, off), x.ChunkAt(id, off+n-1))
}

// mark marks chunks first to last of file id (none when either is negative).
func (s *readSet) mark(x *chunked.Index, id chunked.EntryID, first, last int) {
	if first < 0 || last < first {
		return
	}
	w := s.set(x)
	for i := first; i <= last; i++ {
		if slot := x.ChunkSlot(id, i); slot >= 0 && slot/64 < len(w) {
			if bit := uint64(1) << (slot % 64); w[slot/64].Load()&bit == 0 {
				w[slot/64].Or(bit)
			}
		}
	}
}

// notePassthrough marks every chunk of file id, opened with passthrough.
func (s *readSet) notePassthrough(x *chunked.Index, id chunked.EntryID, size int64) {
	s.passthrough.Add(1)
	s.note(x, id, 0, size)
}

// summary returns how many chunks are marked and the compressed bytes they span in the blob
// (chunks sharing bytes count them once).
func (s *readSet) summary(x *chunked.Index) (chunks, compressed int64) {
	p := s.words.Load()
	if p == nil {
		return 0, 0
	}
	var rs []byterange.Range
	for i := range *p {
		for v := (*p)[i].Load(); v != 0; v &= v - 1 {
			if r, ok := x.SlotRange(i*64 + bits.TrailingZeros64(v)); ok {
				chunks++
				rs = append(rs, r)
			}
		}
	}
	slices.SortFunc(rs, func(a, b byterange.Range) int { return int(min(max(a.Offset-b.Offset, -1), 1)) })
	end := int64(-1)
	for _, r := range rs {
		lo, hi := max(r.Offset, end), r.Offset+r.Length
		if hi > lo {
			compressed += hi - lo
			end = hi
		}
	}
	return chunks, compressed
}
