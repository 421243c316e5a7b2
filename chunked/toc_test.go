package chunked_test

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/layerstore/layerstore/chunked"
	"github.com/layerstore/layerstore/internal/byterange"
)

// tocOffset is where the test layouts put the TOC: file data ends there (eStargz) or 8 bytes
// before it (zstd formats, whose TOC follows a skippable-frame header).
const tocOffset = 1 << 20

// testLayout returns a layout whose TOC starts at tocOffset.
func testLayout(f chunked.Format) *chunked.Layout {
	return &chunked.Layout{Format: f, TOC: byterange.Range{Offset: tocOffset, Length: 100}}
}

// payloadEnd is what testLayout(f).PayloadEnd() must be.
func payloadEnd(f chunked.Format) int64 {
	if f == chunked.EStargz {
		return tocOffset
	}
	return tocOffset - 8
}

// obj renders a JSON object from key/value pairs, keeping their order (so that tests can write
// duplicate keys). Values are marshalled with encoding/json; a json.RawMessage goes in verbatim.
func obj(kv ...any) string {
	if len(kv)%2 != 0 {
		panic("obj: odd number of arguments")
	}
	var b strings.Builder
	b.WriteByte('{')
	for i := 0; i < len(kv); i += 2 {
		if i > 0 {
			b.WriteByte(',')
		}
		k, _ := json.Marshal(kv[i])
		b.Write(k)
		b.WriteByte(':')
		if raw, ok := kv[i+1].(json.RawMessage); ok {
			b.Write(raw)
			continue
		}
		v, err := json.Marshal(kv[i+1])
		if err != nil {
			panic(err)
		}
		b.Write(v)
	}
	b.WriteByte('}')
	return b.String()
}

// ent renders a TOC entry.
func ent(name, typ string, kv ...any) string {
	return obj(append([]any{"name", name, "type", typ}, kv...)...)
}

// tocOf renders a version-1 TOC holding entries.
func tocOf(entries ...string) string {
	return `{"version":1,"entries":[` + strings.Join(entries, ",") + `]}`
}

// dg returns a well-formed sha256 digest made of the hex digit c.
func dg(c byte) string { return "sha256:" + strings.Repeat(string(c), 64) }

// sumOf returns dg(c) as a chunked.Sum.
func sumOf(c byte) chunked.Sum {
	var s chunked.Sum
	for i := range s {
		v, _ := strconv.ParseUint(string([]byte{c, c}), 16, 8)
		s[i] = byte(v)
	}
	return s
}

// file renders an eStargz regular file held in one chunk at blob offset off, with chunk digest
// dg('1').
func file(name string, size, off int64, kv ...any) string {
	return fileD(name, size, off, '1', kv...)
}

// fileD is file with the chunk digest dg(c).
func fileD(name string, size, off int64, c byte, kv ...any) string {
	return ent(name, "reg", append([]any{"size", size, "offset", off, "chunkDigest", dg(c)}, kv...)...)
}

func b64(s string) string { return base64.StdEncoding.EncodeToString([]byte(s)) }

// entryWant is the EntryError a failing Parse must carry.
type entryWant struct {
	names []string // the entry's name as written in the TOC; any of these
	index int      // its position in "entries", -1 when the fault is found after reading them
}

func at(index int, names ...string) *entryWant { return &entryWant{names: names, index: index} }

// entryErrors returns the chain of EntryErrors in err, outermost first.
func entryErrors(err error) []*chunked.EntryError {
	var out []*chunked.EntryError
	for {
		var ee *chunked.EntryError
		if !errors.As(err, &ee) {
			return out
		}
		out = append(out, ee)
		err = ee.Err
	}
}

type tocErrCase struct {
	name   string
	format chunked.Format // EStargz when zero
	limits chunked.Limits
	toc    string
	want   error      // chunked.ErrInvalid or chunked.ErrLimit
	entry  *entryWant // nil when the error is not about one entry
	msg    string     // a substring of the message
}

func longName(n int) string { return strings.Repeat("x", n) }

var (
	manyLinks = func() []string {
		es := []string{file("f", 1, 0)}
		es = append(es, ent("l0", "hardlink", "linkName", "f"))
		for i := 1; i < 70; i++ {
			es = append(es, ent(fmt.Sprintf("l%d", i), "hardlink", "linkName", fmt.Sprintf("l%d", i-1)))
		}
		return es
	}()
	chunk2 = func(name string, fileOff, size, off int64) string {
		return ent(name, "chunk", "chunkOffset", fileOff, "chunkSize", size, "offset", off, "chunkDigest", dg('2'))
	}
)

var tocErrCases = []tocErrCase{
	// Hostile names.
	{name: "dotdot prefix", toc: tocOf(ent("../etc/passwd", "reg")), want: chunked.ErrInvalid, entry: at(0, "../etc/passwd"), msg: "escapes"},
	{name: "dotdot escape after clean", toc: tocOf(ent("a/../../x", "reg")), want: chunked.ErrInvalid, entry: at(0, "a/../../x"), msg: "escapes"},
	{name: "dotdot last", toc: tocOf(ent("a", "dir"), ent("a/..", "dir")), want: chunked.ErrInvalid, entry: at(1, "a/.."), msg: "escapes"},
	{name: "dotdot alone", toc: tocOf(ent("..", "dir")), want: chunked.ErrInvalid, entry: at(0, ".."), msg: "escapes"},
	{name: "dot then dotdot", toc: tocOf(ent("./../x", "reg")), want: chunked.ErrInvalid, entry: at(0, "./../x"), msg: "escapes"},
	{name: "absolute", toc: tocOf(ent("/etc/abs", "reg")), want: chunked.ErrInvalid, entry: at(0, "/etc/abs"), msg: "absolute"},
	{name: "NUL in name", toc: tocOf(ent("ok", "dir"), ent("a\x00b", "reg")), want: chunked.ErrInvalid, entry: at(1, "a\x00b"), msg: "NUL"},
	{name: "empty name", toc: tocOf(ent("ok", "dir"), ent("", "reg")), want: chunked.ErrInvalid, entry: at(1, ""), msg: "empty name"},
	{name: "missing name", toc: tocOf(obj("type", "reg")), want: chunked.ErrInvalid, entry: at(0, ""), msg: "empty name"},
	{name: "name over 4096 bytes", toc: tocOf(ent(longName(4097), "reg")), want: chunked.ErrLimit, entry: at(0, longName(4097)), msg: "4097"},
	{name: "chunk name escapes", toc: tocOf(file("f", 2, 0, "chunkSize", 1), chunk2("../f", 1, 1, 10)), want: chunked.ErrInvalid, entry: at(1, "../f"), msg: "escapes"},
	{name: "symlink without target", toc: tocOf(ent("s", "symlink")), want: chunked.ErrInvalid, entry: at(0, "s"), msg: "symlink target"},
	{name: "symlink target with NUL", toc: tocOf(ent("s", "symlink", "linkName", "a\x00")), want: chunked.ErrInvalid, entry: at(0, "s"), msg: "symlink target"},
	{name: "symlink target over 4096 bytes", toc: tocOf(ent("s", "symlink", "linkName", longName(4097))), want: chunked.ErrInvalid, entry: at(0, "s"), msg: "symlink target"},
	{name: "bad whiteout", toc: tocOf(ent("d/.wh.", "reg")), want: chunked.ErrInvalid, entry: at(-1, "d/.wh."), msg: "whiteout"},
	{name: "opaque marker under a file", toc: tocOf(file("f", 1, 0), ent("f/.wh..wh..opq", "reg")), want: chunked.ErrInvalid, entry: at(-1, "f/.wh..wh..opq"), msg: "non-directory"},
	{name: "opaque marker under a symlink", toc: tocOf(ent("s", "symlink", "linkName", "/"), ent("s/.wh..wh..opq", "reg")), want: chunked.ErrInvalid, entry: at(-1, "s/.wh..wh..opq"), msg: "non-directory"},
	{name: "whiteout of dot", toc: tocOf(ent("d/.wh..", "reg")), want: chunked.ErrInvalid, entry: at(-1, "d/.wh.."), msg: "whiteout"},

	// Hardlinks.
	{name: "hardlink cycle", toc: tocOf(ent("a", "hardlink", "linkName", "b"), ent("b", "hardlink", "linkName", "a")), want: chunked.ErrInvalid, entry: at(-1, "a"), msg: "does not exist before"},
	{name: "hardlink to itself", toc: tocOf(ent("a", "hardlink", "linkName", "a")), want: chunked.ErrInvalid, entry: at(-1, "a"), msg: "does not exist before"},
	{name: "hardlink to a later entry", toc: tocOf(ent("l", "hardlink", "linkName", "f"), file("f", 1, 0)), want: chunked.ErrInvalid, entry: at(-1, "l"), msg: `"f" does not exist before`},
	{name: "dangling hardlink", toc: tocOf(file("f", 1, 0), ent("l", "hardlink", "linkName", "missing")), want: chunked.ErrInvalid, entry: at(-1, "l"), msg: `"missing" does not exist`},
	{name: "hardlink to a hidden artefact", toc: tocOf(file("stargz.index.json", 1, 0), ent("l", "hardlink", "linkName", "stargz.index.json")), want: chunked.ErrInvalid, entry: at(-1, "l"), msg: "does not exist"},
	{name: "hardlink to a directory", toc: tocOf(ent("d", "dir"), ent("l", "hardlink", "linkName", "d")), want: chunked.ErrInvalid, entry: at(-1, "l"), msg: "directory"},
	{name: "hardlink to an implicit directory", toc: tocOf(ent("d/f", "fifo"), ent("l", "hardlink", "linkName", "d")), want: chunked.ErrInvalid, entry: at(-1, "l"), msg: "does not exist"},
	{name: "hardlink chain to a directory", toc: tocOf(ent("d", "dir"), ent("l2", "hardlink", "linkName", "d"), ent("l1", "hardlink", "linkName", "l2")), want: chunked.ErrInvalid, entry: at(-1, "l2"), msg: "directory"},
	{name: "hardlink to a whiteout", toc: tocOf(ent(".wh.x", "reg"), ent("l", "hardlink", "linkName", "x")), want: chunked.ErrInvalid, entry: at(-1, "l"), msg: "whiteout"},
	{name: "hardlink with dotdot target", toc: tocOf(file("f", 1, 0), ent("l", "hardlink", "linkName", "../f")), want: chunked.ErrInvalid, entry: at(1, "l"), msg: "hardlink target"},
	{name: "hardlink with inner dotdot target", toc: tocOf(file("f", 1, 0), ent("l", "hardlink", "linkName", "d/../f")), want: chunked.ErrInvalid, entry: at(1, "l"), msg: "hardlink target"},
	{name: "hardlink with absolute target", toc: tocOf(file("f", 1, 0), ent("l", "hardlink", "linkName", "/f")), want: chunked.ErrInvalid, entry: at(1, "l"), msg: "hardlink target"},
	{name: "hardlink without target", toc: tocOf(ent("l", "hardlink")), want: chunked.ErrInvalid, entry: at(0, "l"), msg: "hardlink target"},
	{name: "hardlink to the root", toc: tocOf(ent("l", "hardlink", "linkName", "./")), want: chunked.ErrInvalid, entry: at(0, "l"), msg: "root"},

	// JSON oddities.
	{name: "duplicate key in an entry", toc: tocOf(`{"name":"a","name":"b","type":"reg"}`), want: chunked.ErrInvalid, entry: at(0, ""), msg: "duplicate"},
	{name: "duplicate xattr key", toc: tocOf(`{"name":"a","type":"reg","xattrs":{"user.a":"","user.a":""}}`), want: chunked.ErrInvalid, entry: at(0, ""), msg: "duplicate"},
	{name: "duplicate version", toc: `{"version":1,"version":1,"entries":[]}`, want: chunked.ErrInvalid, msg: "duplicate"},
	{name: "duplicate entries", toc: `{"version":1,"entries":[],"entries":[]}`, want: chunked.ErrInvalid, msg: "duplicate"},
	{name: "duplicate unknown key", toc: `{"version":1,"x":1,"entries":[],"x":2}`, want: chunked.ErrInvalid, msg: "duplicate"},
	{name: "trailing garbage", toc: tocOf() + "x", want: chunked.ErrInvalid, msg: "trailing"},
	{name: "trailing object", toc: tocOf() + "{}", want: chunked.ErrInvalid, msg: "trailing"},
	{name: "trailing bracket", toc: tocOf() + "]", want: chunked.ErrInvalid},
	{name: "trailing NUL", toc: tocOf() + "\x00", want: chunked.ErrInvalid},
	{name: "invalid UTF-8 in a name", toc: tocOf(`{"name":"a` + "\xff" + `b","type":"reg"}`), want: chunked.ErrInvalid, entry: at(0, ""), msg: "UTF-8"},
	{name: "lone surrogate in a name", toc: tocOf(`{"name":"a\ud800","type":"reg"}`), want: chunked.ErrInvalid, entry: at(0, ""), msg: "surrogate"},
	{name: "invalid UTF-8 in an ignored key", toc: `{"version":1,"x` + "\xc0" + `":1,"entries":[]}`, want: chunked.ErrInvalid, msg: "UTF-8"},
	{name: "invalid UTF-8 in an ignored value", toc: `{"version":1,"x":"` + "\xed\xa0\x80" + `","entries":[]}`, want: chunked.ErrInvalid, msg: "UTF-8"},
	{name: "version 2", toc: `{"version":2,"entries":[]}`, want: chunked.ErrInvalid, msg: "version 2"},
	{name: "version 0", toc: `{"version":0,"entries":[]}`, want: chunked.ErrInvalid, msg: "version 0"},
	{name: "version missing", toc: `{"entries":[]}`, want: chunked.ErrInvalid, msg: "version"},
	{name: "version as a string", toc: `{"version":"1","entries":[]}`, want: chunked.ErrInvalid, msg: "version"},
	{name: "version as a float", toc: `{"version":1.0,"entries":[]}`, want: chunked.ErrInvalid, msg: "version"},
	{name: "empty input", toc: ``, want: chunked.ErrInvalid},
	{name: "array", toc: `[]`, want: chunked.ErrInvalid},
	{name: "null", toc: `null`, want: chunked.ErrInvalid},
	{name: "truncated", toc: `{"version":1,"entries":[{"name":"a","type":"reg"}`, want: chunked.ErrInvalid},
	{name: "entries not an array", toc: `{"version":1,"entries":{}}`, want: chunked.ErrInvalid},
	{name: "entries null", toc: `{"version":1,"entries":null}`, want: chunked.ErrInvalid},
	{name: "entry not an object", toc: `{"version":1,"entries":[1]}`, want: chunked.ErrInvalid},
	{name: "unknown type", toc: tocOf(ent("s", "socket")), want: chunked.ErrInvalid, entry: at(0, "s"), msg: "socket"},
	{name: "missing type", toc: tocOf(obj("name", "s")), want: chunked.ErrInvalid, entry: at(0, "s"), msg: "unknown type"},
	{name: "negative size", toc: tocOf(ent("f", "reg", "size", -1)), want: chunked.ErrInvalid, entry: at(0, "f"), msg: "negative"},
	{name: "negative mode", toc: tocOf(ent("f", "reg", "mode", -1)), want: chunked.ErrInvalid, entry: at(0, "f"), msg: "negative"},
	{name: "negative uid", toc: tocOf(ent("f", "fifo", "uid", -1)), want: chunked.ErrInvalid, entry: at(0, "f"), msg: "uid"},
	{name: "negative gid", toc: tocOf(ent("f", "fifo", "gid", -1)), want: chunked.ErrInvalid, entry: at(0, "f"), msg: "gid"},
	{name: "uid over 32 bits", toc: tocOf(ent("f", "fifo", "uid", int64(math.MaxUint32)+1)), want: chunked.ErrInvalid, entry: at(0, "f"), msg: "uid 4294967296"},
	{name: "gid over 32 bits", toc: tocOf(ent("f", "fifo", "gid", int64(1)<<40)), want: chunked.ErrInvalid, entry: at(0, "f"), msg: "gid"},
	{name: "devMajor out of range", toc: tocOf(ent("c", "char", "devMajor", -1)), want: chunked.ErrInvalid, entry: at(0, "c"), msg: "devMajor"},
	{name: "devMinor out of range", toc: tocOf(ent("c", "block", "devMinor", int64(math.MaxUint32)+1)), want: chunked.ErrInvalid, entry: at(0, "c"), msg: "devMinor"},
	{name: "size over int64", toc: tocOf(`{"name":"f","type":"reg","size":9223372036854775808}`), want: chunked.ErrInvalid, entry: at(0, "")},
	{name: "size as a float", toc: tocOf(`{"name":"f","type":"reg","size":1e3}`), want: chunked.ErrInvalid, entry: at(0, "")},
	{name: "bad modtime", toc: tocOf(ent("f", "fifo", "modtime", "yesterday")), want: chunked.ErrInvalid, entry: at(0, "f"), msg: "yesterday"},
	{name: "bad accesstime", toc: tocOf(ent("f", "fifo", "accesstime", "2024-13-01T00:00:00Z")), want: chunked.ErrInvalid, entry: at(0, "f"), msg: "time"},
	{name: "md5 digest", toc: tocOf(ent("f", "reg", "digest", "md5:"+strings.Repeat("a", 32))), want: chunked.ErrInvalid, entry: at(0, "f"), msg: "sha256"},
	{name: "key differing by case (Digest)", toc: tocOf(ent("f", "reg", "size", 1, "offset", 0, "chunkDigest", dg('1'), "Digest", dg('2'))), want: chunked.ErrInvalid, entry: at(0, "f"), msg: "only by case"},
	{name: "key differing by case (MODE)", toc: tocOf(ent("d", "dir", "MODE", 0o4755)), want: chunked.ErrInvalid, entry: at(0, "d"), msg: "only by case"},
	{name: "uppercase digest", toc: tocOf(ent("f", "reg", "digest", "sha256:"+strings.Repeat("A", 64))), want: chunked.ErrInvalid, entry: at(0, "f"), msg: "digest"},
	{name: "short digest", toc: tocOf(ent("f", "reg", "digest", "sha256:"+strings.Repeat("a", 63))), want: chunked.ErrInvalid, entry: at(0, "f"), msg: "digest"},
	{name: "non-hex digest", toc: tocOf(ent("f", "reg", "digest", "sha256:"+strings.Repeat("g", 64))), want: chunked.ErrInvalid, entry: at(0, "f"), msg: "digest"},
	{name: "bad tarSplitDigest", toc: `{"version":1,"entries":[],"tarSplitDigest":"sha512:00"}`, want: chunked.ErrInvalid, msg: "tarSplitDigest"},

	// Chunks.
	{name: "chunk first", toc: tocOf(chunk2("f", 1, 1, 10)), want: chunked.ErrInvalid, entry: at(0, "f"), msg: "does not follow a regular file"},
	{name: "chunk after a directory", toc: tocOf(ent("f", "dir"), chunk2("f", 1, 1, 10)), want: chunked.ErrInvalid, entry: at(1, "f"), msg: "does not follow a regular file"},
	{name: "chunk after a hardlink", toc: tocOf(file("g", 2, 0), ent("f", "hardlink", "linkName", "g"), chunk2("f", 1, 1, 10)), want: chunked.ErrInvalid, entry: at(2, "f"), msg: "does not follow a regular file"},
	{name: "chunk of another file", toc: tocOf(file("f", 20, 0, "chunkSize", 10), chunk2("g", 10, 10, 100)), want: chunked.ErrInvalid, entry: at(1, "g"), msg: `different file "f"`},
	{name: "chunks with a gap", toc: tocOf(file("f", 20, 0, "chunkSize", 10), chunk2("f", 15, 5, 100)), want: chunked.ErrInvalid, entry: at(0, "f"), msg: "chunk at file offset 15, want 10"},
	{name: "overlapping chunks", toc: tocOf(file("f", 20, 0, "chunkSize", 10), chunk2("f", 5, 15, 100)), want: chunked.ErrInvalid, entry: at(0, "f"), msg: "chunk at file offset 5, want 10"},
	{name: "chunks short of the file", toc: tocOf(file("f", 30, 0, "chunkSize", 10), chunk2("f", 10, 10, 100)), want: chunked.ErrInvalid, entry: at(0, "f"), msg: "chunks cover 20 of 30"},
	{name: "chunks short of a file followed by another", toc: tocOf(file("f", 30, 0, "chunkSize", 10), chunk2("f", 10, 10, 100), ent("g", "dir")), want: chunked.ErrInvalid, entry: at(0, "f"), msg: "chunks cover 20 of 30"},
	{name: "chunks past the file", toc: tocOf(file("f", 15, 0, "chunkSize", 10), chunk2("f", 10, 10, 100)), want: chunked.ErrInvalid, entry: at(0, "f"), msg: "chunks cover 20 of 15"},
	{name: "chunk of an empty file", toc: tocOf(ent("f", "reg"), chunk2("f", 1, 1, 100)), want: chunked.ErrInvalid, entry: at(0, "f"), msg: "file offset 1, want 0"},
	{name: "second chunk at file offset 0", toc: tocOf(file("f", 20, 0, "chunkSize", 10), chunk2("f", 0, 10, 100)), want: chunked.ErrInvalid, entry: at(1, "f"), msg: "file offset 0"},
	{name: "first chunk not at file offset 0", toc: tocOf(file("f", 20, 0, "chunkOffset", 5)), want: chunked.ErrInvalid, entry: at(0, "f"), msg: "first chunk"},
	{name: "chunk at the data end", toc: tocOf(file("f", 1, tocOffset)), want: chunked.ErrInvalid, entry: at(0, "f"), msg: "outside the data"},
	{name: "chunk past the data end", toc: tocOf(file("f", 1, 1<<40)), want: chunked.ErrInvalid, entry: at(0, "f"), msg: "outside the data"},
	{name: "zstd chunk at the data end", format: chunked.ZstdChunked, toc: tocOf(ent("f", "reg", "size", 1, "offset", tocOffset-8, "digest", dg('1'))), want: chunked.ErrInvalid, entry: at(0, "f"), msg: "outside the data"},
	{name: "stargz-zstd chunk in the frame header", format: chunked.StargzZstd, toc: tocOf(file("f", 1, tocOffset-4)), want: chunked.ErrInvalid, entry: at(0, "f"), msg: "outside the data"},
	{name: "legacy zstd chunk in the frame header", format: chunked.ZstdChunkedLegacy, toc: tocOf(ent("f", "reg", "size", 1, "offset", tocOffset-1, "digest", dg('1'))), want: chunked.ErrInvalid, entry: at(0, "f"), msg: "outside the data"},
	{name: "chunk at a negative offset", toc: tocOf(file("f", 1, -1)), want: chunked.ErrInvalid, entry: at(0, "f"), msg: "outside the data"},
	{name: "file without chunkDigest", toc: tocOf(ent("f", "reg", "size", 1, "offset", 0, "digest", dg('1'))), want: chunked.ErrInvalid, entry: at(0, "f"), msg: "chunkDigest"},
	{name: "chunk without chunkDigest", toc: tocOf(file("f", 2, 0, "chunkSize", 1), ent("f", "chunk", "chunkOffset", 1, "offset", 10)), want: chunked.ErrInvalid, entry: at(1, "f"), msg: "chunkDigest"},
	{name: "sha512 chunkDigest", toc: tocOf(ent("f", "reg", "size", 1, "chunkDigest", "sha512:"+strings.Repeat("a", 128))), want: chunked.ErrInvalid, entry: at(0, "f"), msg: "sha256"},
	{name: "chunkDigest without algorithm", toc: tocOf(ent("f", "reg", "size", 1, "chunkDigest", strings.Repeat("a", 64))), want: chunked.ErrInvalid, entry: at(0, "f"), msg: "sha256"},
	{name: "chunk over MaxChunkSize", limits: chunked.Limits{MaxChunkSize: 1024}, toc: tocOf(file("f", 1025, 0)), want: chunked.ErrLimit, entry: at(0, "f"), msg: "1025"},
	{name: "zstd chunk over MaxChunkSize", format: chunked.ZstdChunked, limits: chunked.Limits{MaxChunkSize: 1024}, toc: tocOf(ent("f", "reg", "size", 4096, "offset", 0, "digest", dg('1'))), want: chunked.ErrLimit, entry: at(0, "f"), msg: "4096"},
	{name: "chunk over the default MaxChunkSize", toc: tocOf(file("f", chunked.DefaultMaxChunkSize+1, 0)), want: chunked.ErrLimit, entry: at(0, "f")},
	{name: "inner offset pushes chunk over MaxChunkSize", limits: chunked.Limits{MaxChunkSize: 1024}, toc: tocOf(file("f", 1000, 0, "innerOffset", 25)), want: chunked.ErrLimit, entry: at(0, "f"), msg: "inner offset 25"},
	{name: "negative inner offset", toc: tocOf(file("f", 10, 0, "innerOffset", -1)), want: chunked.ErrInvalid, entry: at(0, "f"), msg: "negative"},
	{name: "negative chunkSize", toc: tocOf(file("f", 20, 0, "chunkSize", -10)), want: chunked.ErrInvalid, entry: at(0, "f"), msg: "negative"},
	{name: "chunkOffset past the file", toc: tocOf(file("f", 20, 0, "chunkSize", 10), ent("f", "chunk", "chunkOffset", 30, "offset", 100, "chunkDigest", dg('2'))), want: chunked.ErrInvalid, entry: at(1, "f"), msg: "empty range"},
	{name: "unknown chunkType", format: chunked.ZstdChunked, toc: tocOf(ent("f", "reg", "size", 20, "offset", 0, "endOffset", 50, "chunkSize", 10, "chunkDigest", dg('1'), "chunkType", "holes")), want: chunked.ErrInvalid, entry: at(0, "f"), msg: "holes"},
	{name: "zstd file without digest", format: chunked.ZstdChunked, toc: tocOf(ent("f", "reg", "size", 5, "offset", 0, "endOffset", 50)), want: chunked.ErrInvalid, entry: at(0, "f"), msg: "without a digest"},
	{name: "zstd negative endOffset", format: chunked.ZstdChunked, toc: tocOf(ent("f", "reg", "size", 5, "offset", 0, "endOffset", -1, "digest", dg('1'))), want: chunked.ErrInvalid, entry: at(0, "f"), msg: "endOffset"},
	{name: "zstd endOffset before offset", format: chunked.ZstdChunked, toc: tocOf(ent("f", "reg", "size", 5, "offset", 100, "endOffset", 50, "digest", dg('1'))), want: chunked.ErrInvalid, msg: "ends at 50"},
	{name: "zstd endOffset equal to offset", format: chunked.ZstdChunkedLegacy, toc: tocOf(ent("f", "reg", "size", 5, "offset", 100, "endOffset", 100, "digest", dg('1'))), want: chunked.ErrInvalid, msg: "ends at 100"},
	{name: "zstd endOffset past the data end", format: chunked.ZstdChunked, toc: tocOf(ent("f", "reg", "size", 5, "offset", 100, "endOffset", tocOffset, "digest", dg('1'))), want: chunked.ErrInvalid, msg: "data ends"},
	{name: "zstd chunks going backwards", format: chunked.ZstdChunked, toc: tocOf(
		ent("f", "reg", "size", 20, "offset", 100, "endOffset", 300, "chunkSize", 10, "chunkDigest", dg('1')),
		ent("f", "chunk", "chunkOffset", 10, "chunkSize", 10, "offset", 50, "chunkDigest", dg('2'))), want: chunked.ErrInvalid, msg: "ends at 50"},
	{name: "zstd chunks at one offset", format: chunked.ZstdChunked, toc: tocOf(
		ent("f", "reg", "size", 20, "offset", 100, "endOffset", 300, "chunkSize", 10, "chunkDigest", dg('1')),
		ent("f", "chunk", "chunkOffset", 10, "chunkSize", 10, "offset", 100, "chunkDigest", dg('2'))), want: chunked.ErrInvalid, msg: "ends at 100"},

	// Limits.
	{name: "more entries than MaxEntries", limits: chunked.Limits{MaxEntries: 2}, toc: tocOf(ent("a", "dir"), ent("b", "dir"), ent("c", "dir")), want: chunked.ErrLimit, msg: "more than 2 entries"},
	{name: "chunk entries count toward MaxEntries", limits: chunked.Limits{MaxEntries: 2}, toc: tocOf(file("f", 3, 0, "chunkSize", 1), chunk2("f", 1, 1, 10), chunk2("f", 2, 1, 20)), want: chunked.ErrLimit, msg: "more than 2 entries"},
	{name: "TOC over MaxTOCSize", limits: chunked.Limits{MaxTOCSize: 40}, toc: tocOf(ent("a", "dir")), want: chunked.ErrLimit, msg: "exceeds 40"},
	{name: "xattrs over MaxXattrBytes", limits: chunked.Limits{MaxXattrBytes: 16}, toc: tocOf(ent("f", "fifo", "xattrs", map[string]string{"user.a": b64("0123456789a")})), want: chunked.ErrLimit, entry: at(0, "f"), msg: "16"},
	{name: "xattrs over the default MaxXattrBytes", toc: tocOf(ent("f", "fifo", "xattrs", map[string]string{"user.a": b64(longName(40 << 10)), "user.b": b64(longName(30 << 10))})), want: chunked.ErrLimit, entry: at(0, "f")},
	{name: "xattr not base64", toc: tocOf(ent("f", "fifo", "xattrs", map[string]string{"user.a": "!!!"})), want: chunked.ErrInvalid, entry: at(0, "f"), msg: "user.a"},
	{name: "xattr base64 without padding", toc: tocOf(ent("f", "fifo", "xattrs", map[string]string{"user.a": "YQ"})), want: chunked.ErrInvalid, entry: at(0, "f"), msg: "user.a"},
	{name: "xattr non-canonical base64", toc: tocOf(ent("f", "fifo", "xattrs", map[string]string{"user.a": "YR=="})), want: chunked.ErrInvalid, entry: at(0, "f"), msg: "user.a"},
	{name: "xattr with an empty name", toc: tocOf(ent("f", "fifo", "xattrs", map[string]string{"": "eQ=="})), want: chunked.ErrInvalid, entry: at(0, "f"), msg: "xattr name"},
	{name: "xattr name with NUL", toc: tocOf(ent("f", "fifo", "xattrs", map[string]string{"user.\x00": "eQ=="})), want: chunked.ErrInvalid, entry: at(0, "f"), msg: "xattr name"},

	// Parents.
	{name: "parent is a file", toc: tocOf(file("a", 1, 0), ent("a/b", "dir")), want: chunked.ErrInvalid, entry: at(-1, "a/b"), msg: "parent is not a directory"},
	{name: "parent is a symlink", toc: tocOf(ent("a", "symlink", "linkName", "/etc"), ent("a/passwd", "fifo")), want: chunked.ErrInvalid, entry: at(-1, "a/passwd"), msg: "parent is not a directory"},
	{name: "grandparent is a fifo", toc: tocOf(ent("a", "fifo"), ent("a/b/c", "fifo")), want: chunked.ErrInvalid, entry: at(-1, "a/b"), msg: "parent is not a directory"},
	{name: "parent is a hardlink", toc: tocOf(ent("d", "dir"), ent("f", "fifo"), ent("l", "hardlink", "linkName", "f"), ent("l/x", "fifo")), want: chunked.ErrInvalid, entry: at(-1, "l/x"), msg: "parent is not a directory"},
	{name: "parent is a whiteout", toc: tocOf(ent("x/.wh.d", "reg"), ent("x/d/f", "fifo")), want: chunked.ErrInvalid, entry: at(-1, "x/d/f"), msg: "parent is not a directory"},
	{name: "directory replaced by a file", toc: tocOf(ent("a", "dir"), ent("a/b", "fifo"), ent("a", "fifo")), want: chunked.ErrInvalid, entry: at(-1, "a/b"), msg: "parent is not a directory"},
	{name: "root is a file", toc: tocOf(ent("./", "fifo")), want: chunked.ErrInvalid, entry: at(-1, "/"), msg: "root"},
}

func TestParseRejects(t *testing.T) {
	for _, tc := range tocErrCases {
		t.Run(tc.name, func(t *testing.T) {
			format := tc.format
			if format == chunked.FormatUnknown {
				format = chunked.EStargz
			}
			x, err := chunked.Parse(context.Background(), testLayout(format), []byte(tc.toc), tc.limits)
			if err == nil {
				t.Fatalf("Parse succeeded with %d entries, want an error wrapping %v", x.Len(), tc.want)
			}
			if x != nil {
				t.Errorf("Parse returned an index with the error %v", err)
			}
			if !errors.Is(err, tc.want) {
				t.Errorf("Parse error = %v, want one wrapping %v", err, tc.want)
			}
			for _, other := range []error{chunked.ErrInvalid, chunked.ErrLimit, chunked.ErrNotLazy} {
				if other != tc.want && errors.Is(err, other) {
					t.Errorf("Parse error = %v also wraps %v", err, other)
				}
			}
			if tc.msg != "" && !strings.Contains(err.Error(), tc.msg) {
				t.Errorf("Parse error = %q, want it to mention %q", err, tc.msg)
			}
			if tc.entry == nil {
				return
			}
			ees := entryErrors(err)
			if len(ees) == 0 {
				t.Fatalf("Parse error = %v, want an EntryError", err)
			}
			found := false
			for _, ee := range ees {
				if slices.Contains(tc.entry.names, ee.Name) && ee.Index == tc.entry.index {
					found = true
				}
			}
			if !found {
				var got []string
				for _, ee := range ees {
					got = append(got, fmt.Sprintf("%d %q", ee.Index, ee.Name))
				}
				t.Errorf("EntryErrors = %v, want index %d name in %q", got, tc.entry.index, tc.entry.names)
			}
			named := false
			for _, n := range tc.entry.names {
				named = named || strings.Contains(err.Error(), strconv.Quote(n))
			}
			if !named {
				t.Errorf("Parse error = %.300q, want it to name the entry %q", err, tc.entry.names)
			}
		})
	}
}

// TestParseEntryErrorNamesTheFaultyFile checks that errors.As finds the entry at fault when the
// fault (chunks that do not cover a file) is only noticed at the next entry.
func TestParseEntryErrorNamesTheFaultyFile(t *testing.T) {
	js := tocOf(file("f", 30, 0, "chunkSize", 10), chunk2("f", 10, 10, 100), ent("g", "dir"))
	_, err := chunked.Parse(context.Background(), testLayout(chunked.EStargz), []byte(js), chunked.Limits{})
	var ee *chunked.EntryError
	if !errors.As(err, &ee) {
		t.Fatalf("Parse error = %v, want an EntryError", err)
	}
	if ee.Name != "f" {
		t.Errorf("EntryError names %d %q, want \"f\"", ee.Index, ee.Name)
	}
}

// TestParseRejectsDotDotWhiteout: ".wh..." whites out "..", which no directory can hold.
func TestParseRejectsDotDotWhiteout(t *testing.T) {
	for _, name := range []string{".wh...", "d/.wh..."} {
		x, err := chunked.Parse(context.Background(), testLayout(chunked.EStargz), []byte(tocOf(ent(name, "reg"))), chunked.Limits{})
		if !errors.Is(err, chunked.ErrInvalid) {
			names := []string{}
			if x != nil {
				for id := range x.Len() {
					names = append(names, x.BaseName(chunked.EntryID(id)))
				}
			}
			t.Errorf("Parse(%q) = names %q, err %v; want ErrInvalid", name, names, err)
		}
	}
}

// TestParsePrefetchLandmarkInsideTheData: PrefetchEnd is a blob offset inside the data, or -1.
func TestParsePrefetchLandmarkInsideTheData(t *testing.T) {
	for _, off := range []int64{-5, 1 << 40} {
		for _, typ := range []string{"reg", "dir"} {
			js := tocOf(ent(".prefetch.landmark", typ, "offset", off))
			x, err := chunked.Parse(context.Background(), testLayout(chunked.EStargz), []byte(js), chunked.Limits{})
			if err == nil && (x.PrefetchEnd() < 0 || x.PrefetchEnd() > x.PayloadEnd()) {
				t.Errorf("%s landmark at %d: PrefetchEnd = %d, want an error or an offset in [0, %d]", typ, off, x.PrefetchEnd(), x.PayloadEnd())
			}
		}
	}
}
