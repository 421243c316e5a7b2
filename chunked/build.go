package chunked

import (
	"context"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"iter"
	"math"
	"path"
	"slices"
	"sort"
	"strings"
	"time"
	"unsafe"

	"github.com/layerstore/layerstore/internal/byterange"
)

// wideIndex is the form the builder fills: one Go value per entry, chunk and xattr.
type wideIndex struct {
	format  Format
	entries blockSlice[wideEntry]
	// names holds the entries' base names, their directories' paths and links' targets
	// (wideExtra.linkOff): an entry's Name is its directory's path (dirs[dir]), a slash and
	// its base name, or its base name alone in the root directory. Entries of a directory
	// mostly follow one another in a TOC, so a directory's path is held once for each run of
	// them (addName), not once for each entry: 47 bytes an entry of names became 14 in a
	// million-entry layer.
	names nameArena
	dirs  blockSlice[nameRef] // dirs[0] is the root directory's path, ""
	// lastDir is the directory of the last name added: the index in dirs of its path.
	lastDir uint32
	// chunks holds the chunks of files but those held in their entry (wideEntry.one): a
	// file's are consecutive, in file order.
	chunks   blockSlice[Chunk]
	extras   blockSlice[wideExtra]
	xattrs   blockSlice[xattrRef]  // by entry (wideExtra.xattr0), each entry's sorted by name
	bigTimes blockSlice[entryTime] // by entry, the times out of wideEntry.mtime's range
	children []EntryID             // visible entries except the root, sorted by (Parent, BaseName)
	// hiddenDirs holds, for each entry that is not visible, in order, the entry its name
	// continues in its record (the entry at its directory's path), or noDir (see
	// linkParents, recordName).
	hiddenDirs []EntryID
	// freeChildren lets go of children (mappedSlice).
	freeChildren func()
	root         EntryID
	tocCount     int // entries below tocCount are the TOC's non-chunk entries, in TOC order

	// times holds access and change times, in TOC order, when the TOC has them.
	times []extTimes

	tarSplitDigest Sum
	prefetchEnd    int64
	payloadEnd     int64

	keep bool // compact keeps the wide form whole (the tests compare it with the index)
}

// newWideIndex returns an empty wide form for a TOC of layout, whose entries and chunks are
// mapped (see blockSlice): its owner frees it.
func newWideIndex(layout *Layout) *wideIndex {
	w := &wideIndex{format: layout.Format, payloadEnd: layout.PayloadEnd(), prefetchEnd: -1, freeChildren: func() {}}
	w.entries.mapped, w.chunks.mapped, w.extras.mapped, w.bigTimes.mapped, w.xattrs.mapped = true, true, true, true, true
	w.dirs.append(nameRef{})
	return w
}

// free lets go of the wide form's mapped blocks: no entry or chunk may be used after.
func (w *wideIndex) free() {
	w.entries.free()
	w.chunks.free()
	w.extras.free()
	w.bigTimes.free()
	w.xattrs.free()
	w.dirs.free()
	w.freeChildren()
	w.children, w.hiddenDirs = nil, nil
}

// wideEntry is an entry as the builder holds it: [Entry]'s fields, but for the rare ones
// (extras), and where its name, chunks, xattrs and attributes are. A million-entry layer
// holds a million of them at once, beside its compact form: 104 bytes each. It holds no
// pointers.
type wideEntry struct {
	Size           int64
	mtime          int64 // its ModTime in Unix nanoseconds, or bigTime (see wideIndex.modTime)
	one            oneChunk
	Mode, UID, GID uint32
	Parent         EntryID
	Digest         Sum
	Type           Type
	Flags          Flags
	baseLen        uint16 // its base name, in the index's names: a nameRef, here where it packs
	// chunk0 is where the file's nchunks chunks start in the chunk table, or inPlace: its one
	// chunk is one. A directory, which has no chunks, holds its Nlink there (see nlink).
	chunk0, nchunks uint32
	extra           uint32 // 1 + the index of its wideExtra in extras, 0 when it has none
	baseOff         uint32
	dir             uint32 // its directory's path: dirs[dir] (see wideIndex.names)
}

// Visible is Entry.Visible.
func (e *wideEntry) Visible() bool { return e.Flags&(FlagHidden|FlagShadowed) == 0 }

// noDir is a hiddenDirs value: the record holds the entry's whole Name.
const noDir = ^EntryID(0)

// inPlace is the chunk0 of a file whose one chunk its entry holds.
const inPlace = math.MaxUint32

// oneChunk is a file's only chunk as most are, held in its entry instead of the chunk table
// (80 bytes a file less): at file offset 0, of the file's size and digest, not zeros, its
// inner offset and its compressed length within 32 bits (setLength moves a longer one to the
// table).
type oneChunk struct {
	offset        int64
	length, inner uint32
}

// wideExtra holds what few entries have: a link's target (in the index's names), a device's
// numbers, xattrs (the index's xattrs from xattr0), what hardlinks make of an inode. It holds
// no pointers (its blocks are mapped, as the entries'): 32 bytes.
type wideExtra struct {
	DevMajor, DevMinor uint32
	xattr0             uint32
	inode              EntryID // a hardlink's Entry.Inode (every hardlink has extras)
	attr               EntryID // 1 + Index.AttrEntry of an inode's owner, 0 when the owner itself
	links              uint32  // the hardlinks to an inode's owner that count in its Nlink
	linkOff            uint32  // LinkName: a nameRef, here where it packs
	linkLen, nxattrs   uint16
}

// linkName returns the LinkName of an entry whose extras are ex.
func (w *wideIndex) linkName(ex wideExtra) string {
	return w.names.get(nameRef{off: ex.linkOff, n: ex.linkLen})
}

// setLinkName sets the LinkName in ex, of at most maxNameLen bytes.
func (w *wideIndex) setLinkName(ex *wideExtra, link string) error {
	at, err := w.names.add(link)
	ex.linkOff, ex.linkLen = at.off, at.n
	return err
}

// bigTime is the wideEntry.mtime of an entry whose time takes more than 64 bits of
// nanoseconds (before 1678 or after 2262): wideIndex.bigTimes holds it.
const bigTime = math.MinInt64

// entryTime is the modification time of entry id, when it is out of wideEntry.mtime's range.
type entryTime struct {
	id   EntryID
	nsec uint32
	sec  int64
}

// setModTime sets the modification time of e, entry id (the last entry added).
func (w *wideIndex) setModTime(id EntryID, e *wideEntry, sec int64, nsec uint32) {
	const maxSec = math.MaxInt64/1_000_000_000 - 1 // so that sec*1e9+nsec never overflows, nor is bigTime
	if sec < -maxSec || sec > maxSec {
		e.mtime = bigTime
		w.bigTimes.append(entryTime{id: id, nsec: nsec, sec: sec})
		return
	}
	e.mtime = sec*1e9 + int64(nsec)
}

// modTime returns the modification time of e, entry id, in Unix seconds and nanoseconds.
func (w *wideIndex) modTime(id EntryID, e *wideEntry) (int64, uint32) {
	if e.mtime == bigTime {
		t := w.bigTimes.at(sort.Search(w.bigTimes.len(), func(i int) bool { return w.bigTimes.at(i).id >= id }))
		return t.sec, t.nsec
	}
	sec, nsec := e.mtime/1e9, e.mtime%1e9
	if nsec < 0 {
		sec, nsec = sec-1, nsec+1e9
	}
	return sec, uint32(nsec)
}

// extraFor returns e's extras, which it adds when e has none.
func (w *wideIndex) extraFor(e *wideEntry) *wideExtra {
	if e.extra == 0 {
		w.extras.append(wideExtra{})
		e.extra = uint32(w.extras.len())
	}
	return w.extras.at(int(e.extra) - 1)
}

// inode returns Entry.Inode of e, entry id: a hardlink's owner, or e itself.
func (w *wideIndex) inode(id EntryID, e *wideEntry) EntryID {
	if e.Type == TypeHardlink {
		return w.extras.at(int(e.extra) - 1).inode
	}
	return id
}

// attrOf returns Index.AttrEntry of e, entry id, an inode's owner: its last hardlink's header,
// or its own.
func (w *wideIndex) attrOf(id EntryID, e *wideEntry) EntryID {
	if e.extra != 0 {
		if a := w.extras.at(int(e.extra) - 1).attr; a != 0 {
			return a - 1
		}
	}
	return id
}

// nlink returns Entry.Nlink of e, once the tree is linked: a directory's, its chunk0; another
// entry's, 1 when visible, and its hardlinks.
func (w *wideIndex) nlink(e *wideEntry) uint32 {
	if e.Type == TypeDir {
		return e.chunk0
	}
	var n uint32
	if e.Visible() {
		n = 1
	}
	if e.extra != 0 {
		n += w.extras.at(int(e.extra) - 1).links
	}
	return n
}

// addName adds an entry's Name, cleaned (cleanName), to names, and returns its directory's
// index in dirs and its base name.
func (w *wideIndex) addName(name string) (dir uint32, base nameRef, err error) {
	d, b := splitPath(name)
	if d != w.names.get(*w.dirs.at(int(w.lastDir))) {
		if d == "" {
			w.lastDir = 0
		} else {
			at, err := w.names.add(d)
			if err != nil {
				return 0, nameRef{}, err
			}
			if uint64(w.dirs.len()) >= math.MaxUint32 {
				return 0, nameRef{}, limitf("too many directories")
			}
			w.lastDir = uint32(w.dirs.len())
			w.dirs.append(at)
		}
	}
	base, err = w.names.add(b)
	return w.lastDir, base, err
}

// dirOf returns the path of e's directory: its Name up to the last slash, "" for an entry of
// the root directory (and for the root).
func (w *wideIndex) dirOf(e *wideEntry) string { return w.names.get(*w.dirs.at(int(e.dir))) }

// baseOf returns e's base name: its Name after the last slash, a whiteout's with its prefix.
func (w *wideIndex) baseOf(e *wideEntry) string {
	return w.names.get(nameRef{off: e.baseOff, n: e.baseLen})
}

// nameOf returns e's Name, in a string of its own when e is not in the root directory.
func (w *wideIndex) nameOf(e *wideEntry) string {
	if d := w.dirOf(e); d != "" {
		return d + "/" + w.baseOf(e)
	}
	return w.baseOf(e)
}

// nameIs reports whether e's Name is name.
func (w *wideIndex) nameIs(e *wideEntry, name string) bool {
	d, b := w.dirOf(e), w.baseOf(e)
	if d == "" {
		return name == b
	}
	return len(name) == len(d)+1+len(b) && name[len(d)] == '/' && name[:len(d)] == d && name[len(d)+1:] == b
}

// xattrRef is an xattr as the wide form holds it: its name and value in the arena of names.
type xattrRef struct {
	name  nameRef
	value bytesRef
}

// xattrAt returns xattr k (below ex.nxattrs) of an entry whose extras are ex. Its strings are
// the arena's bytes, not copies.
func (w *wideIndex) xattrAt(ex wideExtra, k int) Xattr {
	r := w.xattrs.at(int(ex.xattr0) + k)
	return Xattr{Name: w.names.get(r.name), Value: w.names.getBytes(r.value)}
}

// extraOf returns the extras of e.
func (w *wideIndex) extraOf(e *wideEntry) wideExtra {
	if e.extra == 0 {
		return wideExtra{}
	}
	return *w.extras.at(int(e.extra) - 1)
}

// chunk returns chunk i of file e.
func (w *wideIndex) chunk(e *wideEntry, i int) Chunk {
	if e.chunk0 == inPlace {
		return Chunk{Range: byterange.Range{Offset: e.one.offset, Length: int64(e.one.length)}, InnerOffset: int64(e.one.inner),
			Size: e.Size, Digest: e.Digest}
	}
	return *w.chunks.at(int(e.chunk0) + i)
}

// setLength sets the compressed length of chunk i of file e.
func (w *wideIndex) setLength(e *wideEntry, i int, n int64) {
	if e.chunk0 == inPlace {
		if n <= math.MaxUint32 {
			e.one.length = uint32(n)
			return
		}
		c := w.chunk(e, 0) // too long for the entry: into the table
		e.chunk0 = uint32(w.chunks.len())
		w.chunks.append(c)
	}
	w.chunks.at(int(e.chunk0) + i).Length = n
}

// chunksAll yields each chunk of the index, by its file and number, in the order of files.
func (w *wideIndex) chunksAll() iter.Seq2[*wideEntry, int] {
	return func(yield func(*wideEntry, int) bool) {
		for id := range w.entries.len() {
			e := w.entries.at(id)
			for i := range int(e.nchunks) {
				if !yield(e, i) {
					return
				}
			}
		}
	}
}

type extTimes struct {
	atime, ctime int64 // Unix nanoseconds, 0 when absent
}

// baseName is Index.BaseName on the wide form.
func (w *wideIndex) baseName(id EntryID) string {
	e := w.entries.at(int(id))
	b := w.baseOf(e)
	if e.Flags&FlagWhiteout != 0 {
		b = b[len(whiteoutPrefix):]
	}
	return b
}

// builder fills the wide form from the TOC's entries, in TOC order, then links it into a
// tree (finish).
type builder struct {
	ctx       context.Context
	lim       Limits
	x         *wideIndex
	raw       int   // TOC entries read so far (chunks included)
	cur       int   // index of the last non-chunk entry, -1 before the first
	curRaw    int   // its position in the TOC's entries array
	curEnd    int64 // its endOffset (zstd:chunked), 0 when absent
	version   int
	hasTimes  bool
	opaqueDir []string

	// The last modification time parsed: most entries of a TOC share theirs.
	lastMTime     string
	lastMTimeSec  int64
	lastMTimeNsec uint32

	// paths maps the tree's paths to the entries holding them, once finish has mapped them;
	// implicit counts the directories it added that the TOC does not list.
	paths    *pathTable
	implicit int

	// xattrs and xattrValue are addXattrs' scratch space, reused from entry to entry.
	xattrs     []Xattr
	xattrValue []byte
}

// ctxCheckEvery is how many entries the parse handles between two looks at its context.
const ctxCheckEvery = 1 << 12

// canceled returns the context's error on every ctxCheckEvery-th i.
func (b *builder) canceled(i int) error {
	if i%ctxCheckEvery != 0 {
		return nil
	}
	return b.ctx.Err()
}

func (b *builder) addEntry(r *rawEntry) error {
	if err := b.closeFile(); err != nil {
		return err
	}
	typ, ok := typeOf(r.Type)
	if !ok {
		return invalidf("unknown type %q", r.Type)
	}
	name, err := cleanName(r.Name)
	if err != nil {
		return err
	}
	id := EntryID(b.x.entries.len())
	e := wideEntry{Type: typ}
	var base nameRef
	if e.dir, base, err = b.x.addName(name); err != nil {
		return err
	}
	e.baseOff, e.baseLen = base.off, base.n
	var ex wideExtra
	if r.Mode < 0 || r.Size < 0 {
		return invalidf("negative mode or size")
	}
	e.Mode = uint32(r.Mode & 0o7777)
	e.Size = r.Size
	if e.UID, err = u32("uid", r.UID); err != nil {
		return err
	}
	if e.GID, err = u32("gid", r.GID); err != nil {
		return err
	}
	if ex.DevMajor, err = u32("devMajor", r.DevMajor); err != nil {
		return err
	}
	if ex.DevMinor, err = u32("devMinor", r.DevMinor); err != nil {
		return err
	}
	if r.ModTime != "" && r.ModTime != b.lastMTime {
		t, err := parseTime(r.ModTime)
		if err != nil {
			return err
		}
		b.lastMTime, b.lastMTimeSec, b.lastMTimeNsec = r.ModTime, t.Unix(), uint32(t.Nanosecond())
	}
	if r.ModTime != "" {
		b.x.setModTime(id, &e, b.lastMTimeSec, b.lastMTimeNsec)
	}
	if err := b.addTimes(r); err != nil {
		return err
	}
	switch typ {
	case TypeSymlink:
		if r.LinkName == "" || len(r.LinkName) > maxNameLen || strings.IndexByte(r.LinkName, 0) >= 0 {
			return invalidf("bad symlink target %q", r.LinkName)
		}
		if err := b.x.setLinkName(&ex, r.LinkName); err != nil {
			return err
		}
	case TypeHardlink:
		target, err := cleanName(r.LinkName)
		if err != nil {
			return fmt.Errorf("hardlink target: %w", err)
		}
		if target == "" {
			return invalidf("hardlink to the root")
		}
		if err := b.x.setLinkName(&ex, target); err != nil {
			return err
		}
		ex.inode = id // until the tree resolves it
	}
	if r.Digest != "" {
		if e.Digest, err = parseSum(r.Digest); err != nil {
			return err
		}
	}
	if err := b.addXattrs(&ex, r.Xattrs); err != nil {
		return err
	}
	if ex != (wideExtra{}) {
		b.x.extras.append(ex)
		e.extra = uint32(b.x.extras.len())
	}
	b.cur, b.curRaw = b.x.entries.len(), b.raw
	b.curEnd = 0
	b.x.entries.append(e)

	if name == prefetchLandmark {
		if r.Offset < 0 || r.Offset > b.x.payloadEnd {
			return invalidf("prefetch landmark at offset %d outside the data (0-%d)", r.Offset, b.x.payloadEnd)
		}
		b.x.prefetchEnd = r.Offset
	}
	if typ != TypeReg || r.Size == 0 {
		return nil
	}
	if r.ChunkOffset != 0 {
		return invalidf("first chunk at file offset %d", r.ChunkOffset)
	}
	if b.x.format.Zstd() && !b.x.format.StargzTOC() {
		if r.EndOffset < 0 {
			return invalidf("negative endOffset")
		}
		b.curEnd = r.EndOffset
		if r.ChunkDigest == "" {
			// A single-chunk zstd:chunked file: its digest is the chunk's.
			if e.Digest.IsZero() {
				return invalidf("regular file without a digest")
			}
			return b.appendChunk(Chunk{Range: byterange.Range{Offset: r.Offset}, Size: r.Size, Digest: e.Digest})
		}
	}
	return b.chunkFrom(r)
}

// addChunk attaches a "chunk" entry to the regular file before it.
func (b *builder) addChunk(r *rawEntry) error {
	if b.cur < 0 || b.x.entries.at(b.cur).Type != TypeReg {
		return invalidf("chunk entry does not follow a regular file")
	}
	name, err := cleanName(r.Name)
	if err != nil {
		return err
	}
	if cur := b.x.entries.at(b.cur); !b.x.nameIs(cur, name) {
		return invalidf("chunk entry follows a different file %q", b.x.nameOf(cur))
	}
	if r.ChunkOffset <= 0 {
		return invalidf("chunk at file offset %d", r.ChunkOffset)
	}
	return b.chunkFrom(r)
}

func (b *builder) chunkFrom(r *rawEntry) error {
	file := b.x.entries.at(b.cur)
	size := r.ChunkSize
	if size == 0 {
		size = file.Size - r.ChunkOffset
	}
	c := Chunk{Range: byterange.Range{Offset: r.Offset}, InnerOffset: r.InnerOffset, FileOffset: r.ChunkOffset, Size: size}
	switch r.ChunkType {
	case "":
	case "zeros":
		c.Zeros = true
	default:
		return invalidf("unknown chunkType %q", r.ChunkType)
	}
	if r.ChunkDigest == "" {
		return invalidf("chunk without a chunkDigest")
	}
	var err error
	if c.Digest, err = parseSum(r.ChunkDigest); err != nil {
		return err
	}
	return b.appendChunk(c)
}

func (b *builder) appendChunk(c Chunk) error {
	if c.Offset < 0 || c.Offset >= b.x.payloadEnd {
		return invalidf("chunk offset %d outside the data (0-%d)", c.Offset, b.x.payloadEnd)
	}
	if c.InnerOffset < 0 || c.Size <= 0 || c.FileOffset < 0 {
		return invalidf("chunk with negative or empty range")
	}
	if c.Size > b.lim.MaxChunkSize || c.InnerOffset > b.lim.MaxChunkSize-c.Size {
		return limitf("chunk of %d bytes (inner offset %d) exceeds %d", c.Size, c.InnerOffset, b.lim.MaxChunkSize)
	}
	if uint64(b.x.chunks.len()) >= math.MaxUint32-1 {
		return limitf("too many chunks")
	}
	e := b.x.entries.at(b.cur)
	switch {
	case e.nchunks == 0 && c.FileOffset == 0 && c.Size == e.Size && c.Digest == e.Digest && !c.Zeros && c.Length == 0 &&
		c.InnerOffset <= math.MaxUint32:
		e.chunk0, e.one = inPlace, oneChunk{offset: c.Offset, inner: uint32(c.InnerOffset)}
	case e.chunk0 == inPlace: // a second chunk: the first joins it in the table
		first := b.x.chunk(e, 0)
		e.chunk0 = uint32(b.x.chunks.len())
		b.x.chunks.append(first)
		b.x.chunks.append(c)
	default:
		if e.nchunks == 0 {
			e.chunk0 = uint32(b.x.chunks.len())
		}
		b.x.chunks.append(c)
	}
	e.nchunks++
	return nil
}

// closeFile checks that the chunks of the current file cover it exactly, and sets their
// compressed ends where the format records them.
func (b *builder) closeFile() error {
	if b.cur < 0 {
		return nil
	}
	e := b.x.entries.at(b.cur)
	n := int(e.nchunks)
	var off int64
	for i := range n {
		c := b.x.chunk(e, i)
		if c.FileOffset != off {
			return &EntryError{Index: b.curRaw, Name: b.x.nameOf(e), Err: invalidf("chunk at file offset %d, want %d", c.FileOffset, off)}
		}
		off += c.Size
	}
	if off != e.Size {
		return &EntryError{Index: b.curRaw, Name: b.x.nameOf(e), Err: invalidf("chunks cover %d of %d bytes", off, e.Size)}
	}
	if b.curEnd > 0 {
		for i := range n {
			end := b.curEnd
			if i+1 < n {
				end = b.x.chunk(e, i+1).Offset
			}
			if end == 0 {
				continue // as if not recorded: fillEnds finds it
			}
			c := b.x.chunk(e, i)
			if end <= c.Offset {
				return &EntryError{Index: b.curRaw, Name: b.x.nameOf(e), Err: invalidf("chunk at blob offset %d ends at %d (data ends at %d)", c.Offset, end, b.x.payloadEnd)}
			}
			b.x.setLength(e, i, end-c.Offset)
		}
	}
	b.cur = -1
	return nil
}

func (b *builder) addTimes(r *rawEntry) error {
	if r.AccessTime == "" && r.ChangeTime == "" && !b.hasTimes {
		return nil
	}
	if !b.hasTimes {
		b.hasTimes = true
		b.x.times = make([]extTimes, b.x.entries.len())
	}
	var t extTimes
	for _, f := range []struct {
		s   string
		dst *int64
	}{{r.AccessTime, &t.atime}, {r.ChangeTime, &t.ctime}} {
		if f.s == "" {
			continue
		}
		tm, err := parseTime(f.s)
		if err != nil {
			return err
		}
		// c/storage wrote zero times for a while; they mean "none".
		if !tm.IsZero() && tm.Unix() != 0 {
			*f.dst = tm.UnixNano()
		}
	}
	b.x.times = append(b.x.times, t)
	return nil
}

func (b *builder) addXattrs(e *wideExtra, xs map[string]string) error {
	if len(xs) == 0 {
		return nil
	}
	if len(xs) > math.MaxUint16 {
		return limitf("too many xattrs")
	}
	// The names and values are checked and sorted here, then copied into the arena of names:
	// the wide form holds 16 bytes an xattr beside them, not two strings and their headers.
	own := b.xattrs[:0]
	total := 0
	for k, v := range xs {
		if k == "" || strings.IndexByte(k, 0) >= 0 {
			return invalidf("bad xattr name %q", k)
		}
		if len(k) > maxNameLen {
			return limitf("xattr name of %d bytes", len(k))
		}
		if base64.StdEncoding.DecodedLen(len(v))-2 > b.lim.MaxXattrBytes { // not decoded to be refused
			return limitf("xattrs exceed %d bytes", b.lim.MaxXattrBytes)
		}
		own = append(own, Xattr{Name: k, Value: v})
	}
	slices.SortFunc(own, func(a, b Xattr) int { return strings.Compare(a.Name, b.Name) })
	b.xattrs = own
	e.xattr0 = uint32(b.x.xattrs.len())
	for _, xa := range own {
		val, err := base64.StdEncoding.Strict().AppendDecode(b.xattrValue[:0], unsafe.Slice(unsafe.StringData(xa.Value), len(xa.Value)))
		if err != nil {
			return invalidf("xattr %q: %v", xa.Name, err)
		}
		b.xattrValue = val
		total += len(xa.Name) + len(val)
		if total > b.lim.MaxXattrBytes {
			return limitf("xattrs exceed %d bytes", b.lim.MaxXattrBytes)
		}
		var r xattrRef
		if r.name, err = b.x.names.add(xa.Name); err != nil {
			return err
		}
		if r.value, err = b.x.names.addBytes(val); err != nil {
			return fmt.Errorf("xattr %q: %w", xa.Name, err)
		}
		b.x.xattrs.append(r)
	}
	clear(own) // the decoder's strings are not kept alive by the scratch space
	e.nxattrs = uint16(len(own))
	return nil
}

// cleanName validates a TOC name and returns it cleaned and relative ("" for the root).
func cleanName(name string) (string, error) {
	switch {
	case name == "":
		return "", invalidf("empty name")
	case len(name) > maxNameLen:
		return "", limitf("name of %d bytes", len(name))
	case strings.IndexByte(name, 0) >= 0:
		return "", invalidf("name contains NUL")
	case name[0] == '/':
		return "", invalidf("absolute name")
	}
	tidy := true // as path.Clean leaves it, but for one trailing slash
	for part := range strings.SplitSeq(strings.TrimSuffix(name, "/"), "/") {
		switch part {
		case "..":
			return "", invalidf("name escapes the layer root")
		case "", ".":
			tidy = false
		}
	}
	if tidy {
		name = strings.TrimSuffix(name, "/")
	} else {
		name = path.Clean("/" + name)[1:]
	}
	if depth := strings.Count(name, "/") + 1; depth > maxDepth {
		return "", limitf("name of %d components exceeds %d", depth, maxDepth)
	}
	return name, nil
}

// typeOf returns the type an entry's type name names: typeNames without a map lookup per entry.
func typeOf(name string) (Type, bool) {
	switch name {
	case "reg":
		return TypeReg, true
	case "dir":
		return TypeDir, true
	case "symlink":
		return TypeSymlink, true
	case "hardlink":
		return TypeHardlink, true
	}
	t, ok := typeNames[name]
	return t, ok
}

func u32(what string, v int64) (uint32, error) {
	if v < 0 || v > math.MaxUint32 {
		return 0, invalidf("%s %d out of range", what, v)
	}
	return uint32(v), nil
}

func parseTime(s string) (time.Time, error) {
	t, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		return time.Time{}, invalidf("time %q: %v", s, err)
	}
	return t, nil
}

func parseSum(s string) (Sum, error) {
	var sum Sum
	hexPart, ok := strings.CutPrefix(s, "sha256:")
	if !ok || len(hexPart) != 64 {
		return sum, invalidf("digest %q is not a lowercase sha256 digest", s)
	}
	for i := range sum {
		hi, lo := lowerHex[hexPart[2*i]], lowerHex[hexPart[2*i+1]]
		if hi|lo > 0xf {
			if strings.ContainsAny(hexPart, "ABCDEF") {
				return Sum{}, invalidf("digest %q is not a lowercase sha256 digest", s)
			}
			_, err := hex.Decode(sum[:], []byte(hexPart))
			return Sum{}, invalidf("digest %q: %v", s, err)
		}
		sum[i] = hi<<4 | lo
	}
	return sum, nil
}

// lowerHex maps the lowercase hexadecimal digits to their values, every other byte to 0xff.
var lowerHex = func() (t [256]byte) {
	for i := range t {
		t[i] = 0xff
	}
	for i, c := range "0123456789abcdef" {
		t[c] = byte(i)
	}
	return t
}()
