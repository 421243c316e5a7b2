package chunked

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"math"
	"runtime"
	"strings"
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

// wideIndex is the form the builder fills: one Go value per entry, chunk and xattr.
type wideIndex struct {
	format   Format
	entries  []Entry
	chunks   []Chunk
	xattrs   []Xattr
	children []EntryID // visible entries except the root, sorted by (Parent, BaseName)
	root     EntryID
	tocCount int // entries[:tocCount] are the TOC's non-chunk entries, in TOC order

	// times holds access and change times, in TOC order, when the TOC has them.
	times []extTimes

	tarSplitDigest Sum
	prefetchEnd    int64
	payloadEnd     int64
}

type extTimes struct {
	atime, ctime int64 // Unix nanoseconds, 0 when absent
}

// baseName is Index.BaseName on the wide form.
func (w *wideIndex) baseName(id EntryID) string {
	e := &w.entries[id]
	b := e.Name[strings.LastIndexByte(e.Name, '/')+1:]
	if e.Flags&FlagWhiteout != 0 {
		b = b[len(whiteoutPrefix):]
	}
	return b
}

func dirOf(p string) string {
	if i := strings.LastIndexByte(p, '/'); i >= 0 {
		return p[:i]
	}
	return ""
}

// compact returns the Index of the wide form. paths maps tree paths to the entries holding
// them, as the builder left it.
func (w *wideIndex) compact(paths map[string]EntryID) (*Index, error) {
	n := len(w.entries)
	if uint64(n) > math.MaxUint32 {
		return nil, limitf("%d entries", n)
	}
	ntimes := 0
	if w.times != nil {
		ntimes = w.tocCount
	}
	le := binary.LittleEndian
	prefix := headerSize + 4*n + 4*len(w.children) + timesSize*ntimes
	data := make([]byte, headerSize+4*n, prefix+n*96)
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
	recs := data // the records are appended to data, ends set in place
	var table []byte
	for id := range w.entries {
		e := &w.entries[id]
		visible := e.Visible()
		var opt uint64
		name, dir, full := e.Name, EntryID(0), true
		if visible {
			dir = e.Parent
		}
		if EntryID(id) != w.root {
			i := strings.LastIndexByte(e.Name, '/')
			d, base := e.Name[:max(i, 0)], e.Name[i+1:]
			cand, ok := dir, visible
			if !visible {
				cand, ok = paths[d]
			}
			if ok && int(cand) != id && w.entries[cand].Name == d {
				if e.Flags&FlagWhiteout != 0 {
					base = base[len(whiteoutPrefix):]
				}
				name, dir, full = base, cand, false
			}
		}
		if full {
			if visible && EntryID(id) != w.root {
				return nil, fmt.Errorf("index: entry %q has no parent directory entry", e.Name)
			}
			opt |= optFullName
		}
		defNlink := uint32(0)
		if visible {
			defNlink = 1
			if e.Type == TypeDir {
				defNlink = 2
			}
		}
		var c Chunk
		switch {
		case e.nchunks == 1:
			c = w.chunks[e.chunk0]
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
		if e.LinkName != "" {
			opt |= optLink
		}
		if e.DevMajor != 0 || e.DevMinor != 0 {
			opt |= optDev
		}
		if e.Inode != EntryID(id) {
			opt |= optInode
		}
		if e.attr != EntryID(id) {
			opt |= optAttr
		}
		if e.Nlink != defNlink {
			opt |= optNlink
		}
		if !e.Digest.IsZero() {
			opt |= optDigest
		}
		if e.nxattrs != 0 {
			opt |= optXattrs
		}
		recs = append(recs, byte(e.Type), byte(e.Flags))
		recs = binary.AppendUvarint(recs, opt)
		recs = binary.AppendUvarint(recs, uint64(dir))
		recs = binary.AppendUvarint(recs, uint64(len(name)))
		recs = append(recs, name...)
		recs = binary.AppendUvarint(recs, uint64(e.Mode))
		recs = binary.AppendUvarint(recs, uint64(e.UID))
		recs = binary.AppendUvarint(recs, uint64(e.GID))
		recs = binary.AppendVarint(recs, e.ModTimeSec)
		recs = binary.AppendUvarint(recs, uint64(e.ModTimeNsec))
		recs = binary.AppendUvarint(recs, uint64(e.Size))
		if opt&optLink != 0 {
			recs = binary.AppendUvarint(recs, uint64(len(e.LinkName)))
			recs = append(recs, e.LinkName...)
		}
		if opt&optDev != 0 {
			recs = binary.AppendUvarint(recs, uint64(e.DevMajor))
			recs = binary.AppendUvarint(recs, uint64(e.DevMinor))
		}
		if opt&optInode != 0 {
			recs = binary.AppendUvarint(recs, uint64(e.Inode))
		}
		if opt&optAttr != 0 {
			recs = binary.AppendUvarint(recs, uint64(e.attr))
		}
		if opt&optNlink != 0 {
			recs = binary.AppendUvarint(recs, uint64(e.Nlink))
		}
		if opt&optDigest != 0 {
			recs = append(recs, e.Digest[:]...)
		}
		if opt&optChunk != 0 {
			recs = binary.AppendUvarint(recs, uint64(c.Offset))
			recs = binary.AppendUvarint(recs, uint64(c.Length))
			recs = binary.AppendUvarint(recs, uint64(c.InnerOffset))
			if opt&optChunkSum != 0 {
				recs = append(recs, c.Digest[:]...)
			}
		}
		if opt&optChunks != 0 {
			recs = binary.AppendUvarint(recs, uint64(len(table)/chunkSize))
			recs = binary.AppendUvarint(recs, uint64(e.nchunks))
			for _, c := range w.chunks[e.chunk0 : e.chunk0+e.nchunks] {
				for _, v := range []int64{c.Offset, c.Length, c.InnerOffset, c.FileOffset} {
					table = binary.LittleEndian.AppendUint64(table, uint64(v))
				}
				table = append(table, c.Digest[:]...)
				table = append(table, b2byte(c.Zeros))
			}
		}
		if opt&optXattrs != 0 {
			recs = binary.AppendUvarint(recs, uint64(e.nxattrs))
			for _, xa := range w.xattrs[e.xattr0 : e.xattr0+uint32(e.nxattrs)] {
				recs = binary.AppendUvarint(recs, uint64(len(xa.Name)))
				recs = append(recs, xa.Name...)
				recs = binary.AppendUvarint(recs, uint64(len(xa.Value)))
				recs = append(recs, xa.Value...)
			}
		}
		if uint64(len(recs)-prefix) > math.MaxUint32 {
			return nil, limitf("index of more than 4 GiB")
		}
		le.PutUint32(recs[headerSize+4*id:], uint32(len(recs)-prefix))
	}
	nTable := len(table) / chunkSize
	if size := len(recs) + len(table); size <= cap(recs) && cap(recs)-size <= size/8 {
		data = append(recs, table...)
	} else { // not to keep much spare capacity for the index's life (a copy costs its size again)
		data = make([]byte, len(recs)+len(table))
		copy(data[copy(data, recs):], table)
	}
	recsLen := len(recs) - prefix
	copy(data, indexMagic)
	le.PutUint32(data[4:], indexVersion)
	data[8] = byte(w.format)
	data[9] = b2byte(w.times != nil)
	le.PutUint32(data[12:], uint32(w.root))
	le.PutUint32(data[16:], uint32(n))
	le.PutUint32(data[20:], uint32(w.tocCount))
	le.PutUint32(data[24:], uint32(nTable))
	le.PutUint32(data[28:], uint32(len(w.children)))
	le.PutUint64(data[32:], uint64(recsLen))
	le.PutUint64(data[40:], uint64(w.prefetchEnd))
	le.PutUint64(data[48:], uint64(w.payloadEnd))
	copy(data[56:], w.tarSplitDigest[:])
	return indexOf(data)
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

// BinarySize returns the size of the index's compact binary form.
func (x *Index) BinarySize() int { return len(x.data) }

// AppendBinary appends the index's compact binary form to b.
func (x *Index) AppendBinary(b []byte) ([]byte, error) {
	b = append(b, x.data...)
	runtime.KeepAlive(x)
	return b, nil
}

// Binary returns the index's compact binary form itself, not a copy, for writing it out
// without a second copy of it on the heap: the caller must not modify it, and must keep x
// alive while it uses it (runtime.KeepAlive), as the form may be a mapping released with x.
func (x *Index) Binary() []byte { return x.data }

// Moved returns the index x is, using data in place of x's own binary form: data must hold
// the same bytes (say, the mapping of the file x was just written to). It costs a
// comparison of the bytes, where [LoadIndex] checks the structure of untrusted ones: x's was
// checked when x was built or loaded, and data is x's. data is used as by LoadIndex.
func (x *Index) Moved(data []byte) (*Index, error) {
	same := bytes.Equal(data, x.data)
	runtime.KeepAlive(x)
	if !same {
		return nil, invalidf("index: %d bytes that are not the index's", len(data))
	}
	return indexOf(data)
}

// head is the start of an entry record: what lookups need.
type head struct {
	typ   Type
	flags Flags
	opt   uint64
	dir   EntryID
	name  []byte // aliases the record
}

// base returns the entry's name in its directory.
func (h *head) base() []byte {
	b := h.name
	if h.opt&optFullName != 0 {
		b = b[bytes.LastIndexByte(b, '/')+1:]
		if h.flags&FlagWhiteout != 0 && bytes.HasPrefix(b, []byte(whiteoutPrefix)) {
			b = b[len(whiteoutPrefix):]
		}
	}
	return b
}

// rec is a decoded entry record; its byte slices alias the record.
type rec struct {
	head
	id                 EntryID
	mode, uid, gid     uint32
	mtimeSec           int64
	mtimeNsec          uint32
	size               int64
	link               []byte
	devMajor, devMinor uint32
	inode, attr        EntryID
	nlink              uint32
	digest             Sum
	chunk              Chunk // the one chunk, with optChunk
	chunk0, nchunks    int   // with optChunks
	xattrs             []byte
	nxattrs            int
}

func (r *rec) visible() bool { return r.flags&(FlagHidden|FlagShadowed) == 0 }

// entry returns the entry without its Name.
func (r *rec) entry() Entry {
	e := Entry{
		LinkName: string(r.link), Size: r.size, ModTimeSec: r.mtimeSec, ModTimeNsec: r.mtimeNsec,
		Mode: r.mode, UID: r.uid, GID: r.gid, DevMajor: r.devMajor, DevMinor: r.devMinor,
		Inode: r.inode, Nlink: r.nlink, Digest: r.digest, Type: r.typ, Flags: r.flags,
	}
	if r.visible() {
		e.Parent = r.dir
	}
	return e
}

// appendXattrs appends copies of the record's xattrs.
func (r *rec) appendXattrs(xs []Xattr) []Xattr {
	d := decoder{b: r.xattrs}
	for range r.nxattrs {
		k := d.bytes(d.uvarint(math.MaxUint32))
		v := d.bytes(d.uvarint(math.MaxUint32))
		if d.bad {
			break
		}
		xs = append(xs, Xattr{string(k), string(v)})
	}
	return xs
}

// decoder reads a record; past an error, it reads zeros and bad is set.
type decoder struct {
	b   []byte
	bad bool
}

func (d *decoder) fail() uint64 { d.bad, d.b = true, nil; return 0 }

func (d *decoder) byte() byte {
	if len(d.b) == 0 {
		d.fail()
		return 0
	}
	c := d.b[0]
	d.b = d.b[1:]
	return c
}

// uvarint reads a uvarint of at most limit.
func (d *decoder) uvarint(limit uint64) uint64 {
	v, k := binary.Uvarint(d.b)
	if k <= 0 || v > limit {
		return d.fail()
	}
	d.b = d.b[k:]
	return v
}

func (d *decoder) varint() int64 {
	v, k := binary.Varint(d.b)
	if k <= 0 {
		d.fail()
		return 0
	}
	d.b = d.b[k:]
	return v
}

func (d *decoder) bytes(n uint64) []byte {
	if n > uint64(len(d.b)) {
		d.fail()
		return nil
	}
	b := d.b[:n:n]
	d.b = d.b[n:]
	return b
}

func (d *decoder) sum() (s Sum) {
	copy(s[:], d.bytes(32))
	return s
}

// raw returns the record of entry id, or nil.
func (x *Index) raw(id EntryID) []byte {
	if uint64(id) >= uint64(x.n) {
		return nil
	}
	le := binary.LittleEndian
	start := uint32(0)
	if id > 0 {
		start = le.Uint32(x.ends[4*(id-1):])
	}
	end := le.Uint32(x.ends[4*id:])
	if start > end || uint64(end) > uint64(len(x.recs)) {
		return nil
	}
	return x.recs[start:end:end]
}

func decodeHead(d *decoder) (h head) {
	h.typ, h.flags = Type(d.byte()), Flags(d.byte())
	h.opt = d.uvarint(optAll)
	h.dir = EntryID(d.uvarint(math.MaxUint32))
	h.name = d.bytes(d.uvarint(maxNameLen))
	if h.typ < TypeReg || h.typ > TypeFifo || h.flags&^allFlags != 0 {
		d.fail()
	}
	return h
}

// head decodes the start of entry id's record.
func (x *Index) head(id EntryID) (head, bool) {
	d := decoder{b: x.raw(id)}
	h := decodeHead(&d)
	if d.bad {
		return head{}, false
	}
	return h, true
}

// rec decodes entry id's record.
func (x *Index) rec(id EntryID) (rec, bool) {
	d := decoder{b: x.raw(id)}
	r := decodeRec(&d, id)
	if d.bad {
		return rec{}, false
	}
	return r, true
}

// decodeRec decodes a record, strictly: d.bad is set unless it is well-formed.
func decodeRec(d *decoder, id EntryID) rec {
	r := rec{head: decodeHead(d), id: id, inode: id, attr: id}
	r.mode = uint32(d.uvarint(0o7777))
	r.uid = uint32(d.uvarint(math.MaxUint32))
	r.gid = uint32(d.uvarint(math.MaxUint32))
	r.mtimeSec = d.varint()
	r.mtimeNsec = uint32(d.uvarint(999_999_999))
	r.size = int64(d.uvarint(math.MaxInt64))
	opt := r.opt
	if opt&optLink != 0 {
		r.link = d.bytes(d.uvarint(maxNameLen))
	}
	if opt&optDev != 0 {
		r.devMajor = uint32(d.uvarint(math.MaxUint32))
		r.devMinor = uint32(d.uvarint(math.MaxUint32))
	}
	if opt&optInode != 0 {
		r.inode = EntryID(d.uvarint(math.MaxUint32))
	}
	if opt&optAttr != 0 {
		r.attr = EntryID(d.uvarint(math.MaxUint32))
	}
	switch {
	case opt&optNlink != 0:
		r.nlink = uint32(d.uvarint(math.MaxUint32))
	case r.visible() && r.typ == TypeDir:
		r.nlink = 2
	case r.visible():
		r.nlink = 1
	}
	if opt&optDigest != 0 {
		r.digest = d.sum()
	}
	if opt&optChunk != 0 {
		r.chunk = Chunk{
			Range:       Range{Offset: int64(d.uvarint(math.MaxInt64)), Length: int64(d.uvarint(math.MaxInt64))},
			InnerOffset: int64(d.uvarint(math.MaxInt64)),
			Size:        r.size,
			Digest:      r.digest,
			Zeros:       opt&optZeros != 0,
		}
		if opt&optChunkSum != 0 {
			r.chunk.Digest = d.sum()
		}
	} else if opt&(optChunkSum|optZeros) != 0 {
		d.fail()
	}
	if opt&optChunks != 0 {
		r.chunk0 = int(d.uvarint(math.MaxUint32))
		r.nchunks = int(d.uvarint(math.MaxUint32))
	}
	if opt&optXattrs != 0 {
		r.nxattrs = int(d.uvarint(math.MaxUint16))
		r.xattrs = d.b
		d.b = nil
	}
	if len(d.b) != 0 {
		d.fail()
	}
	return r
}

// appendName appends entry id's Name to dst.
func (x *Index) appendName(dst []byte, id EntryID) []byte {
	return x.appendNameDepth(dst, id, 0)
}

func (x *Index) appendNameDepth(dst []byte, id EntryID, depth int) []byte {
	h, ok := x.head(id)
	if !ok || depth > maxDepth {
		return dst
	}
	if h.opt&optFullName != 0 {
		return append(dst, h.name...)
	}
	dst = x.appendNameDepth(dst, h.dir, depth+1)
	if len(dst) > 0 {
		dst = append(dst, '/')
	}
	if h.flags&FlagWhiteout != 0 {
		dst = append(dst, whiteoutPrefix...)
	}
	return append(dst, h.name...)
}

// fileChunks locates the chunks of a file.
type fileChunks struct {
	n      int
	size   int64
	one    Chunk // when n == 1 and the chunk is in the record
	chunk0 int   // else, the first in the chunk table
	inline bool
}

// file returns where the chunks of id's inode are.
func (x *Index) file(id EntryID) fileChunks {
	r, _ := x.rec(id)
	if r.inode != id {
		r, _ = x.rec(r.inode)
	}
	switch {
	case r.opt&optChunk != 0:
		return fileChunks{n: 1, size: r.size, one: r.chunk, inline: true}
	case r.opt&optChunks != 0 && r.chunk0+r.nchunks <= len(x.chunks)/chunkSize:
		return fileChunks{n: r.nchunks, size: r.size, chunk0: r.chunk0}
	}
	return fileChunks{}
}

func (x *Index) tableFileOffset(i int) int64 {
	if i < 0 || i >= len(x.chunks)/chunkSize {
		return 0
	}
	return int64(binary.LittleEndian.Uint64(x.chunks[i*chunkSize+24:]))
}

// chunk returns chunk i (< f.n) of a file.
func (x *Index) chunk(f *fileChunks, i int) Chunk {
	if f.inline {
		return f.one
	}
	j := f.chunk0 + i
	if j < 0 || j >= len(x.chunks)/chunkSize {
		return Chunk{}
	}
	b := x.chunks[j*chunkSize : (j+1)*chunkSize]
	le := binary.LittleEndian
	c := Chunk{
		Range:       Range{Offset: int64(le.Uint64(b)), Length: int64(le.Uint64(b[8:]))},
		InnerOffset: int64(le.Uint64(b[16:])),
		FileOffset:  int64(le.Uint64(b[24:])),
		Zeros:       b[64] != 0,
	}
	copy(c.Digest[:], b[32:64])
	end := f.size
	if i+1 < f.n {
		end = x.tableFileOffset(j + 1)
	}
	c.Size = end - c.FileOffset
	return c
}

// LoadIndex returns the index whose compact binary form is data (as [Index.AppendBinary]
// wrote it), after checking its structure so that no method of the returned index can panic
// or misbehave on it, whatever the bytes: every record, offset, count and reference, the
// chunks against limits (as [Parse] would have), names and their paths (no cycle, none too
// long), the order of the children. data is used in place: it may be a read-only mapping that
// the caller unmaps once the *Index is unreachable (runtime.AddCleanup), so no method returns
// memory aliasing data and every method keeps its receiver alive while it reads data. Errors
// wrap [ErrInvalid] or [ErrLimit]. Checking costs a few bytes of transient memory per entry.
func LoadIndex(data []byte, limits Limits) (*Index, error) {
	lim := limits.WithDefaults()
	x, err := indexOf(data)
	if err != nil {
		return nil, err
	}
	if err := x.check(lim); err != nil {
		return nil, err
	}
	return x, nil
}

// check validates an index whose sections fit (see indexOf).
func (x *Index) check(lim Limits) error {
	n := x.n
	switch {
	case n > lim.MaxEntries+1:
		return limitf("index: %d entries exceed %d", n, lim.MaxEntries)
	case x.format > ZstdChunked:
		return invalidf("index: format %d", x.format)
	case x.tocCount > n || int(x.root) >= n:
		return invalidf("index: %d TOC entries or root %d of %d entries", x.tocCount, x.root, n)
	case x.payloadEnd < 0 || x.prefetchEnd < -1 || x.prefetchEnd > x.payloadEnd:
		return invalidf("index: prefetch end %d or payload end %d", x.prefetchEnd, x.payloadEnd)
	case x.numChildren() > n:
		return invalidf("index: %d children of %d entries", x.numChildren(), n)
	}
	if end := binary.LittleEndian.Uint32(x.ends[4*(n-1):]); uint64(end) != uint64(len(x.recs)) {
		return invalidf("index: records end at %d of %d bytes", end, len(x.recs))
	}
	nTable := len(x.chunks) / chunkSize
	dirs := make([]uint32, n)
	kinds := make([]uint8, n) // type, and 0x80 when visible
	own := make([]uint16, n)  // length of the own name, 0x8000 when it is the whole name
	for i := range n {
		id := EntryID(i)
		bad := func(format string, args ...any) error {
			return invalidf("index: entry %d: "+format, append([]any{i}, args...)...)
		}
		raw := x.raw(id)
		if raw == nil {
			return bad("record out of bounds")
		}
		d := decoder{b: raw}
		r := decodeRec(&d, id)
		if d.bad {
			return bad("malformed record")
		}
		if int(r.dir) >= n || int(r.inode) >= n || int(r.attr) >= n {
			return bad("reference out of range")
		}
		full, vis := r.opt&optFullName != 0, r.visible()
		switch {
		case bytes.IndexByte(r.name, 0) >= 0 || bytes.IndexByte(r.link, 0) >= 0:
			return bad("NUL in a name")
		case id == x.root && (!full || len(r.name) != 0 || !vis || r.typ != TypeDir || r.dir != id):
			return bad("bad root")
		case full && vis && id != x.root:
			return bad("visible entry without a parent")
		case !full && (len(r.name) == 0 || bytes.IndexByte(r.name, '/') >= 0 ||
			string(r.name) == "." || string(r.name) == ".."):
			return bad("bad name %q", r.name)
		case (r.opt&optLink != 0) != (r.typ == TypeSymlink || r.typ == TypeHardlink) ||
			(r.opt&optLink != 0 && len(r.link) == 0):
			return bad("link target of a %v", r.typ)
		}
		if err := x.checkChunks(&r, nTable, lim); err != nil {
			return bad("%v", err)
		}
		var prev []byte
		total := 0
		xd := decoder{b: r.xattrs}
		for range r.nxattrs {
			k := xd.bytes(xd.uvarint(math.MaxUint32))
			v := xd.bytes(xd.uvarint(math.MaxUint32))
			total += len(k) + len(v)
			if xd.bad || len(k) == 0 || bytes.IndexByte(k, 0) >= 0 || (prev != nil && bytes.Compare(prev, k) >= 0) {
				return bad("bad xattrs")
			}
			if total > lim.MaxXattrBytes {
				return limitf("index: entry %d: xattrs exceed %d bytes", i, lim.MaxXattrBytes)
			}
			prev = k
		}
		if len(xd.b) != 0 {
			return bad("bad xattrs")
		}
		dirs[i], kinds[i], own[i] = uint32(r.dir), uint8(r.typ), uint16(len(r.name))
		if vis {
			kinds[i] |= 0x80
		}
		if full {
			own[i] |= 0x8000
		} else if r.flags&FlagWhiteout != 0 {
			own[i] += uint16(len(whiteoutPrefix))
		}
	}
	if err := checkNames(dirs, own); err != nil {
		return err
	}
	for i := range n {
		if kinds[i]&0x80 != 0 && EntryID(i) != x.root && kinds[dirs[i]] != 0x80|uint8(TypeDir) {
			return invalidf("index: entry %d: parent %d is not a visible directory", i, dirs[i])
		}
	}
	var prev head
	for i := range x.numChildren() {
		id := x.child(i)
		h, ok := x.head(id)
		if !ok || id == x.root || kinds[id]&0x80 == 0 {
			return invalidf("index: child %d: entry %d is not a visible entry", i, id)
		}
		if i > 0 && (h.dir < prev.dir || h.dir == prev.dir && bytes.Compare(prev.base(), h.base()) >= 0) {
			return invalidf("index: children out of order at %d", i)
		}
		prev = h
	}
	return nil
}

// checkNames checks that every entry's Name ends (no cycle through the dirs of the entries
// that hold only their base names) and is at most maxNameLen bytes of at most maxDepth
// components. own is as check fills it.
func checkNames(dirs []uint32, own []uint16) error {
	const busy = math.MaxUint16
	plen := make([]uint16, len(dirs)) // the Name's length + 1; 0 unknown, busy on the walk
	var stack []uint32
	for i := range dirs {
		cur := uint32(i)
		stack = stack[:0]
		for plen[cur] == 0 {
			if own[cur]&0x8000 != 0 {
				plen[cur] = own[cur]&^0x8000 + 1
				break
			}
			if len(stack) > maxDepth {
				return limitf("index: entry %d: name of more than %d components", i, maxDepth)
			}
			plen[cur] = busy
			stack = append(stack, cur)
			cur = dirs[cur]
		}
		if plen[cur] == busy {
			return invalidf("index: entry %d: its directories form a cycle", i)
		}
		for k := len(stack) - 1; k >= 0; k-- {
			id := stack[k]
			l := int(plen[dirs[id]]-1) + int(own[id])
			if plen[dirs[id]] > 1 {
				l++ // the slash
			}
			if l > maxNameLen {
				return limitf("index: entry %d: name longer than %d bytes", id, maxNameLen)
			}
			plen[id] = uint16(l + 1)
		}
	}
	return nil
}

// checkChunks checks a record's chunks: only for a regular file, covering it exactly, each
// within the data and the limits.
func (x *Index) checkChunks(r *rec, nTable int, lim Limits) error {
	var f fileChunks
	switch {
	case r.opt&optChunk != 0 && r.opt&optChunks != 0:
		return fmt.Errorf("chunks twice")
	case r.opt&optChunk != 0:
		f = fileChunks{n: 1, size: r.size, one: r.chunk, inline: true}
	case r.opt&optChunks != 0:
		if r.nchunks < 2 || r.chunk0 > nTable || r.nchunks > nTable-r.chunk0 {
			return fmt.Errorf("chunks %d+%d of %d", r.chunk0, r.nchunks, nTable)
		}
		f = fileChunks{n: r.nchunks, size: r.size, chunk0: r.chunk0}
	}
	if f.n > 0 && r.typ != TypeReg || r.typ == TypeReg && (f.n == 0) != (r.size == 0) {
		return fmt.Errorf("chunks of a %v of %d bytes", r.typ, r.size)
	}
	var off int64
	for i := range f.n {
		if !f.inline && i+1 < f.n && x.tableFileOffset(f.chunk0+i+1) <= x.tableFileOffset(f.chunk0+i) {
			return fmt.Errorf("chunk %d: file offsets out of order", i)
		}
		c := x.chunk(&f, i)
		switch {
		case c.FileOffset != off:
			return fmt.Errorf("chunk %d at file offset %d, want %d", i, c.FileOffset, off)
		case c.Offset < 0 || c.Length <= 0 || c.Offset >= x.payloadEnd || c.Length > x.payloadEnd-c.Offset:
			return fmt.Errorf("chunk %d at %d+%d outside the data (0-%d)", i, c.Offset, c.Length, x.payloadEnd)
		case c.InnerOffset < 0 || c.Size <= 0 || c.Size > lim.MaxChunkSize || c.InnerOffset > lim.MaxChunkSize-c.Size:
			return fmt.Errorf("chunk %d of %d bytes (inner offset %d) exceeds %d", i, c.Size, c.InnerOffset, lim.MaxChunkSize)
		case c.Length > MaxSpan(c.InnerOffset+c.Size):
			return fmt.Errorf("chunk %d spans %d bytes", i, c.Length)
		}
		if b := x.chunks; !f.inline && b[(f.chunk0+i)*chunkSize+64] > 1 {
			return fmt.Errorf("chunk %d: bad zeros flag", i)
		}
		off += c.Size
	}
	return nil
}
