package storefs

import (
	"context"
	"encoding/base64"
	"errors"
	"io"
	"log/slog"
	"runtime"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"weak"

	fusefs "github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
	"github.com/opencontainers/go-digest"
	"go.podman.io/image/v5/docker/reference"

	"github.com/layerstore/layerstore/chunked"
)

// Inode numbers (see the package doc). The root is 1. A resolved layer directory owns the
// block [n<<32, (n+1)<<32) for some n >= 1; reference directories take numbers from a
// counter starting at 1<<63, above every block.
const (
	rootIno      = 1
	blockShift   = 32
	inoLayerDir  = 0  // offset of the layer directory in its block
	inoInfo      = 1  // offset of info
	inoBlob      = 2  // offset of blob
	inoEntries   = 16 // offset of diff entry 0
	maxEntries   = 1<<blockShift - inoEntries
	firstRefIno  = 1 << 63
	pollHackIno  = ^uint64(0) // taken by go-fuse
	dirMode      = 0o755
	readOnlyMode = 0o444
)

// filesystem is the state shared by every node of a mount.
type filesystem struct {
	store   Store
	log     *slog.Logger
	entryTO time.Duration // entry timeout of the immutable parts
	attrTO  time.Duration // attribute timeout of the immutable parts
	started time.Time     // times of the synthetic directories and files
	// passthrough is set once the kernel granted FUSE passthrough and Options asked for it.
	passthrough    atomic.Bool
	passthroughLog sync.Once

	mu sync.Mutex // guards the fields below
	// blocks maps each resolved (ref, key, index) to the base of its inode block. An entry
	// goes when its index is garbage collected, which happens only once no node uses it.
	blocks    map[blockKey]uint64
	nextBlock uint64
	// refInos maps the name of each reference directory go-fuse holds a node for to its
	// inode number; nextRefIno is the next number never handed out.
	refInos    map[string]uint64
	nextRefIno uint64
}

type blockKey struct {
	ref   string
	key   digest.Digest
	index weak.Pointer[chunked.Index]
}

func newFilesystem(store Store, log *slog.Logger, entryTO, attrTO time.Duration) *filesystem {
	return &filesystem{
		store:   store,
		log:     log,
		entryTO: entryTO,
		attrTO:  attrTO,
		started: time.Now(),
		blocks:  map[blockKey]uint64{},

		refInos:    map[string]uint64{},
		nextRefIno: firstRefIno,
	}
}

// block returns the base inode number of the layer directory (ref, key) resolved to the
// layer whose index is x.
func (fsys *filesystem) block(ref string, key digest.Digest, x *chunked.Index) uint64 {
	k := blockKey{ref, key, weak.Make(x)}
	fsys.mu.Lock()
	defer fsys.mu.Unlock()
	if b, ok := fsys.blocks[k]; ok {
		return b
	}
	// 2^31 blocks fit below the reference directories' numbers: a daemon would have to
	// resolve a layer every millisecond for 24 days to run out.
	fsys.nextBlock++
	b := fsys.nextBlock << blockShift
	fsys.blocks[k] = b
	runtime.AddCleanup(x, func(k blockKey) {
		fsys.mu.Lock()
		delete(fsys.blocks, k)
		fsys.mu.Unlock()
	}, k)
	return b
}

// synthAttr fills the attributes of a directory or file that the daemon makes up (not part
// of a layer's tree): owned by root, timestamped with the mount's start.
func (fsys *filesystem) synthAttr(out *fuse.Attr, ino uint64, mode uint32, size uint64) {
	*out = fuse.Attr{Ino: ino, Mode: mode, Size: size, Nlink: 1}
	if mode&syscall.S_IFMT == syscall.S_IFDIR {
		out.Nlink = 2
	}
	t := fsys.started
	out.SetTimes(&t, &t, &t)
}

// uncached marks a failed lookup so that go-fuse does not turn it into a cached negative
// entry: go-fuse applies Options.NegativeTimeout (meant for the immutable diff trees) only
// to lookups whose entry timeout is still zero, and the kernel ignores the entry of a lookup
// that fails.
func uncached(out *fuse.EntryOut) {
	out.SetEntryTimeout(time.Nanosecond)
}

// decodeRef decodes a directory name of the store root into an image reference: standard
// base64 with padding of a plausible reference (c/image's normalized form).
func decodeRef(name string) (string, bool) {
	b, err := base64.StdEncoding.Strict().DecodeString(name)
	if err != nil || len(b) == 0 {
		return "", false
	}
	ref := string(b)
	if _, err := reference.ParseNormalizedNamed(ref); err != nil {
		return "", false
	}
	return ref, true
}

// parseKey parses a layer key: a sha256 digest, "sha256:" and 64 lowercase hex digits.
func parseKey(name string) (digest.Digest, bool) {
	d, err := digest.Parse(name)
	if err != nil || d.Algorithm() != digest.SHA256 {
		return "", false
	}
	return d, true
}

// refIno returns the inode number of the reference directory called name: the number its
// node has while go-fuse holds one, a number never handed out before otherwise. Two names
// never share a number, so the kernel and go-fuse (which both identify nodes by number)
// never take one reference directory for another.
func (fsys *filesystem) refIno(name string) uint64 {
	fsys.mu.Lock()
	defer fsys.mu.Unlock()
	if ino, ok := fsys.refInos[name]; ok {
		return ino
	}
	// 2^63 numbers: a daemon would need a new name every nanosecond for 292 years to
	// reach pollHackIno.
	ino := fsys.nextRefIno
	fsys.nextRefIno++
	fsys.refInos[name] = ino
	return ino
}

// forgetRefIno drops the number of the reference directory name once go-fuse forgot its
// node numbered ino. A lookup racing with the forget may have revived the number for the
// same name; the next lookup then takes a new number, which the kernel handles like a
// directory replaced under its name. Numbers are never reused, so no other name gets it.
func (fsys *filesystem) forgetRefIno(name string, ino uint64) {
	fsys.mu.Lock()
	defer fsys.mu.Unlock()
	if fsys.refInos[name] == ino {
		delete(fsys.refInos, name)
	}
}

// privileged reports whether the FUSE request of ctx comes from root: the runtime, or a
// container's process reaching the store through overlayfs, which accesses its lower
// layers with the credentials of whoever mounted the overlay. Only such requests may make
// the Store resolve a layer or count a use, or open anything under the mount.
func privileged(ctx context.Context) bool {
	c, ok := fuse.FromContext(ctx)
	return ok && c.Uid == 0
}

// rootNode is the store root: one directory per base64-encoded reference, found by lookup
// only (readdir is empty).
type rootNode struct {
	fusefs.Inode
	readOnly
	fsys *filesystem
}

var (
	_ fusefs.NodeLookuper    = (*rootNode)(nil)
	_ fusefs.NodeGetattrer   = (*rootNode)(nil)
	_ fusefs.NodeReaddirer   = (*rootNode)(nil)
	_ fusefs.NodeLookuper    = (*refDir)(nil)
	_ fusefs.NodeGetattrer   = (*refDir)(nil)
	_ fusefs.NodeReaddirer   = (*refDir)(nil)
	_ fusefs.NodeRmdirer     = (*refDir)(nil)
	_ fusefs.NodeOnForgetter = (*refDir)(nil)
	_ fusefs.NodeLookuper    = (*layerDir)(nil)
	_ fusefs.NodeGetattrer   = (*layerDir)(nil)
	_ fusefs.NodeReaddirer   = (*layerDir)(nil)
	_ fusefs.NodeCreater     = (*layerDir)(nil)
	_ fusefs.NodeGetattrer   = (*infoFile)(nil)
	_ fusefs.NodeOpener      = (*infoFile)(nil)
	_ fusefs.NodeGetattrer   = (*blobFile)(nil)
	_ fusefs.NodeOpener      = (*blobFile)(nil)
	_ fusefs.NodeReader      = (*blobFile)(nil)
)

// Getattr: the root's attributes never change, and the kernel checks them (for search
// permission) on every path it resolves through the mount: they are cached.
func (n *rootNode) Getattr(_ context.Context, _ fusefs.FileHandle, out *fuse.AttrOut) syscall.Errno {
	n.fsys.synthAttr(&out.Attr, rootIno, syscall.S_IFDIR|dirMode, 0)
	out.SetTimeout(n.fsys.attrTO)
	return 0
}

func (n *rootNode) Readdir(context.Context) (fusefs.DirStream, syscall.Errno) {
	return fusefs.NewListDirStream(nil), 0
}

func (n *rootNode) Lookup(ctx context.Context, name string, out *fuse.EntryOut) (*fusefs.Inode, syscall.Errno) {
	if !privileged(ctx) {
		uncached(out)
		return nil, syscall.EACCES
	}
	ref, ok := decodeRef(name)
	if !ok {
		uncached(out)
		return nil, syscall.ENOENT
	}
	ino := n.fsys.refIno(name)
	n.fsys.synthAttr(&out.Attr, ino, syscall.S_IFDIR|dirMode, 0)
	// A reference directory is a pure function of its name: cache it like the diff trees.
	out.SetEntryTimeout(n.fsys.entryTO)
	out.SetAttrTimeout(n.fsys.attrTO)
	return n.NewInode(ctx, &refDir{fsys: n.fsys, ref: ref, name: name}, fusefs.StableAttr{Mode: syscall.S_IFDIR, Ino: ino}), 0
}

// refDir is <mnt>/<base64(ref)>: one directory per layer key, found by lookup only.
type refDir struct {
	fusefs.Inode
	readOnly
	fsys *filesystem
	ref  string
	name string // base64(ref), the directory's name
}

// OnForget releases the directory's inode number once go-fuse no longer holds its node.
func (n *refDir) OnForget() { n.fsys.forgetRefIno(n.name, n.StableAttr().Ino) }

func (n *refDir) Getattr(_ context.Context, _ fusefs.FileHandle, out *fuse.AttrOut) syscall.Errno {
	n.fsys.synthAttr(&out.Attr, n.StableAttr().Ino, syscall.S_IFDIR|dirMode, 0)
	out.SetTimeout(n.fsys.attrTO)
	return 0
}

func (n *refDir) Readdir(context.Context) (fusefs.DirStream, syscall.Errno) {
	return fusefs.NewListDirStream(nil), 0
}

// Lookup resolves a layer through the Store. Neither a success nor a failure is cached by
// the kernel: each access to <ref>/<key> asks the Store again, and checks its caller (see
// privileged), whatever the kernel caches below. The attributes of a layer directory are a
// function of its inode number, and are cached.
func (n *refDir) Lookup(ctx context.Context, name string, out *fuse.EntryOut) (*fusefs.Inode, syscall.Errno) {
	uncached(out)
	if !privileged(ctx) {
		return nil, syscall.EACCES
	}
	key, ok := parseKey(name)
	if !ok {
		return nil, syscall.ENOENT
	}
	l, err := n.fsys.store.Lookup(ctx, n.ref, key)
	if err == nil && (l == nil || l.Index() == nil) {
		err = errors.New("store returned no layer")
	}
	if err == nil && l.Index().Len() > maxEntries {
		err = errors.New("layer has too many entries for its inode block")
	}
	if err != nil {
		return nil, errno(n.fsys.log, err, "lookup", "ref", n.ref, "key", key)
	}
	ld := &layerDir{
		fsys:  n.fsys,
		ref:   n.ref,
		key:   key,
		layer: l,
		block: n.fsys.block(n.ref, key, l.Index()),
	}
	ld.attr(&out.Attr)
	out.SetEntryTimeout(0)
	out.SetAttrTimeout(n.fsys.attrTO)
	return n.NewInode(ctx, ld, fusefs.StableAttr{Mode: syscall.S_IFDIR, Ino: ld.block + inoLayerDir}), 0
}

// Rmdir of a layer directory is how the runtime drops its use of a layer: the Store counts
// one user less, and the answer is ENOENT, as the contract asks.
func (n *refDir) Rmdir(ctx context.Context, name string) syscall.Errno {
	if !privileged(ctx) {
		return syscall.EACCES
	}
	if key, ok := parseKey(name); ok {
		n.fsys.store.Release(n.ref, key)
	}
	return syscall.ENOENT
}

// layerDir is <mnt>/<base64(ref)>/<key>: diff, info and blob of one resolved layer, and the
// use file that exists only to be created.
type layerDir struct {
	fusefs.Inode
	readOnly
	fsys  *filesystem
	ref   string
	key   digest.Digest
	layer Layer
	block uint64
}

func (n *layerDir) Getattr(_ context.Context, _ fusefs.FileHandle, out *fuse.AttrOut) syscall.Errno {
	n.attr(&out.Attr)
	out.SetTimeout(n.fsys.attrTO)
	return 0
}

// attr fills the layer directory's attributes: the same for as long as its inode number lives.
func (n *layerDir) attr(out *fuse.Attr) {
	n.fsys.synthAttr(out, n.block+inoLayerDir, syscall.S_IFDIR|dirMode, 0)
	out.Nlink = 3
}

func (n *layerDir) Readdir(context.Context) (fusefs.DirStream, syscall.Errno) {
	x := n.layer.Index()
	return fusefs.NewListDirStream([]fuse.DirEntry{
		{Name: "blob", Mode: syscall.S_IFREG, Ino: n.block + inoBlob},
		{Name: "diff", Mode: syscall.S_IFDIR, Ino: n.block + inoEntries + uint64(x.Entry(x.Root()).Inode)},
		{Name: "info", Mode: syscall.S_IFREG, Ino: n.block + inoInfo},
	}), 0
}

func (n *layerDir) Lookup(ctx context.Context, name string, out *fuse.EntryOut) (*fusefs.Inode, syscall.Errno) {
	var node fusefs.InodeEmbedder
	var ino uint64
	var mode uint32
	switch name {
	case "diff":
		v := &layerView{fsys: n.fsys, layer: n.layer, index: n.layer.Index(), block: n.block}
		en := v.node(v.index.Root())
		en.fill(&out.Attr)
		node, ino, mode = en, out.Ino, syscall.S_IFDIR
	case "info":
		f := &infoFile{fsys: n.fsys, layer: n.layer, key: n.key}
		ino, mode = n.block+inoInfo, syscall.S_IFREG
		n.fsys.synthAttr(&out.Attr, ino, mode|readOnlyMode, uint64(len(f.layer.Info(f.key))))
		node = f
	case "blob":
		f := &blobFile{fsys: n.fsys, layer: n.layer}
		ino, mode = n.block+inoBlob, syscall.S_IFREG
		n.fsys.synthAttr(&out.Attr, ino, mode|readOnlyMode, uint64(max(n.layer.BlobSize(), 0)))
		node = f
	default: // "use" included: it never exists
		uncached(out)
		return nil, syscall.ENOENT
	}
	out.SetEntryTimeout(n.fsys.entryTO)
	if name != "info" {
		out.SetAttrTimeout(n.fsys.attrTO)
	}
	return n.NewInode(ctx, node, fusefs.StableAttr{Mode: mode, Ino: ino}), 0
}

// Create of use is how the runtime takes a use of a layer: the Store counts one user more,
// and the answer is ENOENT (a store where the create succeeds is one without GC support).
func (n *layerDir) Create(ctx context.Context, name string, _, _ uint32, _ *fuse.EntryOut) (*fusefs.Inode, fusefs.FileHandle, uint32, syscall.Errno) {
	if !privileged(ctx) {
		return nil, nil, 0, syscall.EACCES
	}
	if name != "use" {
		return nil, nil, 0, syscall.EROFS
	}
	n.fsys.store.Use(n.ref, n.key)
	return nil, nil, 0, syscall.ENOENT
}

// infoFile is <key>/info: the layer's c/storage Layer JSON as seen through the key. It
// may change over the life of a layer (a DiffID proven later, say), so it is never cached:
// stat shows the current size, and each open reads a snapshot, in direct I/O so that reads
// are not cut at a size the kernel saw earlier.
type infoFile struct {
	fusefs.Inode
	readOnly
	fsys  *filesystem
	layer Layer
	key   digest.Digest
}

func (n *infoFile) Getattr(_ context.Context, _ fusefs.FileHandle, out *fuse.AttrOut) syscall.Errno {
	n.fsys.synthAttr(&out.Attr, n.StableAttr().Ino, syscall.S_IFREG|readOnlyMode, uint64(len(n.layer.Info(n.key))))
	return 0
}

func (n *infoFile) Open(ctx context.Context, flags uint32) (fusefs.FileHandle, uint32, syscall.Errno) {
	if !privileged(ctx) {
		return nil, 0, syscall.EACCES
	}
	if writeAccess(flags) {
		return nil, 0, syscall.EROFS
	}
	return &infoHandle{data: n.layer.Info(n.key)}, fuse.FOPEN_DIRECT_IO | fuse.FOPEN_NOFLUSH, 0
}

// infoHandle is an open info file: the content as it was at open.
type infoHandle struct{ data []byte }

var _ fusefs.FileReader = (*infoHandle)(nil)

func (h *infoHandle) Read(_ context.Context, dest []byte, off int64) (fuse.ReadResult, syscall.Errno) {
	if off >= int64(len(h.data)) {
		return fuse.ReadResultData(nil), 0
	}
	return fuse.ReadResultData(dest[:copy(dest, h.data[off:])]), 0
}

// blobFile is <key>/blob: the raw compressed layer, for export.
type blobFile struct {
	fusefs.Inode
	readOnly
	fsys  *filesystem
	layer Layer
}

func (n *blobFile) Getattr(_ context.Context, _ fusefs.FileHandle, out *fuse.AttrOut) syscall.Errno {
	n.fsys.synthAttr(&out.Attr, n.StableAttr().Ino, syscall.S_IFREG|readOnlyMode, uint64(max(n.layer.BlobSize(), 0)))
	out.SetTimeout(n.fsys.attrTO)
	return 0
}

func (n *blobFile) Open(ctx context.Context, flags uint32) (fusefs.FileHandle, uint32, syscall.Errno) {
	if !privileged(ctx) {
		return nil, 0, syscall.EACCES
	}
	if writeAccess(flags) {
		return nil, 0, syscall.EROFS
	}
	return nil, fuse.FOPEN_KEEP_CACHE | fuse.FOPEN_NOFLUSH, 0
}

func (n *blobFile) Read(ctx context.Context, _ fusefs.FileHandle, dest []byte, off int64) (fuse.ReadResult, syscall.Errno) {
	p, ok := clamp(dest, off, n.layer.BlobSize())
	if !ok {
		return fuse.ReadResultData(nil), 0
	}
	k, err := n.layer.ReadBlob(ctx, p, off)
	if err != nil && !errors.Is(err, io.EOF) {
		return nil, errno(n.fsys.log, err, "read blob", "off", off, "len", len(p))
	}
	return fuse.ReadResultData(p[:k]), 0
}

// clamp returns the part of dest that a read at off of a file of size bytes can fill, and
// false when off is at or past the end.
func clamp(dest []byte, off, size int64) ([]byte, bool) {
	if off < 0 || off >= size {
		return nil, false
	}
	if int64(len(dest)) > size-off {
		dest = dest[:size-off]
	}
	return dest, true
}
