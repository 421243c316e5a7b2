package storefs

import (
	"errors"
	"io"
	"syscall"

	"github.com/hanwen/go-fuse/v2/fuse"

	"github.com/layerstore/layerstore/chunked"
)

// ptHandle marks the file handle of a file opened with passthrough. A file handle is
// otherwise the inode number (below 1<<63 for files): reads need no state, so a handle means
// the same to every process of the session.
const ptHandle = 1 << 63

// rawFS answers the kernel's requests by node ID, which is the inode number: every answer
// comes from the numbering (filesystem) and the layers' indexes, none from per-node state.
// What it does not implement answers ENOSYS (go-fuse's default), and every modification
// EROFS, but for the runtime's create of use and rmdir of a layer directory.
type rawFS struct {
	fuse.RawFileSystem
	fsys *filesystem
}

func newRawFS(fsys *filesystem) *rawFS {
	return &rawFS{RawFileSystem: fuse.NewDefaultRawFileSystem(), fsys: fsys}
}

func (r *rawFS) String() string { return fsName }

func (r *rawFS) Init(s *fuse.Server) { r.fsys.srv = s }

// Forget is ignored: no node has state to free, and a process that takes the session over
// does not know the kernel's counts.
func (r *rawFS) Forget(nodeid, nlookup uint64) { r.fsys.forgets.Add(1) }

// kind is what a node ID names.
type kind int

const (
	kindUnknown kind = iota
	kindRoot
	kindRef
	kindLayerDir
	kindInfo
	kindBlob
	kindEntry
)

// node is a resolved node ID.
type node struct {
	kind  kind
	ino   uint64
	ref   refDir          // kindRef
	b     *block          // kinds of a block
	l     Layer           // kinds of a block
	x     *chunked.Index  // kindEntry
	id    chunked.EntryID // kindEntry: the inode owner
	entry chunked.Entry   // kindEntry: its metadata
}

// node resolves a node ID, with the layer of its block. An ID this session never handed out
// answers ESTALE.
func (r *rawFS) node(c *fuse.Context, ino uint64) (node, fuse.Status) {
	fsys := r.fsys
	switch {
	case ino == rootIno:
		return node{kind: kindRoot, ino: ino}, fuse.OK
	case ino >= firstRefIno:
		d, ok := fsys.refDir(ino)
		if !ok {
			return node{}, fuse.Status(syscall.ESTALE)
		}
		return node{kind: kindRef, ino: ino, ref: d}, fuse.OK
	}
	b, off, ok := fsys.blockOf(ino)
	if !ok {
		return node{}, fuse.Status(syscall.ESTALE)
	}
	l, errno := fsys.layerOf(c, b)
	if errno != 0 {
		return node{}, fuse.Status(errno)
	}
	n := node{ino: ino, b: b, l: l}
	switch {
	case off == inoLayerDir:
		n.kind = kindLayerDir
	case off == inoInfo:
		n.kind = kindInfo
	case off == inoBlob:
		n.kind = kindBlob
	case off >= inoEntries:
		x := l.Index()
		id := chunked.EntryID(off - inoEntries)
		if int(id) >= x.Len() || x.Meta(id).Inode != id {
			return node{}, fuse.Status(syscall.ESTALE)
		}
		n.kind, n.x, n.id, n.entry = kindEntry, x, id, x.Meta(id)
	default:
		return node{}, fuse.Status(syscall.ESTALE)
	}
	return n, fuse.OK
}

func (n *node) isDir() bool {
	switch n.kind {
	case kindRoot, kindRef, kindLayerDir:
		return true
	case kindEntry:
		return n.entry.Type == chunked.TypeDir && n.entry.Flags&chunked.FlagWhiteout == 0
	}
	return false
}

func ctxOf(h *fuse.InHeader, cancel <-chan struct{}) *fuse.Context {
	return &fuse.Context{Caller: h.Caller, Cancel: cancel}
}

func (r *rawFS) Lookup(cancel <-chan struct{}, h *fuse.InHeader, name string, out *fuse.EntryOut) fuse.Status {
	defer r.fsys.admit().done()
	c := ctxOf(h, cancel)
	n, st := r.node(c, h.NodeId)
	if !st.Ok() {
		return st
	}
	switch n.kind {
	case kindRoot:
		return r.lookupRef(c, name, out)
	case kindRef:
		return r.lookupLayer(c, n.ref, name, out)
	case kindLayerDir:
		return r.lookupInLayer(&n, name, out)
	case kindEntry:
		if !n.isDir() {
			return fuse.Status(syscall.ENOTDIR)
		}
		id, ok := n.x.Lookup(n.id, name)
		if !ok {
			// A negative entry, kept for the entry timeout: the tree never changes.
			out.NodeId = 0
			out.SetEntryTimeout(r.fsys.entryTO)
			return fuse.OK
		}
		r.entryOut(n.b, n.x, id, out)
		return fuse.OK
	}
	return fuse.Status(syscall.ENOTDIR)
}

// entryOut answers a lookup of entry id of block b's diff tree: the attributes and number of
// the entry owning its inode, cached by the kernel for the configured timeouts.
func (r *rawFS) entryOut(b *block, x *chunked.Index, id chunked.EntryID, out *fuse.EntryOut) {
	owner := x.Meta(id).Inode
	out.NodeId = b.base + inoEntries + uint64(owner)
	r.fsys.fillEntry(&out.Attr, b, x, owner)
	out.SetEntryTimeout(r.fsys.entryTO)
	out.SetAttrTimeout(r.fsys.attrTO)
}

// lookupRef finds a reference directory in the root. A failure is not cached.
func (r *rawFS) lookupRef(c *fuse.Context, name string, out *fuse.EntryOut) fuse.Status {
	if !privileged(&c.Caller) {
		return fuse.EACCES
	}
	ref, ok := decodeRef(name)
	if !ok {
		return fuse.ENOENT
	}
	ino, err := r.fsys.refIno(name, ref)
	if err != nil {
		return fuse.Status(errno(r.fsys.eio, err, "lookup", "name", name))
	}
	out.NodeId = ino
	r.fsys.synthAttr(&out.Attr, ino, syscall.S_IFDIR|dirMode, 0)
	// A reference directory is a pure function of its name: cache it like the diff trees.
	out.SetEntryTimeout(r.fsys.entryTO)
	out.SetAttrTimeout(r.fsys.attrTO)
	return fuse.OK
}

// lookupLayer resolves a layer through the Store. Neither a success nor a failure is cached
// by the kernel: each access to <ref>/<key> asks the Store again, and checks its caller (see
// privileged), whatever the kernel caches below. The attributes of a layer directory are a
// function of its inode number, and are cached.
func (r *rawFS) lookupLayer(c *fuse.Context, d refDir, name string, out *fuse.EntryOut) fuse.Status {
	fsys := r.fsys
	if !privileged(&c.Caller) {
		return fuse.EACCES
	}
	key, ok := parseKey(name)
	if !ok {
		return fuse.ENOENT
	}
	l, err := fsys.store.Lookup(c, d.ref, key)
	if err == nil && (l == nil || l.Index() == nil) {
		err = errors.New("store returned no layer")
	}
	if err == nil && l.Index().Len() > maxEntries {
		err = errors.New("layer has too many entries for its inode block")
	}
	var b *block
	if err == nil {
		b, err = fsys.block(d.ref, key, l)
	}
	if err != nil {
		return fuse.Status(errno(fsys.eio, err, "lookup", "ref", d.ref, "key", key))
	}
	out.NodeId = b.base + inoLayerDir
	r.layerDirAttr(&out.Attr, b)
	out.SetEntryTimeout(0)
	out.SetAttrTimeout(fsys.attrTO)
	return fuse.OK
}

// layerDirAttr fills a layer directory's attributes: the same for as long as its number lives.
func (r *rawFS) layerDirAttr(out *fuse.Attr, b *block) {
	r.fsys.synthAttr(out, b.base+inoLayerDir, syscall.S_IFDIR|dirMode, 0)
	out.Nlink = 3
}

// lookupInLayer finds diff, info or blob in a layer directory ("use" never exists).
func (r *rawFS) lookupInLayer(n *node, name string, out *fuse.EntryOut) fuse.Status {
	fsys := r.fsys
	switch name {
	case "diff":
		x := n.l.Index()
		r.entryOut(n.b, x, x.Root(), out)
		return fuse.OK
	case "info":
		out.NodeId = n.b.base + inoInfo
		fsys.synthAttr(&out.Attr, out.NodeId, syscall.S_IFREG|readOnlyMode, uint64(len(n.l.Info(n.b.key))))
	case "blob":
		out.NodeId = n.b.base + inoBlob
		fsys.synthAttr(&out.Attr, out.NodeId, syscall.S_IFREG|readOnlyMode, uint64(max(n.l.BlobSize(), 0)))
		out.SetAttrTimeout(fsys.attrTO)
	default:
		return fuse.ENOENT
	}
	out.SetEntryTimeout(fsys.entryTO)
	return fuse.OK
}

func (r *rawFS) GetAttr(cancel <-chan struct{}, in *fuse.GetAttrIn, out *fuse.AttrOut) fuse.Status {
	defer r.fsys.admit().done()
	n, st := r.node(ctxOf(&in.InHeader, cancel), in.NodeId)
	if !st.Ok() {
		return st
	}
	fsys := r.fsys
	// The attributes of everything but info never change for their inode numbers, and the
	// kernel checks the root's and the directories' (for search permission) on every path it
	// resolves: they are cached.
	out.SetTimeout(fsys.attrTO)
	switch n.kind {
	case kindRoot, kindRef:
		fsys.synthAttr(&out.Attr, n.ino, syscall.S_IFDIR|dirMode, 0)
	case kindLayerDir:
		r.layerDirAttr(&out.Attr, n.b)
	case kindInfo:
		fsys.synthAttr(&out.Attr, n.ino, syscall.S_IFREG|readOnlyMode, uint64(len(n.l.Info(n.b.key))))
		out.SetTimeout(0)
	case kindBlob:
		fsys.synthAttr(&out.Attr, n.ino, syscall.S_IFREG|readOnlyMode, uint64(max(n.l.BlobSize(), 0)))
	case kindEntry:
		fsys.fillEntry(&out.Attr, n.b, n.x, n.id)
	}
	return fuse.OK
}

// Readlink returns a symlink's target verbatim.
func (r *rawFS) Readlink(cancel <-chan struct{}, h *fuse.InHeader) ([]byte, fuse.Status) {
	defer r.fsys.admit().done()
	n, st := r.node(ctxOf(h, cancel), h.NodeId)
	if !st.Ok() {
		return nil, st
	}
	if n.kind != kindEntry || n.entry.Type != chunked.TypeSymlink {
		return nil, fuse.EINVAL
	}
	return []byte(n.entry.LinkName), fuse.OK
}

// GetXAttr answers the size and ERANGE when dest is too small (the size query of an empty
// dest included), ENODATA for a missing attribute.
func (r *rawFS) GetXAttr(cancel <-chan struct{}, h *fuse.InHeader, attr string, dest []byte) (uint32, fuse.Status) {
	defer r.fsys.admit().done()
	n, st := r.node(ctxOf(h, cancel), h.NodeId)
	if !st.Ok() {
		return 0, st
	}
	if n.kind == kindEntry {
		for _, xa := range n.x.Xattrs(n.id) {
			if xa.Name == attr {
				if len(dest) < len(xa.Value) {
					return uint32(len(xa.Value)), fuse.ERANGE
				}
				return uint32(copy(dest, xa.Value)), fuse.OK
			}
		}
	}
	return 0, fuse.ENOATTR
}

// ListXAttr writes the NUL-terminated names, or returns the size and ERANGE when dest is
// too small.
func (r *rawFS) ListXAttr(cancel <-chan struct{}, h *fuse.InHeader, dest []byte) (uint32, fuse.Status) {
	defer r.fsys.admit().done()
	n, st := r.node(ctxOf(h, cancel), h.NodeId)
	if !st.Ok() {
		return 0, st
	}
	var names []byte
	if n.kind == kindEntry {
		for _, xa := range n.x.Xattrs(n.id) {
			names = append(append(names, xa.Name...), 0)
		}
	}
	if len(dest) < len(names) {
		return uint32(len(names)), fuse.ERANGE
	}
	return uint32(copy(dest, names)), fuse.OK
}

// Open opens a regular file, info or blob for reading. The file handle is the inode number
// (with ptHandle for passthrough). Files are opened FOPEN_NOFLUSH: nothing is written, so a
// close(2) sends no FLUSH to wait for.
//
// Only root opens: overlayfs opens its lower files with the credentials of whoever mounted
// it. Reads are not checked: the pages of a file mapped by a container's process are read
// with that process's credentials.
func (r *rawFS) Open(cancel <-chan struct{}, in *fuse.OpenIn, out *fuse.OpenOut) fuse.Status {
	defer r.fsys.admit().done()
	c := ctxOf(&in.InHeader, cancel)
	n, st := r.node(c, in.NodeId)
	if !st.Ok() {
		return st
	}
	if n.isDir() {
		return fuse.Status(syscall.EISDIR)
	}
	if !privileged(&c.Caller) {
		return fuse.EACCES
	}
	if writeAccess(in.Flags) {
		return fuse.EROFS
	}
	out.Fh = n.ino
	switch n.kind {
	case kindInfo:
		// info may change (see the package doc): every read reaches the daemon and reads
		// the current content, with no size cached by the kernel to cut it.
		out.OpenFlags = fuse.FOPEN_DIRECT_IO | fuse.FOPEN_NOFLUSH
	case kindBlob:
		out.OpenFlags = fuse.FOPEN_KEEP_CACHE | fuse.FOPEN_NOFLUSH
	case kindEntry:
		if n.entry.Type != chunked.TypeReg || n.entry.Flags&chunked.FlagWhiteout != 0 {
			return fuse.EINVAL // the kernel opens only regular files through FUSE
		}
		out.OpenFlags = fuse.FOPEN_KEEP_CACHE | fuse.FOPEN_NOFLUSH
		if in.Flags&fmodeExec != 0 {
			n.l.Executing(n.id)
		}
		r.fsys.openFile(n.b, n.l, n.x, n.id, n.ino, n.entry.Size, out)
	}
	return fuse.OK
}

// fmodeExec is the kernel's __FMODE_EXEC, set in the flags of an open to execute a file
// (execve's, and the ELF interpreter's); overlayfs passes it on to the lower file's open.
const fmodeExec = 0x20

func (r *rawFS) Read(cancel <-chan struct{}, in *fuse.ReadIn, buf []byte) (fuse.ReadResult, fuse.Status) {
	defer r.fsys.admit().done()
	c := ctxOf(&in.InHeader, cancel)
	n, st := r.node(c, in.NodeId)
	if !st.Ok() {
		return nil, st
	}
	fsys, off := r.fsys, int64(in.Offset)
	switch n.kind {
	case kindInfo:
		data := n.l.Info(n.b.key)
		if off >= int64(len(data)) {
			return fuse.ReadResultData(nil), fuse.OK
		}
		return fuse.ReadResultData(buf[:copy(buf, data[off:])]), fuse.OK
	case kindBlob:
		p, ok := clamp(buf, off, n.l.BlobSize())
		if !ok {
			return fuse.ReadResultData(nil), fuse.OK
		}
		k, err := n.l.ReadBlob(c, p, off)
		if err != nil && !errors.Is(err, io.EOF) {
			return nil, fuse.Status(errno(fsys.eio, err, "read blob", "off", off, "len", len(p)))
		}
		return fuse.ReadResultData(p[:k]), fuse.OK
	case kindEntry:
		if n.entry.Type != chunked.TypeReg {
			return nil, fuse.EINVAL
		}
		p, ok := clamp(buf, off, n.entry.Size)
		if !ok {
			return fuse.ReadResultData(nil), fuse.OK
		}
		k, err := n.l.ReadFile(c, n.id, p, off)
		if err != nil && !errors.Is(err, io.EOF) {
			return nil, fuse.Status(errno(fsys.eio, err, "read", "file", n.x.Path(n.id), "off", off, "len", len(p)))
		}
		return fuse.ReadResultData(p[:k]), fuse.OK
	}
	return nil, fuse.Status(syscall.EISDIR)
}

func (r *rawFS) Release(cancel <-chan struct{}, in *fuse.ReleaseIn) {
	defer r.fsys.admit().done()
	if in.NodeId < firstRefIno && in.NodeId&(1<<blockShift-1) >= inoEntries {
		r.fsys.releaseFile(in.NodeId, in.Fh)
	}
}

// OpenDir answers ENOSYS, which the kernel takes as "opening a directory needs no request":
// from the first on it opens directories itself, sends no OPENDIR and no RELEASEDIR, and keeps
// their listings as FOPEN_CACHE_DIR and FOPEN_KEEP_CACHE would. No listing of the mount ever
// changes (a diff tree is immutable; the root and the reference directories list nothing, a
// layer directory the same three names), so a second walk of a tree reaches the daemon only
// for the attributes of the directories it listed (see TestWalkFromKernelCaches), where each
// directory's open and close took two requests more. A listing the kernel does not hold is
// asked for with READDIRPLUS on the directory's inode (readDir): it meets the same checks an
// open did (a block gone, a refused layer), and a refusal drops the listings kept (dropCached).
func (r *rawFS) OpenDir(cancel <-chan struct{}, in *fuse.OpenIn, out *fuse.OpenOut) fuse.Status {
	return fuse.ENOSYS
}

func (r *rawFS) ReadDir(cancel <-chan struct{}, in *fuse.ReadIn, out *fuse.DirEntryList) fuse.Status {
	return r.readDir(cancel, in, out, false)
}

func (r *rawFS) ReadDirPlus(cancel <-chan struct{}, in *fuse.ReadIn, out *fuse.DirEntryList) fuse.Status {
	return r.readDir(cancel, in, out, true)
}

// readDir lists a directory from in.Offset, where offset k is after the k-th entry: any
// offset a listing gave resumes it, in this process or the next. The root and the reference
// directories list nothing (their entries are found by lookup only).
func (r *rawFS) readDir(cancel <-chan struct{}, in *fuse.ReadIn, out *fuse.DirEntryList, plus bool) fuse.Status {
	defer r.fsys.admit().done()
	n, st := r.node(ctxOf(&in.InHeader, cancel), in.NodeId)
	if !st.Ok() {
		return st
	}
	// add adds one entry, with its lookup for READDIRPLUS; false when the buffer is full.
	add := func(de fuse.DirEntry, lookup func(*fuse.EntryOut)) bool {
		if !plus {
			return out.AddDirEntry(de)
		}
		eo := out.AddDirLookupEntry(de)
		if eo == nil {
			return false
		}
		lookup(eo)
		return true
	}
	switch n.kind {
	case kindLayerDir:
		x := n.l.Index()
		names := []fuse.DirEntry{
			{Name: "blob", Mode: syscall.S_IFREG, Ino: n.b.base + inoBlob},
			{Name: "diff", Mode: syscall.S_IFDIR, Ino: entryIno(n.b, x, x.Root())},
			{Name: "info", Mode: syscall.S_IFREG, Ino: n.b.base + inoInfo},
		}
		for i := in.Offset; i < uint64(len(names)); i++ {
			de := names[i]
			de.Off = i + 1
			if !add(de, func(eo *fuse.EntryOut) { r.lookupInLayer(&n, de.Name, eo) }) {
				break
			}
		}
	case kindEntry:
		if !n.isDir() {
			return fuse.ENOTDIR
		}
		x, pos := n.x, in.Offset
		for pos < maxEntries {
			page := x.ChildrenFrom(n.id, int(pos), 128)
			if len(page) == 0 {
				break
			}
			for _, id := range page {
				owner := x.Meta(id).Inode
				o := x.Meta(owner)
				de := fuse.DirEntry{Name: x.BaseName(id), Mode: typeBits(&o), Ino: n.b.base + inoEntries + uint64(owner), Off: pos + 1}
				if !add(de, func(eo *fuse.EntryOut) { r.entryOut(n.b, x, id, eo) }) {
					return fuse.OK
				}
				pos++
			}
		}
	}
	return fuse.OK
}

// Create of use in a layer directory is how the runtime takes a use of a layer: the Store
// counts one user more, and the answer is ENOENT (a store where the create succeeds is one
// without GC support).
func (r *rawFS) Create(cancel <-chan struct{}, in *fuse.CreateIn, name string, _ *fuse.CreateOut) fuse.Status {
	defer r.fsys.admit().done()
	c := ctxOf(&in.InHeader, cancel)
	if in.NodeId >= firstRefIno || in.NodeId&(1<<blockShift-1) != inoLayerDir {
		return fuse.EROFS
	}
	n, st := r.node(c, in.NodeId)
	if !st.Ok() {
		return st
	}
	if !privileged(&c.Caller) {
		return fuse.EACCES
	}
	if n.kind != kindLayerDir || name != "use" {
		return fuse.EROFS
	}
	r.fsys.countUse(useKey{n.b.ref, n.b.key}, 1)
	r.fsys.store.Use(n.b.ref, n.b.key)
	return fuse.ENOENT
}

// Rmdir of a layer directory is how the runtime drops its use of a layer: the Store counts
// one user less, and the answer is ENOENT, as the contract asks.
func (r *rawFS) Rmdir(cancel <-chan struct{}, h *fuse.InHeader, name string) fuse.Status {
	defer r.fsys.admit().done()
	if h.NodeId < firstRefIno {
		return fuse.EROFS
	}
	c := ctxOf(h, cancel)
	n, st := r.node(c, h.NodeId)
	if !st.Ok() {
		return st
	}
	if !privileged(&c.Caller) {
		return fuse.EACCES
	}
	if key, ok := parseKey(name); ok {
		r.fsys.countUse(useKey{n.ref.ref, key}, -1)
		r.fsys.store.Release(n.ref.ref, key)
	}
	return fuse.ENOENT
}

// The modifications: EROFS. The mount is read-write at the VFS level (see the package doc),
// so these are what callers see.

func (r *rawFS) SetAttr(<-chan struct{}, *fuse.SetAttrIn, *fuse.AttrOut) fuse.Status {
	return fuse.EROFS
}

func (r *rawFS) Mknod(<-chan struct{}, *fuse.MknodIn, string, *fuse.EntryOut) fuse.Status {
	return fuse.EROFS
}

func (r *rawFS) Mkdir(<-chan struct{}, *fuse.MkdirIn, string, *fuse.EntryOut) fuse.Status {
	return fuse.EROFS
}

func (r *rawFS) Unlink(<-chan struct{}, *fuse.InHeader, string) fuse.Status { return fuse.EROFS }

func (r *rawFS) Rename(<-chan struct{}, *fuse.RenameIn, string, string) fuse.Status {
	return fuse.EROFS
}

func (r *rawFS) Link(<-chan struct{}, *fuse.LinkIn, string, *fuse.EntryOut) fuse.Status {
	return fuse.EROFS
}

func (r *rawFS) Symlink(<-chan struct{}, *fuse.InHeader, string, string, *fuse.EntryOut) fuse.Status {
	return fuse.EROFS
}

func (r *rawFS) SetXAttr(<-chan struct{}, *fuse.SetXAttrIn, string, []byte) fuse.Status {
	return fuse.EROFS
}

func (r *rawFS) RemoveXAttr(<-chan struct{}, *fuse.InHeader, string) fuse.Status {
	return fuse.EROFS
}

func (r *rawFS) Tmpfile(<-chan struct{}, *fuse.CreateIn, *fuse.CreateOut) fuse.Status {
	return fuse.EROFS
}

func (r *rawFS) Write(<-chan struct{}, *fuse.WriteIn, []byte) (uint32, fuse.Status) {
	return 0, fuse.EROFS
}

func (r *rawFS) CopyFileRange(<-chan struct{}, *fuse.CopyFileRangeIn) (uint32, fuse.Status) {
	return 0, fuse.EROFS
}

func (r *rawFS) Fallocate(<-chan struct{}, *fuse.FallocateIn) fuse.Status { return fuse.EROFS }

// Fsync and FsyncDir have nothing to flush: they succeed. Flush is never sent (FOPEN_NOFLUSH)
// and would succeed too.
func (r *rawFS) Fsync(<-chan struct{}, *fuse.FsyncIn) fuse.Status    { return fuse.OK }
func (r *rawFS) FsyncDir(<-chan struct{}, *fuse.FsyncIn) fuse.Status { return fuse.OK }
func (r *rawFS) Flush(<-chan struct{}, *fuse.FlushIn) fuse.Status    { return fuse.OK }

// StatFs reports a filesystem with no free space, so that tools dividing by the block size
// or the name length do not trip on zeros.
func (r *rawFS) StatFs(_ <-chan struct{}, _ *fuse.InHeader, out *fuse.StatfsOut) fuse.Status {
	out.Bsize = 4096
	out.Frsize = 4096
	out.NameLen = 255
	return fuse.OK
}
