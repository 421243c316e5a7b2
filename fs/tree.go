package storefs

import (
	"context"
	"errors"
	"io"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	fusefs "github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"

	"github.com/layerstore/layerstore/chunked"
)

// layerView is one layer directory's diff tree: the layer and its inode block.
type layerView struct {
	fsys  *filesystem
	layer Layer
	index *chunked.Index
	block uint64
}

// dirent returns the directory entry of id in a listing at offset off: its name, and the type
// and inode number of the entry owning its inode.
func (v *layerView) dirent(id chunked.EntryID, off uint64) fuse.DirEntry {
	x := v.index
	owner := x.Meta(id).Inode
	o := x.Meta(owner)
	return fuse.DirEntry{Name: x.BaseName(id), Mode: typeBits(&o), Ino: v.block + inoEntries + uint64(owner), Off: off}
}

// node returns the node of entry id. Every node stands for the entry that owns its inode,
// so the paths of a hardlink share one node.
func (v *layerView) node(id chunked.EntryID) *entryNode {
	return &entryNode{view: v, id: v.index.Meta(id).Inode}
}

// entryNode is a file, directory, link or special file of a diff tree. The tree is
// immutable: everything about it is cached by the kernel for the configured timeouts.
type entryNode struct {
	fusefs.Inode
	readOnly
	view *layerView
	id   chunked.EntryID // the inode owner

	// opens counts the open handles of a regular file by how the kernel reads them. The
	// kernel refuses (EIO) a passthrough open of an inode with files open through the
	// daemon, and the reverse, so a file opened before it was local is served by the
	// daemon until those handles are released, even once its backing file exists.
	opensMu sync.Mutex
	opens   [2]int // indexed by fileHandle.passthrough
}

var (
	_ fusefs.NodeLookuper       = (*entryNode)(nil)
	_ fusefs.NodeOpendirHandler = (*entryNode)(nil)
	_ fusefs.NodeGetattrer      = (*entryNode)(nil)
	_ fusefs.NodeReadlinker     = (*entryNode)(nil)
	_ fusefs.NodeGetxattrer     = (*entryNode)(nil)
	_ fusefs.NodeListxattrer    = (*entryNode)(nil)
	_ fusefs.NodeOpener         = (*entryNode)(nil)
)

func (n *entryNode) ino() uint64 { return n.view.block + inoEntries + uint64(n.id) }

// typeBits returns the file type of an inode owner in the S_IFMT bits.
func typeBits(e *chunked.Entry) uint32 {
	if e.Flags&chunked.FlagWhiteout != 0 {
		return syscall.S_IFCHR // an overlay whiteout: a 0/0 character device
	}
	switch e.Type {
	case chunked.TypeDir:
		return syscall.S_IFDIR
	case chunked.TypeSymlink:
		return syscall.S_IFLNK
	case chunked.TypeChar:
		return syscall.S_IFCHR
	case chunked.TypeBlock:
		return syscall.S_IFBLK
	case chunked.TypeFifo:
		return syscall.S_IFIFO
	default: // TypeReg; hardlinks are resolved to their owner by the index
		return syscall.S_IFREG
	}
}

// fill sets the attributes of the node's inode from the index: type, size and content from the
// entry, mode, owner and times from the entry an extractor would have applied last (a hardlink
// to it may carry its own).
func (n *entryNode) fill(out *fuse.Attr) {
	x := n.view.index
	e := x.Meta(n.id)
	aid := x.AttrEntry(n.id)
	a := x.Meta(aid)
	*out = fuse.Attr{
		Ino:   n.ino(),
		Mode:  typeBits(&e) | a.Mode&0o7777,
		Nlink: max(e.Nlink, 1),
		Owner: fuse.Owner{Uid: a.UID, Gid: a.GID},
	}
	switch out.Mode & syscall.S_IFMT {
	case syscall.S_IFREG:
		out.Size = uint64(max(e.Size, 0))
	case syscall.S_IFLNK:
		out.Size = uint64(len(e.LinkName))
	case syscall.S_IFCHR, syscall.S_IFBLK:
		if e.Flags&chunked.FlagWhiteout == 0 {
			out.Rdev = mkdev(e.DevMajor, e.DevMinor)
		}
	}
	mtime := time.Unix(a.ModTimeSec, int64(a.ModTimeNsec))
	atime, ctime := mtime, mtime
	if at, ct := x.TOCTimes(aid); at != 0 || ct != 0 {
		if at != 0 {
			atime = time.Unix(0, at)
		}
		if ct != 0 {
			ctime = time.Unix(0, ct)
		}
	}
	out.SetTimes(&atime, &mtime, &ctime)
}

// mkdev encodes a device number the way the FUSE protocol carries it (the kernel's
// new_encode_dev).
func mkdev(major, minor uint32) uint32 {
	return minor&0xff | (major&0xfff)<<8 | (minor&^0xff)<<12
}

func (n *entryNode) Getattr(_ context.Context, _ fusefs.FileHandle, out *fuse.AttrOut) syscall.Errno {
	n.fill(&out.Attr)
	out.SetTimeout(n.view.fsys.attrTO)
	return 0
}

// Lookup finds a child in a directory. A missing name is a negative entry the kernel keeps
// for Options.EntryTimeout (go-fuse's NegativeTimeout, set at mount).
func (n *entryNode) Lookup(ctx context.Context, name string, out *fuse.EntryOut) (*fusefs.Inode, syscall.Errno) {
	id, ok := n.view.index.Lookup(n.id, name)
	if !ok {
		return nil, syscall.ENOENT
	}
	return n.child(ctx, id, out), 0
}

// child answers a lookup of entry id, a child of the directory n: the attributes and node of
// the entry owning its inode, cached by the kernel for the configured timeouts.
func (n *entryNode) child(ctx context.Context, id chunked.EntryID, out *fuse.EntryOut) *fusefs.Inode {
	c := n.view.node(id)
	c.fill(&out.Attr)
	out.SetEntryTimeout(n.view.fsys.entryTO)
	out.SetAttrTimeout(n.view.fsys.attrTO)
	return n.NewInode(ctx, c, fusefs.StableAttr{Mode: out.Mode & syscall.S_IFMT, Ino: out.Ino})
}

// OpendirHandle opens a directory for listing. The kernel lists with READDIRPLUS: each entry
// comes with its attributes and becomes a cached lookup (go-fuse calls dirHandle.Lookup for
// it), so that a walk's lstat of every entry needs no request of its own. A directory of the
// tree never changes, so the kernel also keeps the listing itself (FOPEN_CACHE_DIR): listing
// it again reads the kernel's copy.
func (n *entryNode) OpendirHandle(context.Context, uint32) (fusefs.FileHandle, uint32, syscall.Errno) {
	return &dirHandle{node: n, children: n.view.index.Children(n.id)}, fuse.FOPEN_CACHE_DIR | fuse.FOPEN_KEEP_CACHE, 0
}

// dirHandle is an open directory of a diff tree. go-fuse serializes the calls on a handle.
type dirHandle struct {
	node     *entryNode
	children []chunked.EntryID
	next     int             // position in children of the next entry to list
	last     chunked.EntryID // the entry listed last
	de       fuse.DirEntry   // its directory entry
}

var (
	_ fusefs.FileReaddirenter = (*dirHandle)(nil)
	_ fusefs.FileLookuper     = (*dirHandle)(nil)
	_ fusefs.FileSeekdirer    = (*dirHandle)(nil)
)

// Readdirent lists the next entry. Its offset is its position plus one, as Seekdir takes it.
func (h *dirHandle) Readdirent(context.Context) (*fuse.DirEntry, syscall.Errno) {
	if h.next >= len(h.children) {
		return nil, 0
	}
	h.last = h.children[h.next]
	h.next++
	h.de = h.node.view.dirent(h.last, uint64(h.next))
	return &h.de, 0
}

// Lookup answers the lookup READDIRPLUS makes of the entry listed last, without searching
// the directory for its name. A listing that go-fuse replays after an interrupted request
// looks up other names: those are searched.
func (h *dirHandle) Lookup(ctx context.Context, name string, out *fuse.EntryOut) (*fusefs.Inode, syscall.Errno) {
	if h.next == 0 || name != h.de.Name {
		return h.node.Lookup(ctx, name, out)
	}
	return h.node.child(ctx, h.last, out), 0
}

// Seekdir moves to offset off: 0 is the start, k is after the k-th entry.
func (h *dirHandle) Seekdir(_ context.Context, off uint64) syscall.Errno {
	if off > uint64(len(h.children)) {
		return syscall.EINVAL
	}
	h.next = int(off)
	return 0
}

// Readlink returns a symlink's target verbatim.
func (n *entryNode) Readlink(context.Context) ([]byte, syscall.Errno) {
	e := n.view.index.Meta(n.id)
	if e.Type != chunked.TypeSymlink {
		return nil, syscall.EINVAL
	}
	return []byte(e.LinkName), 0
}

// Getxattr follows go-fuse's convention: the size and ERANGE when dest is too small (the
// size query of an empty dest included), ENODATA for a missing attribute.
func (n *entryNode) Getxattr(_ context.Context, attr string, dest []byte) (uint32, syscall.Errno) {
	for _, xa := range n.view.index.Xattrs(n.id) {
		if xa.Name == attr {
			if len(dest) < len(xa.Value) {
				return uint32(len(xa.Value)), syscall.ERANGE
			}
			return uint32(copy(dest, xa.Value)), 0
		}
	}
	return 0, syscall.ENODATA
}

// Listxattr writes the NUL-terminated names, or returns the size and ERANGE when dest is
// too small.
func (n *entryNode) Listxattr(_ context.Context, dest []byte) (uint32, syscall.Errno) {
	var names []byte
	for _, xa := range n.view.index.Xattrs(n.id) {
		names = append(append(names, xa.Name...), 0)
	}
	if len(dest) < len(names) {
		return uint32(len(names)), syscall.ERANGE
	}
	return uint32(copy(dest, names)), 0
}

// Open opens a regular file for reading. When passthrough is on, the layer holds the
// whole file locally and no open handle of the file reads through the daemon, the handle
// offers it to the kernel, which then reads it without calling the daemon; otherwise reads
// go to Layer.ReadFile and their pages stay cached.
//
// Only root opens: overlayfs opens its lower files with the credentials of whoever mounted
// it. Reads are not checked: the pages of a file mapped by a container's process are read
// with that process's credentials.
func (n *entryNode) Open(ctx context.Context, flags uint32) (fusefs.FileHandle, uint32, syscall.Errno) {
	if !privileged(ctx) {
		return nil, 0, syscall.EACCES
	}
	if writeAccess(flags) {
		return nil, 0, syscall.EROFS
	}
	e := n.view.index.Meta(n.id)
	if e.Type != chunked.TypeReg || e.Flags&chunked.FlagWhiteout != 0 {
		return nil, 0, syscall.EINVAL // the kernel opens only regular files through FUSE
	}
	h := &fileHandle{node: n, view: n.view, id: n.id, size: e.Size}
	n.opensMu.Lock()
	defer n.opensMu.Unlock()
	if n.view.fsys.passthrough.Load() && n.opens[0] == 0 {
		if f := n.backing(e.Size); f != nil {
			h.backing.Store(f)
			h.passthrough = true
		}
	}
	n.opens[b2i(h.passthrough)]++
	return h, fuse.FOPEN_KEEP_CACHE | fuse.FOPEN_NOFLUSH, 0
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}

// backing returns the layer's local copy of the file, or nil.
func (n *entryNode) backing(size int64) *os.File {
	f := n.view.layer.Backing(n.id)
	if f == nil {
		return nil
	}
	if fi, err := f.Stat(); err != nil || !fi.Mode().IsRegular() || fi.Size() != size {
		n.view.fsys.log.Warn("not using a backing file for passthrough: wrong size or type",
			"file", n.view.index.Path(n.id), "want_size", size, "stat_err", err)
		_ = f.Close()
		return nil
	}
	return f
}

// fileHandle is an open regular file of a diff tree.
type fileHandle struct {
	node *entryNode
	view *layerView
	id   chunked.EntryID
	size int64
	// passthrough is set when the handle was offered a backing file: whether the kernel
	// took it or not, the handle counts as one the kernel may read without the daemon.
	passthrough bool
	// backing is the file offered for passthrough, if any; closed on Release, or on the
	// first Read, which proves the kernel is not using it.
	backing atomic.Pointer[os.File]
}

var (
	_ fusefs.FileReader          = (*fileHandle)(nil)
	_ fusefs.FileReleaser        = (*fileHandle)(nil)
	_ fusefs.FilePassthroughFder = (*fileHandle)(nil)
)

// PassthroughFd hands the backing file to go-fuse, which registers it with the kernel once
// per inode. When the kernel refuses (no passthrough support, or a backing file on a
// stacked filesystem), go-fuse stops asking for the rest of the mount and the handle
// serves reads itself.
func (h *fileHandle) PassthroughFd() (int, bool) {
	f := h.backing.Load()
	if f == nil {
		return -1, false
	}
	return int(f.Fd()), true
}

func (h *fileHandle) Read(ctx context.Context, dest []byte, off int64) (fuse.ReadResult, syscall.Errno) {
	if f := h.backing.Swap(nil); f != nil {
		_ = f.Close()
		h.view.fsys.passthroughLog.Do(func() {
			h.view.fsys.log.Info("FUSE passthrough not in effect: reads go through the daemon")
		})
	}
	p, ok := clamp(dest, off, h.size)
	if !ok {
		return fuse.ReadResultData(nil), 0
	}
	k, err := h.view.layer.ReadFile(ctx, h.id, p, off)
	if err != nil && !errors.Is(err, io.EOF) {
		return nil, errno(h.view.fsys.log, err, "read", "file", h.view.index.Path(h.id), "off", off, "len", len(p))
	}
	return fuse.ReadResultData(p[:k]), 0
}

func (h *fileHandle) Release(context.Context) syscall.Errno {
	if f := h.backing.Swap(nil); f != nil {
		_ = f.Close()
	}
	h.node.opensMu.Lock()
	h.node.opens[b2i(h.passthrough)]--
	h.node.opensMu.Unlock()
	return 0
}
