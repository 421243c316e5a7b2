package fetcher

import (
	"errors"
	"slices"
	"testing"
)

func TestCoalesce(t *testing.T) {
	tests := []struct {
		name         string
		in           []Range
		gap, maxSpan int64
		want         []Range
	}{
		{"adjacent", []Range{{0, 10}, {10, 10}, {20, 5}}, 0, 100, []Range{{0, 25}}},
		{"overlapping", []Range{{0, 10}, {5, 10}}, 0, 100, []Range{{0, 15}}},
		{"contained", []Range{{0, 50}, {10, 5}}, 0, 100, []Range{{0, 50}}},
		{"unsorted", []Range{{50, 10}, {0, 10}}, 0, 100, []Range{{0, 10}, {50, 10}}},
		{"within gap", []Range{{0, 10}, {15, 10}}, 6, 100, []Range{{0, 25}}},
		{"gap is exclusive", []Range{{0, 10}, {15, 10}}, 5, 100, []Range{{0, 10}, {15, 10}}},
		{"gap merge stops at max span", []Range{{0, 10}, {15, 10}}, 10, 20, []Range{{0, 10}, {15, 10}}},
		{"long range split", []Range{{0, 25}}, 0, 10, []Range{{0, 10}, {10, 10}, {20, 5}}},
		{"adjacent merge then split", []Range{{0, 8}, {8, 8}}, 0, 10, []Range{{0, 10}, {10, 6}}},
		{"empty ranges dropped", []Range{{5, 0}, {0, 3}}, 0, 10, []Range{{0, 3}}},
		{"none", nil, 0, 10, []Range{}},
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
	if got, want := rangeHeader([]Range{{0, 10}, {100, 1}}), "bytes=0-9,100-100"; got != want {
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
