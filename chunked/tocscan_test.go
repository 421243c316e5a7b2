package chunked

import (
	"bytes"
	"errors"
	"io"
	"reflect"
	"strings"
	"testing"

	"github.com/go-json-experiment/json"
	"github.com/go-json-experiment/json/jsontext"
)

// TOCRead is what a TOC's JSON reads as: its own members and its entries.
type TOCRead struct {
	Top     tocTop
	Entries []rawEntry
}

// ReferenceTOC reads a TOC as json.Unmarshal does, with the refusals of the parse: a TOC
// that is not an object, entries that are not an array (null among them) or hold other than
// objects, members of an entry that differ from a defined key only by case. It is what
// ScanTOC must match.
func ReferenceTOC(js []byte) (TOCRead, error) {
	var t struct {
		Version        int            `json:"version"`
		TarSplitDigest string         `json:"tarSplitDigest"`
		Entries        jsontext.Value `json:"entries"`
	}
	var out TOCRead
	if err := json.Unmarshal(js, &t); err != nil {
		return out, err
	}
	if v := bytes.TrimLeft(js, " \t\r\n"); len(v) == 0 || v[0] != '{' {
		return out, errors.New("not an object")
	}
	out.Top = tocTop{version: t.Version, tarSplitDigest: t.TarSplitDigest}
	if t.Entries == nil {
		return out, nil
	}
	if t.Entries.Kind() != '[' {
		return out, errors.New("entries not an array")
	}
	var elems []jsontext.Value
	if err := json.Unmarshal(t.Entries, &elems); err != nil {
		return out, err
	}
	for _, e := range elems {
		if e.Kind() != '{' {
			return out, errors.New("an entry not an object")
		}
		r, err := referenceEntry(e)
		if err != nil {
			return out, err
		}
		out.Entries = append(out.Entries, r)
	}
	return out, nil
}

// ScanTOC reads a TOC from r with the tocScanner the parse uses, with a first buffer of
// minBuf bytes, as the parse does but for the index: the entries read in order, each with
// strings of its own batch. slow counts the entries it read with the JSON decoder.
func ScanTOC(r io.Reader, minBuf int) (out TOCRead, slow int, err error) {
	out, st, err := scanTOC(r, minBuf)
	return out, st.slow, err
}

func scanTOC(r io.Reader, minBuf int) (out TOCRead, _ scanStats, err error) {
	s := newTOCScanner(r)
	s.minBuf = minBuf
	err = s.scan(&out.Top, func() error {
		for {
			more, err := s.next()
			if err != nil || !more {
				return err
			}
			var r rawEntry
			var strs []byte
			if err := s.entry(&r, &strs); err != nil {
				return err
			}
			out.Entries = append(out.Entries, r)
		}
	})
	return out, s.stats, err
}

// TestScanTOCCommonShapeFast checks that the entries the formats' writers write are read by
// the scanner itself, not by the JSON decoder: indented or not, with every defined member
// but xattrs, and names in UTF-8.
func TestScanTOCCommonShapeFast(t *testing.T) {
	const entry = `{"name":"usr/bin/x","type":"reg","size":4096,"modtime":"2024-03-01T12:00:00Z","accesstime":"2024-03-01T12:00:00.5Z","changetime":"2024-03-01T12:00:00Z","mode":420,"uid":1000,"gid":1000,"digest":"sha256:9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08","offset":512,"endOffset":2012,"innerOffset":0,"chunkOffset":0,"chunkSize":4096,"chunkDigest":"sha256:9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08","chunkType":"zeros","userName":"u","groupName":"g","linkName":"","devMajor":0,"devMinor":0}`
	var v any
	if err := json.Unmarshal([]byte(`{"version":1,"entries":[`+entry+`,{"name":"d/é","type":"dir","size":-1}]}`), &v); err != nil {
		t.Fatal(err)
	}
	compact, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	indented := jsontext.Value(bytes.Clone(compact))
	if err := indented.Indent(jsontext.WithIndent("\t")); err != nil {
		t.Fatal(err)
	}
	for _, js := range [][]byte{compact, indented} {
		for _, minBuf := range []int{1, 64, 256 << 10} {
			got, slow, err := ScanTOC(bytes.NewReader(js), minBuf)
			want, werr := ReferenceTOC(js)
			// A buffer smaller than an entry sends it to the decoder (after two reads more).
			if err != nil || werr != nil || slow != 0 && minBuf > 1<<10 || len(got.Entries) != 2 {
				t.Fatalf("%s, buffer %d: %d entries, %d slow, %v (reference %v)", js, minBuf, len(got.Entries), slow, err, werr)
			}
			if !EqualTOCRead(got, want) {
				t.Fatalf("read %+v, want %+v", got, want)
			}
		}
	}
}

// EqualTOCRead reports whether a and b read the same: the same members and entries.
func EqualTOCRead(a, b TOCRead) bool {
	if a.Top != b.Top || len(a.Entries) != len(b.Entries) {
		return false
	}
	for i := range a.Entries {
		if !reflect.DeepEqual(a.Entries[i], b.Entries[i]) {
			return false
		}
	}
	return true
}

// EntrySeeds are entries of many shapes, for the fuzzers of what reads them.
var EntrySeeds = entryDecoderSeeds

// TestScanTOCLinear checks that the scanner's work is linear in the JSON however it arrives:
// a value of 16 MiB (a member the parse skips, an entry of one long name) arriving 4 KiB a
// read is scanned once for its end, not again at each read, and an entry is read by
// fastEntry three times at most.
func TestScanTOCLinear(t *testing.T) {
	long := strings.Repeat("a", 16<<20)
	for _, tc := range []struct{ name, js string }{
		{"a long member", `{"x":"` + long + `","version":1,"entries":[{"name":"a"}]}`},
		{"a long nested member", `{"x":[{"y":"` + long + `"}],"version":1}`},
		{"a long entry", `{"version":1,"entries":[{"name":"a"},{"name":"` + long + `"},{"name":"b"}]}`},
		{"a long escaped entry", `{"version":1,"entries":[{"name":"` + long + `\u0061"}]}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, st, err := scanTOC(&smallReads{r: strings.NewReader(tc.js), n: 4 << 10}, 4<<10)
			if err != nil {
				t.Fatal(err)
			}
			if st.scanned > 2*int64(len(tc.js)) || st.tries > 3*len(out.Entries) {
				t.Errorf("%d bytes scanned, %d reads by fastEntry, for %d bytes and %d entries", st.scanned, st.tries, len(tc.js), len(out.Entries))
			}
		})
	}
}

// smallReads yields what r yields, at most n bytes a read.
type smallReads struct {
	r io.Reader
	n int
}

func (s *smallReads) Read(p []byte) (int, error) { return s.r.Read(p[:min(len(p), s.n)]) }
