// Package byterange owns the byte range of a blob or a file and the sorted set of them: the
// positions the chunked index gives, the spans the fetcher requests, the bytes the cache holds;
// and Copy, which puts the bytes of one range where they overlap another's (a fetched chunk
// into the buffer of a read). A Range is a value; a Set is a slice its owner guards (its
// methods add in place).
package byterange

import "sort"

// Range is Length bytes from Offset.
type Range struct {
	Offset int64
	Length int64
}

// End returns the offset just past the range.
func (r Range) End() int64 { return r.Offset + r.Length }

// Within reports whether the range lies in [0, end), without overflowing.
func (r Range) Within(end int64) bool {
	return r.Offset >= 0 && r.Length >= 0 && r.Offset <= end && r.Length <= end-r.Offset
}

// Copy copies into dst, which holds the bytes from dstOff, the part of src, the bytes from
// srcOff, that overlaps it, and returns how many bytes it copied.
func Copy(dst []byte, dstOff int64, src []byte, srcOff int64) int {
	if srcOff >= dstOff {
		if skip := srcOff - dstOff; skip < int64(len(dst)) {
			return copy(dst[skip:], src)
		}
		return 0
	}
	if skip := dstOff - srcOff; skip < int64(len(src)) {
		return copy(dst, src[skip:])
	}
	return 0
}

// Set is a sorted list of disjoint, non-adjacent, non-empty ranges.
type Set []Range

// Add returns the set with r included, merging overlapping and adjacent ranges. It works in
// place: the set it was called on is not to be used after.
func (s Set) Add(r Range) Set {
	if r.Length <= 0 {
		return s
	}
	// First range that overlaps or touches r.
	i := sort.Search(len(s), func(i int) bool { return s[i].End() >= r.Offset })
	j := i
	lo, hi := r.Offset, r.End()
	for j < len(s) && s[j].Offset <= hi {
		lo, hi = min(lo, s[j].Offset), max(hi, s[j].End())
		j++
	}
	merged := Range{Offset: lo, Length: hi - lo}
	if i == j {
		s = append(s, Range{})
		copy(s[i+1:], s[i:])
		s[i] = merged
		return s
	}
	s[i] = merged
	return append(s[:i+1], s[j:]...)
}

// Missing returns the parts of [off, end) not in the set.
func (s Set) Missing(off, end int64) []Range {
	var out []Range
	i := sort.Search(len(s), func(i int) bool { return s[i].End() > off })
	for ; off < end; i++ {
		if i == len(s) || s[i].Offset >= end {
			out = append(out, Range{Offset: off, Length: end - off})
			break
		}
		if s[i].Offset > off {
			out = append(out, Range{Offset: off, Length: s[i].Offset - off})
		}
		off = s[i].End()
	}
	return out
}

// PresentEnd returns the end of the run of the set that contains off, or off if none does.
func (s Set) PresentEnd(off int64) int64 {
	i := sort.Search(len(s), func(i int) bool { return s[i].End() > off })
	if i < len(s) && s[i].Offset <= off {
		return s[i].End()
	}
	return off
}

// Bytes returns the number of bytes in the set.
func (s Set) Bytes() int64 {
	var n int64
	for _, r := range s {
		n += r.Length
	}
	return n
}
