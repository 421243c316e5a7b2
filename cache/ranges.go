package cache

import "sort"

// Range is the byte range [Off, Off+Len) of a file.
type Range struct {
	Off, Len int64
}

// End returns the offset just past the range.
func (r Range) End() int64 { return r.Off + r.Len }

// rangeSet is a sorted list of disjoint, non-adjacent, non-empty ranges.
type rangeSet []Range

// add returns the set with r included, merging overlapping and adjacent ranges.
func (s rangeSet) add(r Range) rangeSet {
	if r.Len <= 0 {
		return s
	}
	// First range that overlaps or touches r.
	i := sort.Search(len(s), func(i int) bool { return s[i].End() >= r.Off })
	j := i
	lo, hi := r.Off, r.End()
	for j < len(s) && s[j].Off <= hi {
		lo, hi = min(lo, s[j].Off), max(hi, s[j].End())
		j++
	}
	merged := Range{Off: lo, Len: hi - lo}
	if i == j {
		s = append(s, Range{})
		copy(s[i+1:], s[i:])
		s[i] = merged
		return s
	}
	s[i] = merged
	return append(s[:i+1], s[j:]...)
}

// missing returns the parts of [off, end) not in the set.
func (s rangeSet) missing(off, end int64) []Range {
	var out []Range
	i := sort.Search(len(s), func(i int) bool { return s[i].End() > off })
	for ; off < end; i++ {
		if i == len(s) || s[i].Off >= end {
			out = append(out, Range{Off: off, Len: end - off})
			break
		}
		if s[i].Off > off {
			out = append(out, Range{Off: off, Len: s[i].Off - off})
		}
		off = s[i].End()
	}
	return out
}

// presentEnd returns the end of the present run that contains off, or off if off is missing.
func (s rangeSet) presentEnd(off int64) int64 {
	i := sort.Search(len(s), func(i int) bool { return s[i].End() > off })
	if i < len(s) && s[i].Off <= off {
		return s[i].End()
	}
	return off
}

// bytes returns the number of bytes in the set.
func (s rangeSet) bytes() int64 {
	var n int64
	for _, r := range s {
		n += r.Len
	}
	return n
}
