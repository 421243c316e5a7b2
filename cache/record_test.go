package cache

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
	"unsafe"

	"github.com/layerstore/layerstore/internal/testutil/testlog"
	"github.com/layerstore/layerstore/internal/testutil/testproc"
)

// recordData returns deterministic data of n bytes for seed.
func recordData(seed uint64, n int) []byte {
	b := make([]byte, n)
	_, _ = rand.NewChaCha8([32]byte{byte(seed), byte(seed >> 8), byte(seed >> 16)}).Read(b)
	return b
}

func putRecord(t *testing.T, c *Cache, name string, meta, data []byte) {
	t.Helper()
	if err := c.PutRecord(name, meta, data); err != nil {
		t.Fatal(err)
	}
}

func openRecord(t *testing.T, c *Cache, name string) *Record {
	t.Helper()
	r, err := c.OpenRecord(name)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	return r
}

func recordSize(meta, data []byte) int64 { return alignRecord(int64(len(meta))) + int64(len(data)) }

// TestRecord: a record reads back as written (meta, data mapped page-aligned), counts its
// file size in usage, is replaced by a second Put, survives a restart, and goes with
// RemoveRecord; a missing one is ErrMissing and fs.ErrNotExist.
func TestRecord(t *testing.T) {
	root := t.TempDir()
	c := newCache(t, root, Config{})
	meta, data := []byte(`{"layer":"a"}`), recordData(1, 300<<10+17)
	putRecord(t, c, "layer-a", meta, data)
	putRecord(t, c, "empty", nil, nil)
	if got, err := c.RecordMeta("layer-a"); err != nil || !bytes.Equal(got, meta) {
		t.Fatalf("RecordMeta = %q, %v", got, err)
	}
	r := openRecord(t, c, "layer-a")
	if !bytes.Equal(r.Meta(), meta) || !bytes.Equal(r.Data(), data) {
		t.Fatal("record reads back different")
	}
	if addr := uintptrOf(r.Data()); addr%recordAlign != 0 {
		t.Errorf("data at %#x, not page-aligned", addr)
	}
	if want := recordSize(meta, data) + recordSize(nil, nil); c.Usage() != want {
		t.Errorf("usage %d, want %d (the records' file sizes)", c.Usage(), want)
	}
	if names, _ := c.Records(); !slices.Equal(names, []string{"empty", "layer-a"}) {
		t.Errorf("Records = %q", names)
	}
	e := openRecord(t, c, "empty")
	if len(e.Meta()) != 0 || len(e.Data()) != 0 {
		t.Errorf("empty record: meta %q, %d data bytes", e.Meta(), len(e.Data()))
	}

	// Replaced while open: the open Record keeps the old mapping.
	data2 := recordData(2, 5000)
	putRecord(t, c, "layer-a", []byte("v2"), data2)
	if !bytes.Equal(r.Data(), data) {
		t.Error("open record changed by a replacement")
	}
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	if err := r.Close(); err != nil || r.Data() != nil {
		t.Errorf("second Close = %v, Data %d bytes", err, len(r.Data()))
	}
	e.Close()
	c.Close()

	c = newCache(t, root, Config{})
	if want := recordSize([]byte("v2"), data2) + recordSize(nil, nil); c.Usage() != want {
		t.Errorf("after restart, usage %d, want %d", c.Usage(), want)
	}
	r = openRecord(t, c, "layer-a")
	if string(r.Meta()) != "v2" || !bytes.Equal(r.Data(), data2) {
		t.Error("after restart, record differs")
	}
	r.Close()
	if err := c.RemoveRecord("layer-a"); err != nil {
		t.Fatal(err)
	}
	if err := c.RemoveRecord("layer-a"); err != nil {
		t.Errorf("removing again = %v", err)
	}
	for _, err := range []error{errOf(c.RecordMeta("layer-a")), errOf(c.OpenRecord("layer-a"))} {
		if !errors.Is(err, ErrMissing) || !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("removed record: %v, want ErrMissing and fs.ErrNotExist", err)
		}
	}
	if c.Usage() != recordSize(nil, nil) {
		t.Errorf("usage %d after removal", c.Usage())
	}
	for _, bad := range []string{"", "A", "a/b", "..", "a.b", strings.Repeat("a", 129)} {
		if err := c.PutRecord(bad, nil, nil); err == nil {
			t.Errorf("PutRecord(%q) accepted", bad)
		}
	}
	if err := c.PutRecord(strings.Repeat("a", 128), nil, nil); err != nil {
		t.Errorf("128-byte name: %v", err)
	}
}

func errOf[T any](_ T, err error) error { return err }

// TestRecordDamaged: a record damaged on disk (any bit of its header, meta or data, or its
// length) is detected by OpenRecord (and RecordMeta, except in the data), removed and
// reported as ErrCorrupt; the start-up scan removes damaged headers, short files and
// temporary files.
func TestRecordDamaged(t *testing.T) {
	meta, data := []byte("meta of the record"), recordData(3, 20000)
	dataOff := int(alignRecord(int64(len(meta))))
	for _, tc := range []struct {
		name   string
		damage func(t *testing.T, p string)
		inMeta bool // RecordMeta sees it
		atScan bool // the start-up scan removes it
	}{
		{"header bit", func(t *testing.T, p string) { flipBit(t, p, 17) }, true, true},
		{"magic", func(t *testing.T, p string) { flipBit(t, p, 0) }, true, true},
		{"meta bit", func(t *testing.T, p string) { flipBit(t, p, recordHead+3) }, true, false},
		{"data bit", func(t *testing.T, p string) { flipBit(t, p, dataOff+12345) }, false, false},
		{"last data bit", func(t *testing.T, p string) { flipBit(t, p, dataOff+len(data)-1) }, false, false},
		{"truncated", func(t *testing.T, p string) { truncate(t, p, -1) }, true, true},
		{"extended", func(t *testing.T, p string) { appendBytes(t, p, []byte{0}) }, true, true},
		{"short", func(t *testing.T, p string) { truncate(t, p, 20-fileSize(t, p)) }, true, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, restart := range []bool{false, true} {
				root := t.TempDir()
				logs := &testlog.Handler{}
				c := newCache(t, root, Config{Logger: slog.New(logs)})
				putRecord(t, c, "rec", meta, data)
				putRecord(t, c, "other", meta, data)
				p := c.recordPath("rec")
				if err := os.Chmod(p, 0o600); err != nil {
					t.Fatal(err)
				}
				tc.damage(t, p)
				if restart {
					c.Close()
					c = newCache(t, root, Config{Logger: slog.New(logs)})
					if names, _ := c.Records(); slices.Contains(names, "rec") == tc.atScan {
						t.Fatalf("after restart, records %q: scan should remove it: %v", names, tc.atScan)
					}
					if tc.atScan {
						if _, err := os.Stat(p); !os.IsNotExist(err) {
							t.Errorf("damaged record left on disk: %v", err)
						}
						continue
					}
				}
				if _, err := c.RecordMeta("rec"); tc.inMeta != errors.Is(err, ErrCorrupt) {
					t.Errorf("RecordMeta = %v, want ErrCorrupt: %v", err, tc.inMeta)
				}
				if !tc.inMeta {
					if _, err := c.OpenRecord("rec"); !errors.Is(err, ErrCorrupt) {
						t.Errorf("OpenRecord = %v, want ErrCorrupt", err)
					}
				}
				if _, err := os.Stat(p); !os.IsNotExist(err) {
					t.Errorf("damaged record left on disk: %v", err)
				}
				if _, err := c.OpenRecord("rec"); !errors.Is(err, ErrMissing) {
					t.Errorf("OpenRecord after removal = %v, want ErrMissing", err)
				}
				if c.Usage() != recordSize(meta, data) {
					t.Errorf("usage %d, want only the other record", c.Usage())
				}
				if warns, lines := logs.Count(); warns != 1 {
					t.Errorf("logged %q, want one warning", lines)
				}
				openRecord(t, c, "other").Close()
			}
		})
	}

	t.Run("leftovers", func(t *testing.T) {
		root := t.TempDir()
		c := newCache(t, root, Config{})
		putRecord(t, c, "rec", meta, data)
		c.Close()
		dir := filepath.Join(root, recordsDir)
		stray := []string{".rec.123" + tmpExt, "Bad.Name", "x" + tmpExt}
		for _, s := range stray {
			if err := os.WriteFile(filepath.Join(dir, s), []byte("partial"), 0o600); err != nil {
				t.Fatal(err)
			}
		}
		c = newCache(t, root, Config{})
		des, _ := os.ReadDir(dir)
		if len(des) != 1 || des[0].Name() != "rec" {
			t.Errorf("records/ holds %v, want only rec", des)
		}
		openRecord(t, c, "rec")
	})
}

func flipBit(t *testing.T, p string, i int) {
	t.Helper()
	b := readFile(t, p)
	b[i] ^= 0x10
	if err := os.WriteFile(p, b, 0o600); err != nil {
		t.Fatal(err)
	}
}

// recordChildEnv names the root a child of TestRecordKill writes records into.
const recordChildEnv = "LAYERSTORE_TEST_RECORD_CHILD"

// TestRecordKill kills (SIGKILL) a process that writes versions of a record in a loop, at
// random moments: the record found by the next Cache is always a whole version, the last one
// the child reported done or the one it was writing, never a torn one, and no temporary file
// is left after the start-up scan.
func TestRecordKill(t *testing.T) {
	if root := os.Getenv(recordChildEnv); root != "" {
		recordChild(t, root)
		return
	}
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 1))
	root := t.TempDir()
	for round := range 8 {
		ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
		cmd := exec.CommandContext(ctx, os.Args[0], "-test.run", "^TestRecordKill$", "-test.count", "1", "-test.timeout", "2m")
		cmd.Env = append(os.Environ(), recordChildEnv+"="+root)
		out, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		cmd.Stderr = os.Stderr
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		// Lines "done N" as each version is stored; kill after a random number of them and a
		// random delay, mostly while a version is being written.
		sc := bufio.NewScanner(out)
		done := -1
		stopAt := 1 + rng.IntN(4)
		for sc.Scan() {
			if v, ok := strings.CutPrefix(sc.Text(), "done "); ok {
				done, _ = strconv.Atoi(v)
				if stopAt--; stopAt == 0 {
					break
				}
			}
		}
		time.Sleep(time.Duration(rng.IntN(20000)) * time.Microsecond)
		if err := cmd.Process.Kill(); err != nil {
			t.Fatal(err)
		}
		// The child went on while we slept: the last version it stored is the last line it
		// wrote before it died (lines are written unbuffered, after each store).
		for sc.Scan() {
			if v, ok := strings.CutPrefix(sc.Text(), "done "); ok {
				done, _ = strconv.Atoi(v)
			}
		}
		_ = cmd.Wait()
		cancel()
		if done < 0 {
			t.Fatalf("round %d: the child stored nothing", round)
		}

		before, _ := os.ReadDir(filepath.Join(root, recordsDir))
		c, err := New(root, Config{})
		if err != nil {
			t.Fatal(err)
		}
		r, err := c.OpenRecord("rec")
		if err != nil {
			t.Fatalf("round %d, after kill (version %d done): %v", round, done, err)
		}
		v, err := strconv.Atoi(strings.TrimPrefix(string(r.Meta()), "v"))
		if err != nil || v < done || v > done+1 {
			t.Errorf("round %d: record is version %q, want %d or %d", round, r.Meta(), done, done+1)
		} else if !bytes.Equal(r.Data(), killVersion(v)) {
			t.Errorf("round %d: data of version %d torn", round, v)
		}
		r.Close()
		des, _ := os.ReadDir(filepath.Join(root, recordsDir))
		if len(des) != 1 {
			t.Errorf("round %d: records/ holds %v after the scan", round, des)
		}
		t.Logf("round %d: killed after version %d, found version %d, %d file(s) in records/ before the scan",
			round, done, v, len(before))
		c.Close()
	}
}

// killVersion is the data of version v of the record in TestRecordKill: sizes differ, so
// that a torn file would show in its length too.
func killVersion(v int) []byte { return recordData(uint64(v), 4<<20+v*4099) }

// recordChild writes versions of a record until killed (or a minute has passed), by PutRecord
// and by WriteRecord in turn.
func recordChild(t *testing.T, root string) {
	c, err := New(root, Config{})
	if err != nil {
		t.Fatal(err)
	}
	start := 0
	if r, err := c.OpenRecord("rec"); err == nil {
		start, _ = strconv.Atoi(strings.TrimPrefix(string(r.Meta()), "v"))
		start++
		r.Close()
	}
	deadline := time.Now().Add(time.Minute)
	for v := start; time.Now().Before(deadline); v++ {
		if v%2 == 0 {
			if err := c.PutRecord("rec", []byte("v"+strconv.Itoa(v)), killVersion(v)); err != nil {
				t.Fatal(err)
			}
		} else { // stored in the background, killed there too
			rec, stored, err := c.WriteRecord("rec", []byte("v"+strconv.Itoa(v)), killVersion(v))
			if err != nil {
				t.Fatal(err)
			}
			if err := <-stored; err != nil {
				t.Fatal(err)
			}
			rec.Close()
		}
		fmt.Printf("done %d\n", v)
	}
}

// TestEvictRecords: records are evicted with files in LRU order (opening a record is a use),
// an open record is never evicted, and the order survives a restart (mtimes).
func TestEvictRecords(t *testing.T) {
	fs := realFiles(t)
	a, b, cf := fs["usr/bin/tool"], fs["usr/bin/group-tool"], fs["usr/share/doc/deep/er/README"] // 3000, 1500, 200
	meta := []byte("m")
	rs := recordSize(meta, make([]byte, 1000))
	root := t.TempDir()
	c := newCache(t, root, Config{MaxSize: 3*rs + b.size()})
	putRecord(t, c, "r1", meta, recordData(1, 1000))
	fill(t, c, a)
	putRecord(t, c, "r2", meta, recordData(2, 1000))
	fill(t, c, b)
	openRecord(t, c, "r1").Close() // r1 used: a is now the least recently used
	putRecord(t, c, "r3", meta, recordData(3, 1000))
	if c.Has(a.sum) || !c.Has(b.sum) || !hasRecords(t, c, "r1", "r2", "r3") {
		t.Fatalf("has a=%v b=%v records %q, want a evicted", c.Has(a.sum), c.Has(b.sum), records(t, c))
	}
	// r2, held open, becomes the least recently used: it stays, b goes.
	r2 := openRecord(t, c, "r2")
	open(t, c, b).Close()
	openRecord(t, c, "r1").Close()
	openRecord(t, c, "r3").Close()
	fill(t, c, cf)
	if c.Has(b.sum) || !hasRecords(t, c, "r1", "r2", "r3") {
		t.Fatalf("has b=%v records %q, want b evicted and the open r2 kept", c.Has(b.sum), records(t, c))
	}
	if !bytes.Equal(r2.Data(), recordData(2, 1000)) {
		t.Error("open record's data changed")
	}
	r2.Close() // r2 now the most recent; r1 the least
	fill(t, c, b)
	if hasRecords(t, c, "r1") || !hasRecords(t, c, "r2", "r3") || !c.Has(cf.sum) || !c.Has(b.sum) {
		t.Errorf("records %q, has cf=%v b=%v, want r1 evicted", records(t, c), c.Has(cf.sum), c.Has(b.sum))
	}
	if _, err := os.Stat(c.recordPath("r1")); !os.IsNotExist(err) {
		t.Errorf("evicted record still on disk: %v", err)
	}
	if n := c.Stats().Evictions; n != 3 {
		t.Errorf("%d evictions, want 3", n)
	}
	c.Close()

	// After a restart with a smaller bound, the oldest by mtime go first.
	now := time.Now()
	for name, age := range map[string]time.Duration{"r2": time.Hour, "r3": 3 * time.Hour} {
		if err := os.Chtimes(filepath.Join(root, recordsDir, name), now.Add(-age), now.Add(-age)); err != nil {
			t.Fatal(err)
		}
	}
	for f, age := range map[*testFile]time.Duration{cf: 2 * time.Hour, b: 4 * time.Hour} {
		if err := os.Chtimes(completePath(root, f.sum), now.Add(-age), now.Add(-age)); err != nil {
			t.Fatal(err)
		}
	}
	c = newCache(t, root, Config{MaxSize: rs + cf.size()})
	if !c.Has(cf.sum) || c.Has(b.sum) || !slices.Equal(records(t, c), []string{"r2"}) {
		t.Errorf("after restart: has cf=%v b=%v records %q, want cf and r2", c.Has(cf.sum), c.Has(b.sum), records(t, c))
	}
}

func records(t *testing.T, c *Cache) []string {
	t.Helper()
	names, err := c.Records()
	if err != nil {
		t.Fatal(err)
	}
	return names
}

func hasRecords(t *testing.T, c *Cache, names ...string) bool {
	t.Helper()
	have := records(t, c)
	for _, n := range names {
		if !slices.Contains(have, n) {
			return false
		}
	}
	return true
}

func uintptrOf(b []byte) uintptr { return uintptr(unsafe.Pointer(unsafe.SliceData(b))) }

// FuzzRecordHeader: any header either fails or describes a file of its size with meta and
// data within their bounds.
func FuzzRecordHeader(f *testing.F) {
	h := newRecordHeader([]byte("meta"), [][]byte{make([]byte, 5000)})
	f.Add(h.encode(), h.size())
	f.Fuzz(func(t *testing.T, b []byte, size int64) {
		h, err := parseRecordHeader(b, size)
		if err != nil {
			return
		}
		if h.metaLen > maxRecordMeta || h.dataLen > maxRecordData || h.dataOff != alignRecord(h.metaLen) || h.size() != size {
			t.Errorf("accepted %+v for a file of %d bytes", h, size)
		}
	})
}

// TestWriteRecord: WriteRecord returns the new record open before it is stored, the name
// holding the old one until then; once stored, the open Record holds the cache's record (not
// evicted while open), and Close waits for a write under way, whose file it removes.
func TestWriteRecord(t *testing.T) {
	root := t.TempDir()
	c := newCache(t, root, Config{})
	release := make(chan struct{})
	c.hook = func(point string) error {
		if point == "record:written" {
			<-release
		}
		return nil
	}
	old, data := recordData(1, 5000), recordData(2, 300<<10+17)
	go close(release) // the first write goes through
	putRecord(t, c, "layer-a", []byte("v1"), old)
	release = make(chan struct{})

	rec, stored, err := c.WriteRecord("layer-a", []byte("v2"), data)
	if err != nil {
		t.Fatal(err)
	}
	if string(rec.Meta()) != "v2" || !bytes.Equal(rec.Data(), data) {
		t.Fatal("the written record reads back different")
	}
	if r := openRecord(t, c, "layer-a"); string(r.Meta()) != "v1" || !bytes.Equal(r.Data(), old) {
		t.Error("the name holds another record than the old one before the new one is stored")
	} else {
		r.Close()
	}
	close(release)
	if err := <-stored; err != nil {
		t.Fatal(err)
	}
	r := openRecord(t, c, "layer-a")
	if string(r.Meta()) != "v2" || !bytes.Equal(r.Data(), data) {
		t.Error("the stored record differs")
	}
	r.Close()
	c.mu.Lock()
	refs := c.records["layer-a"].refs
	c.mu.Unlock()
	if refs != 1 {
		t.Errorf("stored record has %d references, want 1 (the Record WriteRecord returned)", refs)
	}
	if want := recordSize([]byte("v2"), data); c.Usage() != want {
		t.Errorf("usage %d, want %d", c.Usage(), want)
	}
	rec.Close()
	if !bytes.Equal(r.Meta(), []byte("v2")) {
		t.Error("meta changed")
	}

	// A write under way when the cache closes: Close waits for it, and it is not stored.
	release = make(chan struct{})
	rec, stored, err = c.WriteRecord("layer-a", []byte("v3"), recordData(3, 100))
	if err != nil {
		t.Fatal(err)
	}
	closed := make(chan struct{})
	go func() { c.Close(); close(closed) }()
	select {
	case <-closed:
		t.Fatal("Close returned with a record write under way")
	case <-time.After(50 * time.Millisecond):
	}
	close(release)
	<-closed
	if err := <-stored; !errors.Is(err, ErrClosed) {
		t.Errorf("write under way at Close: %v, want ErrClosed", err)
	}
	if !bytes.Equal(rec.Data(), recordData(3, 100)) {
		t.Error("the written record reads back different after Close")
	}
	rec.Close()
	if des, _ := os.ReadDir(filepath.Join(root, recordsDir)); len(des) != 1 {
		t.Errorf("records/ holds %v", des)
	}
	c = newCache(t, root, Config{})
	r = openRecord(t, c, "layer-a")
	if string(r.Meta()) != "v2" {
		t.Errorf("after restart, record %q, want v2", r.Meta())
	}
	r.Close()
}

// A record written from parts is the record of their concatenation: the same data, checksum
// and size, after a restart too.
func TestRecordParts(t *testing.T) {
	root := t.TempDir()
	c := newCache(t, root, Config{})
	data := recordData(7, 200<<10+5)
	parts := [][]byte{data[:100<<10+3], nil, data[100<<10+3 : 150<<10], data[150<<10:]}
	if err := c.PutRecord("parts", []byte("m"), parts...); err != nil {
		t.Fatal(err)
	}
	if got := openRecord(t, c, "parts").Data(); !bytes.Equal(got, data) {
		t.Fatalf("data of %d bytes read back, want the %d of the parts joined", len(got), len(data))
	}
	c.Close()
	c2 := newCache(t, root, Config{})
	if got := openRecord(t, c2, "parts").Data(); !bytes.Equal(got, data) {
		t.Fatal("after a restart: not the parts joined")
	}
	if got, want := c2.Usage(), recordSize([]byte("m"), data); got < want {
		t.Errorf("usage %d, want at least the record's %d", got, want)
	}
}

// TestRecordUnresident: a record read whole is resident in the process until Unresident, after
// which its data is still read as it was, only the pages read again becoming resident.
func TestRecordUnresident(t *testing.T) {
	c := newCache(t, t.TempDir(), Config{})
	data := make([]byte, 32<<20)
	for i := range data {
		data[i] = byte(i * 7 >> 12)
	}
	putRecord(t, c, "big", []byte("{}"), data)
	r := openRecord(t, c, "big")
	before := testproc.RSSFile(t)
	if !bytes.Equal(r.Data(), data) {
		t.Fatal("data read back differs")
	}
	read := testproc.RSSFile(t)
	if read-before < int64(len(data))/2 {
		t.Skipf("reading the record's %d bytes made %d resident: RssFile does not count the mapping", len(data), read-before)
	}
	if err := r.Unresident(); err != nil {
		t.Fatal(err)
	}
	after := testproc.RSSFile(t)
	if read-after < int64(len(data))/2 {
		t.Errorf("resident file pages %d after reading the record, %d after Unresident: want %d fewer", read, after, len(data))
	}
	if !bytes.Equal(r.Data(), data) {
		t.Error("data read after Unresident differs")
	}
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	if err := r.Unresident(); err != nil {
		t.Errorf("Unresident after Close: %v", err)
	}
}
