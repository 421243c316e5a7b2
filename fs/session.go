package storefs

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"sync"
	"time"

	"github.com/opencontainers/go-digest"
	"go.podman.io/image/v5/docker/reference"
	"golang.org/x/sys/unix"

	"github.com/layerstore/layerstore/chunked"
)

// Session is what the next process needs to resume serving the mount: the /dev/fuse
// descriptor and the session table. Both survive exec (no CLOEXEC when handed over: the
// caller dups or clears it) and are what goes into the service manager's fd store.
type Session struct{ Dev, State *os.File }

// The session table is a memfd that only grows: a header, then one record per number handed
// to the kernel, each written with one write before the answer that gives the number.
//
//	file:   magic (8 bytes), then records
//	record: length of kind and payload (uint32, little endian), kind (a byte), payload
//	header: format version, mount's device, start time (unix ns), MaxWrite, MaxReadAhead,
//	        disabled capabilities, flags (uvarints; the time a varint), the saved INIT
//	        (uvarint length and bytes); first and only once
//	ref:    number, name of the reference directory (uvarint length and bytes)
//	block:  block number, reference, key (uvarint length and bytes each), identity (32 bytes)
//	backing, unbacking: inode number, backing ID (uvarints; unbacking has no ID)
//	uses:   reference, key (uvarint length and bytes each), the runtime's uses of that layer
//	        directory (uvarint) after a create of use or an rmdir; the last one counts
//
// A record cut short by the death of its writer ends the table: the next process cuts it
// off. Everything else is validated as untrusted input: lengths bounded, numbers in their
// ranges, names and keys well formed, nothing defined twice.
const (
	tableMagic    = "LSFSTAB\x00"
	tableVersion  = 1
	maxTableSize  = 256 << 20
	maxRecordSize = 64 << 10
	maxNameLen    = 4096

	recHeader    = 1
	recRef       = 2
	recBlock     = 3
	recBacking   = 4
	recUnbacking = 5
	recUses      = 6

	maxUses = 1 << 16 // uses of one layer directory a table may hold

	flagPassthrough = 1 << 0
)

// sessionHeader is what a process must repeat to serve the session of another.
type sessionHeader struct {
	dev          uint64 // the mount's device number
	started      time.Time
	maxWrite     int
	maxReadAhead int
	disabledCaps uint64
	flags        uint64
	init         []byte // fusesession.EncodeInit of the kernel's INIT
}

type refRec struct {
	ino       uint64
	name, ref string
}

type blockRec struct {
	n     uint64
	ref   string
	key   digest.Digest
	ident chunked.Sum
}

// useKey is a layer directory as the runtime counts its uses: (reference, key).
type useKey struct {
	ref string
	key digest.Digest
}

// sessionState is a decoded session table.
type sessionState struct {
	hdr     sessionHeader
	refs    []refRec
	blocks  []blockRec
	backing map[uint64]int32 // inode -> backing ID registered and not unregistered
	uses    map[useKey]int64 // the runtime's uses of layer directories, where not 0
	end     int64            // where the last whole record ends
}

// table appends records to a session table. A nil table (no session) takes nothing.
type table struct {
	mu  sync.Mutex
	f   *os.File
	off int64
}

// newTable creates a session table in a new memfd, its header written.
func newTable(h *sessionHeader) (*table, error) {
	fd, err := unix.MemfdCreate("layerstore-session", unix.MFD_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("fs: session table: memfd_create: %w", err)
	}
	t := &table{f: os.NewFile(uintptr(fd), "layerstore-session")}
	if _, err := t.f.WriteAt([]byte(tableMagic), 0); err != nil {
		t.f.Close()
		return nil, fmt.Errorf("fs: session table: %w", err)
	}
	t.off = int64(len(tableMagic))
	if err := t.append(recHeader, encodeHeader(h)); err != nil {
		t.f.Close()
		return nil, err
	}
	return t, nil
}

func encodeHeader(h *sessionHeader) []byte {
	b := binary.AppendUvarint(nil, tableVersion)
	b = binary.AppendUvarint(b, h.dev)
	b = binary.AppendVarint(b, h.started.UnixNano())
	b = binary.AppendUvarint(b, uint64(h.maxWrite))
	b = binary.AppendUvarint(b, uint64(h.maxReadAhead))
	b = binary.AppendUvarint(b, h.disabledCaps)
	b = binary.AppendUvarint(b, h.flags)
	return appendBytes(b, h.init)
}

func appendBytes(b, s []byte) []byte { return append(binary.AppendUvarint(b, uint64(len(s))), s...) }

// append writes one record with one write, at the end of the last whole one.
func (t *table) append(kind byte, payload []byte) error {
	if t == nil {
		return nil
	}
	rec := make([]byte, 5, 5+len(payload))
	binary.LittleEndian.PutUint32(rec, uint32(1+len(payload)))
	rec[4] = kind
	rec = append(rec, payload...)
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.off+int64(len(rec)) > maxTableSize {
		return errors.New("fs: session table full")
	}
	if n, err := t.f.WriteAt(rec, t.off); err != nil || n != len(rec) {
		return fmt.Errorf("fs: writing the session table: %d of %d bytes: %w", n, len(rec), err)
	}
	t.off += int64(len(rec))
	return nil
}

func (t *table) appendRef(ino uint64, name string) error {
	return t.append(recRef, appendBytes(binary.AppendUvarint(nil, ino), []byte(name)))
}

func (t *table) appendBlock(n uint64, ref string, key digest.Digest, ident chunked.Sum) error {
	b := binary.AppendUvarint(nil, n)
	b = appendBytes(b, []byte(ref))
	b = appendBytes(b, []byte(key))
	return t.append(recBlock, append(b, ident[:]...))
}

func (t *table) appendBacking(ino uint64, id int32) error {
	return t.append(recBacking, binary.AppendUvarint(binary.AppendUvarint(nil, ino), uint64(id)))
}

func (t *table) appendUnbacking(ino uint64) error {
	return t.append(recUnbacking, binary.AppendUvarint(nil, ino))
}

func (t *table) appendUses(k useKey, n int64) error {
	b := appendBytes(nil, []byte(k.ref))
	b = appendBytes(b, []byte(k.key))
	return t.append(recUses, binary.AppendUvarint(b, uint64(n)))
}

// readSessionState reads and decodes the session table in f.
func readSessionState(f *os.File) (*sessionState, error) {
	fi, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("fs: session table: %w", err)
	}
	if fi.Size() > maxTableSize {
		return nil, fmt.Errorf("fs: session table of %d bytes, more than %d", fi.Size(), maxTableSize)
	}
	data := make([]byte, fi.Size())
	if _, err := f.ReadAt(data, 0); err != nil && !errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("fs: session table: %w", err)
	}
	return decodeSessionState(data)
}

// decodeSessionState decodes a session table. A record cut short at the end is left out.
func decodeSessionState(data []byte) (*sessionState, error) {
	if len(data) > maxTableSize {
		return nil, fmt.Errorf("fs: session table of %d bytes, more than %d", len(data), maxTableSize)
	}
	if !bytes.HasPrefix(data, []byte(tableMagic)) {
		return nil, errors.New("fs: not a session table")
	}
	st := &sessionState{backing: map[uint64]int32{}, uses: map[useKey]int64{}}
	seen := &seenRecords{refNames: map[string]bool{}, refInos: map[uint64]bool{}, blocks: map[uint64]bool{},
		blockKeys: map[blockKey]bool{}, dirs: map[useKey]bool{}}
	off := len(tableMagic)
	for i := 0; ; i++ {
		rest := data[off:]
		if len(rest) < 5 {
			break
		}
		n := binary.LittleEndian.Uint32(rest)
		if n == 0 || n > maxRecordSize {
			return nil, fmt.Errorf("fs: session table: record %d: length %d", i, n)
		}
		if uint64(len(rest)-4) < uint64(n) {
			break // cut short
		}
		kind, d := rest[4], &dec{b: rest[5 : 4+n]}
		if (i == 0) != (kind == recHeader) {
			return nil, fmt.Errorf("fs: session table: record %d: kind %d", i, kind)
		}
		if err := st.decodeRecord(kind, d, seen); err != nil {
			return nil, fmt.Errorf("fs: session table: record %d: %w", i, err)
		}
		if d.bad || len(d.b) != 0 {
			return nil, fmt.Errorf("fs: session table: record %d (kind %d) malformed", i, kind)
		}
		off += 4 + int(n)
	}
	if st.hdr.init == nil {
		return nil, errors.New("fs: session table without a header")
	}
	st.end = int64(off)
	return st, nil
}

// seenRecords is what the records before the one being decoded defined.
type seenRecords struct {
	refNames  map[string]bool
	refInos   map[uint64]bool
	blocks    map[uint64]bool
	blockKeys map[blockKey]bool
	dirs      map[useKey]bool // layer directories with a block
}

func (st *sessionState) decodeRecord(kind byte, d *dec, seen *seenRecords) error {
	refNames, refInos, blocks, blockKeys := seen.refNames, seen.refInos, seen.blocks, seen.blockKeys
	switch kind {
	case recHeader:
		if v := d.uvarint(); v != tableVersion {
			return fmt.Errorf("format version %d, want %d", v, tableVersion)
		}
		h := &st.hdr
		h.dev = d.uvarint()
		h.started = time.Unix(0, d.varint())
		h.maxWrite = int(d.uvarint())
		h.maxReadAhead = int(d.uvarint())
		h.disabledCaps = d.uvarint()
		h.flags = d.uvarint()
		h.init = d.bytes(maxRecordSize)
		if h.maxWrite <= 0 || h.maxWrite > 16<<20 || h.maxReadAhead < 0 || h.maxReadAhead > 16<<20 || len(h.init) == 0 {
			return errors.New("header out of range")
		}
	case recRef:
		ino, name := d.uvarint(), string(d.bytes(maxNameLen))
		ref, ok := decodeRef(name)
		if ino < firstRefIno || ino > lastRefIno || !ok || refNames[name] || refInos[ino] {
			return fmt.Errorf("reference directory %q numbered %#x", name, ino)
		}
		refNames[name], refInos[ino] = true, true
		st.refs = append(st.refs, refRec{ino: ino, name: name, ref: ref})
	case recBlock:
		b := blockRec{n: d.uvarint(), ref: string(d.bytes(maxNameLen))}
		key, okKey := parseKey(string(d.bytes(maxNameLen)))
		b.key = key
		copy(b.ident[:], d.raw(len(b.ident)))
		_, err := reference.ParseNormalizedNamed(b.ref)
		k := blockKey{b.ref, b.key, b.ident}
		if b.n < 1 || b.n > maxBlock || err != nil || !okKey || blocks[b.n] || blockKeys[k] {
			return fmt.Errorf("block %d of %q %q", b.n, b.ref, b.key)
		}
		blocks[b.n], blockKeys[k] = true, true
		seen.dirs[useKey{b.ref, b.key}] = true
		st.blocks = append(st.blocks, b)
	case recBacking:
		ino, id := d.uvarint(), d.uvarint()
		if !blocks[ino>>blockShift] || ino&(1<<blockShift-1) < inoEntries || id == 0 || id > 1<<31-1 {
			return fmt.Errorf("backing ID %d of inode %#x", id, ino)
		}
		if _, ok := st.backing[ino]; ok {
			return fmt.Errorf("inode %#x registered twice", ino)
		}
		st.backing[ino] = int32(id)
	case recUnbacking:
		ino := d.uvarint()
		if _, ok := st.backing[ino]; !ok {
			return fmt.Errorf("inode %#x unregistered, not registered", ino)
		}
		delete(st.backing, ino)
	case recUses:
		k := useKey{ref: string(d.bytes(maxNameLen))}
		key, ok := parseKey(string(d.bytes(maxNameLen)))
		k.key = key
		n := d.uvarint()
		if !ok || n > maxUses || !seen.dirs[k] {
			return fmt.Errorf("%d uses of %q %q, a layer directory not numbered", n, k.ref, k.key)
		}
		if n == 0 {
			delete(st.uses, k)
		} else {
			st.uses[k] = int64(n)
		}
	default:
		return fmt.Errorf("unknown kind %d", kind)
	}
	return nil
}

// dec reads the fields of a record; a field that does not fit marks it bad.
type dec struct {
	b   []byte
	bad bool
}

func (d *dec) uvarint() uint64 {
	v, n := binary.Uvarint(d.b)
	if n <= 0 {
		d.bad, d.b = true, nil
		return 0
	}
	d.b = d.b[n:]
	return v
}

func (d *dec) varint() int64 {
	v, n := binary.Varint(d.b)
	if n <= 0 {
		d.bad, d.b = true, nil
		return 0
	}
	d.b = d.b[n:]
	return v
}

// raw reads n bytes.
func (d *dec) raw(n int) []byte {
	if d.bad || n > len(d.b) {
		d.bad, d.b = true, nil
		return nil
	}
	s := d.b[:n:n]
	d.b = d.b[n:]
	return s
}

// bytes reads a length (at most limit) and that many bytes.
func (d *dec) bytes(limit uint64) []byte {
	n := d.uvarint()
	if d.bad || n > limit || n > uint64(len(d.b)) {
		d.bad, d.b = true, nil
		return nil
	}
	s := d.b[:n:n]
	d.b = d.b[n:]
	return s
}
