package cache

import (
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"sync"

	"github.com/layerstore/layerstore/chunked"
	"github.com/layerstore/layerstore/internal/byterange"
	"github.com/layerstore/layerstore/verify"
)

// File is a handle on one cached file, returned by [Cache.Open]. While it is open the file
// is pinned: never evicted. All methods are safe for concurrent use.
//
// The methods that read or write content (Put, ReadAt, ReadChunk, ReadChunkAt) fail with
// [ErrClosed] once the handle is closed, and Close waits for those in progress on the same
// handle: a closed handle never writes into a file it no longer pins. Missing, Complete and
// Path only look at the file's state, under the file's own lock, and answer on a closed
// handle too; what they say then may change at any time, since nothing pins the file.
type File struct {
	e *entry

	hmu    sync.RWMutex // held shared by Put, ReadAt and ReadChunkAt, exclusively by Close
	closed bool
}

var _ io.ReaderAt = (*File)(nil)

// Sum returns the file's digest.
func (f *File) Sum() chunked.Sum { return f.e.sum }

// Size returns the file's size.
func (f *File) Size() int64 { return f.e.size }

// Put stores verified chunks of the file, each at its Ref().FileOffset. A chunk may come from
// any layer that holds this file, whatever its chunking: presence is recorded by byte range,
// and bytes already present are not rewritten. Put returns once the bytes are durable (data
// fsynced, then the ranges recorded and fsynced: two syncs for all of cs, so that the chunks
// of a file fetched together are stored at once).
//
// The Put that makes the file full hashes it: if the content matches the digest the file
// becomes complete; if not, all of its content is dropped and Put returns an error wrapping
// [ErrCorrupt]. A chunk that is empty or does not fit the file fails with [ErrBadChunk], and
// none of cs is stored.
// Putting into a complete file does nothing.
func (f *File) Put(cs ...verify.ChunkData) error {
	f.hmu.RLock()
	defer f.hmu.RUnlock()
	if f.closed {
		return ErrClosed
	}
	return f.e.put(cs)
}

// ReadAt reads len(p) bytes at off, following [io.ReaderAt]. It reads only present bytes:
// if some of the requested range is missing, it reads the present bytes from off up to the
// first missing one, returns their count and a [*MissingError] (wrapping [ErrMissing]) that
// lists every missing range in the request. Reading past the end returns [io.EOF].
func (f *File) ReadAt(p []byte, off int64) (int, error) {
	f.hmu.RLock()
	defer f.hmu.RUnlock()
	if f.closed {
		return 0, ErrClosed
	}
	e := f.e
	e.mu.RLock()
	defer e.mu.RUnlock()
	return e.readAtLocked(p, off)
}

// readAtLocked is ReadAt with e.mu held shared.
func (e *entry) readAtLocked(p []byte, off int64) (int, error) {
	if off < 0 {
		return 0, fmt.Errorf("cache: negative offset %d", off)
	}
	if off >= e.size {
		return 0, io.EOF
	}
	if !e.loaded {
		return 0, ErrClosed
	}
	end := min(off+int64(len(p)), e.size)
	var missing []byterange.Range
	readEnd := end
	if !e.complete {
		e.rmu.Lock()
		missing = e.ranges.Missing(off, end)
		readEnd = min(end, e.ranges.PresentEnd(off))
		e.rmu.Unlock()
	}
	var n int
	var err error
	if readEnd > off { // a partial file with nothing recorded may have no data file yet
		n, err = e.data.ReadAt(p[:readEnd-off], off)
	}
	if err != nil && !(errors.Is(err, io.EOF) && int64(n) == readEnd-off) {
		return n, fmt.Errorf("cache: reading %v: %w", e.sum, err)
	}
	switch {
	case len(missing) > 0:
		e.c.misses.Add(1)
		return n, &MissingError{File: e.sum, Ranges: missing}
	case end-off < int64(len(p)):
		e.c.hits.Add(1)
		return n, io.EOF
	}
	e.c.hits.Add(1)
	return n, nil
}

// Missing returns the ranges of [off, off+n) (clipped to the file) that are not present,
// sorted; none for a complete file.
func (f *File) Missing(off, n int64) []byterange.Range {
	e := f.e
	off, end := max(off, 0), min(off+n, e.size)
	if n <= 0 || off >= end {
		return nil
	}
	e.mu.RLock()
	defer e.mu.RUnlock()
	if e.complete {
		return nil
	}
	e.rmu.Lock()
	defer e.rmu.Unlock()
	return e.ranges.Missing(off, end)
}

// Complete reports whether the whole file is present and verified against its digest.
func (f *File) Complete() bool {
	f.e.mu.RLock()
	defer f.e.mu.RUnlock()
	return f.e.complete
}

// Path returns the path of the complete file, a read-only regular file that stays in place
// while the handle is open: the daemon can open it to back FUSE passthrough. For a file
// that is not complete it returns a [*MissingError].
func (f *File) Path() (string, error) {
	e := f.e
	e.mu.RLock()
	defer e.mu.RUnlock()
	if e.complete {
		return completePath(e.c.root, e.sum), nil
	}
	var missing []byterange.Range
	if e.loaded {
		e.rmu.Lock()
		missing = e.ranges.Missing(0, e.size)
		e.rmu.Unlock()
	}
	if len(missing) == 0 {
		missing = []byterange.Range{{Offset: 0, Length: e.size}} // full but not verified yet
	}
	return "", &MissingError{File: e.sum, Ranges: missing}
}

// Close unpins the file. Closing twice is harmless.
func (f *File) Close() error {
	f.hmu.Lock()
	defer f.hmu.Unlock()
	if f.closed {
		return nil
	}
	f.closed = true
	f.e.c.release(f.e)
	return nil
}

// ReadChunk returns the bytes of the chunk ref describes (ref.FileOffset, ref.Size) if they
// are present and hash to ref.Digest. Use it rather than ReadAt when the caller's trust comes
// from its own layer's TOC: a partial file's ranges were verified against the TOC of
// whichever layer supplied them, and only completion proves they belong to the file's digest
// (another image's TOC could name this digest for other content). A complete file is served
// without hashing. Missing bytes give a [*MissingError]; present bytes that do not match
// give an error wrapping [ErrCorrupt] (the stored bytes are left for completion to judge).
func (f *File) ReadChunk(ref chunked.Chunk) ([]byte, error) {
	b := make([]byte, max(ref.Size, 0))
	if _, err := f.ReadChunkAt(ref, b, ref.FileOffset); err != nil {
		return nil, err
	}
	return b, nil
}

// ReadChunkAt reads into p the part of chunk ref at file offset off, on ReadChunk's terms;
// [off, off+len(p)) must lie within the chunk. When the chunk's range is known to hash to
// ref.Digest (it was stored whole from a verified chunk, or hashed by an earlier read) only
// the part asked for is read, without hashing: a file read piece by piece through FUSE costs
// one hash per chunk rather than one per read.
func (f *File) ReadChunkAt(ref chunked.Chunk, p []byte, off int64) (int, error) {
	e := f.e
	if ref.Size <= 0 || ref.FileOffset < 0 || ref.FileOffset > e.size-ref.Size ||
		off < ref.FileOffset || off+int64(len(p)) > ref.FileOffset+ref.Size {
		return 0, fmt.Errorf("%v: %d bytes at %d of the chunk at %d of %d bytes: %w",
			e.sum, len(p), off, ref.FileOffset, ref.Size, ErrBadChunk)
	}
	f.hmu.RLock()
	defer f.hmu.RUnlock()
	if f.closed {
		return 0, ErrClosed
	}
	e.mu.RLock()
	defer e.mu.RUnlock()
	whole := byterange.Range{Offset: ref.FileOffset, Length: ref.Size}
	e.rmu.Lock()
	sum, known := e.hashed[whole]
	known = e.complete || known && sum == ref.Digest
	e.rmu.Unlock()
	if known {
		n, err := e.readAtLocked(p, off)
		if errors.Is(err, io.EOF) && n == len(p) {
			err = nil
		}
		return n, err
	}
	b := make([]byte, ref.Size)
	n, err := e.readAtLocked(b, ref.FileOffset)
	if err != nil && !(errors.Is(err, io.EOF) && int64(n) == ref.Size) {
		return 0, err
	}
	if got := chunked.Sum(sha256.Sum256(b)); got != ref.Digest {
		return 0, fmt.Errorf("%v: bytes at %d+%d hash to %v, want %v: %w",
			e.sum, ref.FileOffset, ref.Size, got, ref.Digest, ErrCorrupt)
	}
	e.rmu.Lock()
	e.knowLocked(whole, ref.Digest)
	e.rmu.Unlock()
	return copy(p, b[off-ref.FileOffset:]), nil
}
