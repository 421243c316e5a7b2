package cache

import (
	"bytes"
	"errors"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/layerstore/layerstore/chunked"
	"github.com/layerstore/layerstore/internal/testutil/testlog"
)

const msgOverBound = "pinned content holds usage above the size bound"

// checkAccounting checks, with the cache quiescent, that usage is the sum of the entries'
// and records' bytes, that the pinned usage is the sum over those pins name, and that exactly
// the entries and records not pinned are in the LRU list.
func checkAccounting(t *testing.T, c *Cache) {
	t.Helper()
	c.mu.Lock()
	defer c.mu.Unlock()
	var usage, pinned int64
	inLRU := map[any]int{}
	for el := c.lru.Front(); el != nil; el = el.Next() {
		inLRU[el.Value]++
	}
	for _, e := range c.entries {
		usage += e.present()
		if want := c.filePinsLocked(e.sum); e.pins != want || (e.bytes.Load() < 0) != (want > 0) {
			t.Errorf("%v: %d pins, bit %v, want %d", e.sum, e.pins, e.bytes.Load() < 0, want)
		}
		if e.pins > 0 {
			pinned += e.present()
		}
		if (inLRU[e] == 1) != (e.pins == 0) || inLRU[e] > 1 {
			t.Errorf("%v: %d pins, %d times in the LRU list", e.sum, e.pins, inLRU[e])
		}
	}
	for _, r := range c.records {
		usage += r.size
		if want := c.recordPinsLocked(r.name); r.pins != want {
			t.Errorf("record %s: %d pins, want %d", r.name, r.pins, want)
		}
		if r.pins > 0 {
			pinned += r.size
		}
		if (inLRU[r] == 1) != (r.pins == 0) || inLRU[r] > 1 {
			t.Errorf("record %s: %d pins, %d times in the LRU list", r.name, r.pins, inLRU[r])
		}
	}
	if len(inLRU) > len(c.entries)+len(c.records) {
		t.Errorf("LRU list holds %d items, the cache %d", len(inLRU), len(c.entries)+len(c.records))
	}
	if usage != c.usage.Load() || pinned != c.pinned.Load() {
		t.Errorf("usage %d pinned %d, want %d and %d", c.usage.Load(), c.pinned.Load(), usage, pinned)
	}
}

func countLines(logs *testlog.Handler, s string) int {
	_, lines := logs.Count()
	n := 0
	for _, l := range lines {
		if strings.Contains(l, s) {
			n++
		}
	}
	return n
}

// TestPinOverfill: the files (complete, partial, and stored after the pin) and the record a
// pin names survive a cache filled past its bound, pinned content is outside the bound
// (other content still gets the whole bound; usage above it is logged once), and Unpin makes
// them evictable again.
func TestPinOverfill(t *testing.T) {
	tf := realFiles(t)
	a, b, cf, sparse := tf["usr/bin/tool"], tf["usr/bin/group-tool"], tf["usr/share/doc/deep/er/README"], tf["usr/share/sparse.img"]
	logs := &testlog.Handler{}
	bound := b.size() + 100
	c := newCache(t, t.TempDir(), Config{MaxSize: bound, Logger: slog.New(logs)})
	if err := c.Pin("img", []string{"rec"}, []chunked.Sum{a.sum, cf.sum, sparse.sum}); err != nil {
		t.Fatal(err)
	}
	putRecord(t, c, "rec", []byte("m"), recordData(1, 10000))
	fill(t, c, a)
	h := open(t, c, sparse)
	putAll(t, h, sparse.chunks["estargz"][:2])
	h.Close()
	putRecord(t, c, "other", nil, nil) // 4096 bytes: over the bound on its own
	fill(t, c, b)
	fill(t, c, cf)
	pinned := recordSize([]byte("m"), make([]byte, 10000)) + a.size() + 2*64<<10 + cf.size()
	if !c.Has(a.sum) || !c.Has(cf.sum) || !hasRecords(t, c, "rec") || !c.Has(b.sum) || hasRecords(t, c, "other") {
		t.Fatalf("has a=%v cf=%v b=%v records %q: want the pinned kept, b (within the bound) too, other evicted",
			c.Has(a.sum), c.Has(cf.sum), c.Has(b.sum), records(t, c))
	}
	if got := c.Usage(); got != pinned+b.size() {
		t.Errorf("usage %d, want the pinned %d plus b", got, pinned)
	}
	if n := countLines(logs, msgOverBound); n != 1 {
		t.Errorf("usage above the bound because of pins logged %d times, want once", n)
	}
	h = open(t, c, sparse)
	if got := h.Missing(0, sparse.size()); len(got) != 1 || got[0].Offset != 2*64<<10 {
		t.Errorf("pinned partial file lost content: missing %v", got)
	}
	h.Close()
	checkAccounting(t, c)
	pins, err := c.Pins()
	if err != nil {
		t.Fatal(err)
	}
	want := []PinInfo{{Name: "img", Records: []string{"rec"}, RecordsPresent: 1, Files: 3, FilesComplete: 2,
		Bytes: a.size() + cf.size() + 2*64<<10}}
	if !slices.EqualFunc(pins, want, pinInfoEqual) {
		t.Errorf("Pins = %+v, want %+v", pins, want)
	}

	// Replaced by a pin of a alone: the rest goes at once (over the bound), before b, which
	// was not pinned.
	if err := c.Pin("img", nil, []chunked.Sum{a.sum}); err != nil {
		t.Fatal(err)
	}
	if !c.Has(a.sum) || c.Has(cf.sum) || hasRecords(t, c, "rec") || c.Usage() != a.size()+b.size() {
		t.Errorf("after re-pinning: has a=%v cf=%v records %q usage %d", c.Has(a.sum), c.Has(cf.sum), records(t, c), c.Usage())
	}
	checkAccounting(t, c)
	if err := c.Unpin("img"); err != nil {
		t.Fatal(err)
	}
	if c.Has(a.sum) || c.Usage() > bound {
		t.Errorf("after Unpin: has a=%v usage %d", c.Has(a.sum), c.Usage())
	}
	if err := c.Unpin("img"); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("second Unpin = %v, want fs.ErrNotExist", err)
	}
	checkAccounting(t, c)
	// Within the bound again, then above it again because of a pin: logged again.
	if err := c.Pin("img2", nil, []chunked.Sum{a.sum}); err != nil {
		t.Fatal(err)
	}
	fill(t, c, a)
	if n := countLines(logs, msgOverBound); n != 2 {
		t.Errorf("logged %d times, want twice", n)
	}
}

func pinInfoEqual(a, b PinInfo) bool {
	return a.Name == b.Name && slices.Equal(a.Records, b.Records) && a.RecordsPresent == b.RecordsPresent &&
		a.Files == b.Files && a.FilesComplete == b.FilesComplete && a.Bytes == b.Bytes
}

// TestPinRestart: pins survive a restart and hold at once (the bound applied at start evicts
// only what they do not name); a damaged pin file is dropped, logged and removed; temporary
// files are removed.
func TestPinRestart(t *testing.T) {
	tf := realFiles(t)
	a, b, cf := tf["usr/bin/tool"], tf["usr/bin/group-tool"], tf["usr/share/doc/deep/er/README"]
	root := t.TempDir()
	c := newCache(t, root, Config{})
	for _, f := range []*testFile{a, b, cf} {
		fill(t, c, f)
	}
	putRecord(t, c, "rec", nil, recordData(1, 100))
	name := "registry.example:5000/ns/image@sha256:" + strings.Repeat("ab", 32) // any bytes
	if err := c.Pin(name, []string{"rec", "absent"}, []chunked.Sum{a.sum}); err != nil {
		t.Fatal(err)
	}
	if err := c.Pin("second", nil, []chunked.Sum{b.sum}); err != nil {
		t.Fatal(err)
	}
	c.Close()
	dir := filepath.Join(root, pinsDir)
	flipBit(t, filepath.Join(dir, pinFileName("second")), 30)
	if err := os.WriteFile(filepath.Join(dir, ".x.1"+tmpExt), []byte("torn"), 0o600); err != nil {
		t.Fatal(err)
	}

	logs := &testlog.Handler{}
	c = newCache(t, root, Config{MaxSize: 1, Logger: slog.New(logs)})
	if !c.Has(a.sum) || c.Has(b.sum) || c.Has(cf.sum) || !slices.Equal(records(t, c), []string{"rec"}) {
		t.Errorf("after restart: has a=%v b=%v cf=%v records %q, want a and rec kept by the pin",
			c.Has(a.sum), c.Has(b.sum), c.Has(cf.sum), records(t, c))
	}
	pins, _ := c.Pins()
	if len(pins) != 1 || pins[0].Name != name || !slices.Equal(pins[0].Records, []string{"absent", "rec"}) || pins[0].RecordsPresent != 1 {
		t.Errorf("Pins = %+v", pins)
	}
	if warns, lines := logs.Count(); warns != 1 || countLines(logs, "damaged pin") != 1 {
		t.Errorf("logged %q, want one warning about the damaged pin", lines)
	}
	if des, _ := os.ReadDir(dir); len(des) != 1 || des[0].Name() != pinFileName(name) {
		t.Errorf("pins/ holds %v, want only the sound pin", des)
	}
	checkAccounting(t, c)
	// The absent record, stored later, is pinned too.
	putRecord(t, c, "absent", nil, nil)
	if !hasRecords(t, c, "absent") {
		t.Error("pinned record evicted as soon as stored")
	}
	checkAccounting(t, c)
}

// TestPinConcurrent: Pin, Unpin and Pins concurrent with stores, opens and eviction (run
// under -race) keep the accounting exact.
func TestPinConcurrent(t *testing.T) {
	all := realFiles(t)
	var files []*testFile
	for _, f := range all {
		files = append(files, f)
	}
	sums := make([]chunked.Sum, len(files))
	for i, f := range files {
		sums[i] = f.sum
	}
	c := newCache(t, t.TempDir(), Config{MaxSize: 200 << 10})
	stop := make(chan struct{})
	var wg sync.WaitGroup
	errs := make(chan error, 100)
	for w := range 3 {
		wg.Go(func() {
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				f := files[(i*7+w)%len(files)]
				h, err := c.Open(f.sum, f.size())
				if err != nil {
					errs <- err
					return
				}
				for _, ch := range f.chunks[[]string{"zstd", "estargz"}[(i+w)%2]] {
					if err := h.Put(ch); err != nil {
						errs <- err
						break
					}
				}
				h.Close()
				name := []string{"r0", "r1", "r2"}[i%3]
				if err := c.PutRecord(name, nil, recordData(uint64(i), 1000*(i%5))); err != nil {
					errs <- err
				}
				if r, err := c.OpenRecord(name); err == nil {
					r.Close()
				}
			}
		})
	}
	wg.Go(func() {
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			n := []string{"p0", "p1"}[i%2]
			lo := i % len(sums)
			if err := c.Pin(n, []string{"r0", "r2"}[i%2:], sums[lo:min(lo+4, len(sums))]); err != nil {
				errs <- err
			}
			if i%3 == 0 {
				if err := c.Unpin(n); err != nil {
					errs <- err
				}
			}
			if _, err := c.Pins(); err != nil {
				errs <- err
			}
		}
	})
	time.Sleep(2 * time.Second)
	close(stop)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	checkAccounting(t, c)
	for _, n := range []string{"p0", "p1"} {
		if err := c.Unpin(n); err != nil && !errors.Is(err, fs.ErrNotExist) {
			t.Error(err)
		}
	}
	checkAccounting(t, c)
	if c.pinned.Load() != 0 || c.Usage() > 200<<10 {
		t.Errorf("pinned %d usage %d after unpinning all", c.pinned.Load(), c.Usage())
	}
}

// FuzzParsePin: any bytes either parse into a pin that encodes back to them, or fail; never
// a panic or an allocation beyond what the bytes justify.
func FuzzParsePin(f *testing.F) {
	p := &pin{name: "img", records: []string{"a", "b-1"}, files: []chunked.Sum{{1}, {2}}}
	f.Add(p.encode())
	f.Add((&pin{name: "x"}).encode())
	f.Fuzz(func(t *testing.T, b []byte) {
		p, err := parsePin(b)
		if err != nil {
			return
		}
		if got := p.encode(); !bytes.Equal(got, b) {
			t.Errorf("parsed %+v encodes to %x, not %x", p, got, b)
		}
	})
}
