package cache

import (
	"container/list"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/layerstore/layerstore/chunked"
	"github.com/layerstore/layerstore/internal/byterange"
	"github.com/layerstore/layerstore/verify"
)

// entry is the cache's state for one digest, shared by all handles on it.
type entry struct {
	c    *Cache
	sum  chunked.Sum
	size int64 // immutable

	// Guarded by Cache.mu.
	refs    int
	elem    *list.Element
	storing bool // a PutFiles is writing the whole file

	// pins counts the pins that name the entry's digest (guarded by Cache.mu); a pinned
	// entry is out of the LRU list.
	pins int

	// bytes is this entry's share of Cache.usage (see present), with the sign bit set while
	// the entry is pinned, so that a change of the bytes and a change of the pin are ordered
	// and each byte counts in Cache.pinned exactly when the entry is pinned. The bytes change
	// under rmu (recording ranges), under mu held exclusively (load, reset) or under
	// Cache.mu with refs == 0 (drop); the sign bit only under Cache.mu.
	bytes atomic.Int64

	// mu guards the files: held shared for reads and writes of the data, exclusively to
	// open, close, complete or drop them.
	mu       sync.RWMutex
	loaded   bool // data (and journal, if partial) are open
	complete bool // the data file is files/<hex>, verified
	data     *os.File
	journal  *os.File

	// rmu guards the range record; taken with mu held shared.
	rmu       sync.Mutex
	ranges    byterange.Set
	jlen      int64         // valid length of the journal; the next record goes there
	verifying chan struct{} // a finish is hashing the content; closed once it has committed or failed
	// hashed holds the present ranges of the partial file known to hash to a chunk digest:
	// written whole from a verified chunk, or hashed by a read since the file was loaded.
	// Present bytes are never rewritten while the file is loaded, so a reader asking for the
	// same range and digest needs no hashing (see File.ReadChunkAt). Cleared with ranges.
	hashed map[byterange.Range]chunked.Sum
}

func (e *entry) dataPathLocked() string {
	if e.complete {
		return completePath(e.c.root, e.sum)
	}
	return partialPath(e.c.root, e.sum)
}

// load opens the entry's files. A file with no usable partial file gets none yet: the first
// Put creates it (ensurePartial), so that opening a file only to read it costs no fsync.
func (e *entry) load() error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.loaded {
		return nil
	}
	if e.complete {
		f, err := os.Open(completePath(e.c.root, e.sum))
		if err != nil {
			return fmt.Errorf("cache: %w", err)
		}
		e.data, e.loaded = f, true
		return nil
	}
	err := e.openPartialLocked()
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		e.c.opts.logger.Warn("cache: discarding partial file", "file", e.sum, "err", err)
	}
	switch {
	case err == nil:
	case e.size == 0:
		// Complete at once (Open finishes it): it needs its data file now.
		if err := e.createPartialLocked(); err != nil {
			return fmt.Errorf("cache: creating partial file for %v: %w", e.sum, err)
		}
	default:
		// Journal first, as for any removal; the first Put creates fresh files.
		p := partialPath(e.c.root, e.sum)
		if err := errors.Join(removeIfExists(p+journalExt), removeIfExists(p)); err != nil {
			return fmt.Errorf("cache: discarding partial file of %v: %w", e.sum, err)
		}
		e.ranges, e.hashed, e.jlen = nil, nil, journalRec
		e.setBytesLocked(0)
	}
	e.loaded = true
	return nil
}

// errNoPartial reports a write to an entry whose partial file does not exist yet.
var errNoPartial = errors.New("cache: no partial file yet")

// ensurePartial creates the entry's partial file if it has none yet.
func (e *entry) ensurePartial() error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if !e.loaded {
		return ErrClosed
	}
	if e.complete || e.data != nil {
		return nil
	}
	if err := e.c.refuseIfFull(); err != nil {
		return err
	}
	if err := e.createPartialLocked(); err != nil {
		return fmt.Errorf("cache: creating partial file for %v: %w", e.sum, err)
	}
	return nil
}

// openPartialLocked opens an existing partial file and its journal, cutting a torn tail off
// the journal.
func (e *entry) openPartialLocked() error {
	p := partialPath(e.c.root, e.sum)
	j, err := os.OpenFile(p+journalExt, os.O_RDWR, 0)
	if err != nil {
		return err
	}
	b, err := io.ReadAll(j)
	if err == nil {
		var size int64
		var good int
		e.hashed = nil
		size, e.ranges, good, err = parseJournal(b)
		if err == nil && size != e.size {
			err = fmt.Errorf("journal says %d bytes, want %d", size, e.size)
		}
		if err == nil && good < len(b) {
			if err = j.Truncate(int64(good)); err == nil {
				err = j.Sync()
			}
		}
		e.jlen = int64(good)
	}
	var d *os.File
	if err == nil {
		d, err = os.OpenFile(p, os.O_RDWR, 0)
	}
	if err == nil {
		var info fs.FileInfo
		if info, err = d.Stat(); err == nil && info.Size() != e.size {
			err = fmt.Errorf("data file has %d bytes, want %d", info.Size(), e.size)
		}
	}
	if err != nil {
		_ = j.Close()
		if d != nil {
			_ = d.Close()
		}
		e.ranges, e.hashed = nil, nil
		return err
	}
	e.data, e.journal = d, j
	e.setBytesLocked(e.ranges.Bytes())
	return nil
}

// createPartialLocked replaces any partial file with an empty one: a sparse data file of the
// right size, then a journal holding only the header, renamed into place and made durable.
func (e *entry) createPartialLocked() error {
	p := partialPath(e.c.root, e.sum)
	if err := removeIfExists(p + journalExt); err != nil {
		return err
	}
	e.ranges, e.hashed, e.jlen = nil, nil, journalRec
	e.setBytesLocked(0)
	if err := ensureDir(filepath.Dir(p)); err != nil {
		return err
	}
	d, err := os.OpenFile(p, os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return err
	}
	err = d.Truncate(e.size)
	if err == nil {
		err = d.Sync()
	}
	var j *os.File
	if err == nil {
		j, err = createJournal(p+journalExt, e.size)
	}
	if err == nil {
		err = syncDir(filepath.Dir(p))
	}
	if err != nil {
		_ = d.Close()
		if j != nil {
			_ = j.Close()
		}
		return err
	}
	e.data, e.journal = d, j
	return nil
}

func createJournal(path string, size int64) (*os.File, error) {
	tmp := path + tmpExt
	j, err := os.OpenFile(tmp, os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return nil, err
	}
	_, err = j.Write(journalHeader(size))
	if err == nil {
		err = j.Sync()
	}
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err != nil {
		_ = j.Close()
		_ = removeIfExists(tmp) // best effort; the next scan removes leftovers
		return nil, err
	}
	return j, nil
}

// pinnedBit is the bit of entry.bytes that says the entry is pinned.
const pinnedBit = math.MinInt64

// present returns the entry's content bytes.
func (e *entry) present() int64 { return e.bytes.Load() &^ pinnedBit }

// addBytes adds delta to the entry's content bytes and to the cache's usage, and to its
// pinned usage if the entry is pinned at that moment.
func (e *entry) addBytes(delta int64) {
	if e.bytes.Add(delta) < 0 {
		e.c.pinned.Add(delta)
	}
	e.c.usage.Add(delta)
}

// setBytesLocked sets the entry's accounted bytes (mu held exclusively, or Cache.mu with
// refs == 0).
func (e *entry) setBytesLocked(n int64) {
	for {
		old := e.bytes.Load()
		if e.bytes.CompareAndSwap(old, old&pinnedBit|n) {
			delta := n - old&^pinnedBit
			if old < 0 {
				e.c.pinned.Add(delta)
			}
			e.c.usage.Add(delta)
			return
		}
	}
}

// setPinnedLocked sets or clears the entry's pinned bit and moves its bytes into or out of
// the cache's pinned usage (Cache.mu held).
func (e *entry) setPinnedLocked(on bool) {
	for {
		old := e.bytes.Load()
		nv := old &^ pinnedBit
		if on {
			nv |= pinnedBit
		}
		if old == nv {
			return
		}
		if e.bytes.CompareAndSwap(old, nv) {
			if on {
				e.c.pinned.Add(old &^ pinnedBit)
			} else {
				e.c.pinned.Add(-(old &^ pinnedBit))
			}
			return
		}
	}
}

// unloadLocked closes the entry's files (mu held exclusively).
func (e *entry) unloadLocked() {
	if !e.loaded {
		return
	}
	if e.data != nil {
		_ = e.data.Close() // read-only use or already synced: nothing to lose
	}
	if e.journal != nil {
		_ = e.journal.Close()
	}
	e.data, e.journal, e.loaded, e.ranges, e.hashed = nil, nil, false, nil, nil
}

// put writes the parts of verified chunks not yet present, makes them durable (one sync of
// the data, then one of the journal recording them all), records them, and completes the file
// when that fills it. A full filesystem makes room first (see withRoom); a write that fails
// records nothing.
func (e *entry) put(cs []verify.ChunkData) error {
	var need int64
	for _, c := range cs {
		ref, b := c.Ref(), c.Bytes()
		if ref.Size <= 0 || int64(len(b)) != ref.Size || ref.FileOffset < 0 || ref.FileOffset > e.size-ref.Size {
			return fmt.Errorf("%v: chunk at %d of %d bytes (%d given) in a %d-byte file: %w",
				e.sum, ref.FileOffset, ref.Size, len(b), e.size, ErrBadChunk)
		}
		need += ref.Size + journalRec
	}
	var full bool
	err := e.c.withRoom(need, func() (err error) {
		full, err = e.write(cs)
		for errors.Is(err, errNoPartial) {
			if err = e.ensurePartial(); err == nil {
				full, err = e.write(cs)
			}
		}
		return err
	})
	if err != nil {
		return err
	}
	if full {
		err = e.finish()
	}
	e.c.maybeEvict()
	return err
}

// write stores the parts of cs not yet present; it reports whether the file is then full. A
// chunk all of which was missing is known, from then on, to hash to its digest.
func (e *entry) write(cs []verify.ChunkData) (full bool, err error) {
	e.mu.RLock()
	defer e.mu.RUnlock()
	if !e.loaded {
		return false, ErrClosed
	}
	if e.complete {
		return false, nil
	}
	// The gaps each chunk fills: what neither the file nor an earlier chunk of cs holds.
	type part struct {
		c    verify.ChunkData
		gaps []byterange.Range
	}
	var parts []part
	e.rmu.Lock()
	pending := e.ranges // a copy once a chunk's gaps are added to it (Add works in place)
	for i, c := range cs {
		ref := c.Ref()
		if gaps := pending.Missing(ref.FileOffset, ref.FileOffset+ref.Size); len(gaps) > 0 {
			if i < len(cs)-1 {
				if len(parts) == 0 {
					pending = slices.Clone(pending)
				}
				for _, g := range gaps {
					pending = pending.Add(g)
				}
			}
			parts = append(parts, part{c, gaps})
		}
	}
	full = len(e.ranges.Missing(0, e.size)) == 0
	e.rmu.Unlock()
	if len(parts) == 0 {
		return full, nil
	}
	if e.data == nil {
		return false, errNoPartial
	}
	if err := e.c.refuseIfFull(); err != nil {
		return false, fmt.Errorf("cache: writing %v: %w", e.sum, err)
	}
	// Present bytes are never rewritten, so concurrent readers see stable content.
	var rec []byte
	for _, p := range parts {
		off, b := p.c.Ref().FileOffset, p.c.Bytes()
		for _, g := range p.gaps {
			if _, err := e.data.WriteAt(b[g.Offset-off:g.End()-off], g.Offset); err != nil {
				return false, fmt.Errorf("cache: writing %v: %w", e.sum, err)
			}
			rec = appendRecord(rec, g)
		}
	}
	if err := e.data.Sync(); err != nil {
		return false, fmt.Errorf("cache: syncing %v: %w", e.sum, err)
	}
	if err := e.c.crashPoint("put:data-synced"); err != nil {
		return false, err
	}
	e.rmu.Lock()
	defer e.rmu.Unlock()
	// Written at jlen rather than appended: a failed write leaves jlen alone and the next
	// records overwrite the torn ones.
	if _, err := e.journal.WriteAt(rec, e.jlen); err != nil {
		return false, fmt.Errorf("cache: recording ranges of %v: %w", e.sum, err)
	}
	if err := e.journal.Sync(); err != nil {
		return false, fmt.Errorf("cache: syncing journal of %v: %w", e.sum, err)
	}
	e.jlen += int64(len(rec))
	before := e.ranges.Bytes()
	for _, p := range parts {
		for _, g := range p.gaps {
			e.ranges = e.ranges.Add(g)
		}
	}
	e.addBytes(e.ranges.Bytes() - before)
	for _, p := range parts {
		ref := p.c.Ref()
		if whole := (byterange.Range{Offset: ref.FileOffset, Length: ref.Size}); len(p.gaps) == 1 && p.gaps[0] == whole {
			e.knowLocked(whole, ref.Digest)
		}
	}
	return len(e.ranges.Missing(0, e.size)) == 0, nil
}

// knowLocked records that present range r hashes to sum (rmu held, mu held shared).
func (e *entry) knowLocked(r byterange.Range, sum chunked.Sum) {
	if e.hashed == nil {
		e.hashed = map[byterange.Range]chunked.Sum{}
	}
	e.hashed[r] = sum
}

func (c *Cache) crashPoint(name string) error {
	if c.hook == nil {
		return nil
	}
	return c.hook(name)
}

// finish completes a full partial file: it hashes the content (readers continue meanwhile;
// no writer can change a full file), then, if it matches, renames the data file into files/
// and removes the journal; if not, it drops the content and returns [ErrCorrupt]. It does
// nothing for a file that is not full or is complete; for one another caller is finishing,
// it waits for that caller (the file is then complete, unless its content was corrupt): a
// Put that fills a file returns once the file is complete, whoever completes it.
func (e *entry) finish() error {
	e.mu.RLock()
	if !e.loaded || e.complete {
		e.mu.RUnlock()
		return nil
	}
	e.rmu.Lock()
	if busy := e.verifying; busy != nil || len(e.ranges.Missing(0, e.size)) > 0 {
		e.rmu.Unlock()
		e.mu.RUnlock()
		if busy != nil {
			<-busy
		}
		return nil
	}
	busy := make(chan struct{})
	e.verifying = busy
	e.rmu.Unlock()
	h := sha256.New()
	_, err := io.Copy(h, io.NewSectionReader(e.data, 0, e.size))
	if herr := e.c.crashPoint("finish:hashed"); herr != nil && err == nil {
		err = herr
	}
	e.mu.RUnlock()

	e.mu.Lock()
	defer e.mu.Unlock()
	e.rmu.Lock()
	e.verifying = nil
	e.rmu.Unlock()
	defer close(busy) // before the unlock: a waiter that then looks sees the outcome
	if !e.loaded {
		return ErrClosed
	}
	if e.complete { // completed meanwhile by PutFiles, which replaced the partial file
		return nil
	}
	if err != nil {
		return fmt.Errorf("cache: hashing %v: %w", e.sum, err)
	}
	if got := chunked.Sum(h.Sum(nil)); got != e.sum {
		e.unloadLocked()
		if err := e.createPartialLocked(); err != nil {
			return fmt.Errorf("cache: %v: content hashes to %v: %w (and resetting failed: %v)", e.sum, got, ErrCorrupt, err)
		}
		e.loaded = true
		return fmt.Errorf("cache: %v: content hashes to %v: %w", e.sum, got, ErrCorrupt)
	}
	if err := e.c.crashPoint("finish:verified"); err != nil {
		return err
	}
	return e.commitLocked()
}

// setCompleteLocked marks the entry complete (e.mu held exclusively; it was not) and counts
// it in the cache's complete files.
func (e *entry) setCompleteLocked() {
	e.complete = true
	e.c.completeFiles.Add(1)
}

// commitLocked moves a verified partial file into files/. The rename is the commit point:
// before it the file is partial, after it complete; the journal left behind by a crash
// right after it is removed by the next scan.
func (e *entry) commitLocked() error {
	src, dst := partialPath(e.c.root, e.sum), completePath(e.c.root, e.sum)
	if err := e.data.Chmod(0o400); err != nil {
		return fmt.Errorf("cache: %w", err)
	}
	if err := ensureDir(filepath.Dir(dst)); err != nil {
		return fmt.Errorf("cache: %w", err)
	}
	if err := os.Rename(src, dst); err != nil {
		return fmt.Errorf("cache: completing %v: %w", e.sum, err)
	}
	if err := syncDir(filepath.Dir(dst)); err != nil {
		return fmt.Errorf("cache: completing %v: %w", e.sum, err)
	}
	e.setCompleteLocked()
	_ = e.journal.Close() // every record was synced
	e.journal = nil
	e.ranges, e.hashed = nil, nil
	if err := removeIfExists(src + journalExt); err != nil {
		e.c.opts.logger.Warn("cache: removing journal", "file", e.sum, "err", err)
	}
	return nil
}
