package chunked

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"testing"

	"github.com/layerstore/layerstore/internal/byterange"
)

// releaseTOC returns a TOC of about n entries that makes compact read across blocks of the
// wide form: directories listed after their entries or not at all, files of three chunks
// (the chunk table spans blocks), hardlinks, whiteouts and opaque markers of directories
// the TOC lists far before, hidden entries whose directory has no entry (a whole name),
// entries replaced later, symbolic links and xattrs.
func releaseTOC(n int) []byte {
	const sum = "sha256:9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"
	var b strings.Builder
	b.WriteString(`{"version":1,"entries":[`)
	off := int64(512)
	entry := func(format string, args ...any) {
		if b.Len() > len(`{"version":1,"entries":[`) {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, format, args...)
	}
	file := func(name string, chunks int) {
		if chunks == 1 {
			entry(`{"type":"reg","name":%q,"size":10,"digest":%q,"offset":%d,"chunkDigest":%q}`, name, sum, off, sum)
			off += 100
			return
		}
		entry(`{"type":"reg","name":%q,"size":%d,"digest":%q,"offset":%d,"chunkSize":10,"chunkDigest":%q}`, name, 10*chunks, sum, off, sum)
		for c := 1; c < chunks; c++ {
			entry(`{"type":"chunk","name":%q,"offset":%d,"chunkOffset":%d,"chunkSize":10,"chunkDigest":%q}`, name, off+int64(c)*100, c*10, sum)
		}
		off += int64(chunks) * 100
	}
	for i := 0; i < n; i += 8 {
		d := fmt.Sprintf("d%d", i/64)
		file(fmt.Sprintf("%s/f%d", d, i), 3)
		file(fmt.Sprintf("%s/g%d", d, i), 1)
		entry(`{"type":"symlink","name":"%s/l%d","linkName":"../x","xattrs":{"user.a":"YQ=="}}`, d, i)
		entry(`{"type":"hardlink","name":"%s/h%d","linkName":"d0/g0"}`, d, i)
		entry(`{"type":"reg","name":"%s/.wh.gone%d"}`, fmt.Sprintf("d%d", i/3000), i)
		entry(`{"type":"reg","name":"implicit%d/sub/.wh..wh.plnk%d"}`, i/500, i)
		file(fmt.Sprintf("%s/g%d", d, i), 1) // replaces the g above
		if i%64 == 56 {
			entry(`{"type":"dir","name":"%s","mode":493}`, d) // after its entries
			entry(`{"type":"reg","name":"d%d/.wh..wh..opq"}`, i/3000)
		} else {
			entry(`{"type":"dir","name":"%s/e%d"}`, d, i)
		}
	}
	b.WriteString(`]}`)
	return []byte(b.String())
}

// parseKept parses as parse does, but keeps the wide form whole through compact.
func parseKept(layout *Layout, toc []byte) (*Index, error) {
	b := &builder{ctx: context.Background(), lim: Limits{}.WithDefaults(), cur: -1, x: newWideIndex(layout)}
	b.x.keep = true
	defer b.free()
	if err := b.decode(bytes.NewReader(toc)); err != nil {
		return nil, err
	}
	return b.finish()
}

// TestCompactReleases checks that compact, which unmaps the wide form's blocks behind it,
// writes the index it writes from the whole wide form, byte for byte, and that a parse
// unmaps every block it mapped, however it ends.
func TestCompactReleases(t *testing.T) {
	toc := releaseTOC(3*blockLen + 100)
	layout := &Layout{Format: EStargz, TOC: byterange.Range{Offset: 1 << 30, Length: 1}}
	want, err := parseKept(layout, toc)
	if err != nil {
		t.Fatal(err)
	}
	if want.Len() < 3*blockLen || len(want.chunks) < blockLen*chunkSize {
		t.Fatalf("%d entries and %d table chunks: not several blocks of each", want.Len(), len(want.chunks)/chunkSize)
	}
	got, err := Parse(context.Background(), layout, toc, Limits{})
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got.Binary(), want.Binary()) {
		t.Fatal("the index written as the wide form is unmapped differs from the one written from the whole form")
	}
	if err := CompareWide(layout, toc, Limits{}); err != nil {
		t.Fatal(err)
	}
	if n := mappedBytes.Load(); n != 0 {
		t.Fatalf("%d bytes mapped after the parses", n)
	}

	canceled, cancel := context.WithCancel(context.Background())
	cancel()
	bad := append(bytes.TrimSuffix(toc, []byte("]}")), []byte(`,{"type":"reg","name":"../escape"}]}`)...)
	for _, c := range []struct {
		name string
		ctx  context.Context
		toc  []byte
		lim  Limits
		want error
	}{
		{"an invalid last entry", context.Background(), bad, Limits{}, ErrInvalid},
		{"the entry limit", context.Background(), toc, Limits{MaxEntries: 2*blockLen + 7}, ErrLimit},
		{"canceled", canceled, toc, Limits{}, context.Canceled},
	} {
		if _, err := Parse(c.ctx, layout, c.toc, c.lim); !errors.Is(err, c.want) {
			t.Errorf("%s: %v, want %v", c.name, err, c.want)
		}
		if n := mappedBytes.Load(); n != 0 {
			t.Errorf("%s: %d bytes mapped after the parse", c.name, n)
		}
	}
}

// TestMappedTypesHoldNoPointers checks the types the builder maps outside the heap: a
// pointer there is invisible to the collector, which would free what it points to.
func TestMappedTypesHoldNoPointers(t *testing.T) {
	var pointers func(reflect.Type) bool
	pointers = func(t reflect.Type) bool {
		switch t.Kind() {
		case reflect.Struct:
			for f := range t.Fields() {
				if pointers(f.Type) {
					return true
				}
			}
			return false
		case reflect.Array:
			return pointers(t.Elem())
		}
		return t.Kind() > reflect.Complex128 // pointers, strings, slices, maps, ...
	}
	for _, v := range []any{wideEntry{}, Chunk{}, wideExtra{}, entryTime{}, nameRef{}, xattrRef{}, EntryID(0), uint32(0), int64(0)} {
		if pointers(reflect.TypeOf(v)) {
			t.Errorf("%T holds pointers", v)
		}
	}
}
