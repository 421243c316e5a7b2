package cache

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/layerstore/layerstore/internal/byterange"
	"github.com/layerstore/layerstore/verify"
)

var errCrash = errors.New("simulated crash")

// crashAt makes the cache stop at the named point, as a crash there would, from the n-th
// time it is reached (counting from 1).
func crashAt(c *Cache, point string, n int) {
	seen := 0
	c.hook = func(p string) error {
		if p != point {
			return nil
		}
		if seen++; seen >= n {
			return errCrash
		}
		return nil
	}
}

// TestCrashBeforeRecord: bytes written and synced but not recorded read as missing after a
// restart, and a later Put of that range stores it.
func TestCrashBeforeRecord(t *testing.T) {
	big := realFiles(t)["usr/share/big.bin"]
	cs := big.chunks["estargz"]
	root := t.TempDir()
	c := newCache(t, root, Config{})
	crashAt(c, "put:data-synced", 2)
	h := open(t, c, big)
	if err := h.Put(cs[0]); err != nil {
		t.Fatal(err)
	}
	if err := h.Put(cs[1]); !errors.Is(err, errCrash) {
		t.Fatalf("Put = %v, want the simulated crash", err)
	}
	h.Close()
	c.Close()
	// The bytes did reach the data file: only the record says whether they count.
	raw, err := os.ReadFile(partialPath(root, big.sum))
	if err != nil {
		t.Fatal(err)
	}
	r1 := chunkRange(cs[1])
	if !bytes.Equal(raw[r1.Offset:r1.End()], big.content[r1.Offset:r1.End()]) {
		t.Fatal("test premise: unrecorded chunk not in the data file")
	}

	c = newCache(t, root, Config{})
	if c.Usage() != chunkRange(cs[0]).Length {
		t.Errorf("usage = %d, want only the recorded chunk", c.Usage())
	}
	h = open(t, c, big)
	want := []byterange.Range{{Offset: r1.Offset, Length: big.size() - r1.Offset}}
	if got := h.Missing(0, big.size()); !slices.Equal(got, want) {
		t.Errorf("missing after crash = %v, want %v", got, want)
	}
	if _, err := h.ReadAt(make([]byte, 10), r1.Offset); !errors.Is(err, ErrMissing) {
		t.Errorf("ReadAt of unrecorded range = %v, want ErrMissing", err)
	}
	putAll(t, h, cs[1:])
	if !h.Complete() {
		t.Error("not complete after refilling")
	}
}

// TestCrashBeforeCommit: a file fully recorded but not renamed into files/ is verified and
// completed by the next Open.
func TestCrashBeforeCommit(t *testing.T) {
	big := realFiles(t)["usr/share/big.bin"]
	root := t.TempDir()
	c := newCache(t, root, Config{})
	crashAt(c, "finish:verified", 1)
	h := open(t, c, big)
	cs := big.chunks["zstd"]
	putAll(t, h, cs[:len(cs)-1])
	if err := h.Put(cs[len(cs)-1]); !errors.Is(err, errCrash) {
		t.Fatalf("last Put = %v, want the simulated crash", err)
	}
	if h.Complete() || c.Has(big.sum) {
		t.Fatal("complete despite the crash before commit")
	}
	h.Close()
	c.Close()

	c = newCache(t, root, Config{})
	if c.Has(big.sum) {
		t.Fatal("complete after restart before any Open")
	}
	h = open(t, c, big)
	if !h.Complete() {
		t.Fatal("fully recorded file not completed on Open")
	}
	p, _ := h.Path()
	if got, err := os.ReadFile(p); err != nil || !bytes.Equal(got, big.content) {
		t.Errorf("content after recovery differs (%v)", err)
	}
}

// TestCrashAfterCommit: leftovers of a completion interrupted after its rename (the journal)
// and of interrupted creations (temporary journal, data file without journal) are removed.
func TestCrashAfterCommit(t *testing.T) {
	fs := realFiles(t)
	tool, big := fs["usr/bin/tool"], fs["usr/share/big.bin"]
	root := t.TempDir()
	c := newCache(t, root, Config{})
	fill(t, c, tool)
	c.Close()
	tp, bp := partialPath(root, tool.sum), partialPath(root, big.sum)
	stray := map[string][]byte{
		tp + journalExt:          journalHeader(tool.size()),
		bp:                       make([]byte, big.size()),
		bp + journalExt + tmpExt: journalHeader(big.size()),
	}
	for p, b := range stray {
		if err := ensureDir(filepath.Dir(p)); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	c = newCache(t, root, Config{})
	for p := range stray {
		if _, err := os.Stat(p); !os.IsNotExist(err) {
			t.Errorf("%s not removed: %v", p, err)
		}
	}
	if !c.Has(tool.sum) || c.Has(big.sum) || c.Usage() != tool.size() {
		t.Errorf("has tool=%v big=%v usage=%d", c.Has(tool.sum), c.Has(big.sum), c.Usage())
	}
}

// TestDamagedJournal damages a partial file's metadata between two runs: the file must be
// treated as (partly) missing, never trusted beyond its sound records, and never panic.
func TestDamagedJournal(t *testing.T) {
	big := realFiles(t)["usr/share/big.bin"]
	cs := big.chunks["estargz"]
	r0, r1 := chunkRange(cs[0]), chunkRange(cs[1])
	all := []byterange.Range{{Offset: 0, Length: big.size()}}
	for _, tc := range []struct {
		name   string
		damage func(t *testing.T, journal, data string)
		want   []byterange.Range // missing after the damage
	}{
		{"torn last record", func(t *testing.T, j, _ string) { truncate(t, j, -7) },
			[]byterange.Range{{Offset: r1.Offset, Length: big.size() - r1.Offset}}},
		{"garbage appended", func(t *testing.T, j, _ string) { appendBytes(t, j, []byte("garbage")) },
			[]byterange.Range{{Offset: r1.End(), Length: big.size() - r1.End()}}},
		{"flipped bit in first record", func(t *testing.T, j, _ string) { flipByte(t, j, journalRec+3) }, all},
		{"truncated header", func(t *testing.T, j, _ string) { truncate(t, j, 5-fileSize(t, j)) }, all},
		{"empty journal", func(t *testing.T, j, _ string) { truncate(t, j, -fileSize(t, j)) }, all},
		{"corrupt header", func(t *testing.T, j, _ string) { flipByte(t, j, 2) }, all},
		{"data file gone", func(t *testing.T, _, d string) { os.Remove(d) }, all},
		{"data file truncated", func(t *testing.T, _, d string) { truncate(t, d, -1) }, all},
		{"journal gone", func(t *testing.T, j, _ string) { os.Remove(j) }, all},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := t.TempDir()
			c := newCache(t, root, Config{})
			h := open(t, c, big)
			putAll(t, h, cs[:2])
			h.Close()
			c.Close()
			p := partialPath(root, big.sum)
			tc.damage(t, p+journalExt, p)

			c = newCache(t, root, Config{})
			if want := big.size() - byterange.Set(tc.want).Bytes(); c.Usage() != want {
				t.Errorf("usage = %d, want %d", c.Usage(), want)
			}
			h = open(t, c, big)
			if got := h.Missing(0, big.size()); !slices.Equal(got, tc.want) {
				t.Errorf("missing = %v, want %v", got, tc.want)
			}
			// The journal is usable again: a new record survives another restart.
			if err := h.Put(cs[5]); err != nil {
				t.Fatal(err)
			}
			h.Close()
			c.Close()
			c = newCache(t, root, Config{})
			h = open(t, c, big)
			if got := h.Missing(chunkRange(cs[5]).Offset, r0.Length); got != nil {
				t.Errorf("chunk recorded after repair lost: missing %v", got)
			}
			putAll(t, h, cs)
			if !h.Complete() {
				t.Error("not complete")
			}
			if p, _ := h.Path(); !bytes.Equal(readFile(t, p), big.content) {
				t.Error("content differs")
			}
		})
	}
}

func readFile(t *testing.T, p string) []byte {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func fileSize(t *testing.T, p string) int64 {
	t.Helper()
	info, err := os.Stat(p)
	if err != nil {
		t.Fatal(err)
	}
	return info.Size()
}

func truncate(t *testing.T, p string, by int64) {
	t.Helper()
	if err := os.Truncate(p, fileSize(t, p)+by); err != nil {
		t.Fatal(err)
	}
}

func appendBytes(t *testing.T, p string, b []byte) {
	t.Helper()
	f, err := os.OpenFile(p, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.Write(b); err != nil {
		t.Fatal(err)
	}
}

func flipByte(t *testing.T, p string, i int) {
	t.Helper()
	b := readFile(t, p)
	b[i] ^= 0xff
	if err := os.WriteFile(p, b, 0o600); err != nil {
		t.Fatal(err)
	}
}

// TestPutMany: chunks put together (out of order, one already present) are written with one
// sync of the data and one of the journal, read back, survive a restart, and are known by
// digest; a bad chunk among them stores none; a crash after the data's sync records none.
func TestPutMany(t *testing.T) {
	big := realFiles(t)["usr/share/big.bin"]
	cs := big.chunks["estargz"]
	if len(cs) < 6 {
		t.Fatalf("test premise: %d chunks", len(cs))
	}
	root := t.TempDir()
	c := newCache(t, root, Config{})
	syncs := 0
	c.hook = func(p string) error {
		if p == "put:data-synced" {
			syncs++
		}
		return nil
	}
	h := open(t, c, big)
	putAll(t, h, cs[1:2])
	syncs = 0
	if err := h.Put(cs[3], cs[0], cs[1], cs[2]); err != nil {
		t.Fatal(err)
	}
	if syncs != 1 {
		t.Errorf("%d syncs of the data for one Put of 4 chunks, want 1", syncs)
	}
	upTo := chunkRange(cs[3]).End()
	if got := h.Missing(0, upTo); len(got) != 0 {
		t.Errorf("missing after the Put: %v", got)
	}
	buf := make([]byte, upTo)
	if n, err := h.ReadAt(buf, 0); n != len(buf) || err != nil || !bytes.Equal(buf, big.content[:upTo]) {
		t.Errorf("ReadAt = %d, %v", n, err)
	}
	// A chunk that does not fit the file: nothing of the Put is stored.
	if err := h.Put(cs[4], verify.ChunkData{}); !errors.Is(err, ErrBadChunk) {
		t.Fatalf("Put with a bad chunk = %v, want ErrBadChunk", err)
	}
	if h.Missing(0, big.size())[0].Offset != upTo {
		t.Error("a Put with a bad chunk stored the good one")
	}
	h.Close()
	c.Close()

	c = newCache(t, root, Config{})
	if u := c.Usage(); u != upTo {
		t.Errorf("usage after a restart = %d, want %d", u, upTo)
	}
	h = open(t, c, big)
	if got := h.Missing(0, upTo); len(got) != 0 {
		t.Errorf("missing after a restart: %v", got)
	}
	// A crash after the data's sync: none of the Put's chunks is recorded.
	crashAt(c, "put:data-synced", 1)
	if err := h.Put(cs[4], cs[5]); !errors.Is(err, errCrash) {
		t.Fatalf("Put = %v, want the simulated crash", err)
	}
	h.Close()
	c.Close()
	c = newCache(t, root, Config{})
	h = open(t, c, big)
	if got := h.Missing(0, big.size()); len(got) == 0 || got[0].Offset != upTo {
		t.Errorf("missing after a crash in a Put = %v, want from %d", got, upTo)
	}
	putAll(t, h, cs[4:])
	if !h.Complete() {
		t.Error("not complete after refilling")
	}
}
