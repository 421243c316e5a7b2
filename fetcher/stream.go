package fetcher

import (
	"context"
	"io"
	"sort"
	"sync"
	"sync/atomic"

	"github.com/layerstore/layerstore/internal/byterange"
)

// A span is the buffer one requested span of a blob is read into, published as it fills:
// readers of the ranges in it ([Part]) read its bytes as they arrive, while the request runs.
// Its bytes are written once, in order, and never again: a request that fails part way
// through is followed by one that skips what is filled already (spanSet.copyPart), so a reader
// never sees a byte change under it.
type span struct {
	// b is set before anything is published (filled above zero) and never changes after.
	b      []byte
	filled atomic.Int64 // bytes of b written, from its start

	mu   sync.Mutex
	err  error         // guarded by mu: why the span will never fill; set once
	wake chan struct{} // guarded by mu: closed when filled grows or err is set; nil when nobody waits
}

func (s *span) full() bool { return s.filled.Load() == int64(len(s.b)) && s.b != nil }

// grew publishes n more bytes written to b.
func (s *span) grew(n int) {
	s.filled.Add(int64(n))
	s.mu.Lock()
	if s.wake != nil {
		close(s.wake)
		s.wake = nil
	}
	s.mu.Unlock()
}

// take publishes b, read whole by another request, as the span's bytes.
func (s *span) take(b []byte) {
	s.b = b
	s.grew(len(b))
}

// fail wakes the span's readers with err unless the span is full.
func (s *span) fail(err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.full() || s.err != nil {
		return
	}
	s.err = err
	if s.wake != nil {
		close(s.wake)
		s.wake = nil
	}
}

// await returns once more than n bytes are filled, or the span failed: how many are filled,
// and the failure when no more than n are.
func (s *span) await(n int64) (int64, error) {
	for {
		if f := s.filled.Load(); f > n {
			return f, nil
		}
		s.mu.Lock()
		if f := s.filled.Load(); f > n {
			s.mu.Unlock()
			return f, nil
		}
		if s.err != nil {
			s.mu.Unlock()
			return 0, s.err
		}
		if s.wake == nil {
			s.wake = make(chan struct{})
		}
		w := s.wake
		s.mu.Unlock()
		<-w
	}
}

// newSpans returns a span for each of spans, without buffers: fetchShared gives each its own,
// or the one of the request it joins.
func newSpans(n int) []*span {
	sps := make([]*span, n)
	for i := range sps {
		sps[i] = new(span)
	}
	return sps
}

// Stream starts fetching ranges as [Blob.Fetch] does and returns at once: a reader of each
// range's bytes, in the order asked, which returns them as they arrive and blocks for those
// still on their way, and wait, which returns once every request has ended, with the first
// error. A reader returns io.EOF at the end of its range, or the fetch's error when the bytes
// do not come. A reader is also an [io.ByteReader], and its Bytes method waits for the whole
// range and returns it, read-only as Fetch's slices are.
//
// The requests run on a goroutine of their own and end as Fetch's do (ctx, each attempt's
// timeout, the retries): the caller need not read every range, nor call wait.
func (b *Blob) Stream(ctx context.Context, ranges []byterange.Range) (parts []io.Reader, wait func() error, err error) {
	if err := b.checkRanges(ctx, ranges); err != nil {
		return nil, nil, err
	}
	spans := coalesce(ranges, b.o.maxGap, b.o.maxSpan)
	sps := newSpans(len(spans))
	done := make(chan struct{})
	var ferr error
	go func() {
		defer close(done)
		if ferr = b.fetchShared(ctx, spans, sps); ferr != nil {
			for _, sp := range sps {
				sp.fail(ferr)
			}
		}
	}()
	parts = make([]io.Reader, len(ranges))
	for k, r := range ranges {
		parts[k] = newPart(r, spans, sps)
	}
	return parts, func() error { <-done; return ferr }, nil
}

// A Part reads one range of a [Blob.Stream] as its bytes arrive. It is for one goroutine.
type Part struct {
	segs []segment // the range's pieces: one, unless it is longer than a span
	seg  int       // the piece being read
	pos  int64     // in the piece's span
	fill int64     // bytes of the piece's span known to be filled
}

// A segment is the bytes [lo, hi) of a span.
type segment struct {
	sp     *span
	lo, hi int64
}

func newPart(r byterange.Range, spans []byterange.Range, sps []*span) *Part {
	p := &Part{}
	if r.Length == 0 {
		return p
	}
	j := sort.Search(len(spans), func(j int) bool { return spans[j].End() > r.Offset })
	for pos := r.Offset; pos < r.End(); j++ {
		hi := min(r.End(), spans[j].End())
		p.segs = append(p.segs, segment{sps[j], pos - spans[j].Offset, hi - spans[j].Offset})
		pos = hi
	}
	p.pos = p.segs[0].lo
	return p
}

// next makes sure a byte of the current piece is filled, moving to the next piece at the end
// of one: io.EOF at the end of the range, the fetch's error when the byte will not come.
func (p *Part) next() error {
	for {
		if p.seg == len(p.segs) {
			return io.EOF
		}
		s := &p.segs[p.seg]
		if p.pos == s.hi {
			p.seg++
			if p.seg < len(p.segs) {
				p.pos, p.fill = p.segs[p.seg].lo, 0
			}
			continue
		}
		if p.pos < p.fill {
			return nil
		}
		f, err := s.sp.await(p.pos)
		if err != nil {
			return err
		}
		p.fill = f
	}
}

// Read reads the range's next bytes, waiting for at least one to arrive.
func (p *Part) Read(b []byte) (int, error) {
	if len(b) == 0 {
		return 0, nil
	}
	if err := p.next(); err != nil {
		return 0, err
	}
	s := p.segs[p.seg]
	n := copy(b, s.sp.b[p.pos:min(p.fill, s.hi)])
	p.pos += int64(n)
	return n, nil
}

// ReadByte reads the range's next byte, waiting for it to arrive: a decompressor reads its
// input a byte at a time through it without a buffer of its own.
func (p *Part) ReadByte() (byte, error) {
	if p.pos < p.fill && p.seg < len(p.segs) && p.pos < p.segs[p.seg].hi {
		c := p.segs[p.seg].sp.b[p.pos]
		p.pos++
		return c, nil
	}
	if err := p.next(); err != nil {
		return 0, err
	}
	c := p.segs[p.seg].sp.b[p.pos]
	p.pos++
	return c, nil
}

// Bytes waits for the whole range and returns it: a view of the span it lies in, or a copy
// when it spans several. It does not move the reader.
func (p *Part) Bytes() ([]byte, error) {
	var n int64
	for _, s := range p.segs {
		if _, err := s.sp.await(s.hi - 1); err != nil {
			return nil, err
		}
		n += s.hi - s.lo
	}
	switch len(p.segs) {
	case 0:
		return []byte{}, nil
	case 1:
		s := p.segs[0]
		return s.sp.b[s.lo:s.hi:s.hi], nil
	}
	out := make([]byte, 0, n)
	for _, s := range p.segs {
		out = append(out, s.sp.b[s.lo:s.hi]...)
	}
	return out, nil
}
