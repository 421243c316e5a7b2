package cache

import (
	"container/list"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// A record file ("records/<name>") is a fixed header, the meta, zeros up to the next multiple
// of recordAlign, then the data, so that the data starts page-aligned in a mapping of the file:
//
//	header: "LSCRECD1" | version (uint32 LE) | meta length (uint32 LE) | data offset (uint64 LE)
//	        | data length (uint64 LE) | CRC-32C of the meta | CRC-32C of the data
//	        | CRC-32C of the previous 40 bytes | 4 zero bytes
//
// The data offset is the end of the meta rounded up to recordAlign, and the file's size is
// exactly the data offset plus the data length: a short or long file is damaged.
const (
	recordMagic   = "LSCRECD1"
	recordVersion = 1
	recordHead    = 48
	recordAlign   = 4096
	// maxRecordMeta bounds the meta that RecordMeta reads into memory.
	maxRecordMeta = 4 << 20
	// maxRecordData bounds the data of a record (1 TiB): beyond it the header is damaged.
	maxRecordData = 1 << 40
	// maxRecordName is the longest record name.
	maxRecordName = 128
	// recordWritePiece is the most a record's data is written in one write (writeRecordFile).
	recordWritePiece = 64 << 10
)

// record is the cache's state for one record file. Guarded by Cache.mu.
type record struct {
	name string
	size int64 // of the file, counted in usage
	refs int   // open Records
	pins int   // pins that name it; a pinned record is out of the LRU list
	elem *list.Element
}

// recordHeader is a record file's decoded header.
type recordHeader struct {
	metaLen, dataOff, dataLen int64
	metaCRC, dataCRC          uint32
}

func (h recordHeader) size() int64 { return h.dataOff + h.dataLen }

// newRecordHeader is the header of a record of meta whose data is the concatenation of data.
func newRecordHeader(meta []byte, data [][]byte) recordHeader {
	h := recordHeader{metaLen: int64(len(meta)), dataOff: alignRecord(int64(len(meta))), metaCRC: crc32.Checksum(meta, crcTable)}
	for _, p := range data {
		h.dataLen += int64(len(p))
		h.dataCRC = crc32.Update(h.dataCRC, crcTable, p)
	}
	return h
}

// alignRecord returns the data offset of a record whose meta has n bytes.
func alignRecord(n int64) int64 {
	return (recordHead + n + recordAlign - 1) / recordAlign * recordAlign
}

func (h recordHeader) encode() []byte {
	b := make([]byte, 0, recordHead)
	b = append(b, recordMagic...)
	b = binary.LittleEndian.AppendUint32(b, recordVersion)
	b = binary.LittleEndian.AppendUint32(b, uint32(h.metaLen))
	b = binary.LittleEndian.AppendUint64(b, uint64(h.dataOff))
	b = binary.LittleEndian.AppendUint64(b, uint64(h.dataLen))
	b = binary.LittleEndian.AppendUint32(b, h.metaCRC)
	b = binary.LittleEndian.AppendUint32(b, h.dataCRC)
	b = binary.LittleEndian.AppendUint32(b, crc32.Checksum(b, crcTable))
	return append(b, 0, 0, 0, 0)
}

// parseRecordHeader decodes and checks a header against the size of its file.
func parseRecordHeader(b []byte, fileSize int64) (recordHeader, error) {
	if len(b) < recordHead || string(b[:8]) != recordMagic {
		return recordHeader{}, errors.New("not a record (bad magic)")
	}
	if crc32.Checksum(b[:40], crcTable) != binary.LittleEndian.Uint32(b[40:44]) {
		return recordHeader{}, errors.New("header checksum mismatch")
	}
	if v := binary.LittleEndian.Uint32(b[8:12]); v != recordVersion {
		return recordHeader{}, fmt.Errorf("record version %d, want %d", v, recordVersion)
	}
	metaLen := binary.LittleEndian.Uint32(b[12:16])
	dataOff, dataLen := binary.LittleEndian.Uint64(b[16:24]), binary.LittleEndian.Uint64(b[24:32])
	if metaLen > maxRecordMeta || dataLen > maxRecordData || dataOff != uint64(alignRecord(int64(metaLen))) {
		return recordHeader{}, fmt.Errorf("bad lengths (meta %d, data %d at %d)", metaLen, dataLen, dataOff)
	}
	h := recordHeader{metaLen: int64(metaLen), dataOff: int64(dataOff), dataLen: int64(dataLen),
		metaCRC: binary.LittleEndian.Uint32(b[32:36]), dataCRC: binary.LittleEndian.Uint32(b[36:40])}
	if h.size() != fileSize {
		return recordHeader{}, fmt.Errorf("file has %d bytes, header says %d", fileSize, h.size())
	}
	return h, nil
}

// validRecordName reports whether name is 1 to 128 bytes of [0-9a-z] and '-'.
func validRecordName(name string) bool {
	if name == "" || len(name) > maxRecordName {
		return false
	}
	for i := range len(name) {
		if c := name[i]; !('0' <= c && c <= '9' || 'a' <= c && c <= 'z' || c == '-') {
			return false
		}
	}
	return true
}

func checkRecordName(name string) error {
	if !validRecordName(name) {
		return fmt.Errorf("cache: invalid record name %q: want 1 to %d bytes of [0-9a-z-]", name, maxRecordName)
	}
	return nil
}

func (c *Cache) recordPath(name string) string { return filepath.Join(c.root, recordsDir, name) }

// errNoRecord returns the error for a record that does not exist: it wraps both [ErrMissing]
// and [fs.ErrNotExist].
func errNoRecord(name string) error {
	return fmt.Errorf("cache: record %q: %w (%w)", name, ErrMissing, fs.ErrNotExist)
}

// PutRecord stores a record under name (1 to 128 bytes of [0-9a-z] and '-'), replacing any
// record of that name, atomically and durably: the file is written under a temporary name,
// fsynced, renamed into place and the directory fsynced, so that a crash at any point leaves
// the old record or the new one, never a torn one (a leftover temporary file is removed by the
// next start). meta (at most 4 MiB) is read whole by [Cache.RecordMeta]; data is mapped by
// [Cache.OpenRecord], written from its parts (a caller need not join them in memory); each
// has a CRC-32C. The record's file size counts in [Cache.Usage], and
// the record is evicted with files, least recently used first, when neither open nor pinned.
// A full filesystem makes room as any write does (see the package documentation) and fails
// with an error wrapping [ErrNoSpace] if that is not enough. Open [Record]s of the old record
// keep their mapping of it.
func (c *Cache) PutRecord(name string, meta []byte, data ...[]byte) error {
	w, err := c.writeRecord(name, meta, data)
	if err != nil {
		return err
	}
	return c.storeRecord(w, nil)
}

// WriteRecord is [Cache.PutRecord] for a caller that uses the new record at once: it returns
// as soon as the record's bytes are written, with the new record open as [Cache.OpenRecord]
// would return it, and makes it durable and renames it into place in the background, as
// PutRecord does, then sends the outcome on stored (nil: stored under name). Until then the
// name holds the previous record, if any: a crash at any point leaves the old record or the
// new one, never a torn one. Writes of one name are stored in the order of their calls.
func (c *Cache) WriteRecord(name string, meta []byte, data ...[]byte) (rec *Record, stored <-chan error, err error) {
	w, err := c.writeRecord(name, meta, data)
	if err != nil {
		return nil, nil, err
	}
	m, err := unix.Mmap(int(w.f.Fd()), 0, int(w.h.size()), unix.PROT_READ, unix.MAP_SHARED)
	if err != nil {
		w.abort()
		return nil, nil, fmt.Errorf("cache: mapping record %q: %w", name, err)
	}
	// Until stored, the Record holds a record of its own, not the cache's: it takes the
	// cache's (and a use of it) when stored, if still open.
	rec = &Record{c: c, r: &record{name: name, refs: 1}, meta: slices.Clone(meta), m: m, data: m[w.h.dataOff:w.h.size():w.h.size()]}
	ch := make(chan error, 1)
	go func() { ch <- c.storeRecord(w, rec) }()
	return rec, ch, nil
}

// recordWrite is a record written to its temporary file, not yet durable nor named.
type recordWrite struct {
	name string
	h    recordHeader
	f    *os.File
	done func() // lets the next write of the name proceed
}

// writeRecord writes a record to a temporary file, after any earlier write of the name is
// stored. The caller stores it (storeRecord) or aborts it.
func (c *Cache) writeRecord(name string, meta []byte, data [][]byte) (*recordWrite, error) {
	if err := checkRecordName(name); err != nil {
		return nil, err
	}
	dataLen := int64(0)
	for _, p := range data {
		dataLen += int64(len(p))
	}
	if len(meta) > maxRecordMeta || dataLen > maxRecordData {
		return nil, fmt.Errorf("cache: record %q: meta of %d bytes (at most %d), data of %d (at most %d)",
			name, len(meta), maxRecordMeta, dataLen, int64(maxRecordData))
	}
	done, err := c.startRecordWrite(name)
	if err != nil {
		return nil, err
	}
	h := newRecordHeader(meta, data)
	dir := filepath.Join(c.root, recordsDir)
	var f *os.File
	err = c.withRoom(h.size(), func() error {
		if err := c.refuseIfFull(); err != nil {
			return fmt.Errorf("cache: writing record %q: %w", name, err)
		}
		var err error
		f, err = writeRecordFile(dir, name, h, meta, data)
		if err != nil {
			return fmt.Errorf("cache: writing record %q: %w", name, err)
		}
		return nil
	})
	if err != nil {
		done()
		return nil, err
	}
	return &recordWrite{name: name, h: h, f: f, done: done}, nil
}

// startRecordWrite waits until no other write of name is under way (or the cache is closed),
// then registers one, which the returned function ends.
func (c *Cache) startRecordWrite(name string) (func(), error) {
	for {
		c.mu.Lock()
		if c.closed {
			c.mu.Unlock()
			return nil, ErrClosed
		}
		busy := c.recordWrites[name]
		if busy == nil {
			ch := make(chan struct{})
			c.recordWrites[name] = ch
			c.writers.Add(1)
			c.mu.Unlock()
			return func() {
				c.mu.Lock()
				delete(c.recordWrites, name)
				c.mu.Unlock()
				close(ch)
				c.writers.Done()
			}, nil
		}
		c.mu.Unlock()
		<-busy
	}
}

// abort removes the temporary file of a write not stored.
func (w *recordWrite) abort() {
	_ = w.f.Close()
	_ = removeIfExists(w.f.Name())
	w.done()
}

// storeRecord makes a written record durable and renames it into place (see PutRecord). rec,
// when not nil, is the Record WriteRecord returned for it: it then holds the stored record.
func (c *Cache) storeRecord(w *recordWrite, rec *Record) error {
	defer w.done()
	tmp := w.f.Name()
	err := w.f.Sync()
	if cerr := w.f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		_ = removeIfExists(tmp)
		return fmt.Errorf("cache: writing record %q: %w", w.name, err)
	}
	if err := c.crashPoint("record:written"); err != nil {
		return err
	}
	if rec != nil {
		rec.mu.Lock() // before Cache.mu, as Record.Close takes them
	}
	err = c.renameRecord(w, tmp, rec)
	if rec != nil {
		rec.mu.Unlock()
	}
	if err != nil {
		return err
	}
	if err := syncDir(filepath.Dir(tmp)); err != nil {
		return fmt.Errorf("cache: storing record %q: %w", w.name, err)
	}
	c.maybeEvict()
	return nil
}

// renameRecord renames a durable record into place and registers it (rec.mu held, if rec
// is not nil).
func (c *Cache) renameRecord(w *recordWrite, tmp string, rec *Record) error {
	// Renamed and registered under Cache.mu, so that RemoveRecord and eviction, which remove
	// the name under it too, never leave the record registered without its file.
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		_ = removeIfExists(tmp)
		return ErrClosed
	}
	if err := os.Rename(tmp, c.recordPath(w.name)); err != nil {
		c.mu.Unlock()
		_ = removeIfExists(tmp)
		return fmt.Errorf("cache: storing record %q: %w", w.name, err)
	}
	r := c.records[w.name]
	if r == nil {
		r = &record{name: w.name}
		r.elem = c.lru.PushFront(r)
		c.records[w.name] = r
		if n := c.recordPinsLocked(w.name); n > 0 {
			c.setRecordPinsLocked(r, n)
		}
	}
	c.setRecordSizeLocked(r, w.h.size())
	c.lru.MoveToFront(r.elem)
	if rec != nil && rec.m != nil {
		r.refs++
		rec.r = r // its own record is forgotten: no one else holds it
	}
	c.mu.Unlock()
	return nil
}

// writeRecordFile writes a record to a new temporary file in dir and returns it, open; it is
// not synced. On failure it removes it.
//
// The data is written in pieces of recordWritePiece bytes, not in one write: the page cache
// keeps what one write stores in folios as large as the write (up to 2 MiB on ext4 and xfs
// with large folios), and a fault on a mapping maps the whole folio, so that the few lookups
// of a freshly written record (a directory's children, spread over the index) would make
// most of it resident again after [Record.Unresident]. Small folios cost each such fault
// what the kernel's fault-around maps anyway.
func writeRecordFile(dir, name string, h recordHeader, meta []byte, data [][]byte) (*os.File, error) {
	f, err := os.CreateTemp(dir, "."+name+".*"+tmpExt)
	if err != nil {
		return nil, err
	}
	head := append(h.encode(), meta...)
	_, err = f.WriteAt(head, 0)
	off := h.dataOff
	for i := 0; err == nil && i < len(data); i++ {
		for p := data[i]; err == nil && len(p) > 0; {
			n := min(len(p), recordWritePiece)
			_, err = f.WriteAt(p[:n], off)
			p, off = p[n:], off+int64(n)
		}
	}
	if err == nil {
		err = f.Truncate(h.size()) // the zeros between meta and data, if no data follows
	}
	if err == nil {
		err = f.Chmod(0o400)
	}
	if err != nil {
		_ = f.Close()
		_ = removeIfExists(f.Name())
		return nil, err
	}
	return f, nil
}

// setRecordSizeLocked sets the size a record counts in usage (Cache.mu held).
func (c *Cache) setRecordSizeLocked(r *record, size int64) {
	delta := size - r.size
	r.size = size
	c.usage.Add(delta)
	if r.pins > 0 {
		c.pinned.Add(delta)
	}
}

// dropRecordLocked removes a record's file and forgets it (Cache.mu held). Open Records keep
// their mapping.
func (c *Cache) dropRecordLocked(r *record) {
	if err := removeIfExists(c.recordPath(r.name)); err != nil {
		c.opts.logger.Warn("cache: removing record", "record", r.name, "err", err)
	}
	c.setRecordSizeLocked(r, 0)
	c.lru.Remove(r.elem)
	if c.records[r.name] == r {
		delete(c.records, r.name)
	}
}

// RemoveRecord removes the record name, pinned or not; open [Record]s keep their mapping.
// Removing a record that does not exist does nothing.
func (c *Cache) RemoveRecord(name string) error {
	if err := checkRecordName(name); err != nil {
		return err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return ErrClosed
	}
	if r := c.records[name]; r != nil {
		c.dropRecordLocked(r)
	}
	return nil
}

// Records returns the names of the records present, sorted.
func (c *Cache) Records() ([]string, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil, ErrClosed
	}
	names := make([]string, 0, len(c.records))
	for n := range c.records {
		names = append(names, n)
	}
	slices.Sort(names)
	return names, nil
}

// RecordMeta reads and checks only the header and meta of record name: it reads no data, and
// does not count as a use for eviction. A damaged record is removed and reported with an error
// wrapping [ErrCorrupt]; a missing one with an error wrapping [ErrMissing] and
// [fs.ErrNotExist].
func (c *Cache) RecordMeta(name string) ([]byte, error) {
	if err := checkRecordName(name); err != nil {
		return nil, err
	}
	c.mu.Lock()
	closed, r := c.closed, c.records[name]
	c.mu.Unlock()
	switch {
	case closed:
		return nil, ErrClosed
	case r == nil:
		return nil, errNoRecord(name)
	}
	f, err := os.Open(c.recordPath(name))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, errNoRecord(name) // removed meanwhile
	}
	if err != nil {
		return nil, fmt.Errorf("cache: record %q: %w", name, err)
	}
	defer f.Close()
	info, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("cache: record %q: %w", name, err)
	}
	_, meta, err := readRecordMeta(f, info.Size())
	if err != nil {
		if errors.Is(err, errDamaged) {
			return nil, c.damagedRecord(name, info, err)
		}
		return nil, fmt.Errorf("cache: record %q: %w", name, err)
	}
	return meta, nil
}

// errDamaged marks the errors of readRecordMeta that come from the file's content (not from
// reading it).
var errDamaged = errors.New("damaged")

// readRecordMeta reads and checks a record's header and meta.
func readRecordMeta(f *os.File, size int64) (recordHeader, []byte, error) {
	var hb [recordHead]byte
	if n, err := f.ReadAt(hb[:], 0); n < recordHead {
		if err == nil || errors.Is(err, io.EOF) {
			return recordHeader{}, nil, fmt.Errorf("%w: short file (%d bytes)", errDamaged, size)
		}
		return recordHeader{}, nil, err
	}
	h, err := parseRecordHeader(hb[:], size)
	if err != nil {
		return recordHeader{}, nil, fmt.Errorf("%w: %w", errDamaged, err)
	}
	meta := make([]byte, h.metaLen)
	if _, err := f.ReadAt(meta, recordHead); err != nil {
		return recordHeader{}, nil, err // the size was checked: a short read is an I/O error
	}
	if crc32.Checksum(meta, crcTable) != h.metaCRC {
		return recordHeader{}, nil, fmt.Errorf("%w: meta checksum mismatch", errDamaged)
	}
	return h, meta, nil
}

// damagedRecord removes the record name if its file is still the one found damaged (info),
// logs it and returns the error to report, wrapping [ErrCorrupt].
func (c *Cache) damagedRecord(name string, info fs.FileInfo, cause error) error {
	c.mu.Lock()
	if r := c.records[name]; r != nil && !c.closed {
		if now, err := os.Stat(c.recordPath(name)); err == nil && os.SameFile(now, info) {
			c.dropRecordLocked(r)
		}
	}
	c.mu.Unlock()
	c.opts.logger.Warn("cache: removed damaged record", "record", name, "err", cause)
	return fmt.Errorf("cache: record %q: %w: %w", name, ErrCorrupt, cause)
}

// Record is an open record: its meta, and its data mapped read-only. While it is open the
// record is not evicted. Its methods are safe for concurrent use, but Data must not be used
// after Close.
type Record struct {
	c    *Cache
	r    *record
	meta []byte

	mu   sync.Mutex
	m    []byte // the mapping of the whole file; nil once closed
	data []byte
}

// OpenRecord maps record name read-only, after checking the CRCs of its header, meta and data
// (which reads the data once, through the page cache rather than the mapping: the mapping's
// pages become resident only as they are used). The record is marked most recently used and
// is not evicted until the Record is closed. A damaged record is removed and reported with an
// error wrapping [ErrCorrupt]; a missing one with an error wrapping [ErrMissing] and
// [fs.ErrNotExist].
func (c *Cache) OpenRecord(name string) (*Record, error) {
	if err := checkRecordName(name); err != nil {
		return nil, err
	}
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil, ErrClosed
	}
	r := c.records[name]
	if r == nil {
		c.mu.Unlock()
		return nil, errNoRecord(name)
	}
	r.refs++ // held while checking: not evicted meanwhile
	c.lru.MoveToFront(r.elem)
	c.mu.Unlock()

	rec, err := c.mapRecord(r)
	if err != nil {
		c.releaseRecord(r)
		return nil, err
	}
	now := time.Now()
	if err := os.Chtimes(c.recordPath(name), now, now); err != nil && !errors.Is(err, fs.ErrNotExist) {
		c.opts.logger.Warn("cache: recording use", "record", name, "err", err)
	}
	return rec, nil
}

// mapRecord checks and maps the file of r.
func (c *Cache) mapRecord(r *record) (*Record, error) {
	f, err := os.Open(c.recordPath(r.name))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, errNoRecord(r.name) // removed meanwhile
	}
	if err != nil {
		return nil, fmt.Errorf("cache: record %q: %w", r.name, err)
	}
	defer f.Close()
	info, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("cache: record %q: %w", r.name, err)
	}
	h, meta, err := readRecordMeta(f, info.Size())
	if err == nil {
		var sum uint32
		if sum, err = crcOf(io.NewSectionReader(f, h.dataOff, h.dataLen)); err == nil && sum != h.dataCRC {
			err = fmt.Errorf("%w: data checksum mismatch", errDamaged)
		}
	}
	if err != nil {
		if errors.Is(err, errDamaged) {
			return nil, c.damagedRecord(r.name, info, err)
		}
		return nil, fmt.Errorf("cache: record %q: %w", r.name, err)
	}
	m, err := unix.Mmap(int(f.Fd()), 0, int(h.size()), unix.PROT_READ, unix.MAP_SHARED)
	if err != nil {
		return nil, fmt.Errorf("cache: mapping record %q: %w", r.name, err)
	}
	return &Record{c: c, r: r, meta: meta, m: m, data: m[h.dataOff:h.size():h.size()]}, nil
}

// crcOf returns the CRC-32C of what r yields, read in pieces of bounded size.
func crcOf(r io.Reader) (uint32, error) {
	h := crc32.New(crcTable)
	buf := make([]byte, 256<<10)
	_, err := io.CopyBuffer(h, r, buf)
	return h.Sum32(), err
}

// releaseRecord drops one reference on r taken by OpenRecord. The last one marks the record
// used (in memory and in its file's mtime, for the order after a restart) and may evict.
func (c *Cache) releaseRecord(r *record) {
	c.mu.Lock()
	defer c.mu.Unlock()
	r.refs--
	if r.refs > 0 || c.closed || c.records[r.name] != r {
		return
	}
	c.lru.MoveToFront(r.elem)
	now := time.Now()
	if err := os.Chtimes(c.recordPath(r.name), now, now); err != nil && !errors.Is(err, fs.ErrNotExist) {
		c.opts.logger.Warn("cache: recording use", "record", r.name, "err", err)
	}
	c.evictLocked()
}

// Meta returns the record's meta (a copy in memory: valid after Close too).
func (r *Record) Meta() []byte { return r.meta }

// Data returns the record's data: a read-only mapping of the record file, valid until Close.
// Writing to it faults. The data starts at a page-aligned address (4096 bytes).
func (r *Record) Data() []byte {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.data
}

// Unresident takes the record's pages out of the process's resident memory (they stay in the
// page cache, and are mapped again as they are read): for after a pass over the whole record,
// a check say, so that only what is used afterwards is resident. The data stays valid.
func (r *Record) Unresident() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.m == nil {
		return nil
	}
	if err := unix.Madvise(r.m, unix.MADV_DONTNEED); err != nil {
		return fmt.Errorf("cache: record %q: %w", r.r.name, err)
	}
	return nil
}

// Close unmaps the data and lets the record be evicted again. Closing twice is harmless.
func (r *Record) Close() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.m == nil {
		return nil
	}
	err := unix.Munmap(r.m)
	r.m, r.data = nil, nil
	r.c.releaseRecord(r.r)
	if err != nil {
		return fmt.Errorf("cache: unmapping record %q: %w", r.r.name, err)
	}
	return nil
}

// foundRecord is a record found by the start-up scan, with its file's mtime.
type foundRecord struct {
	r     *record
	mtime time.Time
}

// scanRecords returns the records whose header is sound, and removes everything else in
// records/ (temporary files of an interrupted PutRecord, short files, damaged headers).
func (c *Cache) scanRecords() ([]foundRecord, error) {
	dir := filepath.Join(c.root, recordsDir)
	des, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	var out []foundRecord
	for _, de := range des {
		p := filepath.Join(dir, de.Name())
		if !validRecordName(de.Name()) || !de.Type().IsRegular() {
			if de.Type().IsRegular() {
				c.removeStray(p)
			} else {
				c.opts.logger.Warn("cache: unexpected entry in records", "path", p)
			}
			continue
		}
		info, err := checkRecordHeader(p)
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			c.opts.logger.Warn("cache: discarding damaged record", "record", de.Name(), "err", err)
			c.removeStray(p)
			continue
		}
		out = append(out, foundRecord{&record{name: de.Name(), size: info.Size()}, info.ModTime()})
	}
	return out, nil
}

// checkRecordHeader reads and checks a record file's header only.
func checkRecordHeader(p string) (fs.FileInfo, error) {
	f, err := os.Open(p)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	info, err := f.Stat()
	if err != nil {
		return nil, err
	}
	var hb [recordHead]byte
	if n, err := f.ReadAt(hb[:], 0); n < recordHead {
		if err == nil || errors.Is(err, io.EOF) {
			return nil, fmt.Errorf("short file (%d bytes)", info.Size())
		}
		return nil, err
	}
	if _, err := parseRecordHeader(hb[:], info.Size()); err != nil {
		return nil, err
	}
	return info, nil
}
