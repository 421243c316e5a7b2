//go:build linux

package cache

import (
	"bytes"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/layerstore/layerstore/chunked"
	"github.com/layerstore/layerstore/internal/byterange"
	"github.com/layerstore/layerstore/internal/testutil/testlog"
	"github.com/layerstore/layerstore/internal/testutil/testtmpfs"
)

// TestNoSpaceEvicts: on a full filesystem, with files not in use stored, a Put evicts them
// (although the cache is far below its size bound) and succeeds.
func TestNoSpaceEvicts(t *testing.T) {
	testtmpfs.Run(t, "4m", func(t *testing.T, dir string) {
		fs := realFiles(t)
		big, sparse := fs["usr/share/big.bin"], fs["usr/share/sparse.img"]
		logs := &testlog.Handler{}
		c := newCache(t, filepath.Join(dir, "cache"), Config{Logger: slog.New(logs)})
		fill(t, c, big) // complete, closed: evictable
		testtmpfs.Fill(t, dir)

		h := open(t, c, sparse)
		for _, ch := range sparse.chunks["estargz"] {
			if err := h.Put(ch); err != nil {
				t.Fatalf("Put on a full filesystem with %s evictable: %v", big.name, err)
			}
		}
		if !h.Complete() {
			t.Fatal("not complete after all its chunks")
		}
		if c.Has(big.sum) {
			t.Error("the file not in use was not evicted")
		}
		if st := c.Stats(); st.Evictions != 1 || st.Bytes != sparse.size() {
			t.Errorf("stats %+v, want one eviction and only %s stored", st, sparse.name)
		}
		if warns, lines := logs.Count(); warns != 0 || len(lines) != 1 {
			t.Errorf("logged %q, want one line (the eviction), no warning", lines)
		}
	})
}

// TestNoSpaceNothingToEvict: on a full filesystem with nothing evictable, Put fails with
// ErrNoSpace and records nothing (in memory and after a restart); further writes fail at once
// for the backoff, even once the disk has room, with a bounded number of log lines; PutFiles
// too; after the backoff, writes go to the disk again.
func TestNoSpaceNothingToEvict(t *testing.T) {
	testtmpfs.Run(t, "4m", func(t *testing.T, dir string) {
		fs := realFiles(t)
		big, tool := fs["usr/share/big.bin"], fs["usr/bin/tool"]
		cs := big.chunks["estargz"]
		root := filepath.Join(dir, "cache")
		c := newCache(t, root, Config{})
		h := open(t, c, big)
		putAll(t, h, cs[:1]) // the partial file exists: later Puts only write data
		filler := testtmpfs.Fill(t, dir)

		err := h.Put(cs[1])
		if !errors.Is(err, ErrNoSpace) || !errors.Is(err, syscall.ENOSPC) {
			t.Fatalf("Put on a full filesystem = %v, want ErrNoSpace wrapping ENOSPC", err)
		}
		if got, want := h.Missing(0, big.size()), []byterange.Range{{Offset: chunkRange(cs[1]).Offset, Length: big.size() - chunkRange(cs[1]).Offset}}; !slices.Equal(got, want) {
			t.Errorf("missing %v after the failed Put, want %v", got, want)
		}
		if c.Usage() != chunkRange(cs[0]).Length {
			t.Errorf("usage %d, want only the first chunk", c.Usage())
		}
		// After a restart, the journal records only the first chunk.
		h.Close()
		c.Close()
		logs := &testlog.Handler{}
		c = newCache(t, root, Config{Logger: slog.New(logs)})
		clock := time.Now()
		c.now = func() time.Time { return clock }
		if c.Usage() != chunkRange(cs[0]).Length {
			t.Errorf("after a restart, usage %d, want only the first chunk", c.Usage())
		}
		h = open(t, c, big)
		buf := make([]byte, chunkRange(cs[1]).Length)
		if _, err := h.ReadAt(buf, chunkRange(cs[1]).Offset); !errors.Is(err, ErrMissing) {
			t.Errorf("after a restart, reading the chunk that failed = %v, want ErrMissing", err)
		}

		// The first Put meets the full disk; the others, for the backoff, do not try.
		for i := range 200 {
			if err := h.Put(cs[1+i%(len(cs)-1)]); !errors.Is(err, ErrNoSpace) {
				t.Fatalf("Put %d = %v, want ErrNoSpace", i, err)
			}
		}
		errs := c.PutFiles([]Content{{Sum: tool.sum, Size: tool.size(), Chunks: tool.chunks["zstd"]}})
		if !errors.Is(errs[0], ErrNoSpace) {
			t.Errorf("PutFiles = %v, want ErrNoSpace", errs[0])
		}
		if err := os.Remove(filler); err != nil {
			t.Fatal(err)
		}
		if err := h.Put(cs[1]); !errors.Is(err, ErrNoSpace) {
			t.Errorf("Put within the backoff, with room again = %v, want ErrNoSpace at once", err)
		}
		// A chunk already present is no write: it succeeds.
		if err := h.Put(cs[0]); err != nil {
			t.Errorf("Put of a present chunk within the backoff = %v", err)
		}
		if warns, lines := logs.Count(); warns != 1 {
			t.Errorf("logged %d warnings for 203 refused writes, want 1: %q", warns, lines)
		}
		if len(h.Missing(0, big.size())) != 1 {
			t.Errorf("missing %v, want all but the first chunk", h.Missing(0, big.size()))
		}

		clock = clock.Add(noSpaceBackoff)
		putAll(t, h, cs[1:])
		if !h.Complete() {
			t.Fatal("not complete after the backoff")
		}
		if errs := c.PutFiles([]Content{{Sum: tool.sum, Size: tool.size(), Chunks: tool.chunks["zstd"]}}); errs[0] != nil {
			t.Errorf("PutFiles after the backoff = %v", errs[0])
		}
		// The next line about the full disk counts the writes refused meanwhile.
		clock = clock.Add(reportEvery)
		c.report.Log(clock, msgFull, slog.LevelWarn, msgFull)
		if _, lines := logs.Count(); !strings.Contains(lines[len(lines)-1], "repeated=") {
			t.Errorf("last line %q, want the count of refused writes", lines[len(lines)-1])
		}
	})
}

// TestNoSpaceRecords: on a full filesystem PutRecord and Pin evict files not in use and not
// pinned (although the cache is far below its size bound) and succeed; with nothing left to
// evict (the rest pinned or open) PutRecord fails with ErrNoSpace, leaves no temporary file
// and keeps the old record; Available follows the filesystem.
func TestNoSpaceRecords(t *testing.T) {
	testtmpfs.Run(t, "4m", func(t *testing.T, dir string) {
		fs := realFiles(t)
		sparse, tool := fs["usr/share/sparse.img"], fs["usr/bin/tool"]
		root := filepath.Join(dir, "cache")
		c := newCache(t, root, Config{})
		fill(t, c, sparse) // 420 KiB, evictable
		fill(t, c, tool)   // pinned below
		putRecord(t, c, "rec", []byte("v1"), recordData(1, 100<<10))
		if err := c.Pin("img", []string{"rec"}, []chunked.Sum{tool.sum}); err != nil {
			t.Fatal(err)
		}
		free, err := c.Available()
		if err != nil || free <= 0 || free > 4<<20 {
			t.Fatalf("Available = %d, %v on a 4 MiB tmpfs", free, err)
		}
		filler := testtmpfs.Fill(t, dir)
		if free, _ := c.Available(); free > 64<<10 {
			t.Errorf("Available = %d on a full filesystem", free)
		}

		data := recordData(2, 200<<10)
		if err := c.PutRecord("new", []byte("v1"), data); err != nil {
			t.Fatalf("PutRecord on a full filesystem with %s evictable: %v", sparse.name, err)
		}
		if c.Has(sparse.sum) || !c.Has(tool.sum) {
			t.Errorf("has sparse=%v tool=%v, want the file not pinned evicted", c.Has(sparse.sum), c.Has(tool.sum))
		}
		r := openRecord(t, c, "new") // open: not evictable

		// Nothing left to evict: the record rec and the file tool are pinned, new is open.
		err = c.PutRecord("rec", []byte("v2"), recordData(3, 1<<20))
		if !errors.Is(err, ErrNoSpace) || !errors.Is(err, syscall.ENOSPC) {
			t.Fatalf("PutRecord with nothing evictable = %v, want ErrNoSpace wrapping ENOSPC", err)
		}
		if got, err := c.RecordMeta("rec"); err != nil || string(got) != "v1" {
			t.Errorf("old record after the failed replacement: %q, %v", got, err)
		}
		if !c.Has(tool.sum) || !bytes.Equal(r.Data(), data) {
			t.Error("pinned file or open record evicted")
		}
		if des, _ := os.ReadDir(filepath.Join(root, recordsDir)); len(des) != 2 {
			t.Errorf("records/ holds %v, want rec and new only", des)
		}
		checkAccounting(t, c)
		if err := os.Remove(filler); err != nil {
			t.Fatal(err)
		}
		c.now = func() time.Time { return time.Now().Add(noSpaceBackoff) }
		putRecord(t, c, "rec", []byte("v2"), recordData(3, 1<<20))
	})
}
