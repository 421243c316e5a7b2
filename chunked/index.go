package chunked

import (
	"cmp"
	"encoding/hex"
	"path"
	"slices"
	"sort"
	"strings"
	"time"
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

	chunk0, nchunks uint32
	xattr0          uint32
	attr            EntryID // see Index.AttrEntry
	nxattrs         uint16
}

// ModTime returns the modification time.
func (e *Entry) ModTime() time.Time { return time.Unix(e.ModTimeSec, int64(e.ModTimeNsec)) }

// Visible reports whether the entry is part of the tree.
func (e *Entry) Visible() bool { return e.Flags&(FlagHidden|FlagShadowed) == 0 }

// Chunk is a piece of a regular file's content and where it is in the blob.
type Chunk struct {
	// Range is the compressed bytes to fetch: decompressing them yields InnerOffset bytes
	// to skip, then the chunk's Size bytes (and possibly more, ignored). Its Length is at
	// most MaxSpan(InnerOffset+Size).
	Range
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
type Index struct {
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

// Format returns the layer's format.
func (x *Index) Format() Format { return x.format }

// Root returns the root directory.
func (x *Index) Root() EntryID { return x.root }

// Len returns the number of entries (all of them, including hidden and shadowed ones).
func (x *Index) Len() int { return len(x.entries) }

// TOCLen returns the number of the TOC's non-chunk entries; their IDs are 0 to TOCLen()-1, in
// TOC order. Entries after them are implicit directories.
func (x *Index) TOCLen() int { return x.tocCount }

// Entry returns an entry. The pointer is valid for the life of the index; do not modify.
func (x *Index) Entry(id EntryID) *Entry { return &x.entries[id] }

// AttrEntry returns the entry whose mode, owner and times the inode of id shows: the last
// hardlink to that inode in layer order, whose header an extractor applies to the shared inode
// last, or else the inode's owner. The entries themselves keep what the TOC says.
func (x *Index) AttrEntry(id EntryID) EntryID { return x.entries[x.entries[id].Inode].attr }

// TarSplitDigest returns the digest of the compressed tar-split that the TOC names (modern
// zstd:chunked), or zero.
func (x *Index) TarSplitDigest() Sum { return x.tarSplitDigest }

// PrefetchEnd returns the blob offset up to which the layer's prioritized files lie (the
// eStargz ".prefetch.landmark"), or -1 when the layer has no prefetch profile.
func (x *Index) PrefetchEnd() int64 { return x.prefetchEnd }

// PayloadEnd returns the blob offset where file data ends.
func (x *Index) PayloadEnd() int64 { return x.payloadEnd }

// BaseName returns the name an entry has in its directory (for a whiteout, without ".wh.").
func (x *Index) BaseName(id EntryID) string {
	e := &x.entries[id]
	b := e.Name[strings.LastIndexByte(e.Name, '/')+1:]
	if e.Flags&FlagWhiteout != 0 {
		b = b[len(whiteoutPrefix):]
	}
	return b
}

// Chunks returns the chunks of a regular file (of its inode, for a hardlink), in file order.
func (x *Index) Chunks(id EntryID) []Chunk {
	e := &x.entries[x.entries[id].Inode]
	return x.chunks[e.chunk0 : e.chunk0+e.nchunks : e.chunk0+e.nchunks]
}

// ChunkAt returns the index in [Index.Chunks] of the chunk holding byte off of a file, or -1
// when off is outside the file.
func (x *Index) ChunkAt(id EntryID, off int64) int {
	cs := x.Chunks(id)
	i := sort.Search(len(cs), func(i int) bool { return cs[i].FileOffset+cs[i].Size > off })
	if off < 0 || i == len(cs) {
		return -1
	}
	return i
}

// Xattrs returns an entry's extended attributes as the overlay tree shows them: the TOC's,
// plus "trusted.overlay.opaque" and "user.overlay.opaque" set to "y" on opaque directories.
func (x *Index) Xattrs(id EntryID) []Xattr {
	e := &x.entries[x.entries[id].Inode]
	xs := x.xattrs[e.xattr0 : e.xattr0+uint32(e.nxattrs) : e.xattr0+uint32(e.nxattrs)]
	if e.Flags&FlagOpaque != 0 {
		xs = append(xs, Xattr{"trusted.overlay.opaque", "y"}, Xattr{"user.overlay.opaque", "y"})
	}
	return xs
}

// TOCXattrs returns an entry's xattrs exactly as the TOC lists them, sorted by name.
func (x *Index) TOCXattrs(id EntryID) []Xattr {
	e := &x.entries[id]
	return x.xattrs[e.xattr0 : e.xattr0+uint32(e.nxattrs) : e.xattr0+uint32(e.nxattrs)]
}

// TOCTimes returns the access and change times the TOC gives an entry, in Unix nanoseconds,
// 0 when absent.
func (x *Index) TOCTimes(id EntryID) (atime, ctime int64) {
	if int(id) >= len(x.times) {
		return 0, 0
	}
	return x.times[id].atime, x.times[id].ctime
}

// Children returns the visible entries of a directory, sorted by name.
func (x *Index) Children(dir EntryID) []EntryID {
	lo, hi := x.childRange(dir)
	return x.children[lo:hi:hi]
}

func (x *Index) childRange(dir EntryID) (int, int) {
	lo := sort.Search(len(x.children), func(i int) bool { return x.entries[x.children[i]].Parent >= dir })
	hi := lo + sort.Search(len(x.children)-lo, func(i int) bool { return x.entries[x.children[lo+i]].Parent > dir })
	return lo, hi
}

// Lookup finds the visible entry called name in directory dir.
func (x *Index) Lookup(dir EntryID, name string) (EntryID, bool) {
	lo, hi := x.childRange(dir)
	i := lo + sort.Search(hi-lo, func(i int) bool { return x.BaseName(x.children[lo+i]) >= name })
	if i < hi && x.BaseName(x.children[i]) == name {
		return x.children[i], true
	}
	return 0, false
}

// LookupPath finds the visible entry at a slash-separated path relative to the root.
func (x *Index) LookupPath(p string) (EntryID, bool) {
	id := x.root
	p = strings.Trim(path.Clean("/"+p), "/")
	for p != "" {
		var name string
		name, p, _ = strings.Cut(p, "/")
		var ok bool
		if id, ok = x.Lookup(id, name); !ok {
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
	e := &x.entries[id]
	if e.Flags&FlagWhiteout == 0 {
		return e.Name
	}
	return path.Join(path.Dir(e.Name), x.BaseName(id))
}

func (x *Index) sortChildren() {
	slices.SortFunc(x.children, func(a, b EntryID) int {
		if c := cmp.Compare(x.entries[a].Parent, x.entries[b].Parent); c != 0 {
			return c
		}
		return strings.Compare(x.BaseName(a), x.BaseName(b))
	})
}
