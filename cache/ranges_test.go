package cache

import (
	"math/rand/v2"
	"slices"
	"testing"
)

func TestRangeSet(t *testing.T) {
	for _, tc := range []struct {
		name string
		add  []Range
		want rangeSet
	}{
		{"empty", nil, nil},
		{"one", []Range{{10, 5}}, rangeSet{{10, 5}}},
		{"disjoint unsorted", []Range{{20, 5}, {0, 5}, {10, 5}}, rangeSet{{0, 5}, {10, 5}, {20, 5}}},
		{"adjacent merge", []Range{{0, 5}, {5, 5}}, rangeSet{{0, 10}}},
		{"overlap", []Range{{0, 6}, {4, 6}}, rangeSet{{0, 10}}},
		{"bridge", []Range{{0, 2}, {4, 2}, {8, 2}, {1, 8}}, rangeSet{{0, 10}}},
		{"contained", []Range{{0, 10}, {2, 3}}, rangeSet{{0, 10}}},
		{"zero length ignored", []Range{{3, 0}}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var s rangeSet
			for _, r := range tc.add {
				s = s.add(r)
			}
			if !slices.Equal(s, tc.want) {
				t.Errorf("got %v, want %v", s, tc.want)
			}
		})
	}
}

func TestRangeSetMissing(t *testing.T) {
	s := rangeSet{{10, 10}, {30, 10}}
	for _, tc := range []struct {
		off, end int64
		want     []Range
		pe       int64
	}{
		{0, 50, []Range{{0, 10}, {20, 10}, {40, 10}}, 0},
		{10, 20, nil, 20},
		{15, 35, []Range{{20, 10}}, 20},
		{20, 30, []Range{{20, 10}}, 20},
		{35, 40, nil, 40},
		{45, 50, []Range{{45, 5}}, 45},
	} {
		if got := s.missing(tc.off, tc.end); !slices.Equal(got, tc.want) {
			t.Errorf("missing(%d, %d) = %v, want %v", tc.off, tc.end, got, tc.want)
		}
		if got := s.presentEnd(tc.off); got != tc.pe {
			t.Errorf("presentEnd(%d) = %d, want %d", tc.off, got, tc.pe)
		}
	}
}

// TestRangeSetRandom checks the set against a bitmap.
func TestRangeSetRandom(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	const n = 200
	for range 200 {
		var s rangeSet
		var bits [n]bool
		for range rng.IntN(12) {
			off := rng.Int64N(n)
			l := rng.Int64N(n - off)
			s = s.add(Range{off, l})
			for i := off; i < off+l; i++ {
				bits[i] = true
			}
		}
		var got [n]bool
		for i := range got {
			got[i] = true
		}
		for _, r := range s.missing(0, n) {
			for i := r.Off; i < r.End(); i++ {
				got[i] = false
			}
		}
		if got != bits {
			t.Fatalf("set %v disagrees with bitmap", s)
		}
		for i := 1; i < len(s); i++ {
			if s[i].Off <= s[i-1].End() {
				t.Fatalf("set %v not disjoint and non-adjacent", s)
			}
		}
		var count int64
		for _, b := range bits {
			if b {
				count++
			}
		}
		if s.bytes() != count {
			t.Fatalf("bytes = %d, want %d", s.bytes(), count)
		}
	}
}
