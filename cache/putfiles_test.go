package cache

import (
	"bytes"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/layerstore/layerstore/chunked"
)

// contents returns every distinct real file as whole content from the given fixture's chunks.
func contents(t *testing.T, kind string) []Content {
	t.Helper()
	var out []Content
	seen := map[chunked.Sum]bool{}
	names := make([]string, 0, len(realFiles(t)))
	for name := range realFiles(t) {
		names = append(names, name)
	}
	slices.Sort(names)
	for _, name := range names {
		tf := realFiles(t)[name]
		if seen[tf.sum] {
			continue
		}
		seen[tf.sum] = true
		out = append(out, Content{Sum: tf.sum, Size: tf.size(), Chunks: tf.chunks[kind]})
	}
	return out
}

func byName(t *testing.T, sum chunked.Sum) *testFile {
	for _, tf := range realFiles(t) {
		if tf.sum == sum {
			return tf
		}
	}
	t.Fatalf("no file %v", sum)
	return nil
}

// leftovers lists what is on disk besides complete files: temporary files, partial files.
func leftovers(t *testing.T, root string) []string {
	t.Helper()
	var out []string
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		if d.IsDir() || rel == lockName {
			return nil
		}
		if _, ok := parseName(d.Name()); ok && strings.HasPrefix(rel, filesDir+string(filepath.Separator)) {
			return nil
		}
		out = append(out, rel)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func checkStored(t *testing.T, c *Cache, cs []Content) {
	t.Helper()
	var total int64
	for _, f := range cs {
		total += f.Size
		if !c.Has(f.Sum) {
			t.Errorf("%v not complete", f.Sum)
			continue
		}
		h, err := c.Open(f.Sum, f.Size)
		if err != nil {
			t.Fatal(err)
		}
		p, err := h.Path()
		if err != nil {
			t.Fatal(err)
		}
		got, err := os.ReadFile(p)
		if err != nil || !bytes.Equal(got, byName(t, f.Sum).content) {
			t.Errorf("%v: stored content differs (%v)", f.Sum, err)
		}
		if info, err := os.Stat(p); err != nil || info.Mode().Perm() != 0o400 {
			t.Errorf("%v: mode %v (%v), want read-only", f.Sum, info.Mode(), err)
		}
		h.Close()
	}
	if c.Usage() != total {
		t.Errorf("usage = %d, want %d", c.Usage(), total)
	}
}

// TestPutFiles stores every file of the layer in one group, from chunks of both chunkings
// (single-chunk files, whose chunk digest is the file's, and multi-chunk ones).
func TestPutFiles(t *testing.T) {
	for _, kind := range []string{"estargz", "zstd"} {
		t.Run(kind, func(t *testing.T) {
			root := t.TempDir()
			c := newCache(t, root, Config{})
			cs := contents(t, kind)
			for i, err := range c.PutFiles(cs) {
				if err != nil {
					t.Errorf("%v: %v", cs[i].Sum, err)
				}
			}
			checkStored(t, c, cs)
			if st := c.Stats(); st.Files != len(cs) || st.Complete != len(cs) {
				t.Errorf("stats: %d files, %d complete; want %d of each", st.Files, st.Complete, len(cs))
			}
			if l := leftovers(t, root); len(l) > 0 {
				t.Errorf("leftovers: %v", l)
			}
			// Again: already complete, nothing changes.
			for i, err := range c.PutFiles(cs) {
				if err != nil {
					t.Errorf("second time, %v: %v", cs[i].Sum, err)
				}
			}
			if st := c.Stats(); st.Complete != len(cs) {
				t.Errorf("stats after storing again: %d complete, want %d", st.Complete, len(cs))
			}
			c.Close()
			c = newCache(t, root, Config{})
			checkStored(t, c, cs)
		})
	}
}

// TestPutFilesRefuses: content that does not hash to its digest, or chunks that do not tile
// the file, are not stored; the good files of the same group are.
func TestPutFilesRefuses(t *testing.T) {
	fs := realFiles(t)
	big, tool := fs["usr/share/big.bin"], fs["usr/bin/tool"]
	if len(big.chunks["estargz"]) < 3 {
		t.Fatal("test premise: big.bin has several chunks")
	}
	root := t.TempDir()
	c := newCache(t, root, Config{})
	good := Content{Sum: tool.sum, Size: tool.size(), Chunks: tool.chunks["estargz"]}
	group := []Content{
		{Sum: tool.sum, Size: big.size(), Chunks: big.chunks["estargz"]},                                        // another file's content
		{Sum: big.sum, Size: big.size(), Chunks: big.chunks["estargz"][1:]},                                     // a gap
		{Sum: big.sum, Size: big.size(), Chunks: append(big.chunks["estargz"][:1:1], big.chunks["estargz"]...)}, // an overlap
		good,
	}
	errs := c.PutFiles(group)
	for i, want := range []error{ErrCorrupt, ErrBadChunk, ErrBadChunk, nil} {
		if !errors.Is(errs[i], want) || (want == nil) != (errs[i] == nil) {
			t.Errorf("file %d: error %v, want %v", i, errs[i], want)
		}
	}
	if c.Has(big.sum) {
		t.Error("refused file is complete")
	}
	checkStored(t, c, []Content{good})
	if l := leftovers(t, root); len(l) > 0 {
		t.Errorf("leftovers: %v", l)
	}
	if got := c.Stats().Files; got != 1 {
		t.Errorf("cache holds %d files, want 1", got)
	}
}

// TestPutFilesOverPartial: a file the cache holds partially, open in a handle, is completed
// through the chunk path and the handle sees it complete.
func TestPutFilesOverPartial(t *testing.T) {
	big := realFiles(t)["usr/share/big.bin"]
	root := t.TempDir()
	c := newCache(t, root, Config{})
	h := open(t, c, big)
	putAll(t, h, big.chunks["zstd"][:1])
	if err := c.PutFiles([]Content{{Sum: big.sum, Size: big.size(), Chunks: big.chunks["estargz"]}})[0]; err != nil {
		t.Fatal(err)
	}
	if !h.Complete() {
		t.Fatal("handle does not see the file complete")
	}
	h.Close()
	checkStored(t, c, []Content{{Sum: big.sum, Size: big.size()}})
	if l := leftovers(t, root); len(l) > 0 {
		t.Errorf("leftovers: %v", l)
	}
}

// TestPutFilesReaderMeanwhile: a reader opens the file (creating a partial file) and stores a
// chunk while the group is being committed; the group's file replaces the partial one, and
// the reader's handle reads the complete file.
func TestPutFilesReaderMeanwhile(t *testing.T) {
	big := realFiles(t)["usr/share/big.bin"]
	root := t.TempDir()
	c := newCache(t, root, Config{})
	var h *File
	c.hook = func(p string) error {
		if p != "putfiles:data-synced" {
			return nil
		}
		var err error
		if h, err = c.Open(big.sum, big.size()); err != nil {
			t.Fatal(err)
		}
		putAll(t, h, big.chunks["zstd"][:1])
		if h.Complete() {
			t.Fatal("test premise: complete before the commit")
		}
		return nil
	}
	if err := c.PutFiles([]Content{{Sum: big.sum, Size: big.size(), Chunks: big.chunks["estargz"]}})[0]; err != nil {
		t.Fatal(err)
	}
	if h == nil {
		t.Fatal("hook not called")
	}
	defer h.Close()
	if !h.Complete() {
		t.Fatal("reader's handle does not see the file complete")
	}
	got := make([]byte, big.size())
	if n, err := h.ReadAt(got, 0); err != nil || int64(n) != big.size() || !bytes.Equal(got, big.content) {
		t.Fatalf("ReadAt = %d, %v; content equal: %t", n, err, bytes.Equal(got, big.content))
	}
	// Later chunks from the reader are no-ops.
	putAll(t, h, big.chunks["zstd"][1:])
	if l := leftovers(t, root); len(l) > 0 {
		t.Errorf("leftovers: %v", l)
	}
	if c.Usage() != big.size() {
		t.Errorf("usage = %d, want %d", c.Usage(), big.size())
	}
}

// TestCrashPutFiles: a crash after the data sync leaves only temporary files, which the next
// start removes; a crash after the renames leaves complete, verified files.
func TestCrashPutFiles(t *testing.T) {
	cs := contents(t, "estargz")
	for _, tc := range []struct {
		point    string
		complete bool
	}{
		{"putfiles:data-synced", false},
		{"putfiles:renamed", true},
	} {
		t.Run(tc.point, func(t *testing.T) {
			root := t.TempDir()
			c := newCache(t, root, Config{})
			crashAt(c, tc.point, 1)
			for _, err := range c.PutFiles(cs) {
				if !errors.Is(err, errCrash) {
					t.Fatalf("PutFiles = %v, want the simulated crash", err)
				}
			}
			for _, f := range cs {
				if c.Has(f.Sum) {
					t.Fatalf("%v complete despite the crash", f.Sum)
				}
			}
			c.Close()
			c = newCache(t, root, Config{})
			if l := leftovers(t, root); len(l) > 0 {
				t.Errorf("leftovers after restart: %v", l)
			}
			if !tc.complete {
				if n := c.Stats().Files; n != 0 {
					t.Errorf("%d files after restart, want none", n)
				}
				return
			}
			checkStored(t, c, cs)
		})
	}
}

// TestPutFilesOpenHandle: a file open in a handle that stored nothing yet (a reader that is
// fetching it) is stored whole, without a partial file, and the handle sees it complete.
func TestPutFilesOpenHandle(t *testing.T) {
	big := realFiles(t)["usr/share/big.bin"]
	root := t.TempDir()
	c := newCache(t, root, Config{})
	h := open(t, c, big)
	var created bool
	c.hook = func(p string) error {
		if p == "putfiles:data-synced" {
			_, err := os.Stat(partialPath(root, big.sum) + journalExt)
			created = err == nil
		}
		return nil
	}
	if err := c.PutFiles([]Content{{Sum: big.sum, Size: big.size(), Chunks: big.chunks["estargz"]}})[0]; err != nil {
		t.Fatal(err)
	}
	if created {
		t.Error("a partial file was made for a file stored whole")
	}
	if !h.Complete() {
		t.Fatal("handle does not see the file complete")
	}
	got := make([]byte, big.size())
	if n, err := h.ReadAt(got, 0); err != nil || !bytes.Equal(got[:n], big.content) {
		t.Fatalf("ReadAt = %d, %v", n, err)
	}
	h.Close()
	checkStored(t, c, []Content{{Sum: big.sum, Size: big.size()}})
	if l := leftovers(t, root); len(l) > 0 {
		t.Errorf("leftovers: %v", l)
	}
}

// TestOpenWritesNothing: opening a file the cache does not hold, to read it, creates no file
// (and costs no fsync); the first Put creates the partial file.
func TestOpenWritesNothing(t *testing.T) {
	big := realFiles(t)["usr/share/big.bin"]
	root := t.TempDir()
	c := newCache(t, root, Config{})
	h := open(t, c, big)
	if _, err := h.ReadAt(make([]byte, 10), 0); !errors.Is(err, ErrMissing) {
		t.Fatalf("ReadAt = %v, want ErrMissing", err)
	}
	if _, err := h.ReadChunk(big.chunks["zstd"][0].Ref()); !errors.Is(err, ErrMissing) {
		t.Fatalf("ReadChunk = %v, want ErrMissing", err)
	}
	if l := leftovers(t, root); len(l) > 0 {
		t.Fatalf("Open made files: %v", l)
	}
	putAll(t, h, big.chunks["zstd"][:1])
	if _, err := os.Stat(partialPath(root, big.sum) + journalExt); err != nil {
		t.Fatalf("no journal after a Put: %v", err)
	}
	h.Close()
	c.Close()
	c = newCache(t, root, Config{})
	if got := c.Usage(); got != chunkRange(big.chunks["zstd"][0]).Length {
		t.Errorf("usage after restart = %d, want the stored chunk", got)
	}
}
