package byterange

import (
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
)

func TestSet(t *testing.T) {
	for _, tc := range []struct {
		name string
		add  []Range
		want Set
	}{
		{"empty", nil, nil},
		{"one", []Range{{Offset: 10, Length: 5}}, Set{{Offset: 10, Length: 5}}},
		{"disjoint unsorted", []Range{{Offset: 20, Length: 5}, {Offset: 0, Length: 5}, {Offset: 10, Length: 5}}, Set{{Offset: 0, Length: 5}, {Offset: 10, Length: 5}, {Offset: 20, Length: 5}}},
		{"adjacent merge", []Range{{Offset: 0, Length: 5}, {Offset: 5, Length: 5}}, Set{{Offset: 0, Length: 10}}},
		{"overlap", []Range{{Offset: 0, Length: 6}, {Offset: 4, Length: 6}}, Set{{Offset: 0, Length: 10}}},
		{"bridge", []Range{{Offset: 0, Length: 2}, {Offset: 4, Length: 2}, {Offset: 8, Length: 2}, {Offset: 1, Length: 8}}, Set{{Offset: 0, Length: 10}}},
		{"contained", []Range{{Offset: 0, Length: 10}, {Offset: 2, Length: 3}}, Set{{Offset: 0, Length: 10}}},
		{"zero length ignored", []Range{{Offset: 3, Length: 0}}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var s Set
			for _, r := range tc.add {
				s = s.Add(r)
			}
			if !slices.Equal(s, tc.want) {
				t.Errorf("got %v, want %v", s, tc.want)
			}
		})
	}
}

func TestSetMissing(t *testing.T) {
	s := Set{{Offset: 10, Length: 10}, {Offset: 30, Length: 10}}
	for _, tc := range []struct {
		off, end int64
		want     []Range
		pe       int64
	}{
		{0, 50, []Range{{Offset: 0, Length: 10}, {Offset: 20, Length: 10}, {Offset: 40, Length: 10}}, 0},
		{10, 20, nil, 20},
		{15, 35, []Range{{Offset: 20, Length: 10}}, 20},
		{20, 30, []Range{{Offset: 20, Length: 10}}, 20},
		{35, 40, nil, 40},
		{45, 50, []Range{{Offset: 45, Length: 5}}, 45},
	} {
		if got := s.Missing(tc.off, tc.end); !slices.Equal(got, tc.want) {
			t.Errorf("Missing(%d, %d) = %v, want %v", tc.off, tc.end, got, tc.want)
		}
		if got := s.PresentEnd(tc.off); got != tc.pe {
			t.Errorf("PresentEnd(%d) = %d, want %d", tc.off, got, tc.pe)
		}
	}
}

// TestSetRandom checks the set against a bitmap.
func TestSetRandom(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	const n = 200
	for range 200 {
		var s Set
		var bits [n]bool
		for range rng.IntN(12) {
			off := rng.Int64N(n)
			l := rng.Int64N(n - off)
			s = s.Add(Range{Offset: off, Length: l})
			for i := off; i < off+l; i++ {
				bits[i] = true
			}
		}
		var got [n]bool
		for i := range got {
			got[i] = true
		}
		for _, r := range s.Missing(0, n) {
			for i := r.Offset; i < r.End(); i++ {
				got[i] = false
			}
		}
		if got != bits {
			t.Fatalf("set %v disagrees with bitmap", s)
		}
		for i := 1; i < len(s); i++ {
			if s[i].Offset <= s[i-1].End() {
				t.Fatalf("set %v not disjoint and non-adjacent", s)
			}
		}
		var count int64
		for _, b := range bits {
			if b {
				count++
			}
		}
		if s.Bytes() != count {
			t.Fatalf("Bytes = %d, want %d", s.Bytes(), count)
		}
	}
}

// TestCopy: Copy puts the overlap of a source range into a destination range, whichever
// starts first, and nothing when they do not overlap.
func TestCopy(t *testing.T) {
	file := []byte("0123456789abcdefghij")
	for _, c := range []struct {
		dstOff, dstLen, srcOff, srcLen int64
		want                           string // dst after the copy, '.' where nothing was copied
		n                              int
	}{
		{dstOff: 4, dstLen: 6, srcOff: 4, srcLen: 6, want: "456789", n: 6},  // the same range
		{dstOff: 4, dstLen: 6, srcOff: 6, srcLen: 2, want: "..67..", n: 2},  // the source within
		{dstOff: 4, dstLen: 6, srcOff: 0, srcLen: 6, want: "45....", n: 2},  // the source first
		{dstOff: 4, dstLen: 6, srcOff: 8, srcLen: 10, want: "....89", n: 2}, // the source last
		{dstOff: 4, dstLen: 6, srcOff: 0, srcLen: 20, want: "456789", n: 6}, // the source around
		{dstOff: 4, dstLen: 6, srcOff: 0, srcLen: 4, want: "......", n: 0},  // before, adjacent
		{dstOff: 4, dstLen: 6, srcOff: 10, srcLen: 4, want: "......", n: 0}, // after, adjacent
		{dstOff: 4, dstLen: 6, srcOff: 15, srcLen: 5, want: "......", n: 0}, // far after
	} {
		dst := []byte(strings.Repeat(".", int(c.dstLen)))
		n := Copy(dst, c.dstOff, file[c.srcOff:c.srcOff+c.srcLen], c.srcOff)
		if string(dst) != c.want || n != c.n {
			t.Errorf("dst %d+%d, src %d+%d: %q, %d bytes; want %q, %d", c.dstOff, c.dstLen, c.srcOff, c.srcLen, dst, n, c.want, c.n)
		}
	}
}
