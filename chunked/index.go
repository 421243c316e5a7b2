package chunked

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"path"
	"runtime"
	"sort"
	"strings"
	"time"

	"github.com/layerstore/layerstore/internal/byterange"
)

// Type is the kind of an entry, as written in the TOC.
type Type uint8

// Entry types.
const (
	TypeReg Type = iota + 1
	TypeDir
	TypeSymlink
	TypeHardlink
	TypeChar
	TypeBlock
	TypeFifo
)

var typeNames = map[string]Type{
	"reg": TypeReg, "dir": TypeDir, "symlink": TypeSymlink, "hardlink": TypeHardlink,
	"char": TypeChar, "block": TypeBlock, "fifo": TypeFifo,
}

func (t Type) String() string {
	for k, v := range typeNames {
		if v == t {
			return k
		}
	}
	return "invalid"
}

// Flags qualify an entry.
type Flags uint8

// Entry flags.
const (
	// FlagWhiteout marks an overlay whiteout: the TOC entry ".wh.NAME", shown as a character
	// device 0/0 named NAME.
	FlagWhiteout Flags = 1 << iota
	// FlagOpaque marks a directory that held a ".wh..wh..opq" marker: it carries the overlay
	// opaque xattrs.
	FlagOpaque
	// FlagHidden marks an entry that is not part of the tree: an opaque marker or a format
	// artefact (stargz.index.json, prefetch landmarks).
	FlagHidden
	// FlagShadowed marks an entry superseded by a later entry with the same path.
	FlagShadowed
	// FlagImplicit marks a directory the TOC did not list but that a listed entry needs.
	FlagImplicit
)

// Sum is a sha256 digest; the zero value means "none".
type Sum [32]byte

// IsZero reports whether s is the "none" value.
func (s Sum) IsZero() bool { return s == Sum{} }

func (s Sum) String() string {
	if s.IsZero() {
		return ""
	}
	return "sha256:" + hex.EncodeToString(s[:])
}

// EntryID identifies an entry of an [Index]. It is stable for the life of the index and can
// serve as an inode number (add an offset: the root's ID may be any value).
type EntryID uint32

// Entry is one file, directory or link of a layer.
type Entry struct {
	// Name is the entry's cleaned path relative to the layer root, without a leading slash;
	// "" is the root. For a whiteout it is the TOC's name (".../.wh.NAME"); [Index.BaseName]
	// gives the name shown in the tree.
	Name string
	// LinkName is a symlink's target, verbatim, or a hardlink's target path, cleaned.
	LinkName string
	// Size is the content size of a regular file.
	Size int64
	// ModTime is the modification time, in seconds and nanoseconds since the epoch.
	ModTimeSec  int64
	ModTimeNsec uint32
	// Mode holds the permission bits, with setuid, setgid and sticky (mode & 07777).
	Mode     uint32
	UID, GID uint32
	DevMajor uint32
	DevMinor uint32
	// Parent is the directory holding the entry (the root is its own parent).
	Parent EntryID
	// Inode is the entry that owns the content and metadata: the entry itself, or for a
	// hardlink the owner of what its target path held at the hardlink's place in the layer, as
	// extraction links it (that entry may be replaced, FlagShadowed, at its own path later).
	Inode EntryID
	// Nlink is the link count of the inode (meaningful on the inode's owner): its visible
	// names.
	Nlink uint32
	// Digest is the digest of the whole content of a regular file; zero when the TOC has
	// none (empty files).
	Digest Sum
	Type   Type
	Flags  Flags
}

// ModTime returns the modification time.
func (e Entry) ModTime() time.Time { return time.Unix(e.ModTimeSec, int64(e.ModTimeNsec)) }

// Visible reports whether the entry is part of the tree.
func (e Entry) Visible() bool { return e.Flags&(FlagHidden|FlagShadowed) == 0 }

// Chunk is a piece of a regular file's content and where it is in the blob.
type Chunk struct {
	// Range is the compressed bytes to fetch: decompressing them yields InnerOffset bytes
	// to skip, then the chunk's Size bytes (and possibly more, ignored). Its Length is at
	// most MaxSpan(InnerOffset+Size).
	byterange.Range
	InnerOffset int64
	// FileOffset is the chunk's position in the file; Size its uncompressed length.
	FileOffset int64
	Size       int64
	// Digest is the sha256 of the chunk's uncompressed bytes.
	Digest Sum
	// Zeros marks a chunk that holds only zero bytes (zstd:chunked "zeros" chunks).
	Zeros bool
}

// Xattr is an extended attribute.
type Xattr struct {
	Name  string
	Value string
}

// Index is the verified-or-not model of a layer (package verify hands out only verified
// ones). It is immutable and safe for concurrent use.
//
// An Index is its compact binary form (see compact.go): one byte array, possibly a read-only
// mapping of a file (see [LoadIndex]). Its methods decode what they are asked for and hand out
// copies: nothing they return aliases that array. An entry ID out of range gives zero values.
type Index struct {
	data []byte // the whole binary form

	format         Format
	root           EntryID
	n, tocCount    int
	tarSplitDigest Sum
	prefetchEnd    int64
	payloadEnd     int64

	// Sections of data.
	ends     []byte // n little-endian uint32: where each entry's record ends in recs
	recs     []byte // the entry records
	chunks   []byte // the chunks of files of more than one chunk, chunkSize bytes each
	children []byte // uint32 entry IDs: visible entries except the root, by (Parent, BaseName)
	times    []byte // access and change times of the TOC's entries, if the TOC has them
}

// Format returns the layer's format.
func (x *Index) Format() Format { return x.format }

// Root returns the root directory.
func (x *Index) Root() EntryID { return x.root }

// Len returns the number of entries (all of them, including hidden and shadowed ones).
func (x *Index) Len() int { return x.n }

// TOCLen returns the number of the TOC's non-chunk entries; their IDs are 0 to TOCLen()-1, in
// TOC order. Entries after them are implicit directories.
func (x *Index) TOCLen() int { return x.tocCount }

// TarSplitDigest returns the digest of the compressed tar-split that the TOC names (modern
// zstd:chunked), or zero.
func (x *Index) TarSplitDigest() Sum { return x.tarSplitDigest }

// PrefetchEnd returns the blob offset up to which the layer's prioritized files lie (the
// eStargz ".prefetch.landmark"), or -1 when the layer has no prefetch profile.
func (x *Index) PrefetchEnd() int64 { return x.prefetchEnd }

// PayloadEnd returns the blob offset where file data ends.
func (x *Index) PayloadEnd() int64 { return x.payloadEnd }

// Entry returns an entry, decoded. Building its Name walks up its directories; [Index.Meta]
// gives the rest without that cost.
func (x *Index) Entry(id EntryID) Entry {
	r, ok := x.rec(id)
	if !ok {
		return Entry{}
	}
	e := r.entry()
	var buf [256]byte
	e.Name = string(x.appendName(buf[:0], id))
	runtime.KeepAlive(x)
	return e
}

// Meta returns an entry without its Name: what [Index.Entry] returns, cheaply.
func (x *Index) Meta(id EntryID) Entry {
	r, _ := x.rec(id)
	e := r.entry()
	runtime.KeepAlive(x)
	return e
}

// AttrEntry returns the entry whose mode, owner and times the inode of id shows: the last
// hardlink to that inode in layer order, whose header an extractor applies to the shared inode
// last, or else the inode's owner. The entries themselves keep what the TOC says.
func (x *Index) AttrEntry(id EntryID) EntryID {
	r, _ := x.rec(id)
	o, _ := x.rec(r.inode)
	runtime.KeepAlive(x)
	return o.attr
}

// BaseName returns the name an entry has in its directory (for a whiteout, without ".wh.").
func (x *Index) BaseName(id EntryID) string {
	h, _ := x.head(id)
	s := string(h.base())
	runtime.KeepAlive(x)
	return s
}

// Chunks returns the chunks of a regular file (of its inode, for a hardlink), in file order.
func (x *Index) Chunks(id EntryID) []Chunk {
	f := x.file(id)
	if f.n == 0 {
		return nil
	}
	cs := make([]Chunk, f.n)
	for i := range cs {
		cs[i] = x.chunk(&f, i)
	}
	runtime.KeepAlive(x)
	return cs
}

// NumChunks returns len(x.Chunks(id)), without decoding them.
func (x *Index) NumChunks(id EntryID) int {
	f := x.file(id)
	runtime.KeepAlive(x)
	return f.n
}

// Chunk returns x.Chunks(id)[i], without decoding the others; false when i is out of range.
func (x *Index) Chunk(id EntryID, i int) (Chunk, bool) {
	f := x.file(id)
	if i < 0 || i >= f.n {
		return Chunk{}, false
	}
	c := x.chunk(&f, i)
	runtime.KeepAlive(x)
	return c, true
}

// ChunkAt returns the index in [Index.Chunks] of the chunk holding byte off of a file, or -1
// when off is outside the file.
func (x *Index) ChunkAt(id EntryID, off int64) int {
	f := x.file(id)
	if off < 0 || off >= f.size || f.n == 0 {
		return -1
	}
	i := 0
	if f.n > 1 {
		i = sort.Search(f.n, func(i int) bool {
			return i+1 == f.n || x.tableFileOffset(f.chunk0+i+1) > off
		})
	}
	runtime.KeepAlive(x)
	return i
}

// Xattrs returns an entry's extended attributes as the overlay tree shows them: the TOC's,
// plus "trusted.overlay.opaque" and "user.overlay.opaque" set to "y" on opaque directories.
func (x *Index) Xattrs(id EntryID) []Xattr {
	r, _ := x.rec(id)
	o, _ := x.rec(r.inode)
	xs := o.appendXattrs(nil)
	if o.flags&FlagOpaque != 0 {
		xs = append(xs, Xattr{"trusted.overlay.opaque", "y"}, Xattr{"user.overlay.opaque", "y"})
	}
	runtime.KeepAlive(x)
	return xs
}

// TOCXattrs returns an entry's xattrs exactly as the TOC lists them, sorted by name.
func (x *Index) TOCXattrs(id EntryID) []Xattr {
	r, _ := x.rec(id)
	xs := r.appendXattrs(nil)
	runtime.KeepAlive(x)
	return xs
}

// TOCTimes returns the access and change times the TOC gives an entry, in Unix nanoseconds,
// 0 when absent.
func (x *Index) TOCTimes(id EntryID) (atime, ctime int64) {
	if uint64(id) >= uint64(len(x.times)/timesSize) {
		return 0, 0
	}
	t := x.times[int(id)*timesSize:]
	atime, ctime = int64(binary.LittleEndian.Uint64(t)), int64(binary.LittleEndian.Uint64(t[8:]))
	runtime.KeepAlive(x)
	return atime, ctime
}

// ChildrenFrom returns at most n visible entries of a directory, sorted by name, starting
// with its i-th (0 is the first): a page of them, without building the whole list.
func (x *Index) ChildrenFrom(dir EntryID, i, n int) []EntryID {
	lo, hi := x.childRange(dir)
	if i < 0 || n <= 0 || i >= hi-lo {
		return nil
	}
	ids := make([]EntryID, min(n, hi-lo-i))
	for k := range ids {
		ids[k] = x.child(lo + i + k)
	}
	runtime.KeepAlive(x)
	return ids
}

// Identity returns a digest of the index's header: its format version, layer format, root,
// counts of entries, chunks and children, size of its records and tar-split digest. Two
// indexes of one TOC with the same identity number their entries alike; one built by a
// builder that numbers them otherwise has another format version.
func (x *Index) Identity() Sum {
	s := Sum(sha256.Sum256(x.data[:headerSize]))
	runtime.KeepAlive(x)
	return s
}

func (x *Index) numChildren() int { return len(x.children) / 4 }

func (x *Index) child(i int) EntryID {
	return EntryID(binary.LittleEndian.Uint32(x.children[4*i:]))
}

func (x *Index) childRange(dir EntryID) (int, int) {
	n := x.numChildren()
	parent := func(i int) EntryID { h, _ := x.head(x.child(i)); return h.dir }
	lo := sort.Search(n, func(i int) bool { return parent(i) >= dir })
	hi := lo + sort.Search(n-lo, func(i int) bool { return parent(lo+i) > dir })
	return lo, hi
}

// Lookup finds the visible entry called name in directory dir.
func (x *Index) Lookup(dir EntryID, name string) (EntryID, bool) {
	id, ok := x.lookup(dir, name)
	runtime.KeepAlive(x)
	return id, ok
}

func (x *Index) lookup(dir EntryID, name string) (EntryID, bool) {
	// One search for (dir, name) in the children, sorted by (Parent, BaseName).
	n := x.numChildren()
	i := sort.Search(n, func(i int) bool {
		h, _ := x.head(x.child(i))
		return h.dir > dir || h.dir == dir && string(h.base()) >= name
	})
	if i < n {
		if h, _ := x.head(x.child(i)); h.dir == dir && string(h.base()) == name {
			return x.child(i), true
		}
	}
	return 0, false
}

// LookupPath finds the visible entry at a slash-separated path relative to the root.
func (x *Index) LookupPath(p string) (EntryID, bool) {
	defer runtime.KeepAlive(x)
	id := x.root
	p = strings.Trim(path.Clean("/"+p), "/")
	for p != "" {
		var name string
		name, p, _ = strings.Cut(p, "/")
		var ok bool
		if id, ok = x.lookup(id, name); !ok {
			return 0, false
		}
	}
	return id, true
}

// Path returns the path of a visible entry as shown in the tree.
func (x *Index) Path(id EntryID) string {
	if id == x.root {
		return ""
	}
	h, _ := x.head(id)
	var buf [256]byte
	name := string(x.appendName(buf[:0], id))
	if h.flags&FlagWhiteout != 0 {
		name = path.Join(path.Dir(name), string(h.base()))
	}
	runtime.KeepAlive(x)
	return name
}
