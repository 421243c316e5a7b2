package cache

import (
	"os"
	"testing"
	"time"
)

func TestEvictLRU(t *testing.T) {
	fs := realFiles(t)
	a, b, cf := fs["usr/bin/tool"], fs["usr/bin/group-tool"], fs["usr/share/doc/deep/er/README"] // 3000, 1500, 200
	c := newCache(t, t.TempDir(), Config{MaxSize: a.size() + b.size() + cf.size() - 1})
	fill(t, c, a)
	fill(t, c, b)
	// Use a again: b becomes the least recently used.
	open(t, c, a).Close()
	fill(t, c, cf)
	if !c.Has(a.sum) || c.Has(b.sum) || !c.Has(cf.sum) {
		t.Errorf("after overflow: has a=%v b=%v c=%v, want the LRU file b evicted",
			c.Has(a.sum), c.Has(b.sum), c.Has(cf.sum))
	}
	if n := c.Stats().Evictions; n != 1 {
		t.Errorf("%d evictions counted, want 1", n)
	}
	if c.Usage() != a.size()+cf.size() {
		t.Errorf("usage = %d, want %d", c.Usage(), a.size()+cf.size())
	}
	if _, err := os.Stat(completePath(c.root, b.sum)); !os.IsNotExist(err) {
		t.Errorf("evicted file still on disk: %v", err)
	}
}

func TestEvictSkipsPinned(t *testing.T) {
	fs := realFiles(t)
	a, b := fs["usr/bin/tool"], fs["usr/bin/group-tool"]
	c := newCache(t, t.TempDir(), Config{MaxSize: a.size() + 100})
	fill(t, c, a)
	pin := open(t, c, a) // a is the LRU file but pinned
	fill(t, c, b)        // over the bound: only b is evictable once closed
	if !c.Has(a.sum) || c.Has(b.sum) {
		t.Errorf("has a=%v b=%v, want the pinned a kept and b evicted", c.Has(a.sum), c.Has(b.sum))
	}
	if p, err := pin.Path(); err != nil {
		t.Error(err)
	} else if _, err := os.Stat(p); err != nil {
		t.Errorf("pinned file removed: %v", err)
	}
	// Over the bound while everything is pinned: nothing goes.
	hb := open(t, c, b)
	putAll(t, hb, b.chunks["zstd"])
	if c.Usage() != a.size()+b.size() || !c.Has(a.sum) || !c.Has(b.sum) {
		t.Errorf("pinned files evicted: usage %d", c.Usage())
	}
	pin.Close() // a unpinned, and older than b
	if c.Has(a.sum) || !c.Has(b.sum) {
		t.Errorf("after unpinning: has a=%v b=%v, want a evicted", c.Has(a.sum), c.Has(b.sum))
	}
}

// TestEvictPartial: partial files count by their present bytes and are evicted like others.
func TestEvictPartial(t *testing.T) {
	fs := realFiles(t)
	big, tool := fs["usr/share/big.bin"], fs["usr/bin/tool"]
	c := newCache(t, t.TempDir(), Config{MaxSize: 64<<10 + tool.size() - 1})
	h := open(t, c, big)
	putAll(t, h, big.chunks["estargz"][:1])
	h.Close()
	if c.Usage() != 64<<10 {
		t.Fatalf("usage = %d", c.Usage())
	}
	fill(t, c, tool)
	if c.Usage() != tool.size() {
		t.Errorf("usage = %d, want the partial file evicted", c.Usage())
	}
	if _, err := os.Stat(partialPath(c.root, big.sum) + journalExt); !os.IsNotExist(err) {
		t.Errorf("journal of evicted partial file remains: %v", err)
	}
}

// TestRestartLRUOrder: after a restart, the order comes from the files' mtimes, and the
// bound applies at once.
func TestRestartLRUOrder(t *testing.T) {
	fs := realFiles(t)
	a, b, cf := fs["usr/bin/tool"], fs["usr/bin/group-tool"], fs["usr/share/doc/deep/er/README"]
	root := t.TempDir()
	c := newCache(t, root, Config{})
	fill(t, c, a)
	fill(t, c, b)
	fill(t, c, cf)
	c.Close()
	now := time.Now()
	for f, age := range map[*testFile]time.Duration{a: time.Hour, b: 3 * time.Hour, cf: 2 * time.Hour} {
		if err := os.Chtimes(completePath(root, f.sum), now.Add(-age), now.Add(-age)); err != nil {
			t.Fatal(err)
		}
	}
	c = newCache(t, root, Config{MaxSize: a.size() + cf.size()})
	if !c.Has(a.sum) || c.Has(b.sum) || !c.Has(cf.sum) {
		t.Errorf("has a=%v b=%v c=%v, want the oldest (b) evicted", c.Has(a.sum), c.Has(b.sum), c.Has(cf.sum))
	}
}
