package cache

import (
	"errors"
	"slices"
	"testing"

	"github.com/layerstore/layerstore/internal/byterange"
)

func TestJournalRoundTrip(t *testing.T) {
	b := journalHeader(1000)
	b = appendRecord(b, byterange.Range{Offset: 0, Length: 100})
	b = appendRecord(b, byterange.Range{Offset: 500, Length: 500})
	size, set, good, err := parseJournal(b)
	if err != nil || size != 1000 || good != len(b) || !slices.Equal(set, byterange.Set{{Offset: 0, Length: 100}, {Offset: 500, Length: 500}}) {
		t.Fatalf("parse = %d, %v, %d, %v", size, set, good, err)
	}
}

func TestJournalDamage(t *testing.T) {
	valid := appendRecord(appendRecord(journalHeader(1000), byterange.Range{Offset: 0, Length: 100}), byterange.Range{Offset: 200, Length: 100})
	flip := func(i int) []byte { b := slices.Clone(valid); b[i] ^= 1; return b }
	for _, tc := range []struct {
		name    string
		b       []byte
		wantErr bool
		want    byterange.Set
		good    int
	}{
		{"empty", nil, true, nil, 0},
		{"short header", valid[:5], true, nil, 0},
		{"bad magic", flip(0), true, nil, 0},
		{"bad header crc", flip(9), true, nil, 0},
		{"torn last record", valid[:len(valid)-3], false, byterange.Set{{Offset: 0, Length: 100}}, 40},
		{"bad first record", flip(21), false, nil, 20},
		{"bad second record", flip(41), false, byterange.Set{{Offset: 0, Length: 100}}, 40},
		{"record past end", appendRecord(journalHeader(10), byterange.Range{Offset: 5, Length: 6}), false, nil, 20},
		{"empty record", appendRecord(journalHeader(10), byterange.Range{Offset: 5, Length: 0}), false, nil, 20},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, set, good, err := parseJournal(tc.b)
			if gotErr := errors.Is(err, errBadJournal); gotErr != tc.wantErr {
				t.Fatalf("err = %v, want bad journal: %v", err, tc.wantErr)
			}
			if !slices.Equal(set, tc.want) || good != tc.good {
				t.Errorf("got %v (good %d), want %v (good %d)", set, good, tc.want, tc.good)
			}
		})
	}
}

func FuzzParseJournal(f *testing.F) {
	f.Add(appendRecord(appendRecord(journalHeader(1000), byterange.Range{Offset: 0, Length: 100}), byterange.Range{Offset: 200, Length: 100}))
	f.Add(journalHeader(0))
	f.Add([]byte("LSCJRNL1"))
	f.Fuzz(func(t *testing.T, b []byte) {
		size, set, good, err := parseJournal(b)
		if err != nil {
			return
		}
		if good > len(b) || good < journalRec || (good-journalRec)%journalRec != 0 {
			t.Fatalf("good = %d of %d", good, len(b))
		}
		for _, r := range set {
			if r.Offset < 0 || r.Length <= 0 || r.End() > size {
				t.Fatalf("range %v outside a %d-byte file", r, size)
			}
		}
	})
}
