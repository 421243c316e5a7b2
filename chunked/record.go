package chunked

import (
	"bytes"
	"encoding/binary"
	"math"

	"github.com/layerstore/layerstore/internal/byterange"
)

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
			Range:       byterange.Range{Offset: int64(d.uvarint(math.MaxInt64)), Length: int64(d.uvarint(math.MaxInt64))},
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
		Range:       byterange.Range{Offset: int64(le.Uint64(b)), Length: int64(le.Uint64(b[8:]))},
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
