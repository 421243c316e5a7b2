package chunked

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"math"
)

// LoadIndex returns the index whose compact binary form is data (as [Index.Binary] hands it
// out), after checking its structure so that no method of the returned index can panic or
// misbehave on it, whatever the bytes: every record, offset, count and reference, the
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
	if err := x.checkHeader(lim); err != nil {
		return err
	}
	n := x.n
	nTable := len(x.chunks) / chunkSize
	dirs := make([]uint32, n)
	kinds := make([]uint8, n) // type, and 0x80 when visible
	own := make([]uint16, n)  // length of the own name, 0x8000 when it is the whole name
	for i := range n {
		id := EntryID(i)
		raw := x.raw(id)
		if raw == nil {
			return entryInvalid(id, "record out of bounds")
		}
		d := decoder{b: raw}
		r := decodeRec(&d, id)
		if d.bad {
			return entryInvalid(id, "malformed record")
		}
		if int(r.dir) >= n || int(r.inode) >= n || int(r.attr) >= n {
			return entryInvalid(id, "reference out of range")
		}
		full, vis := r.opt&optFullName != 0, r.visible()
		switch {
		case bytes.IndexByte(r.name, 0) >= 0 || bytes.IndexByte(r.link, 0) >= 0:
			return entryInvalid(id, "NUL in a name")
		case id == x.root && (!full || len(r.name) != 0 || !vis || r.typ != TypeDir || r.dir != id):
			return entryInvalid(id, "bad root")
		case full && vis && id != x.root:
			return entryInvalid(id, "visible entry without a parent")
		case !full && (len(r.name) == 0 || bytes.IndexByte(r.name, '/') >= 0 ||
			string(r.name) == "." || string(r.name) == ".."):
			return entryInvalid(id, "bad name %q", r.name)
		case (r.opt&optLink != 0) != (r.typ == TypeSymlink || r.typ == TypeHardlink) ||
			(r.opt&optLink != 0 && len(r.link) == 0):
			return entryInvalid(id, "link target of a %v", r.typ)
		}
		if err := x.checkChunks(&r, nTable, lim); err != nil {
			return entryInvalid(id, "%v", err)
		}
		if r.opt&optXattrs != 0 {
			if err := checkXattrs(&r, lim); err != nil {
				return err
			}
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
	return x.checkChildren(kinds)
}

// checkHeader checks the header's fields against each other and the limits, and that the
// records fill their section.
func (x *Index) checkHeader(lim Limits) error {
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
	return nil
}

// entryInvalid returns the error of a malformed record.
func entryInvalid(id EntryID, format string, args ...any) error {
	return invalidf("index: entry %d: "+format, append([]any{id}, args...)...)
}

// checkXattrs checks a record's xattrs: well-formed, named, sorted by name and within the
// limits.
func checkXattrs(r *rec, lim Limits) error {
	var prev []byte
	total := 0
	d := decoder{b: r.xattrs}
	for range r.nxattrs {
		k := d.bytes(d.uvarint(math.MaxUint32))
		v := d.bytes(d.uvarint(math.MaxUint32))
		total += len(k) + len(v)
		if d.bad || len(k) == 0 || bytes.IndexByte(k, 0) >= 0 || (prev != nil && bytes.Compare(prev, k) >= 0) {
			return entryInvalid(r.id, "bad xattrs")
		}
		if total > lim.MaxXattrBytes {
			return limitf("index: entry %d: xattrs exceed %d bytes", r.id, lim.MaxXattrBytes)
		}
		prev = k
	}
	if len(d.b) != 0 {
		return entryInvalid(r.id, "bad xattrs")
	}
	return nil
}

// checkChildren checks that the children are visible entries but the root, sorted by
// (dir, base name); kinds is as check fills it.
func (x *Index) checkChildren(kinds []uint8) error {
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
