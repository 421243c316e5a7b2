package cache

import (
	"sort"

	"github.com/layerstore/layerstore/chunked"
)

// rangeSet is a sorted list of disjoint, non-adjacent, non-empty ranges.
type rangeSet []chunked.Range

// add returns the set with r included, merging overlapping and adjacent ranges.
func (s rangeSet) add(r chunked.Range) rangeSet {
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
	merged := chunked.Range{Offset: lo, Length: hi - lo}
	if i == j {
		s = append(s, chunked.Range{})
		copy(s[i+1:], s[i:])
		s[i] = merged
		return s
	}
	s[i] = merged
	return append(s[:i+1], s[j:]...)
}

// missing returns the parts of [off, end) not in the set.
func (s rangeSet) missing(off, end int64) []chunked.Range {
	var out []chunked.Range
	i := sort.Search(len(s), func(i int) bool { return s[i].End() > off })
	for ; off < end; i++ {
		if i == len(s) || s[i].Offset >= end {
			out = append(out, chunked.Range{Offset: off, Length: end - off})
			break
		}
		if s[i].Offset > off {
			out = append(out, chunked.Range{Offset: off, Length: s[i].Offset - off})
		}
		off = s[i].End()
	}
	return out
}

// presentEnd returns the end of the present run that contains off, or off if off is missing.
func (s rangeSet) presentEnd(off int64) int64 {
	i := sort.Search(len(s), func(i int) bool { return s[i].End() > off })
	if i < len(s) && s[i].Offset <= off {
		return s[i].End()
	}
	return off
}

// bytes returns the number of bytes in the set.
func (s rangeSet) bytes() int64 {
	var n int64
	for _, r := range s {
		n += r.Length
	}
	return n
}
