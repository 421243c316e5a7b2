package fetcher

import (
	"errors"
	"slices"
	"testing"

	"github.com/layerstore/layerstore/internal/byterange"
)

func TestCoalesce(t *testing.T) {
	tests := []struct {
		name         string
		in           []byterange.Range
		gap, maxSpan int64
		want         []byterange.Range
	}{
		{"adjacent", []byterange.Range{{Offset: 0, Length: 10}, {Offset: 10, Length: 10}, {Offset: 20, Length: 5}}, 0, 100, []byterange.Range{{Offset: 0, Length: 25}}},
		{"overlapping", []byterange.Range{{Offset: 0, Length: 10}, {Offset: 5, Length: 10}}, 0, 100, []byterange.Range{{Offset: 0, Length: 15}}},
		{"contained", []byterange.Range{{Offset: 0, Length: 50}, {Offset: 10, Length: 5}}, 0, 100, []byterange.Range{{Offset: 0, Length: 50}}},
		{"unsorted", []byterange.Range{{Offset: 50, Length: 10}, {Offset: 0, Length: 10}}, 0, 100, []byterange.Range{{Offset: 0, Length: 10}, {Offset: 50, Length: 10}}},
		{"within gap", []byterange.Range{{Offset: 0, Length: 10}, {Offset: 15, Length: 10}}, 6, 100, []byterange.Range{{Offset: 0, Length: 25}}},
		{"gap is exclusive", []byterange.Range{{Offset: 0, Length: 10}, {Offset: 15, Length: 10}}, 5, 100, []byterange.Range{{Offset: 0, Length: 10}, {Offset: 15, Length: 10}}},
		{"gap merge stops at max span", []byterange.Range{{Offset: 0, Length: 10}, {Offset: 15, Length: 10}}, 10, 20, []byterange.Range{{Offset: 0, Length: 10}, {Offset: 15, Length: 10}}},
		{"long range split", []byterange.Range{{Offset: 0, Length: 25}}, 0, 10, []byterange.Range{{Offset: 0, Length: 10}, {Offset: 10, Length: 10}, {Offset: 20, Length: 5}}},
		{"adjacent merge then split", []byterange.Range{{Offset: 0, Length: 8}, {Offset: 8, Length: 8}}, 0, 10, []byterange.Range{{Offset: 0, Length: 10}, {Offset: 10, Length: 6}}},
		{"empty ranges dropped", []byterange.Range{{Offset: 5, Length: 0}, {Offset: 0, Length: 3}}, 0, 10, []byterange.Range{{Offset: 0, Length: 3}}},
		{"none", nil, 0, 10, []byterange.Range{}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := coalesce(tt.in, tt.gap, tt.maxSpan)
			if !slices.Equal(got, tt.want) {
				t.Errorf("coalesce(%v, gap %d, span %d) = %v, want %v", tt.in, tt.gap, tt.maxSpan, got, tt.want)
			}
		})
	}
}

func TestRangeHeader(t *testing.T) {
	if got, want := rangeHeader([]byterange.Range{{Offset: 0, Length: 10}, {Offset: 100, Length: 1}}), "bytes=0-9,100-100"; got != want {
		t.Errorf("rangeHeader = %q, want %q", got, want)
	}
}

func TestParseContentRange(t *testing.T) {
	tests := []struct {
		in                string
		first, last, size int64
		wantErr           bool
	}{
		{"bytes 0-9/100", 0, 9, 100, false},
		{"bytes 5-5/*", 5, 5, -1, false},
		{"bytes 9-0/100", 0, 0, 0, true},
		{"bytes */100", 0, 0, 0, true},
		{"items 0-9/100", 0, 0, 0, true},
		{"bytes 0-9", 0, 0, 0, true},
		{"bytes -1-9/100", 0, 0, 0, true},
		{"", 0, 0, 0, true},
	}
	for _, tt := range tests {
		first, last, size, err := parseContentRange(tt.in)
		if tt.wantErr {
			if !errors.Is(err, ErrBadResponse) {
				t.Errorf("parseContentRange(%q) error = %v, want ErrBadResponse", tt.in, err)
			}
			continue
		}
		if err != nil || first != tt.first || last != tt.last || size != tt.size {
			t.Errorf("parseContentRange(%q) = %d, %d, %d, %v; want %d, %d, %d", tt.in, first, last, size, err, tt.first, tt.last, tt.size)
		}
	}
}
