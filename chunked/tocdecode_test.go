package chunked

import (
	"bytes"
	"path"
	"reflect"
	"strings"
	"testing"
	"unsafe"

	"github.com/go-json-experiment/json"
	"github.com/go-json-experiment/json/jsontext"
)

// referenceEntry reads one entry as json.Unmarshal does into a rawEntry, then refuses the
// members that differ from a defined key only by case: what entryDecoder must match.
func referenceEntry(in []byte) (rawEntry, error) {
	var r rawEntry
	if err := json.UnmarshalDecode(jsontext.NewDecoder(bytes.NewReader(in)), &r); err != nil {
		return r, err
	}
	if err := refuseCaseVariants(r.Unknown, knownKeys); err != nil {
		return r, err
	}
	r.Unknown = nil
	return r, nil
}

var entryDecoderSeeds = []string{
	`{"name":"usr/bin/x","type":"reg","size":4096,"modtime":"2024-03-01T12:00:00Z","accesstime":"2024-03-01T12:00:00.5Z","changetime":"2024-03-01T12:00:00Z","mode":420,"uid":1000,"gid":1000,"digest":"sha256:9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08","offset":512,"endOffset":2012,"innerOffset":0,"chunkOffset":0,"chunkSize":4096,"chunkDigest":"sha256:9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08","chunkType":"zeros","userName":"u","groupName":"g"}`,
	`{"name":"d","type":"dir","linkName":"","devMajor":1,"devMinor":2,"xattrs":{"user.a":"YQ==","user.b":null}}`,
	`{"name":"l","type":"symlink","linkName":"../t","xattrs":null,"future":{"a":[1,2,{"b":null}]},"x":"y"}`,
	`{"n\u0061me":"\u00e9\n","typ\u0065":"ch\u0075nk","xattrs":{"k\u0031":"v\u0032"}}`,
	`{"name":null,"type":null,"size":null,"mode":null,"xattrs":{}}`,
	`{"size":-0}`, `{"size":1.0}`, `{"size":1e3}`, `{"size":-1}`, `{"size":"1"}`, `{"size":true}`,
	`{"size":9223372036854775807}`, `{"size":9223372036854775808}`, `{"size":-9223372036854775808}`,
	`{"size":-9223372036854775809}`, `{"size":18446744073709551615}`, `{"size":184467440737095516150}`,
	`{"name":1}`, `{"name":["a"]}`, `{"name":{}}`, `{"xattrs":"a"}`, `{"xattrs":[]}`, `{"xattrs":{"a":1}}`,
	`{"Name":"a"}`, `{"DIGEST":"a"}`, `{"n\u0041me":"a"}`, `{"chunkdigest":"a"}`, `{"username":"a"}`,
	`{"name":"a","name":"b"}`, `{"name":"a","n\u0061me":"b"}`, `{"xattrs":{"a":"1","a":"2"}}`,
	`{"x":1,"y":2,"x":3}`, `{"x":1,"X":2}`, `{"x":{"a":1,"a":2}}`, `{"x":[{"a":1,"a":2}]}`, `{"x":[{"a":1},{"a":2}]}`,
	`{"x":1,"name":"a","x":2}`, `{"x\u0031":1,"x1":2}`, `{"xattrs":{"a":"1","\u0061":"2"}}`,
	`{"name":"a"`, `{"name":"a",}`, `{"name":"\xff"}`, `{"\xff":1}`, `[]`, `null`, `{}`, ``, `{"a":1}}`,
}

// FuzzEntryDecoder checks that the entryDecoder reads every entry as json.Unmarshal reads it
// into a rawEntry (with the refusal of case variants): the same values, or an error for both.
func FuzzEntryDecoder(f *testing.F) {
	for _, s := range entryDecoderSeeds {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, in []byte) {
		d := entryDecoder{dec: jsontext.NewDecoder(bytes.NewReader(in), tocJSON)}
		if d.dec.PeekKind() != '{' {
			return // the parse reads entries only while an object follows
		}
		want, werr := referenceEntry(in)
		got := rawEntry{Name: "stale", Size: 7, Xattrs: map[string]string{"stale": ""}}
		gerr := d.decodeEntry(&got)
		if (werr == nil) != (gerr == nil) {
			t.Fatalf("%q: error %v, json.Unmarshal's %v", in, gerr, werr)
		}
		if werr == nil && !reflect.DeepEqual(got, want) {
			t.Fatalf("%q: read\n%+v\njson.Unmarshal reads\n%+v", in, got, want)
		}
	})
}

// TestEntryDecoderSeeds runs FuzzEntryDecoder's seeds.
func TestEntryDecoderSeeds(t *testing.T) {
	for _, s := range entryDecoderSeeds {
		d := entryDecoder{dec: jsontext.NewDecoder(bytes.NewReader([]byte(s)), tocJSON)}
		if d.dec.PeekKind() != '{' {
			continue
		}
		want, werr := referenceEntry([]byte(s))
		var got rawEntry
		gerr := d.decodeEntry(&got)
		if (werr == nil) != (gerr == nil) || werr == nil && !reflect.DeepEqual(got, want) {
			t.Errorf("%q: read %+v, %v; json.Unmarshal reads %+v, %v", s, got, gerr, want, werr)
		}
	}
}

// FuzzCleanName checks cleanName's fast path against path.Clean.
func FuzzCleanName(f *testing.F) {
	for _, s := range []string{"a", "a/", "a//b", "a/./b", "./a", ".", "a/..", "a/../b", "a/b/", "a/b//", "/a", "a/.", "..a/b.", ""} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, name string) {
		got, err := cleanName(name)
		if err != nil {
			return
		}
		for part := range strings.SplitSeq(name, "/") {
			if part == ".." {
				t.Fatalf("%q: accepted as %q", name, got)
			}
		}
		if want := path.Clean("/" + name)[1:]; got != want {
			t.Fatalf("%q: cleaned to %q, path.Clean gives %q", name, got, want)
		}
	})
}

// referenceTarSplit reads one tar-split entry as json.Unmarshal does, then refuses the
// members that differ from a defined key only by case: what decodeTarSplit must match.
func referenceTarSplit(in []byte) (TarSplitEntry, error) {
	var r rawTarSplitEntry
	if err := json.UnmarshalDecode(jsontext.NewDecoder(bytes.NewReader(in)), &r); err != nil {
		return r.TarSplitEntry, err
	}
	return r.TarSplitEntry, refuseCaseVariants(r.Unknown, tarSplitNames)
}

var tarSplitDecoderSeeds = []string{
	`{"type":1,"name":"usr/bin/x","size":4096,"payload":"AAECAwQFBgc=","position":3}`,
	`{"type":2,"payload":"dXN0YXIAMDA=","position":0}`,
	`{"type":1,"name_raw":"/w==","name":null,"size":0,"payload":null,"position":1,"x":[1,{}]}`,
	`{"payload":""}`, `{"payload":"AA"}`, `{"payload":"AA=="}`, `{"payload":"AA\r\n=="}`, `{"payload":"A\nA=="}`,
	`{"payload":"-_8="}`, `{"payload":"AAB="}`, `{"payload":"AAA"}`, `{"payload":1}`, `{"payload":[]}`,
	`{"Payload":"AA=="}`, `{"NAME_RAW":"AA=="}`, `{"type":"1"}`, `{"type":1.5}`, `{"type":9223372036854775808}`,
	`{"p\u0061yload":"AA=="}`, `{"payload":"A\u0041=="}`, `{"position":1,"position":2}`,
}

// FuzzTarSplitDecoder checks that decodeTarSplit reads every record as json.Unmarshal reads
// it (with the refusal of case variants), reusing the buffers of the record before.
func FuzzTarSplitDecoder(f *testing.F) {
	for _, s := range tarSplitDecoderSeeds {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, in []byte) {
		d := entryDecoder{dec: jsontext.NewDecoder(bytes.NewReader(in))}
		if d.dec.PeekKind() != '{' {
			return
		}
		want, werr := referenceTarSplit(in)
		got := TarSplitEntry{Type: 7, Name: "stale", NameRaw: []byte("stale"), Payload: make([]byte, 3, 64)}
		gerr := d.decodeTarSplit(&got)
		if (werr == nil) != (gerr == nil) {
			t.Fatalf("%q: error %v, json.Unmarshal's %v", in, gerr, werr)
		}
		if werr == nil && !reflect.DeepEqual(got, want) {
			t.Fatalf("%q: read\n%+v\njson.Unmarshal reads\n%+v", in, got, want)
		}
	})
}

// TestEntryDecoderSharesChunkDigest: a chunk digest equal to the entry's digest (every
// single-chunk file of eStargz and zstd:chunked TOCs) is the same string, not a second
// allocation of it; another one is its own.
func TestEntryDecoderSharesChunkDigest(t *testing.T) {
	const sum = "sha256:9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"
	const other = "sha256:0f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"
	for _, tc := range []struct {
		in    string
		share bool
	}{
		{`{"name":"f","digest":"` + sum + `","chunkDigest":"` + sum + `"}`, true},
		{`{"name":"f","digest":"` + sum + `","chunkDigest":"` + other + `"}`, false},
		{`{"name":"f","chunkDigest":"` + sum + `","digest":"` + sum + `"}`, false},
	} {
		d := entryDecoder{dec: jsontext.NewDecoder(strings.NewReader(tc.in), tocJSON)}
		var r rawEntry
		if err := d.decodeEntry(&r); err != nil {
			t.Fatal(err)
		}
		want, err := referenceEntry([]byte(tc.in))
		if err != nil || !reflect.DeepEqual(r, want) {
			t.Fatalf("%s: read %+v, json.Unmarshal reads %+v (%v)", tc.in, r, want, err)
		}
		if shared := unsafe.StringData(r.Digest) == unsafe.StringData(r.ChunkDigest); shared != tc.share {
			t.Errorf("%s: chunk digest shares the digest's bytes: %v, want %v", tc.in, shared, tc.share)
		}
	}
}
