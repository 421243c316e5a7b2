package cache

import (
	"container/list"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/layerstore/layerstore/chunked"
	"github.com/layerstore/layerstore/internal/byterange"
	"github.com/layerstore/layerstore/internal/control/protocol"
	"github.com/layerstore/layerstore/internal/ratelog"
)

// Cache is the store under one root directory. It is safe for concurrent use.
//
// Lock order: File.hmu or Record.mu or Cache.pinMu, then Cache.mu, then entry.mu, then
// entry.rmu. Cache.mu is never taken while an entry lock is held, so an entry's I/O never
// waits on the cache's bookkeeping, and usage is kept in atomics that entries update without
// Cache.mu.
type Cache struct {
	root string
	opts options
	lock *os.File

	// hook, when set (by tests only, before any use), is called at the named crash points
	// ("put:data-synced", "finish:hashed", "finish:verified", ...); an error stops the operation there, as a
	// crash would.
	hook func(point string) error
	// now, noSpaceBackoff and the reporter's interval are fixed by New; tests change them
	// before any use.
	now            func() time.Time
	noSpaceBackoff time.Duration

	full   noSpace         // the filesystem was found full: writes are refused for a while
	report *ratelog.Logger // events that recur with every write, logged at a bounded rate, by message

	// usage is the number of content bytes present in all entries (sum of their present
	// bytes) plus the size of the records; pinned is the part of it that pins hold.
	usage, pinned atomic.Int64
	// hits and misses count reads that found all or not all of their bytes; evictions the
	// files and records removed to stay within the size bound or make room.
	hits, misses, evictions atomic.Int64
	// completeFiles counts the entries that are complete: raised when an entry becomes
	// complete (it never becomes partial again), lowered when a complete entry is dropped,
	// so that Stats costs the same for ten files and for millions.
	completeFiles atomic.Int64

	// pinMu serialises Pin and Unpin, so that the pin files on disk and c.pins agree; it is
	// held across their file writes, never by eviction.
	pinMu sync.Mutex

	// writers counts the record writes under way (see WriteRecord); Close waits for them.
	writers sync.WaitGroup

	mu      sync.Mutex // guards the fields below
	closed  bool
	entries map[chunked.Sum]*entry
	records map[string]*record
	// recordWrites holds the record writes under way, by name: closed when stored or failed.
	recordWrites map[string]chan struct{}
	pins         map[string]*pin
	// lru holds the entries and records not pinned (*entry or *record); front = most
	// recently used.
	lru list.List
	// overBound: usage above the bound because of pins was logged (until it is within again).
	overBound bool
}

// New opens (creating if needed) the cache under root and takes an exclusive lock on it:
// a second Cache on the same root fails with [ErrLocked] until the first is closed. Complete
// files, recorded ranges of partial files, records and pins left by a previous Cache are
// kept; unrecorded bytes, damaged journals, record headers and pins, and temporary files are
// discarded.
func New(root string, cfg Config) (*Cache, error) {
	o, err := cfg.options()
	if err != nil {
		return nil, err
	}
	for _, d := range []string{root, filepath.Join(root, filesDir), filepath.Join(root, partialDir),
		filepath.Join(root, recordsDir), filepath.Join(root, pinsDir)} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return nil, fmt.Errorf("cache: %w", err)
		}
	}
	lock, err := lockRoot(filepath.Join(root, lockName))
	if err != nil {
		return nil, fmt.Errorf("cache: %w", err)
	}
	c := &Cache{root: root, opts: o, lock: lock, entries: map[chunked.Sum]*entry{},
		records: map[string]*record{}, recordWrites: map[string]chan struct{}{}, pins: map[string]*pin{}, now: time.Now, noSpaceBackoff: noSpaceBackoff,
		report: ratelog.New(o.logger, reportEvery)}
	if err := c.scan(); err != nil {
		_ = lock.Close()
		return nil, fmt.Errorf("cache: scanning %s: %w", root, err)
	}
	c.mu.Lock()
	for _, p := range c.pins {
		c.applyPinLocked(p, 1)
	}
	c.evictLocked()
	c.mu.Unlock()
	return c, nil
}

// Close releases the root directory. Open [File] handles fail with [ErrClosed] from then on
// (their Close still succeeds); open [Record]s keep their mapping until closed. Close writes nothing: what is on disk after Close is what a
// crash would leave.
func (c *Cache) Close() error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil
	}
	c.closed = true
	c.mu.Unlock()
	c.writers.Wait() // record writes in the background end, their files removed
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, e := range c.entries {
		e.mu.Lock()
		e.unloadLocked()
		e.mu.Unlock()
	}
	return c.lock.Close()
}

// Usage returns the number of content bytes the cache holds: the size of complete files
// plus the recorded ranges of partial ones plus the size of the records' files (other
// metadata and filesystem block rounding are not counted). Pinned content is included.
func (c *Cache) Usage() int64 { return c.usage.Load() }

// Stats returns the cache's current figures.
func (c *Cache) Stats() protocol.CacheStats {
	c.mu.Lock()
	files := len(c.entries)
	c.mu.Unlock()
	return protocol.CacheStats{
		Bytes: c.usage.Load(), MaxBytes: c.opts.maxSize, Files: files, Complete: int(c.completeFiles.Load()),
		Hits: c.hits.Load(), Misses: c.misses.Load(), Evictions: c.evictions.Load(),
	}
}

// Has reports whether the file with digest sum is stored complete.
func (c *Cache) Has(sum chunked.Sum) bool {
	c.mu.Lock()
	e := c.entries[sum]
	c.mu.Unlock()
	// Outside Cache.mu: an entry's lock can be held across an fsync, and Cache.mu must never
	// wait for one (every Open and Has would wait too).
	return e != nil && e.isComplete()
}

func (e *entry) isComplete() bool {
	e.mu.RLock()
	defer e.mu.RUnlock()
	return e.complete
}

// Open returns a handle on the file whose content has sha256 digest sum and size bytes,
// as an empty partial file if the cache has none (its files on disk are made by the first
// [File.Put]: opening a file only to read it writes nothing). The handle pins the file: it
// is not evicted until every handle on it is closed. Opening marks the file most recently
// used.
//
// A stored complete file, or one held open, with a different size fails with
// [ErrSizeMismatch]; an unpinned partial one is discarded and started again. An empty file
// (size 0) is complete at once if sum is the digest of no bytes, and fails with [ErrCorrupt]
// otherwise; so does a partial file that a crash left fully recorded but unverified and that
// turns out not to match (its content is dropped first).
func (c *Cache) Open(sum chunked.Sum, size int64) (*File, error) {
	if sum.IsZero() {
		return nil, errors.New("cache: zero digest")
	}
	if size < 0 || size > 1<<62 {
		return nil, fmt.Errorf("cache: invalid size %d", size)
	}
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil, ErrClosed
	}
	e := c.entries[sum]
	if e != nil && e.size != size {
		e.mu.RLock()
		complete := e.complete
		e.mu.RUnlock()
		if complete || e.refs > 0 {
			c.mu.Unlock()
			return nil, fmt.Errorf("%v: opened with size %d, stored with %d: %w", sum, size, e.size, ErrSizeMismatch)
		}
		c.opts.logger.Warn("cache: discarding partial file opened with another size",
			"file", sum, "size", size, "stored", e.size)
		c.dropLocked(e)
		e = nil
	}
	if e == nil {
		e = c.newEntryLocked(sum, size)
	}
	e.refs++
	c.lru.MoveToFront(e.elem)
	c.mu.Unlock()

	if err := e.load(); err != nil {
		c.release(e)
		return nil, err
	}
	if err := e.finish(); err != nil {
		c.release(e)
		return nil, err
	}
	return &File{e: e}, nil
}

// release drops one pin. The last one closes the entry's descriptors, records the time of
// use in the file's mtime (for the LRU order after a restart) and may evict.
func (c *Cache) release(e *entry) {
	c.mu.Lock()
	defer c.mu.Unlock()
	e.refs--
	if e.refs > 0 || c.closed {
		return
	}
	c.lru.MoveToFront(e.elem)
	e.mu.Lock()
	p := e.dataPathLocked()
	e.unloadLocked()
	e.mu.Unlock()
	now := time.Now()
	if err := os.Chtimes(p, now, now); err != nil && !errors.Is(err, fs.ErrNotExist) {
		c.opts.logger.Warn("cache: recording use", "file", e.sum, "err", err)
	}
	c.evictLocked()
}

// newEntryLocked registers a new entry, pinned if a pin names its digest.
func (c *Cache) newEntryLocked(sum chunked.Sum, size int64) *entry {
	e := &entry{c: c, sum: sum, size: size}
	e.elem = c.lru.PushFront(e)
	c.entries[sum] = e
	if n := c.filePinsLocked(sum); n > 0 {
		c.setEntryPinsLocked(e, n)
	}
	return e
}

// unpinnedUsage is the usage that the bound applies to: content not held by pins.
func (c *Cache) unpinnedUsage() int64 { return c.usage.Load() - c.pinned.Load() }

// maybeEvict evicts if usage is above the bound.
func (c *Cache) maybeEvict() {
	if c.unpinnedUsage() <= c.opts.maxSize {
		return
	}
	c.mu.Lock()
	c.evictLocked()
	c.mu.Unlock()
}

// evictLocked removes least-recently-used entries and records, neither open nor pinned,
// until the content not pinned is within the bound or nothing more can go. Pinned content
// is outside the bound: usage above the bound because of it is logged once (until usage is
// within the bound again).
func (c *Cache) evictLocked() {
	c.evictUntilLocked(func(int64) bool { return c.unpinnedUsage() <= c.opts.maxSize })
	switch usage := c.usage.Load(); {
	case usage <= c.opts.maxSize:
		c.overBound = false
	case !c.overBound && !c.closed && c.pinned.Load() > 0:
		c.overBound = true
		c.opts.logger.Info("cache: pinned content holds usage above the size bound",
			"usage", usage, "pinned", c.pinned.Load(), "bound", c.opts.maxSize)
	}
}

// evictUntilLocked removes least-recently-used unpinned entries until enough, given the
// content bytes removed so far, says so or nothing more can go. It returns how many entries
// it removed and their content bytes.
func (c *Cache) evictUntilLocked(enough func(freed int64) bool) (files int, freed int64) {
	if c.closed {
		return 0, 0
	}
	for el := c.lru.Back(); el != nil && !enough(freed); {
		v := el.Value
		el = el.Prev()
		switch v := v.(type) {
		case *entry:
			if v.refs > 0 || v.pins > 0 {
				continue
			}
			freed += v.present()
			c.dropLocked(v)
		case *record:
			if v.refs > 0 || v.pins > 0 {
				continue
			}
			freed += v.size
			c.dropRecordLocked(v)
		}
		c.evictions.Add(1)
		files++
	}
	return files, freed
}

// dropLocked forgets an unpinned entry and removes its files (journal first, so that a crash
// in between leaves a data file without journal, which the next scan removes).
func (c *Cache) dropLocked(e *entry) {
	p := partialPath(c.root, e.sum)
	for _, f := range []string{p + journalExt, p, completePath(c.root, e.sum)} {
		if err := removeIfExists(f); err != nil {
			c.opts.logger.Warn("cache: removing file", "path", f, "err", err)
		}
	}
	// No handle holds e (refs == 0), so nothing completes it meanwhile: complete is the
	// entry's last state, ordered before this by Cache.mu (see release).
	if e.complete {
		c.completeFiles.Add(-1)
	}
	e.setBytesLocked(0)
	c.lru.Remove(e.elem)
	delete(c.entries, e.sum)
}

// scan registers what a previous Cache left: complete files as they are, partial files whose
// journal is sound, records whose header is sound, pins, and removes the rest (temporary
// files, data files without a journal, journals without data, leftovers of a completion
// interrupted after its rename, damaged records and pins).
func (c *Cache) scan() error {
	if err := c.scanPins(); err != nil {
		return err
	}
	type found struct {
		v     any // *entry or *record
		mtime time.Time
	}
	var all []found
	recs, err := c.scanRecords()
	if err != nil {
		return err
	}
	for _, r := range recs {
		all = append(all, found{r.r, r.mtime})
	}
	complete := map[chunked.Sum]bool{}
	err = walkShards(filepath.Join(c.root, filesDir), func(p string, info fs.FileInfo) {
		sum, ok := parseName(info.Name())
		if !ok || !info.Mode().IsRegular() {
			if strings.HasSuffix(info.Name(), tmpExt) {
				c.removeStray(p)
			}
			return
		}
		e := &entry{c: c, sum: sum, size: info.Size(), complete: true}
		e.bytes.Store(info.Size()) // not pinned yet: pins apply after the scan
		complete[sum] = true
		all = append(all, found{e, info.ModTime()})
	})
	if err != nil {
		return err
	}
	err = walkShards(filepath.Join(c.root, partialDir), func(p string, info fs.FileInfo) {
		name := info.Name()
		sum, isJournal := parseName(strings.TrimSuffix(name, journalExt))
		isJournal = isJournal && strings.HasSuffix(name, journalExt)
		if !isJournal {
			// Data files are handled with their journal; anything else is a leftover.
			if s, ok := parseName(name); ok && fileExists(p+journalExt) && !complete[s] {
				return
			}
			c.removeStray(p)
			return
		}
		data := strings.TrimSuffix(p, journalExt)
		if complete[sum] {
			c.removeStray(p)
			c.removeStray(data)
			return
		}
		size, set, mtime, err := readJournal(p, data)
		if err != nil {
			c.opts.logger.Warn("cache: discarding partial file", "file", sum, "err", err)
			c.removeStray(p)
			c.removeStray(data)
			return
		}
		e := &entry{c: c, sum: sum, size: size}
		e.bytes.Store(set.Bytes())
		all = append(all, found{e, mtime})
	})
	if err != nil {
		return err
	}
	// Oldest first, each pushed to the front: the most recent ends at the front.
	slices.SortStableFunc(all, func(a, b found) int { return a.mtime.Compare(b.mtime) })
	for _, f := range all {
		switch v := f.v.(type) {
		case *entry:
			v.elem = c.lru.PushFront(v)
			c.entries[v.sum] = v
			c.usage.Add(v.present())
			if v.complete {
				c.completeFiles.Add(1)
			}
		case *record:
			v.elem = c.lru.PushFront(v)
			c.records[v.name] = v
			c.usage.Add(v.size)
		}
	}
	return nil
}

func (c *Cache) removeStray(p string) {
	if err := removeIfExists(p); err != nil {
		c.opts.logger.Warn("cache: removing leftover", "path", p, "err", err)
	}
}

// walkShards calls fn for each entry of each two-hex-digit subdirectory of dir.
func walkShards(dir string, fn func(p string, info fs.FileInfo)) error {
	shards, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	for _, sh := range shards {
		if !sh.IsDir() || len(sh.Name()) != 2 {
			continue
		}
		sd := filepath.Join(dir, sh.Name())
		des, err := os.ReadDir(sd)
		if err != nil {
			return err
		}
		for _, de := range des {
			info, err := de.Info()
			if errors.Is(err, fs.ErrNotExist) {
				continue
			}
			if err != nil {
				return err
			}
			fn(filepath.Join(sd, de.Name()), info)
		}
	}
	return nil
}

func fileExists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}

// readJournal reads and checks a partial file's journal against its data file, and returns
// the data file's mtime.
func readJournal(journal, data string) (int64, byterange.Set, time.Time, error) {
	b, err := os.ReadFile(journal)
	if err != nil {
		return 0, nil, time.Time{}, err
	}
	size, set, _, err := parseJournal(b)
	if err != nil {
		return 0, nil, time.Time{}, err
	}
	di, err := os.Stat(data)
	if err != nil {
		return 0, nil, time.Time{}, fmt.Errorf("data file: %w", err)
	}
	if di.Size() != size {
		return 0, nil, time.Time{}, fmt.Errorf("data file has %d bytes, journal says %d", di.Size(), size)
	}
	return size, set, di.ModTime(), nil
}
