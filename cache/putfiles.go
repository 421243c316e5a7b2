package cache

import (
	"crypto/sha256"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/layerstore/layerstore/chunked"
	"github.com/layerstore/layerstore/verify"
)

// Content is the whole content of one file as verified chunks: they must cover the file
// from offset 0 to its size, in order, without gaps or overlaps.
type Content struct {
	Sum    chunked.Sum
	Size   int64
	Chunks []verify.ChunkData
}

// PutFiles stores whole files at once and makes them complete, with one group commit for
// all of them: each file's content is hashed (in memory) and written to a temporary file in
// files/, then one syncfs of the cache's filesystem makes every temporary file durable, then
// each is renamed to its final name and a second syncfs makes the renames durable. Only then
// are the files complete (Has, Open and readers see them so). This costs two syncfs calls
// per call instead of about seven fsyncs per file, which is what makes fetching layers of
// thousands of small files fast; the price is that syncfs also writes back whatever else is
// dirty on that filesystem.
//
// The crash-safety invariant is kept: a temporary file is never taken for content (the
// next scan removes it), and a file appears under its final name only after its content was
// durable and hashed to its digest. Content that does not hash to its digest is not stored
// and gives an error wrapping [ErrCorrupt]; chunks that do not tile the file give
// [ErrBadChunk].
//
// Files already complete are left as they are. A file of which the cache holds some content
// (a reader is filling it) goes through [File.Put] chunk by chunk instead. Files open in
// handles may be stored this way; the handles see them complete. PutFiles returns one error
// per file, nil for files that are complete on return.
func (c *Cache) PutFiles(files []Content) []error {
	errs := make([]error, len(files))
	var todo []*pending
	var slow []int
	for i, f := range files {
		if err := checkContent(f); err != nil {
			errs[i] = err
			continue
		}
		switch e, err := c.claim(f); {
		case err != nil:
			errs[i] = err
		case e != nil:
			todo = append(todo, &pending{i: i, e: e, f: f})
		case !c.Has(f.Sum):
			slow = append(slow, i)
		}
	}
	if len(todo) > 0 {
		c.commitFiles(todo)
		for _, p := range todo {
			errs[p.i] = p.err
		}
		c.unpin(todo)
	}
	for _, i := range slow {
		errs[i] = c.putChunks(files[i])
	}
	return errs
}

// pending is one file of a PutFiles group.
type pending struct {
	i    int
	e    *entry
	f    Content
	tmp  string
	done bool // renamed into files/ (or found complete)
	err  error
	// crashed: a test's crash point stopped the group; its files are left as they are.
	crashed bool
}

// checkContent checks that the chunks tile the file and that the content hashes to its
// digest. A single chunk covering the whole file whose digest is the file's was hashed by
// verification already.
func checkContent(f Content) error {
	if f.Sum.IsZero() {
		return errors.New("cache: zero digest")
	}
	if f.Size <= 0 || f.Size > 1<<62 {
		return fmt.Errorf("cache: %v: invalid size %d for whole-file storage", f.Sum, f.Size)
	}
	var off int64
	for _, ch := range f.Chunks {
		ref := ch.Ref()
		if ref.FileOffset != off || ref.Size <= 0 || int64(len(ch.Bytes())) != ref.Size {
			return fmt.Errorf("%v: chunk at %d of %d bytes (%d given) where %d was expected: %w",
				f.Sum, ref.FileOffset, ref.Size, len(ch.Bytes()), off, ErrBadChunk)
		}
		off += ref.Size
	}
	if off != f.Size {
		return fmt.Errorf("%v: chunks cover %d of %d bytes: %w", f.Sum, off, f.Size, ErrBadChunk)
	}
	if len(f.Chunks) == 1 && f.Chunks[0].Ref().Digest == f.Sum {
		return nil
	}
	h := sha256.New()
	for _, ch := range f.Chunks {
		h.Write(ch.Bytes())
	}
	if got := chunked.Sum(h.Sum(nil)); got != f.Sum {
		return fmt.Errorf("cache: %v: content hashes to %v: %w", f.Sum, got, ErrCorrupt)
	}
	return nil
}

// claim returns the entry for f, pinned and marked as being stored, when the cache holds
// none of its content: no entry, or one that records no bytes (opened by a reader that has
// not stored anything yet) and that no other PutFiles is storing. It returns nil when the
// cache holds some (complete, or partial: see PutFiles).
func (c *Cache) claim(f Content) (*entry, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil, ErrClosed
	}
	e := c.entries[f.Sum]
	if e != nil && e.size != f.Size {
		if e.isComplete() || e.refs > 0 {
			return nil, fmt.Errorf("%v: stored with size %d, given %d: %w", f.Sum, e.size, f.Size, ErrSizeMismatch)
		}
		c.lru.MoveToFront(e.elem)
		return nil, nil // Open discards it
	}
	if e != nil {
		// A complete entry holds its size in bytes (> 0): no need to take its lock, which
		// Cache.mu must not wait for.
		c.lru.MoveToFront(e.elem)
		if e.storing || e.present() > 0 {
			return nil, nil
		}
	} else {
		e = c.newEntryLocked(f.Sum, f.Size)
	}
	e.refs++
	e.storing = true
	return e, nil
}

// commitFiles writes, syncs and renames the files of a group; see PutFiles.
func (c *Cache) commitFiles(ps []*pending) {
	shards := map[string]bool{}
	var written []string
	for _, p := range ps {
		dir := filepath.Dir(completePath(c.root, p.f.Sum))
		p.tmp = completePath(c.root, p.f.Sum) + tmpExt
		// The group's files are pinned: making room evicts others only.
		p.err = c.withRoom(p.f.Size, func() error {
			if err := c.refuseIfFull(); err != nil {
				return fmt.Errorf("cache: writing %v: %w", p.f.Sum, err)
			}
			if !shards[dir] {
				if err := ensureDir(dir); err != nil {
					return fmt.Errorf("cache: %w", err)
				}
				shards[dir] = true
			}
			if err := writeContent(p.tmp, p.f.Chunks); err != nil {
				_ = removeIfExists(p.tmp)
				return fmt.Errorf("cache: writing %v: %w", p.f.Sum, err)
			}
			return nil
		})
		if p.err == nil {
			written = append(written, p.tmp)
		}
	}
	if len(written) == 0 {
		return
	}
	// The content of every temporary file is durable before any takes its final name.
	if err := syncFS(c.root, written); err != nil {
		if isNoSpace(err) {
			err = fmt.Errorf("%w: %w", ErrNoSpace, err)
		}
		c.failGroup(ps, fmt.Errorf("cache: syncing: %w", err))
		return
	}
	if err := c.crashPoint("putfiles:data-synced"); err != nil {
		crash(ps, err)
		return
	}
	for _, p := range ps {
		if p.err != nil {
			continue
		}
		e := p.e
		e.mu.Lock()
		if e.complete { // completed meanwhile by a reader's Put: same verified content
			_ = removeIfExists(p.tmp)
			p.done = true
		} else if err := os.Rename(p.tmp, completePath(c.root, p.f.Sum)); err != nil {
			p.err = fmt.Errorf("cache: completing %v: %w", p.f.Sum, err)
			_ = removeIfExists(p.tmp)
		} else {
			p.done = true
		}
		e.mu.Unlock()
	}
	dirs := make([]string, 0, len(shards))
	for d := range shards {
		dirs = append(dirs, d)
	}
	if err := syncFS(c.root, dirs); err != nil {
		// The renamed files are sound (their content was durable first), but the renames
		// may not be: the files are not marked complete, and unpin removes them.
		c.failGroup(ps, fmt.Errorf("cache: syncing: %w", err))
		return
	}
	if err := c.crashPoint("putfiles:renamed"); err != nil {
		crash(ps, err)
		return
	}
	for _, p := range ps {
		if p.err == nil && p.done {
			p.err = p.e.adopt()
		}
	}
}

// failGroup records err for the files of the group not failed yet and removes their
// temporary files.
func (c *Cache) failGroup(ps []*pending, err error) {
	for _, p := range ps {
		if p.err == nil {
			p.err = err
			if !p.done {
				_ = removeIfExists(p.tmp)
			}
		}
	}
}

// crash stops a group at a test's crash point, leaving the files as a crash would.
func crash(ps []*pending, err error) {
	for _, p := range ps {
		if p.err == nil {
			p.err, p.crashed = err, true
		}
	}
}

// writeContent writes chunks to a new file at path, read-only from the start.
func writeContent(path string, chunks []verify.ChunkData) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o400)
	if err != nil {
		return err
	}
	for _, ch := range chunks {
		if _, err = f.Write(ch.Bytes()); err != nil {
			break
		}
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

// adopt marks the entry complete once its file is durably in files/. Readers may have the
// entry open, and may have begun a partial file meanwhile: its files are closed and removed
// (journal first) and the complete file takes their place.
func (e *entry) adopt() error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.complete {
		return nil
	}
	if e.loaded {
		d, err := os.Open(completePath(e.c.root, e.sum))
		if err != nil {
			return fmt.Errorf("cache: %w", err)
		}
		if e.data != nil {
			_ = e.data.Close()
		}
		if e.journal != nil {
			_ = e.journal.Close()
		}
		e.data, e.journal = d, nil
	}
	p := partialPath(e.c.root, e.sum)
	for _, f := range []string{p + journalExt, p} {
		if err := removeIfExists(f); err != nil {
			e.c.opts.logger.Warn("cache: removing partial file", "path", f, "err", err)
		}
	}
	e.rmu.Lock()
	e.ranges, e.hashed = nil, nil
	e.rmu.Unlock()
	e.setCompleteLocked()
	e.setBytesLocked(e.size)
	return nil
}

// unpin drops the pins PutFiles took, forgets entries whose storage failed and nobody else
// holds, and evicts if needed. The files were just written, so their mtime already records
// their use.
func (c *Cache) unpin(ps []*pending) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, p := range ps {
		e := p.e
		e.refs--
		e.storing = false
		if e.refs > 0 || c.closed {
			continue
		}
		e.mu.Lock()
		complete := e.complete
		e.unloadLocked()
		e.mu.Unlock()
		if !complete && !p.crashed && e.present() == 0 && c.entries[e.sum] == e {
			// Nothing stored: forget the entry (its partial files, if a reader made
			// them, are removed with it).
			c.dropLocked(e)
		}
	}
	c.evictLocked()
}

// putChunks stores a file chunk by chunk through a handle (the path for files the cache
// holds partially).
func (c *Cache) putChunks(f Content) error {
	h, err := c.Open(f.Sum, f.Size)
	if err != nil {
		return err
	}
	defer h.Close()
	for _, ch := range f.Chunks {
		if err := h.Put(ch); err != nil {
			return err
		}
	}
	return nil
}
