package verify_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"testing"

	"github.com/layerstore/layerstore/chunked"
	"github.com/layerstore/layerstore/internal/byterange"
	"github.com/layerstore/layerstore/internal/testutil/testlayer"
	"github.com/layerstore/layerstore/verify"
)

func fixtures(t testing.TB) []testlayer.Fixture {
	t.Helper()
	fs, err := testlayer.Fixtures()
	if err != nil {
		t.Fatal(err)
	}
	return fs
}

func source(blob []byte) verify.Source { return testlayer.BlobSource(blob) }

// open opens a fixture that must verify.
func open(t testing.TB, f testlayer.Fixture) (*verify.Verifier, verify.Source) {
	t.Helper()
	src := source(f.Blob)
	l, err := verify.Open(t.Context(), f.Desc, f.DiffID, src, verify.Config{})
	if err != nil {
		t.Fatal(err)
	}
	return l, src
}

// viewTree renders what a verified layer shows, reading every file through verified chunks.
func viewTree(t *testing.T, l *verify.Verifier, src verify.Source) testlayer.Tree {
	t.Helper()
	x := l.Index()
	tree := testlayer.Tree{}
	var walk func(id chunked.EntryID)
	walk = func(id chunked.EntryID) {
		e := x.Entry(id)
		ino := x.Entry(e.Inode)
		a := x.Entry(x.AttrEntry(id))
		n := testlayer.Node{Type: ino.Type.String(), Mode: a.Mode, UID: a.UID, GID: a.GID,
			MTime: a.ModTimeSec, Nlink: ino.Nlink}
		xs := map[string]string{}
		for _, xa := range x.Xattrs(id) {
			xs[xa.Name] = xa.Value
		}
		n.Xattrs = testlayer.XattrString(xs)
		switch ino.Type {
		case chunked.TypeSymlink:
			n.Link = ino.LinkName
		case chunked.TypeChar, chunked.TypeBlock:
			n.Dev = [2]uint32{ino.DevMajor, ino.DevMinor}
		case chunked.TypeReg:
			if ino.Flags&chunked.FlagWhiteout != 0 {
				n.Type = "char"
				break
			}
			h := sha256.New()
			for i := range x.Chunks(id) {
				c, err := l.ReadChunk(t.Context(), src, id, i)
				if err != nil {
					t.Fatalf("%s: %v", x.Path(id), err)
				}
				h.Write(c.Bytes())
			}
			n.Size, n.Content = ino.Size, fmt.Sprintf("%x", h.Sum(nil))
		}
		if ino.Type != chunked.TypeDir && ino.Nlink > 1 {
			n.HardTo = x.Path(e.Inode)
		}
		tree[x.Path(id)] = n
		for _, c := range x.ChildrenFrom(id, 0, x.Len()) {
			walk(c)
		}
	}
	walk(x.Root())
	return tree
}

func TestConformance(t *testing.T) {
	for _, f := range fixtures(t) {
		t.Run(f.Name, func(t *testing.T) {
			l, src := open(t, f)
			if got := l.Layout().Format; got != f.Format {
				t.Errorf("format = %v, want %v", got, f.Format)
			}
			stream, err := f.Decompress()
			if err != nil {
				t.Fatal(err)
			}
			want, err := testlayer.ReferenceTree(stream)
			if err != nil {
				t.Fatal(err)
			}
			got := viewTree(t, l, src)
			for p, w := range want {
				if g, ok := got[p]; !ok {
					t.Errorf("%q missing from the index view", p)
				} else if g != w {
					t.Errorf("%q:\n got %+v\nwant %+v", p, g, w)
				}
			}
			for p := range got {
				if _, ok := want[p]; !ok {
					t.Errorf("%q in the index view but not in the tar", p)
				}
			}
			if len(want) < 35 {
				t.Errorf("reference tree has only %d entries", len(want))
			}
		})
	}
}

// payloads serves file contents through verified chunks.
func payloads(l *verify.Verifier, src verify.Source) verify.PayloadFunc {
	return func(ctx context.Context, id chunked.EntryID) (io.ReadCloser, error) {
		var buf bytes.Buffer
		for i := range l.Index().Chunks(id) {
			c, err := l.ReadChunk(ctx, src, id, i)
			if err != nil {
				return nil, err
			}
			buf.Write(c.Bytes())
		}
		return io.NopCloser(&buf), nil
	}
}

func TestCheckDiffID(t *testing.T) {
	for _, f := range fixtures(t) {
		t.Run(f.Name, func(t *testing.T) {
			l, src := open(t, f)
			if g := l.Guarantee(); g != verify.ChunksVerified {
				t.Fatalf("guarantee after Open = %v", g)
			}
			if size := l.TarSize(); size != -1 {
				t.Errorf("TarSize = %d before the tar-split comparison, want -1", size)
			}
			err := l.CheckDiffID(t.Context(), src, payloads(l, src))
			if f.Name != "zstdchunked-modern" {
				if size := l.TarSize(); size != -1 {
					t.Errorf("TarSize = %d without a tar-split, want -1", size)
				}
				if !errors.Is(err, verify.ErrNoDiffIDProof) || l.CanProveDiffID() {
					t.Fatalf("CheckDiffID = %v, want ErrNoDiffIDProof", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if g := l.Guarantee(); g != verify.DiffIDVerified {
				t.Fatalf("guarantee = %v, want diffid-verified", g)
			}
			tarStream, err := f.Decompress()
			if err != nil {
				t.Fatal(err)
			}
			if size := l.TarSize(); size != int64(len(tarStream)) {
				t.Errorf("TarSize = %d, want the tar's %d bytes", size, len(tarStream))
			}
		})
	}
}

// countingSource counts requests: a ReadAt is one, a Fetch of several ranges one (as a
// multi-range request is); it records the ranges read.
type countingSource struct {
	verify.Source
	reads int
	read  []byterange.Range
}

func (c *countingSource) ReadAt(ctx context.Context, p []byte, off int64) (int, error) {
	c.reads++
	c.read = append(c.read, byterange.Range{Offset: off, Length: int64(len(p))})
	return c.Source.ReadAt(ctx, p, off)
}

func (c *countingSource) Fetch(ctx context.Context, ranges []byterange.Range) ([][]byte, error) {
	c.reads++
	out := make([][]byte, len(ranges))
	for i, r := range ranges {
		c.read = append(c.read, r)
		out[i] = make([]byte, r.Length)
		if _, err := c.Source.ReadAt(ctx, out[i], r.Offset); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// Open reads the footer and the TOC (and the tar-split, Config.TarSplit) in one request when the
// annotations place a TOC of at most two pieces (a larger one is streamed: TestTOCStreamed),
// and none of the tar-split's bytes without Config.TarSplit; eStargz needs its footer first.
func TestOpenReads(t *testing.T) {
	want := map[string]int{"zstdchunked-modern": 1, "zstdchunked-legacy": 1, "estargz-zstd-annotated": 1, "estargz": 2, "estargz-zstd": 2}
	for _, f := range fixtures(t) {
		n, ok := want[f.Name]
		if !ok {
			continue
		}
		for _, withTarSplit := range []bool{false, true} {
			src := &countingSource{Source: source(f.Blob)}
			l, err := verify.Open(t.Context(), f.Desc, f.DiffID, src, verify.Config{TarSplit: withTarSplit})
			if err != nil {
				t.Fatal(err)
			}
			if src.reads != n {
				t.Errorf("%s (tar-split %t): Open made %d requests, want %d", f.Name, withTarSplit, src.reads, n)
			}
			ts := l.Layout().TarSplit
			if ts.Length == 0 || !l.CanProveDiffID() {
				continue
			}
			var read int64
			for _, r := range src.read {
				read += max(0, min(r.End(), ts.End())-max(r.Offset, ts.Offset))
			}
			if want := map[bool]int64{false: 0, true: ts.Length}[withTarSplit]; read != want {
				t.Errorf("%s (tar-split %t): Open read %d bytes of the tar-split's %d, want %d", f.Name, withTarSplit, read, ts.Length, want)
			}
			before := src.reads
			if err := l.CheckTarSplit(t.Context(), src); err != nil {
				t.Fatal(err)
			}
			if got, want := src.reads-before, map[bool]int{false: 1, true: 0}[withTarSplit]; got != want {
				t.Errorf("%s (tar-split %t): CheckTarSplit made %d requests, want %d", f.Name, withTarSplit, got, want)
			}
		}
	}
}

// TestOpenReadsTwoPiecesWhole: a zstd:chunked TOC of two pieces is read whole with the footer,
// in one request (the stream would hold it whole too); one byte more than two pieces, and it
// is streamed in pieces after the footer's request.
func TestOpenReadsTwoPiecesWhole(t *testing.T) {
	for _, f := range fixtures(t) {
		if f.Name != "zstdchunked-modern" {
			continue
		}
		l, err := verify.Open(t.Context(), f.Desc, f.DiffID, source(f.Blob), verify.Config{})
		if err != nil {
			t.Fatal(err)
		}
		n := l.Layout().TOC.Length
		for _, c := range []struct {
			piece int64
			reads int
		}{{(n + 1) / 2, 1}, {(n - 1) / 2, 1 + int((n+(n-1)/2-1)/((n-1)/2))}} {
			verify.SetStreamPiece(t, c.piece)
			src := &countingSource{Source: source(f.Blob)}
			if _, err := verify.Open(t.Context(), f.Desc, f.DiffID, src, verify.Config{}); err != nil {
				t.Fatal(err)
			}
			if src.reads != c.reads {
				t.Errorf("a TOC of %d bytes in pieces of %d: %d requests, want %d", n, c.piece, src.reads, c.reads)
			}
		}
		return
	}
	t.Fatal("no zstdchunked-modern fixture")
}

// tamperingSource flips the first byte of every range it returns.
type tamperingSource struct{ *countingSource }

func (s tamperingSource) Fetch(ctx context.Context, ranges []byterange.Range) ([][]byte, error) {
	out, err := s.countingSource.Fetch(ctx, ranges)
	for _, b := range out {
		if len(b) > 0 {
			b[0] ^= 0xff
		}
	}
	return out, err
}

// ReadChunks reads a file's chunks in one request set (a chunk of zeros reads nothing), and
// its bytes come out only verified: the content of ReadChunk, a source's tampered bytes
// refused, each chunk verified once.
func TestReadChunks(t *testing.T) {
	for _, f := range fixtures(t) {
		t.Run(f.Name, func(t *testing.T) {
			l, plain := open(t, f)
			x := l.Index()
			for id := range chunked.EntryID(x.Len()) {
				if x.Entry(id).Inode != id || x.NumChunks(id) == 0 {
					continue
				}
				var ids []verify.ChunkID
				var want int64
				for i, c := range x.Chunks(id) {
					ids = append(ids, verify.ChunkID{File: id, I: i})
					want += c.Length
				}
				src := &countingSource{Source: plain}
				got, err := l.ReadChunks(t.Context(), src, ids)
				if err != nil {
					t.Fatalf("%s: %v", x.Path(id), err)
				}
				if src.reads != 1 || got.Size() != want || got.Len() != len(ids) {
					t.Errorf("%s: %d requests, %d bytes, %d chunks; want 1, %d, %d", x.Path(id), src.reads, got.Size(), got.Len(), want, len(ids))
				}
				for i := range ids {
					c, err := got.Verify(i)
					one, err1 := l.ReadChunk(t.Context(), plain, id, i)
					if err != nil || err1 != nil || !bytes.Equal(c.Bytes(), one.Bytes()) {
						t.Fatalf("%s chunk %d: %v, %v, or content differs from ReadChunk's", x.Path(id), i, err, err1)
					}
					if c.Ref().Length > 0 {
						if _, err := got.Verify(i); err == nil {
							t.Errorf("%s chunk %d: verified twice", x.Path(id), i)
						}
					}
				}
				bad, err := l.ReadChunks(t.Context(), tamperingSource{&countingSource{Source: plain}}, ids)
				if err != nil {
					t.Fatal(err)
				}
				for i := range ids {
					c, err := bad.Verify(i)
					if err == nil && x.Chunks(id)[i].Length > 0 {
						t.Errorf("%s chunk %d: a tampered chunk verified", x.Path(id), i)
					}
					if err != nil && c.Bytes() != nil {
						t.Errorf("%s chunk %d: bytes with an error", x.Path(id), i)
					}
				}
			}
		})
	}
}
