package chunked

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"math"
	"math/bits"
	"runtime"

	"github.com/layerstore/layerstore/internal/prefault"
)

// The compact binary form of an Index, little-endian throughout:
//
//	header    headerSize bytes: magic, version, format, counts, root, the layer's offsets and
//	          its tar-split digest (see the offsets below)
//	ends      one uint32 per entry: where its record ends in recs (it starts where the
//	          previous one ends)
//	children  uint32 entry IDs: the visible entries but the root, by (Parent, BaseName)
//	times     when the TOC has access or change times, two int64 per TOC entry
//	recs      the entry records, one after the other
//	chunks    the chunks of files of more than one chunk, chunkSize bytes each: offset,
//	          length, inner offset and file offset (int64), digest, zeros (a byte); a chunk's
//	          size is up to the next one's file offset, or the end of the file
//
// An entry record is: its type and flags (a byte each), opt (a uvarint of the opt bits
// below: which optional fields follow), dir, its name (a uvarint length and the bytes), mode,
// uid, gid, the modification time (a varint of seconds and a uvarint of nanoseconds), size,
// then the optional fields in this order: link, dev, inode, attr, nlink, digest, the one
// chunk, the chunk table's, xattrs. dir is the entry's Parent for a
// visible entry, and the entry its name continues: the record holds only the base name
// (a whiteout's without ".wh."), unless optFullName says it holds the whole Name (the root,
// and hidden or shadowed entries whose directory has no entry). A file of one chunk holds it
// in its record (its file offset is 0, its size the file's; its digest is the file's unless
// optChunkSum), a file of more holds where its chunks start in the chunk table and how many.
const (
	indexMagic   = "LSIX"
	indexVersion = 1
	headerSize   = 88
	chunkSize    = 4*8 + 32 + 1
	timesSize    = 16
)

// The opt bits of an entry record.
// The most common come first: a file's record has one byte of them.
const (
	optDigest   = 1 << iota // 32 bytes: Digest
	optChunk                // one chunk: uvarint offset, length, inner offset
	optChunkSum             // after optChunk: 32 bytes, the chunk's digest (else the file's)
	optZeros                // the one chunk holds only zeros
	optChunks               // uvarint first chunk in the chunk table, number of chunks
	optLink                 // uvarint length and bytes: LinkName
	optNlink                // uvarint Nlink (else 2 for a visible directory, 1 for another visible entry, 0)
	optFullName             // name is the whole Name
	optDev                  // uvarint DevMajor, DevMinor
	optInode                // uvarint Inode (else the entry itself)
	optAttr                 // uvarint attribute entry (else the entry itself)
	optXattrs               // uvarint count, then each: uvarint length and name, uvarint length and value
	optAll      = 1<<iota - 1
)

const allFlags = FlagWhiteout | FlagOpaque | FlagHidden | FlagShadowed | FlagImplicit

// compact returns the Index of the wide form. It sizes the form first and then writes it in
// place, so that a large index is allocated once, at its size (not grown, nor copied into
// place with its chunk table), and lets go of the wide form as it writes (see releaser): the
// form is written in entry order, and a record needs no other entry's than the one it
// describes (its dir is its Parent, or in hiddenDirs), so that the entries and chunks behind
// are no longer read. The wide form is unusable after: only its header fields and names
// remain.
func (w *wideIndex) compact() (*Index, error) {
	n := w.entries.len()
	if uint64(n) > math.MaxUint32 {
		return nil, limitf("%d entries", n)
	}
	var recsLen, nTable, hidden int
	for i := range n {
		id := EntryID(i)
		if e := w.entries.at(i); e.Visible() && id != w.root && (e.Parent == id || !w.nameIs(w.entries.at(int(e.Parent)), w.dirOf(e))) {
			return nil, fmt.Errorf("index: entry %q has no parent directory entry", w.nameOf(e))
		}
		name, dir, isFull := w.recordName(id, &hidden)
		opt := w.recordOpt(id, isFull)
		recsLen += w.recordSize(id, opt, name, dir, nTable)
		if opt&optChunks != 0 {
			nTable += int(w.entries.at(i).nchunks)
		}
		if uint64(recsLen) > math.MaxUint32 {
			return nil, limitf("index of more than 4 GiB")
		}
	}
	rel := releaser{w}
	nChildren := len(w.children)
	data := w.startForm(recsLen + nTable*chunkSize)
	if !w.keep { // copied into the form
		w.freeChildren()
		w.children = nil
	}
	prefix := len(data)
	data = data[:cap(data)]
	recs := data[: prefix : prefix+recsLen] // full once every record is in
	table := data[prefix+recsLen : prefix+recsLen]
	endsAhead := faultAhead{b: data[:headerSize+4*n], next: headerSize}
	recsAhead := faultAhead{b: data[:prefix+recsLen], next: prefix}
	tableAhead := faultAhead{b: data, next: prefix + recsLen}
	hidden = 0
	for i := range n {
		endsAhead.to(headerSize + 4*i)
		recsAhead.to(len(recs))
		tableAhead.to(prefix + recsLen + len(table))
		id := EntryID(i)
		e := w.entries.at(i)
		name, dir, isFull := w.recordName(id, &hidden)
		opt := w.recordOpt(id, isFull)
		recs = w.appendRecord(recs, id, opt, name, dir, len(table)/chunkSize)
		if opt&optChunks != 0 {
			table = w.appendChunkTable(table, e)
		}
		binary.LittleEndian.PutUint32(data[headerSize+4*i:], uint32(len(recs)-prefix))
		rel.written(i, e)
	}
	if len(recs) != prefix+recsLen || &recs[0] != &data[0] || len(table) != nTable*chunkSize {
		return nil, fmt.Errorf("index: records of %d bytes, sized %d", len(recs)-prefix, recsLen)
	}
	w.putHeader(data, recsLen, nTable, nChildren)
	return indexOf(data)
}

// startForm returns the binary form up to its records (the header, the ends, the children
// and the times), with the capacity for the rest bytes after it. The ends are left to be
// written.
func (w *wideIndex) startForm(rest int) []byte {
	n := w.entries.len()
	ntimes := 0
	if w.times != nil {
		ntimes = w.tocCount
	}
	le := binary.LittleEndian
	prefix := headerSize + 4*n + 4*len(w.children) + timesSize*ntimes
	data := make([]byte, headerSize+4*n, prefix+rest)
	prefault.Write(data[headerSize+4*n : prefix]) // written now; the rest as compact writes it (faultAhead)
	for _, id := range w.children {
		data = le.AppendUint32(data, uint32(id))
	}
	for i := range ntimes {
		var t extTimes
		if i < len(w.times) {
			t = w.times[i]
		}
		data = le.AppendUint64(le.AppendUint64(data, uint64(t.atime)), uint64(t.ctime))
	}
	return data
}

// recordName returns the name entry id's record holds and its dir: the entry's base name
// and the entry its name continues when there is one, else its whole Name (full). It reads
// no other entry: a visible entry's name continues its Parent's (compact checked it), that of
// one that is not visible the one linkParents noted, the next of hiddenDirs from *hidden.
func (w *wideIndex) recordName(id EntryID, hidden *int) (name string, dir EntryID, full bool) {
	e := w.entries.at(int(id))
	switch {
	case id == w.root:
		return w.nameOf(e), e.Parent, true
	case e.Visible():
		return w.baseName(id), e.Parent, false
	}
	dir = w.hiddenDirs[*hidden]
	*hidden++
	if dir == noDir {
		return w.nameOf(e), 0, true
	}
	return w.baseName(id), dir, false
}

// recordOpt returns the opt bits of entry id's record: which optional fields it holds.
func (w *wideIndex) recordOpt(id EntryID, full bool) uint64 {
	e := w.entries.at(int(id))
	var opt uint64
	if full {
		opt |= optFullName
	}
	defNlink := uint32(0) // what an index takes when the record holds none
	if e.Visible() {
		defNlink = 1
		if e.Type == TypeDir {
			defNlink = 2
		}
	}
	switch {
	case e.nchunks == 1:
		c := w.chunk(e, 0)
		opt |= optChunk
		if c.Digest != e.Digest {
			opt |= optChunkSum
		}
		if c.Zeros {
			opt |= optZeros
		}
	case e.nchunks > 1:
		opt |= optChunks
	}
	ex := w.extraOf(e)
	if ex.linkLen != 0 {
		opt |= optLink
	}
	if ex.DevMajor != 0 || ex.DevMinor != 0 {
		opt |= optDev
	}
	if w.inode(id, e) != id {
		opt |= optInode
	}
	if w.attrOf(id, e) != id {
		opt |= optAttr
	}
	if w.nlink(e) != defNlink {
		opt |= optNlink
	}
	if !e.Digest.IsZero() {
		opt |= optDigest
	}
	if ex.nxattrs != 0 {
		opt |= optXattrs
	}
	return opt
}

// appendRecord appends entry id's record, with the fields opt names, name and dir (see
// recordName); chunk0 is where its chunks start in the chunk table, with optChunks.
func (w *wideIndex) appendRecord(recs []byte, id EntryID, opt uint64, name string, dir EntryID, chunk0 int) []byte {
	e := w.entries.at(int(id))
	recs = append(recs, byte(e.Type), byte(e.Flags))
	recs = binary.AppendUvarint(recs, opt)
	recs = binary.AppendUvarint(recs, uint64(dir))
	recs = binary.AppendUvarint(recs, uint64(len(name)))
	recs = append(recs, name...)
	recs = binary.AppendUvarint(recs, uint64(e.Mode))
	recs = binary.AppendUvarint(recs, uint64(e.UID))
	recs = binary.AppendUvarint(recs, uint64(e.GID))
	sec, nsec := w.modTime(id, e)
	recs = binary.AppendVarint(recs, sec)
	recs = binary.AppendUvarint(recs, uint64(nsec))
	recs = binary.AppendUvarint(recs, uint64(e.Size))
	ex := w.extraOf(e)
	if opt&optLink != 0 {
		link := w.linkName(ex)
		recs = binary.AppendUvarint(recs, uint64(len(link)))
		recs = append(recs, link...)
	}
	if opt&optDev != 0 {
		recs = binary.AppendUvarint(recs, uint64(ex.DevMajor))
		recs = binary.AppendUvarint(recs, uint64(ex.DevMinor))
	}
	if opt&optInode != 0 {
		recs = binary.AppendUvarint(recs, uint64(w.inode(id, e)))
	}
	if opt&optAttr != 0 {
		recs = binary.AppendUvarint(recs, uint64(w.attrOf(id, e)))
	}
	if opt&optNlink != 0 {
		recs = binary.AppendUvarint(recs, uint64(w.nlink(e)))
	}
	if opt&optDigest != 0 {
		recs = append(recs, e.Digest[:]...)
	}
	if opt&optChunk != 0 {
		c := w.chunk(e, 0)
		recs = binary.AppendUvarint(recs, uint64(c.Offset))
		recs = binary.AppendUvarint(recs, uint64(c.Length))
		recs = binary.AppendUvarint(recs, uint64(c.InnerOffset))
		if opt&optChunkSum != 0 {
			recs = append(recs, c.Digest[:]...)
		}
	}
	if opt&optChunks != 0 {
		recs = binary.AppendUvarint(recs, uint64(chunk0))
		recs = binary.AppendUvarint(recs, uint64(e.nchunks))
	}
	if opt&optXattrs != 0 {
		recs = binary.AppendUvarint(recs, uint64(ex.nxattrs))
		for k := range int(ex.nxattrs) {
			xa := w.xattrAt(ex, k)
			recs = binary.AppendUvarint(recs, uint64(len(xa.Name)))
			recs = append(recs, xa.Name...)
			recs = binary.AppendUvarint(recs, uint64(len(xa.Value)))
			recs = append(recs, xa.Value...)
		}
	}
	return recs
}

// recordSize returns the length of the record appendRecord appends with the same arguments.
func (w *wideIndex) recordSize(id EntryID, opt uint64, name string, dir EntryID, chunk0 int) int {
	e := w.entries.at(int(id))
	sec, nsec := w.modTime(id, e)
	n := 2 + uvlen(opt) + uvlen(uint64(dir)) + uvlen(uint64(len(name))) + len(name) +
		uvlen(uint64(e.Mode)) + uvlen(uint64(e.UID)) + uvlen(uint64(e.GID)) +
		uvlen(uint64(sec)<<1^uint64(sec>>63)) + uvlen(uint64(nsec)) + uvlen(uint64(e.Size))
	ex := w.extraOf(e)
	if opt&optLink != 0 {
		n += uvlen(uint64(ex.linkLen)) + int(ex.linkLen)
	}
	if opt&optDev != 0 {
		n += uvlen(uint64(ex.DevMajor)) + uvlen(uint64(ex.DevMinor))
	}
	if opt&optInode != 0 {
		n += uvlen(uint64(w.inode(id, e)))
	}
	if opt&optAttr != 0 {
		n += uvlen(uint64(w.attrOf(id, e)))
	}
	if opt&optNlink != 0 {
		n += uvlen(uint64(w.nlink(e)))
	}
	if opt&optDigest != 0 {
		n += len(e.Digest)
	}
	if opt&optChunk != 0 {
		c := w.chunk(e, 0)
		n += uvlen(uint64(c.Offset)) + uvlen(uint64(c.Length)) + uvlen(uint64(c.InnerOffset))
		if opt&optChunkSum != 0 {
			n += len(c.Digest)
		}
	}
	if opt&optChunks != 0 {
		n += uvlen(uint64(chunk0)) + uvlen(uint64(e.nchunks))
	}
	if opt&optXattrs != 0 {
		n += uvlen(uint64(ex.nxattrs))
		for k := range int(ex.nxattrs) {
			xa := w.xattrAt(ex, k)
			n += uvlen(uint64(len(xa.Name))) + len(xa.Name) + uvlen(uint64(len(xa.Value))) + len(xa.Value)
		}
	}
	return n
}

// uvlen is the length of v as a uvarint.
func uvlen(v uint64) int { return (bits.Len64(v|1) + 6) / 7 }

// appendChunkTable appends the chunks of file e to the chunk table.
func (w *wideIndex) appendChunkTable(table []byte, e *wideEntry) []byte {
	for i := range int(e.nchunks) {
		c := w.chunk(e, i)
		for _, v := range []int64{c.Offset, c.Length, c.InnerOffset, c.FileOffset} {
			table = binary.LittleEndian.AppendUint64(table, uint64(v))
		}
		table = append(table, c.Digest[:]...)
		table = append(table, b2byte(c.Zeros))
	}
	return table
}

// putHeader writes the header of the binary form data, whose records take recsLen bytes
// and whose chunk table holds nTable chunks.
func (w *wideIndex) putHeader(data []byte, recsLen, nTable, nChildren int) {
	le := binary.LittleEndian
	copy(data, indexMagic)
	le.PutUint32(data[4:], indexVersion)
	data[8] = byte(w.format)
	data[9] = b2byte(w.times != nil)
	le.PutUint32(data[12:], uint32(w.root))
	le.PutUint32(data[16:], uint32(w.entries.len()))
	le.PutUint32(data[20:], uint32(w.tocCount))
	le.PutUint32(data[24:], uint32(nTable))
	le.PutUint32(data[28:], uint32(nChildren))
	le.PutUint64(data[32:], uint64(recsLen))
	le.PutUint64(data[40:], uint64(w.prefetchEnd))
	le.PutUint64(data[48:], uint64(w.payloadEnd))
	copy(data[56:], w.tarSplitDigest[:])
}

func b2byte(b bool) byte {
	if b {
		return 1
	}
	return 0
}

// indexOf reads the header of data and slices its sections, checking only that they fit.
func indexOf(data []byte) (*Index, error) {
	if len(data) < headerSize || string(data[:4]) != indexMagic {
		return nil, invalidf("index: not an index")
	}
	le := binary.LittleEndian
	if v := le.Uint32(data[4:]); v != indexVersion {
		return nil, invalidf("index: version %d, want %d", v, indexVersion)
	}
	x := &Index{
		data:        data,
		format:      Format(data[8]),
		root:        EntryID(le.Uint32(data[12:])),
		n:           int(le.Uint32(data[16:])),
		tocCount:    int(le.Uint32(data[20:])),
		prefetchEnd: int64(le.Uint64(data[40:])),
		payloadEnd:  int64(le.Uint64(data[48:])),
	}
	copy(x.tarSplitDigest[:], data[56:])
	if data[9] > 1 || data[10] != 0 || data[11] != 0 {
		return nil, invalidf("index: bad header")
	}
	nTable, nChildren, recsLen := uint64(le.Uint32(data[24:])), uint64(le.Uint32(data[28:])), le.Uint64(data[32:])
	nTimes := uint64(0)
	if data[9] == 1 {
		nTimes = uint64(x.tocCount)
	}
	rest := data[headerSize:]
	for _, s := range []struct {
		dst  *[]byte
		size uint64
	}{
		{&x.ends, 4 * uint64(x.n)}, {&x.children, 4 * nChildren}, {&x.times, timesSize * nTimes},
		{&x.recs, recsLen}, {&x.chunks, chunkSize * nTable},
	} {
		if s.size > uint64(len(rest)) {
			return nil, invalidf("index: truncated")
		}
		*s.dst, rest = rest[:s.size:s.size], rest[s.size:]
	}
	if len(rest) != 0 {
		return nil, invalidf("index: %d bytes of trailing data", len(rest))
	}
	return x, nil
}

// Binary returns the index's compact binary form itself, not a copy, for writing it out
// without a second copy of it on the heap: the caller must not modify it, and must keep x
// alive while it uses it (runtime.KeepAlive), as the form may be a mapping released with x.
func (x *Index) Binary() []byte { return x.data }

// Moved returns the index x is, using data in place of x's own binary form: data must hold
// the same bytes (say, the mapping of the file x was just written to). It costs a
// comparison of the bytes, where [LoadIndex] checks the structure of untrusted ones: x's was
// checked when x was built or loaded, and data is x's. data is used as by LoadIndex.
//
// The bytes are compared in windows of movedWindow; read, when not nil, is called after each,
// with the bytes of data compared so far: a mapping's caller can take them out of its resident
// memory there, so that the comparison never holds the whole mapping beside x (a million-entry
// index: 82 MiB of each).
func (x *Index) Moved(data []byte, read func(done []byte)) (*Index, error) {
	same := len(data) == len(x.data)
	for off := 0; same && off < len(data); off += movedWindow {
		end := min(off+movedWindow, len(data))
		same = bytes.Equal(data[off:end], x.data[off:end])
		if read != nil {
			read(data[:end])
		}
	}
	runtime.KeepAlive(x)
	if !same {
		return nil, invalidf("index: %d bytes that are not the index's", len(data))
	}
	return indexOf(data)
}

// movedWindow is the window of Moved's comparison.
const movedWindow = 8 << 20
