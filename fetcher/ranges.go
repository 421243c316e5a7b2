package fetcher

import (
	"cmp"
	"errors"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"

	"github.com/layerstore/layerstore/internal/byterange"
)

// coalesce returns the sorted, disjoint spans to fetch for ranges: overlapping and adjacent
// ranges merge, ranges less than gap bytes apart merge while the result stays within maxSpan,
// and spans longer than maxSpan are cut into pieces of at most maxSpan.
func coalesce(ranges []byterange.Range, gap, maxSpan int64) []byterange.Range {
	rs := make([]byterange.Range, 0, len(ranges))
	for _, r := range ranges {
		if r.Length > 0 {
			rs = append(rs, r)
		}
	}
	slices.SortFunc(rs, func(a, b byterange.Range) int {
		if a.Offset != b.Offset {
			return cmp.Compare(a.Offset, b.Offset)
		}
		return cmp.Compare(a.Length, b.Length)
	})
	var merged []byterange.Range
	for _, r := range rs {
		if n := len(merged); n > 0 {
			last := &merged[n-1]
			end := last.End()
			if r.Offset <= end {
				last.Length = max(end, r.End()) - last.Offset
				continue
			}
			if r.Offset-end < gap && r.End()-last.Offset <= maxSpan {
				last.Length = r.End() - last.Offset
				continue
			}
		}
		merged = append(merged, r)
	}
	spans := make([]byterange.Range, 0, len(merged))
	for _, m := range merged {
		for off := m.Offset; off < m.End(); off += maxSpan {
			spans = append(spans, byterange.Range{Offset: off, Length: min(maxSpan, m.End()-off)})
		}
	}
	return spans
}

// rangeHeader is the value of a Range header asking for spans.
func rangeHeader(spans []byterange.Range) string {
	var b strings.Builder
	b.WriteString("bytes=")
	for i, s := range spans {
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, "%d-%d", s.Offset, s.End()-1)
	}
	return b.String()
}

// parseContentRange parses "bytes first-last/size" (size may be "*", returned as -1).
func parseContentRange(v string) (first, last, size int64, err error) {
	rest, ok := strings.CutPrefix(v, "bytes ")
	if !ok {
		return 0, 0, 0, fmt.Errorf("%w: Content-Range %q is not a byte range", ErrBadResponse, v)
	}
	rng, total, ok := strings.Cut(rest, "/")
	if !ok {
		return 0, 0, 0, fmt.Errorf("%w: Content-Range %q has no size", ErrBadResponse, v)
	}
	a, b, ok := strings.Cut(rng, "-")
	if !ok {
		return 0, 0, 0, fmt.Errorf("%w: Content-Range %q has no range", ErrBadResponse, v)
	}
	first, err1 := strconv.ParseInt(a, 10, 64)
	last, err2 := strconv.ParseInt(b, 10, 64)
	size = -1
	var err3 error
	if total != "*" {
		size, err3 = strconv.ParseInt(total, 10, 64)
	}
	if err := errors.Join(err1, err2, err3); err != nil || first < 0 || last < first {
		return 0, 0, 0, fmt.Errorf("%w: malformed Content-Range %q", ErrBadResponse, v)
	}
	return first, last, size, nil
}

// spanSet receives the bytes of the spans of one request into their buffers.
type spanSet struct {
	spans []byterange.Range // sorted, disjoint
	sps   []*span
}

// copyPart reads from r the bytes first..last (inclusive) of the blob, as far as needed, and
// stores those of the spans they contain, publishing them as they come; of a span that an
// earlier request filled in part, the bytes it holds are skipped. It returns how many spans it
// filled. A span cut by the part is a protocol error (ErrBadResponse); a read error means a
// truncated body.
func (s *spanSet) copyPart(r io.Reader, first, last int64) (int, error) {
	pos, n := first, 0
	for i, sp := range s.spans {
		if sp.End() <= first || sp.Offset > last {
			continue
		}
		if sp.Offset < first || sp.End()-1 > last {
			return n, fmt.Errorf("%w: part bytes %d-%d cuts requested range %d-%d",
				ErrBadResponse, first, last, sp.Offset, sp.End()-1)
		}
		dst := s.sps[i]
		if dst.full() {
			continue
		}
		have := dst.filled.Load()
		if _, err := io.CopyN(io.Discard, r, sp.Offset+have-pos); err != nil {
			return n, truncated(err)
		}
		for have < sp.Length {
			m, err := r.Read(dst.b[have:])
			if m > 0 {
				have += int64(m)
				dst.grew(m)
			}
			if err != nil && have < sp.Length {
				if errors.Is(err, io.EOF) {
					err = io.ErrUnexpectedEOF
				}
				return n, truncated(err)
			}
		}
		pos = sp.End()
		n++
	}
	return n, nil
}

// missing returns the spans not yet filled.
func (s *spanSet) missing() []byterange.Range {
	var out []byterange.Range
	for i, sp := range s.spans {
		if !s.sps[i].full() {
			out = append(out, sp)
		}
	}
	return out
}

// errTruncated marks read errors of a body; they are retried.
type errTruncated struct{ err error }

func (e *errTruncated) Error() string { return "truncated body: " + e.err.Error() }
func (e *errTruncated) Unwrap() error { return e.err }

func truncated(err error) error {
	if errors.Is(err, io.EOF) {
		err = io.ErrUnexpectedEOF
	}
	return &errTruncated{err: err}
}
