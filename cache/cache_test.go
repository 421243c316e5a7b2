package cache

import (
	"bytes"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/layerstore/layerstore/chunked"
	"github.com/layerstore/layerstore/internal/byterange"
	"github.com/layerstore/layerstore/verify"
)

// TestFillConcurrent fills big.bin from the chunks of two layers with different chunk
// boundaries, in random order, from many goroutines, while others read; every byte a read
// returns must be right, and the file must end complete with the right content.
func TestFillConcurrent(t *testing.T) {
	for _, name := range []string{"usr/share/big.bin", "usr/share/sparse.img"} {
		t.Run(filepath.Base(name), func(t *testing.T) {
			tf := realFiles(t)[name]
			c := newCache(t, t.TempDir(), Config{})
			h := open(t, c, tf)
			cs := append(slices.Clone(tf.chunks["zstd"]), tf.chunks["estargz"]...)
			rand.New(rand.NewPCG(5, 6)).Shuffle(len(cs), func(i, j int) { cs[i], cs[j] = cs[j], cs[i] })

			var wg sync.WaitGroup
			errs := make(chan error, len(cs)+4)
			for _, ch := range cs {
				wg.Go(func() {
					if err := h.Put(ch); err != nil {
						errs <- err
					}
				})
			}
			done := make(chan struct{})
			var readers sync.WaitGroup
			for r := range 4 {
				readers.Go(func() {
					rng := rand.New(rand.NewPCG(uint64(r), 7))
					buf := make([]byte, 100<<10)
					for {
						select {
						case <-done:
							return
						default:
						}
						off := rng.Int64N(tf.size())
						n, err := h.ReadAt(buf, off)
						if err != nil && !errors.Is(err, ErrMissing) && err != io.EOF {
							errs <- err
							return
						}
						if !bytes.Equal(buf[:n], tf.content[off:off+int64(n)]) {
							errs <- errors.New("read returned wrong bytes")
							return
						}
					}
				})
			}
			wg.Wait()
			close(done)
			readers.Wait()
			close(errs)
			for err := range errs {
				t.Error(err)
			}
			if !h.Complete() {
				t.Fatalf("not complete; missing %v", h.Missing(0, tf.size()))
			}
			p, err := h.Path()
			if err != nil {
				t.Fatal(err)
			}
			if p != filepath.Join(c.root, "files", tf.sum.String()[7:9], tf.sum.String()[7:]) {
				t.Errorf("path = %s", p)
			}
			got, err := os.ReadFile(p)
			if err != nil || !bytes.Equal(got, tf.content) {
				t.Fatalf("complete file differs from the content (err %v)", err)
			}
			buf := make([]byte, tf.size()+10)
			if n, err := h.ReadAt(buf, 0); n != int(tf.size()) || err != io.EOF || !bytes.Equal(buf[:n], tf.content) {
				t.Errorf("ReadAt(whole+10) = %d, %v", n, err)
			}
			if u := c.Usage(); u != tf.size() {
				t.Errorf("usage = %d, want %d", u, tf.size())
			}
			if _, err := os.Stat(partialPath(c.root, tf.sum) + journalExt); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("journal left after completion: %v", err)
			}
			if !c.Has(tf.sum) {
				t.Error("Has = false")
			}
		})
	}
}

func TestPartialRead(t *testing.T) {
	tf := realFiles(t)["usr/share/big.bin"]
	cs := tf.chunks["estargz"] // 64 KiB chunks
	const k = 64 << 10
	c := newCache(t, t.TempDir(), Config{})
	h := open(t, c, tf)
	putAll(t, h, []verify.ChunkData{cs[0], cs[2], cs[len(cs)-1]})
	if u, want := c.Usage(), 2*k+cs[len(cs)-1].Ref().Size; u != want {
		t.Errorf("usage = %d, want %d", u, want)
	}

	buf := make([]byte, 3*k)
	n, err := h.ReadAt(buf, 100)
	var me *MissingError
	if !errors.As(err, &me) || !errors.Is(err, ErrMissing) {
		t.Fatalf("ReadAt over a hole: err = %v, want a MissingError", err)
	}
	if n != k-100 || !bytes.Equal(buf[:n], tf.content[100:k]) {
		t.Errorf("ReadAt over a hole read %d bytes, want the %d present ones", n, k-100)
	}
	if want := []byterange.Range{{Offset: k, Length: k}, {Offset: 3 * k, Length: 100}}; !slices.Equal(me.Ranges, want) || me.File != tf.sum {
		t.Errorf("missing = %v, want %v", me.Ranges, want)
	}

	n, err = h.ReadAt(buf, k+5)
	if n != 0 || !errors.As(err, &me) || !slices.Equal(me.Ranges, []byterange.Range{{Offset: k + 5, Length: k - 5}, {Offset: 3 * k, Length: k + 5}}) {
		t.Errorf("ReadAt at a hole = %d, %v", n, err)
	}
	if n, err := h.ReadAt(buf[:k], 2*k); n != k || err != nil || !bytes.Equal(buf[:k], tf.content[2*k:3*k]) {
		t.Errorf("ReadAt of a present chunk = %d, %v", n, err)
	}
	if n, err := h.ReadAt(buf, tf.size()); n != 0 || err != io.EOF {
		t.Errorf("ReadAt at the end = %d, %v", n, err)
	}
	last := cs[len(cs)-1].Ref()
	if n, err := h.ReadAt(buf, last.FileOffset); n != int(last.Size) || err != io.EOF {
		t.Errorf("ReadAt across the end = %d, %v", n, err)
	}
	wantMissing := []byterange.Range{{Offset: k, Length: k}, {Offset: 3 * k, Length: last.FileOffset - 3*k}}
	if got := h.Missing(0, tf.size()); !slices.Equal(got, wantMissing) {
		t.Errorf("Missing = %v, want %v", got, wantMissing)
	}
	if got := h.Missing(-10, 20); got != nil {
		t.Errorf("Missing(-10, 20) = %v, want none", got)
	}
	if h.Complete() {
		t.Error("Complete = true")
	}
	if _, err := h.Path(); !errors.Is(err, ErrMissing) {
		t.Errorf("Path of a partial file: err = %v", err)
	}
	if c.Has(tf.sum) {
		t.Error("Has = true for a partial file")
	}
}

func TestRestart(t *testing.T) {
	fs := realFiles(t)
	big, tool := fs["usr/share/big.bin"], fs["usr/bin/tool"]
	root := t.TempDir()
	c := newCache(t, root, Config{})
	fill(t, c, tool)
	h := open(t, c, big)
	putAll(t, h, big.chunks["zstd"][:3])
	putAll(t, h, big.chunks["estargz"][10:12])
	missing := h.Missing(0, big.size())
	usage := c.Usage()
	h.Close()
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}

	c = newCache(t, root, Config{})
	if c.Usage() != usage {
		t.Errorf("usage after restart = %d, want %d", c.Usage(), usage)
	}
	if !c.Has(tool.sum) {
		t.Fatal("complete file lost on restart")
	}
	th := open(t, c, tool)
	if p, err := th.Path(); err != nil {
		t.Error(err)
	} else if got, _ := os.ReadFile(p); !bytes.Equal(got, tool.content) {
		t.Error("complete file content differs after restart")
	}
	h = open(t, c, big)
	if got := h.Missing(0, big.size()); !slices.Equal(got, missing) {
		t.Errorf("missing after restart = %v, want %v", got, missing)
	}
	buf := make([]byte, 100)
	if n, err := h.ReadAt(buf, 1000); n != 100 || err != nil || !bytes.Equal(buf, big.content[1000:1100]) {
		t.Errorf("ReadAt after restart = %d, %v", n, err)
	}
	putAll(t, h, big.chunks["estargz"])
	if !h.Complete() {
		t.Fatal("not complete after filling the rest")
	}
}

func TestLocked(t *testing.T) {
	root := t.TempDir()
	c := newCache(t, root, Config{})
	if _, err := New(root, Config{}); !errors.Is(err, ErrLocked) {
		t.Fatalf("second New = %v, want ErrLocked", err)
	}
	c.Close()
	c2, err := New(root, Config{})
	if err != nil {
		t.Fatalf("New after Close: %v", err)
	}
	c2.Close()
}

func TestConfig(t *testing.T) {
	if _, err := New(t.TempDir(), Config{MaxSize: -1}); err == nil {
		t.Error("a negative max size was accepted")
	}
	c := newCache(t, t.TempDir(), Config{})
	if c.opts.maxSize != DefaultMaxSize || DefaultMaxSize != 10<<30 {
		t.Errorf("default max size = %d", c.opts.maxSize)
	}
}

// TestCorruptWholeFile stores verified chunks under the digest of another file: every chunk
// passes, the whole file does not, and nothing of it is kept.
func TestCorruptWholeFile(t *testing.T) {
	fs := realFiles(t)
	tool, other := fs["usr/bin/tool"], fs["usr/share/big.bin"]
	c := newCache(t, t.TempDir(), Config{})
	h, err := c.Open(other.sum, tool.size())
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	err = h.Put(tool.chunks["zstd"][0])
	if !errors.Is(err, ErrCorrupt) {
		t.Fatalf("Put completing a wrong file = %v, want ErrCorrupt", err)
	}
	if h.Complete() || c.Has(other.sum) {
		t.Error("corrupt file marked complete")
	}
	if c.Usage() != 0 {
		t.Errorf("usage = %d after dropping", c.Usage())
	}
	if got := h.Missing(0, tool.size()); !slices.Equal(got, []byterange.Range{{Offset: 0, Length: tool.size()}}) {
		t.Errorf("missing = %v, want everything", got)
	}
	if _, err := os.Stat(completePath(c.root, other.sum)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("corrupt file present under files/: %v", err)
	}
	if n, err := h.ReadAt(make([]byte, 10), 0); n != 0 || !errors.Is(err, ErrMissing) {
		t.Errorf("ReadAt after drop = %d, %v", n, err)
	}
}

func TestBadChunk(t *testing.T) {
	fs := realFiles(t)
	tool, big := fs["usr/bin/tool"], fs["usr/share/big.bin"]
	c := newCache(t, t.TempDir(), Config{})
	h := open(t, c, tool)
	for _, ch := range []verify.ChunkData{{}, big.chunks["estargz"][3], big.chunks["zstd"][0]} {
		if err := h.Put(ch); !errors.Is(err, ErrBadChunk) {
			t.Errorf("Put(%v) = %v, want ErrBadChunk", chunkRange(ch), err)
		}
	}
	if c.Usage() != 0 {
		t.Errorf("usage = %d", c.Usage())
	}
}

func TestEmptyFile(t *testing.T) {
	c := newCache(t, t.TempDir(), Config{})
	h, err := c.Open(sha256.Sum256(nil), 0)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	p, err := h.Path()
	if err != nil {
		t.Fatal(err)
	}
	if info, err := os.Stat(p); err != nil || info.Size() != 0 {
		t.Errorf("empty file: %v, %v", info, err)
	}
	if n, err := h.ReadAt(make([]byte, 1), 0); n != 0 || err != io.EOF {
		t.Errorf("ReadAt = %d, %v", n, err)
	}
	if _, err := c.Open(chunked.Sum{1}, 0); !errors.Is(err, ErrCorrupt) {
		t.Errorf("empty file with a wrong digest: %v", err)
	}
	if _, err := c.Open(chunked.Sum{}, 1); err == nil {
		t.Error("zero digest accepted")
	}
}

func TestSizeMismatch(t *testing.T) {
	fs := realFiles(t)
	tool, big := fs["usr/bin/tool"], fs["usr/share/big.bin"]
	c := newCache(t, t.TempDir(), Config{})
	fill(t, c, tool)
	if _, err := c.Open(tool.sum, tool.size()+1); !errors.Is(err, ErrSizeMismatch) {
		t.Errorf("complete file with another size: %v", err)
	}
	h := open(t, c, big)
	putAll(t, h, big.chunks["zstd"][:1])
	if _, err := c.Open(big.sum, 5); !errors.Is(err, ErrSizeMismatch) {
		t.Errorf("pinned partial file with another size: %v", err)
	}
	h.Close()
	// Unpinned partial content of unproven size is discarded.
	h2, err := c.Open(big.sum, 5)
	if err != nil {
		t.Fatal(err)
	}
	if h2.Size() != 5 || c.Usage() != tool.size() {
		t.Errorf("size %d usage %d", h2.Size(), c.Usage())
	}
	h2.Close()
}

func TestClosedCache(t *testing.T) {
	fs := realFiles(t)
	big := fs["usr/share/big.bin"]
	c, err := New(t.TempDir(), Config{})
	if err != nil {
		t.Fatal(err)
	}
	h, err := c.Open(big.sum, big.size())
	if err != nil {
		t.Fatal(err)
	}
	c.Close()
	if err := h.Put(big.chunks["zstd"][0]); !errors.Is(err, ErrClosed) {
		t.Errorf("Put after Cache.Close = %v", err)
	}
	if _, err := h.ReadAt(make([]byte, 1), 0); !errors.Is(err, ErrClosed) {
		t.Errorf("ReadAt after Cache.Close = %v", err)
	}
	if err := h.Close(); err != nil {
		t.Errorf("File.Close after Cache.Close = %v", err)
	}
	if _, err := c.Open(big.sum, big.size()); !errors.Is(err, ErrClosed) {
		t.Errorf("Open after Close = %v", err)
	}
	if _, err := h.ReadAt(make([]byte, 1), 0); !errors.Is(err, ErrClosed) {
		t.Errorf("ReadAt on a closed File = %v", err)
	}
}

// TestReadChunkPoisoned: a verified chunk of another file put at a range of this one (as a
// lying TOC would) is not served to a reader that checks its own chunk digests.
func TestReadChunkPoisoned(t *testing.T) {
	fs := realFiles(t)
	big, sparse := fs["usr/share/big.bin"], fs["usr/share/sparse.img"]
	c := newCache(t, t.TempDir(), Config{})
	h := open(t, c, big)
	honest, liar := big.chunks["estargz"], sparse.chunks["estargz"]
	putAll(t, h, []verify.ChunkData{honest[0], liar[1]}) // same offsets and sizes, other bytes
	if b, err := h.ReadChunk(honest[0].Ref()); err != nil || !bytes.Equal(b, honest[0].Bytes()) {
		t.Errorf("ReadChunk of an honest chunk = %v", err)
	}
	if _, err := h.ReadChunk(honest[1].Ref()); !errors.Is(err, ErrCorrupt) {
		t.Errorf("ReadChunk of a poisoned range = %v, want ErrCorrupt", err)
	}
	if _, err := h.ReadChunk(honest[2].Ref()); !errors.Is(err, ErrMissing) {
		t.Errorf("ReadChunk of a missing chunk = %v, want ErrMissing", err)
	}
	// Completion catches the poison and drops the file; honest chunks then complete it.
	err := error(nil)
	for _, ch := range honest[2:] {
		if err = h.Put(ch); err != nil {
			break
		}
	}
	if !errors.Is(err, ErrCorrupt) || h.Complete() {
		t.Fatalf("completing a poisoned file: %v", err)
	}
	putAll(t, h, honest)
	if !h.Complete() {
		t.Fatal("not complete after honest refill")
	}
	if b, err := h.ReadChunk(honest[1].Ref()); err != nil || !bytes.Equal(b, honest[1].Bytes()) {
		t.Errorf("ReadChunk after completion = %v", err)
	}
}

// TestReadChunkAt: parts of a chunk read piece by piece are the chunk's bytes, whether the
// range was stored whole (known to hash to the digest), made present by chunks of another
// chunking (hashed on the first read), or poisoned (refused on every read); a file reset by a
// failed completion knows none of its former ranges.
func TestReadChunkAt(t *testing.T) {
	fs := realFiles(t)
	big, sparse := fs["usr/share/big.bin"], fs["usr/share/sparse.img"]
	c := newCache(t, t.TempDir(), Config{})
	h := open(t, c, big)
	honest, liar, other := big.chunks["estargz"], sparse.chunks["estargz"], big.chunks["zstd"]
	putAll(t, h, []verify.ChunkData{honest[0], liar[1]})
	// Chunks of the other chunking that cover honest[2] (and maybe more).
	r2 := chunkRange(honest[2])
	for _, ch := range other {
		if r := chunkRange(ch); r.End() > r2.Offset && r.Offset < r2.End() {
			putAll(t, h, []verify.ChunkData{ch})
		}
	}
	readParts := func(ch verify.ChunkData) error {
		ref := ch.Ref()
		for _, piece := range []int64{4096, 1000, ref.Size} {
			for off := ref.FileOffset; off < ref.FileOffset+ref.Size; off += piece {
				p := make([]byte, min(piece, ref.FileOffset+ref.Size-off))
				if n, err := h.ReadChunkAt(ref, p, off); err != nil || n != len(p) {
					return fmt.Errorf("%d bytes at %d: n=%d: %w", len(p), off, n, err)
				}
				if !bytes.Equal(p, big.content[off:off+int64(len(p))]) {
					return fmt.Errorf("%d bytes at %d differ from the file", len(p), off)
				}
			}
		}
		return nil
	}
	for _, ch := range []verify.ChunkData{honest[0], honest[2], honest[0], honest[2]} {
		if err := readParts(ch); err != nil {
			t.Errorf("chunk at %d: %v", ch.Ref().FileOffset, err)
		}
	}
	for range 2 {
		if _, err := h.ReadChunkAt(honest[1].Ref(), make([]byte, 10), honest[1].Ref().FileOffset); !errors.Is(err, ErrCorrupt) {
			t.Errorf("part of a poisoned range = %v, want ErrCorrupt", err)
		}
	}
	ref := honest[0].Ref()
	if _, err := h.ReadChunkAt(ref, make([]byte, 10), ref.FileOffset+ref.Size-5); !errors.Is(err, ErrBadChunk) {
		t.Errorf("a read past the chunk's end = %v, want ErrBadChunk", err)
	}
	// Completion catches the poison and drops every range, known ones included.
	var err error
	for _, ch := range other {
		if err = h.Put(ch); err != nil {
			break
		}
	}
	if !errors.Is(err, ErrCorrupt) {
		t.Fatalf("completing a poisoned file: %v", err)
	}
	if _, err := h.ReadChunkAt(ref, make([]byte, 10), ref.FileOffset); !errors.Is(err, ErrMissing) {
		t.Errorf("a known range after the reset = %v, want ErrMissing", err)
	}
	// Poison over the formerly known range, by a chunk of other bounds: still refused.
	var poison *verify.ChunkData
	for _, ch := range append(sparse.chunks["zstd"], sparse.chunks["estargz"]...) {
		if r := chunkRange(ch); r.Offset <= ref.FileOffset && r.End() > ref.FileOffset && r != chunkRange(honest[0]) &&
			r.End() <= big.size() && !bytes.Equal(ch.Bytes(), big.content[r.Offset:r.End()]) {
			poison = &ch
			break
		}
	}
	if poison == nil {
		t.Fatal("no chunk of sparse.img overlaps the first chunk of big.bin with other bounds")
	}
	putAll(t, h, []verify.ChunkData{*poison})
	for _, ch := range other { // the rest of the range, honest bytes
		if r := chunkRange(ch); r.Offset < ref.FileOffset+ref.Size && r.End() > poison.Ref().FileOffset+poison.Ref().Size {
			putAll(t, h, []verify.ChunkData{ch})
		}
	}
	if _, err := h.ReadChunkAt(ref, make([]byte, 10), ref.FileOffset); !errors.Is(err, ErrCorrupt) {
		t.Errorf("a poisoned range once known = %v, want ErrCorrupt", err)
	}
	for _, ch := range other {
		if err = h.Put(ch); err != nil {
			break
		}
	}
	if !errors.Is(err, ErrCorrupt) {
		t.Fatalf("completing a poisoned file: %v", err)
	}
	putAll(t, h, other)
	if !h.Complete() {
		t.Fatal("not complete after honest refill")
	}
	if err := readParts(honest[1]); err != nil {
		t.Errorf("after completion: %v", err)
	}
}

func TestStats(t *testing.T) {
	c := newCache(t, t.TempDir(), Config{})
	var f *testFile
	for _, tf := range realFiles(t) {
		if f == nil || tf.size() > f.size() {
			f = tf
		}
	}
	h := open(t, c, f)
	buf := make([]byte, 10)
	if _, err := h.ReadAt(buf, 0); !errors.Is(err, ErrMissing) {
		t.Fatalf("read of an empty file: %v", err)
	}
	putAll(t, h, f.chunks["zstd"])
	if _, err := h.ReadAt(buf, 0); err != nil {
		t.Fatal(err)
	}
	st := c.Stats()
	if st.Hits != 1 || st.Misses != 1 || st.Files != 1 || st.Complete != 1 || st.Bytes != f.size() || st.MaxBytes != DefaultMaxSize {
		t.Errorf("stats %+v", st)
	}
}

// TestStatsCounted: Stats reads counters kept as files are added, completed, evicted and
// found again by a new Cache, rather than walking the entries (it allocates nothing, however
// many files the cache holds), and its figures agree with a recount at every step.
func TestStatsCounted(t *testing.T) {
	root := t.TempDir()
	fs := realFiles(t)
	a, b, cf := fs["usr/bin/tool"], fs["usr/bin/group-tool"], fs["usr/share/doc/deep/er/README"]
	check := func(c *Cache, step string) {
		t.Helper()
		c.mu.Lock()
		all := make([]*entry, 0, len(c.entries))
		for _, e := range c.entries {
			all = append(all, e)
		}
		c.mu.Unlock()
		complete := 0
		for _, e := range all {
			if e.isComplete() {
				complete++
			}
		}
		if st := c.Stats(); st.Files != len(all) || st.Complete != complete {
			t.Errorf("%s: stats count %d files, %d complete; recount %d, %d", step, st.Files, st.Complete, len(all), complete)
		}
		if n := testing.AllocsPerRun(10, func() { c.Stats() }); n != 0 {
			t.Errorf("%s: Stats allocates %v times, want 0 (no walk of the entries)", step, n)
		}
	}
	others := 0 // enough files that a walk could not keep its slice on the stack
	var rest int64
	for _, f := range fs {
		if f != a && f != b && f != cf {
			others++
			rest += f.size()
		}
	}
	if others < 5 {
		t.Fatalf("%d other files", others)
	}
	c := newCache(t, root, Config{MaxSize: rest + a.size() + b.size() + cf.size() - 1})
	check(c, "empty")
	fill(t, c, a)
	check(c, "one complete")
	for _, f := range fs {
		if f != a && f != b && f != cf {
			fill(t, c, f)
		}
	}
	check(c, "more complete")
	h := open(t, c, b)
	putAll(t, h, b.chunks["zstd"][:1])
	check(c, "one partial")
	putAll(t, h, b.chunks["zstd"][1:])
	h.Close()
	check(c, "b complete")
	hc := open(t, c, cf)
	putAll(t, hc, cf.chunks["zstd"])
	hc.Close() // over the bound: a, the least recently used, is evicted
	if c.Has(a.sum) {
		t.Fatal("nothing evicted")
	}
	check(c, "after an eviction")
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	c = newCache(t, root, Config{})
	check(c, "reopened")
}

// TestPutWaitsForFinish: a Put that finds the file full while another caller is verifying it
// (two layers storing the same file at once) returns once the file is complete, not before:
// the layer whose Put returned checks that the cache holds its files.
func TestPutWaitsForFinish(t *testing.T) {
	big := realFiles(t)["usr/share/big.bin"]
	c := newCache(t, t.TempDir(), Config{})
	cs := big.chunks["zstd"]
	first, second := open(t, c, big), open(t, c, big)
	putAll(t, first, cs[:len(cs)-1])
	type outcome struct {
		err      error
		complete bool
	}
	done := make(chan outcome, 1)
	var once sync.Once
	c.hook = func(p string) error {
		if p != "finish:hashed" {
			return nil
		}
		once.Do(func() {
			// The first Put is hashing the full file: the second finds it full.
			go func() {
				err := second.Put(cs[len(cs)-1])
				done <- outcome{err, c.Has(big.sum)}
			}()
			select {
			case o := <-done:
				done <- o // returned while the file is being verified: seen below
			case <-time.After(200 * time.Millisecond):
			}
		})
		return nil
	}
	if err := first.Put(cs[len(cs)-1]); err != nil {
		t.Fatal(err)
	}
	o := <-done
	if o.err != nil {
		t.Fatal(o.err)
	}
	if !o.complete {
		t.Error("a Put that found the file full returned before the file was complete")
	}
}
