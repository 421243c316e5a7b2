package storefs

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/hanwen/go-fuse/v2/fuse"
	"github.com/opencontainers/go-digest"
	"go.podman.io/image/v5/docker/reference"

	"github.com/layerstore/layerstore/chunked"
	"github.com/layerstore/layerstore/internal/ratelog"
)

// Inode numbers, which are also the FUSE node IDs (see the package doc). The root is 1. A
// resolved layer directory owns the block [n<<32, (n+1)<<32) for some n in [1, maxBlock];
// reference directories have numbers from firstRefIno up, above every block.
const (
	rootIno      = 1
	blockShift   = 32
	inoLayerDir  = 0  // offset of the layer directory in its block
	inoInfo      = 1  // offset of info
	inoBlob      = 2  // offset of blob
	inoEntries   = 16 // offset of diff entry 0
	maxEntries   = 1<<blockShift - inoEntries
	maxBlock     = 1<<31 - 1
	firstRefIno  = 1 << 63
	lastRefIno   = ^uint64(0) - 1 // ^0 is go-fuse's poll hack's
	dirMode      = 0o755
	readOnlyMode = 0o444
)

// filesystem is the state of a mount: the numbering, the open files' passthrough state and
// the gate that Stop closes. Its methods are safe for concurrent use.
type filesystem struct {
	store   Store
	log     *slog.Logger
	eio     *ratelog.Logger // the EIO answers (errno), logged at a bounded rate
	entryTO time.Duration   // entry timeout of the immutable parts
	attrTO  time.Duration   // attribute timeout of the immutable parts
	started time.Time       // times of the synthetic directories and files, the same in every process of a session
	self    fuse.Owner      // owner of the synthetic directories and files: the daemon's user
	ids     *IDMap          // how the diff trees' owners are shown (Config.IDs)
	srv     *fuse.Server    // set by Init, before the first request
	// passthrough is set once the kernel granted FUSE passthrough and Config asked for it;
	// ptRefused once the kernel refused to register a backing file.
	passthrough atomic.Bool
	ptRefused   atomic.Bool
	forgets     atomic.Int64 // FORGETs received (ignored), for tests

	mu sync.RWMutex // guards the numbering below and writes to tab
	// tab is the session table every new number is written to before the kernel gets it;
	// nil when mounted without a session.
	tab       *table
	refs      map[string]uint64 // name of a reference directory -> its number
	refDirs   map[uint64]refDir // and back
	nextRef   uint64
	blocks    map[uint64]*block // block number -> block
	byKey     map[blockKey]*block
	nextBlock uint64
	// uses counts the runtime's uses of each layer directory (creates of use less rmdirs),
	// kept in the session table so that a process resuming the session gives them back to
	// its Store (restoreUses).
	uses  map[useKey]int64
	swept atomic.Int64 // unix time of the last sweep

	ptMu sync.Mutex // guards the passthrough state below
	// inherited holds the backing IDs that earlier processes of the session registered
	// for inodes and did not unregister: opens of those inodes reuse them.
	inherited map[uint64]int32
	// opens holds the inodes of this process's blocks with open files or a backing ID.
	opens map[uint64]*fileOpens

	gateMu   sync.Mutex
	stopping bool          // Stop was called: requests are held
	active   int           // requests being answered
	idle     chan struct{} // closed when active drops to 0 while stopping
	held     chan struct{} // closed on unmount: held requests are answered then
	heldOnce sync.Once
}

// refDir is a reference directory: its name in the root and the reference it decodes to.
type refDir struct {
	name string
	ref  string
}

// block is one (reference, key) layer directory's block of inode numbers, for one layer
// identity (chunked.Index.Identity): the entries' numbers mean the same as long as the layer
// has that identity.
type block struct {
	base    uint64 // n << blockShift
	ref     string
	key     digest.Digest
	ident   chunked.Sum
	resumed bool // numbered by an earlier process of the session
	// layer is the layer the block's numbers belong to, nil once unused for layerIdle
	// (layerOf then asks the Store again); used is the unix time of its last use.
	layer atomic.Pointer[heldLayer]
	used  atomic.Int64
	// watched is set while a goroutine waits for the refusal of the block's layer, and for
	// good once it dropped what the kernel cached of the block (watchRefusal).
	watched atomic.Bool
}

// layerIdle is how long a block keeps its layer unused. The daemon holds no state per
// entry, but a layer's index is large: a layer the runtime no longer uses is left to the
// Store to free. sweepEvery bounds how often blocks are looked at.
const (
	layerIdle  = 10 * time.Minute
	sweepEvery = time.Minute
)

// heldLayer is a layer as a block holds it; gone is closed when the block lets it go (another
// layer of the identity replaced it, or the sweep dropped it).
type heldLayer struct {
	Layer
	gone chan struct{}
}

func newHeldLayer(l Layer) *heldLayer { return &heldLayer{Layer: l, gone: make(chan struct{})} }

type blockKey struct {
	ref   string
	key   digest.Digest
	ident chunked.Sum
}

// fileOpens counts the open handles of a regular file of this process's blocks by how the
// kernel reads them. The kernel refuses (EIO) a passthrough open of an inode with files open
// through the daemon, and the reverse, so a file opened before it was local is served by the
// daemon until those handles are released, even once its backing file exists.
type fileOpens struct {
	daemon, passthrough int
	backingID           int32 // registered by this process while passthrough > 0; 0 if none
}

func newFilesystem(store Store, log *slog.Logger, entryTO, attrTO time.Duration, started time.Time) *filesystem {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &filesystem{
		store:     store,
		log:       log,
		eio:       ratelog.New(log, eioEvery),
		entryTO:   entryTO,
		attrTO:    attrTO,
		started:   started,
		self:      fuse.Owner{Uid: daemonUID, Gid: uint32(os.Getegid())},
		refs:      map[string]uint64{},
		refDirs:   map[uint64]refDir{},
		nextRef:   firstRefIno,
		blocks:    map[uint64]*block{},
		byKey:     map[blockKey]*block{},
		nextBlock: 1,
		uses:      map[useKey]int64{},
		inherited: map[uint64]int32{},
		opens:     map[uint64]*fileOpens{},
		held:      make(chan struct{}),
	}
}

// load takes the numbering and backing IDs of an earlier process from its session table.
func (fsys *filesystem) load(st *sessionState) {
	fsys.mu.Lock()
	defer fsys.mu.Unlock()
	for _, r := range st.refs {
		fsys.refs[r.name] = r.ino
		fsys.refDirs[r.ino] = refDir{name: r.name, ref: r.ref}
		fsys.nextRef = max(fsys.nextRef, r.ino+1)
	}
	for _, b := range st.blocks {
		bl := &block{base: b.n << blockShift, ref: b.ref, key: b.key, ident: b.ident, resumed: true}
		fsys.blocks[b.n] = bl
		fsys.byKey[blockKey{b.ref, b.key, b.ident}] = bl
		fsys.nextBlock = max(fsys.nextBlock, b.n+1)
	}
	for ino, id := range st.backing {
		fsys.inherited[ino] = id
	}
	maps.Copy(fsys.uses, st.uses)
}

// countUse adds delta (1: a create of use; -1: an rmdir) to the runtime's uses of the layer
// directory k, never below 0, and writes the new count to the session table.
func (fsys *filesystem) countUse(k useKey, delta int64) {
	fsys.mu.Lock()
	defer fsys.mu.Unlock()
	n := max(0, fsys.uses[k]+delta)
	if n == fsys.uses[k] {
		return
	}
	if n == 0 {
		delete(fsys.uses, k)
	} else {
		fsys.uses[k] = n
	}
	if err := fsys.tab.appendUses(k, n); err != nil {
		fsys.log.Warn("cannot record a use of a layer in the session table: a daemon resuming the session will not count it", "ref", k.ref, "key", k.key, "err", err)
	}
}

// restoreUses gives the Store, in a process that resumed the session, the uses the runtime
// took of layer directories under earlier processes and has not dropped: each such layer is
// looked up again (from its record when it has one) and counted, so that its background
// fetch goes on and it is not freed as unused while running containers read it.
func (fsys *filesystem) restoreUses(ctx context.Context) {
	fsys.mu.RLock()
	uses := maps.Clone(fsys.uses)
	fsys.mu.RUnlock()
	restored := 0
	for k, n := range uses {
		if _, err := fsys.store.Lookup(ctx, k.ref, k.key); err != nil {
			fsys.log.Warn("layer in use before the restart not resolved again; resolved at its next use", "ref", k.ref, "key", k.key, "err", err)
			continue
		}
		for range n {
			fsys.store.Use(k.ref, k.key)
		}
		restored++
	}
	if len(uses) > 0 {
		fsys.log.Info("uses of layers taken back from the session", "layers", restored, "of", len(uses))
	}
}

// refIno returns the number of the reference directory called name (ref decoded), taking
// the next one never handed out, and writing it to the session table, on its first lookup.
// Numbers are never reused: the kernel and the table identify a directory by its number, so
// two names sharing one would serve one reference under the other's name (numbers derived
// from a hash of the name could collide). FORGET is ignored, so a name keeps its number for
// the session's life: the table grows by one record per reference ever looked up.
func (fsys *filesystem) refIno(name, ref string) (uint64, error) {
	fsys.mu.RLock()
	ino, ok := fsys.refs[name]
	fsys.mu.RUnlock()
	if ok {
		return ino, nil
	}
	fsys.mu.Lock()
	defer fsys.mu.Unlock()
	if ino, ok := fsys.refs[name]; ok {
		return ino, nil
	}
	// 2^63 numbers: a new name every nanosecond for 292 years.
	if fsys.nextRef > lastRefIno {
		return 0, errors.New("reference directory numbers exhausted")
	}
	ino = fsys.nextRef
	if err := fsys.tab.appendRef(ino, name); err != nil {
		return 0, err
	}
	fsys.nextRef++
	fsys.refs[name] = ino
	fsys.refDirs[ino] = refDir{name: name, ref: ref}
	return ino, nil
}

// refDir returns the reference directory numbered ino.
func (fsys *filesystem) refDir(ino uint64) (refDir, bool) {
	fsys.mu.RLock()
	defer fsys.mu.RUnlock()
	d, ok := fsys.refDirs[ino]
	return d, ok
}

// block returns the block of the layer directory (ref, key) resolved to l, taking the next
// block never handed out, and writing it to the session table, the first time (ref, key)
// resolves to a layer of that identity. A layer that changed identity under (ref, key) gets a
// new block: the kernel's numbers of the old one then answer ESTALE (see layerOf).
func (fsys *filesystem) block(ref string, key digest.Digest, l Layer) (*block, error) {
	k := blockKey{ref, key, l.Index().Identity()}
	fsys.mu.RLock()
	b, ok := fsys.byKey[k]
	fsys.mu.RUnlock()
	if !ok {
		fsys.mu.Lock()
		if b, ok = fsys.byKey[k]; !ok {
			// 2^31 blocks: a new layer directory every millisecond for 24 days.
			if fsys.nextBlock > maxBlock {
				fsys.mu.Unlock()
				return nil, errors.New("layer directory numbers exhausted")
			}
			n := fsys.nextBlock
			if err := fsys.tab.appendBlock(n, ref, key, k.ident); err != nil {
				fsys.mu.Unlock()
				return nil, err
			}
			fsys.nextBlock++
			b = &block{base: n << blockShift, ref: ref, key: key, ident: k.ident}
			fsys.blocks[n] = b
			fsys.byKey[k] = b
		}
		fsys.mu.Unlock()
	}
	if cur := b.layer.Load(); cur == nil || cur.Layer != l {
		if old := b.layer.Swap(newHeldLayer(l)); old != nil {
			close(old.gone)
		}
		fsys.watchRefusal(b, l)
	}
	now := time.Now()
	b.used.Store(now.Unix())
	if last := fsys.swept.Load(); now.Unix()-last >= int64(sweepEvery/time.Second) && fsys.swept.CompareAndSwap(last, now.Unix()) {
		fsys.sweep(now)
	}
	return b, nil
}

// sweep drops the layers of blocks unused for layerIdle.
func (fsys *filesystem) sweep(now time.Time) {
	fsys.mu.RLock()
	defer fsys.mu.RUnlock()
	for _, b := range fsys.blocks {
		if box := b.layer.Load(); box != nil && now.Unix()-b.used.Load() >= int64(layerIdle/time.Second) && b.layer.CompareAndSwap(box, nil) {
			close(box.gone)
		}
	}
}

// blockOf returns the block of inode number ino and ino's offset in it.
func (fsys *filesystem) blockOf(ino uint64) (*block, uint64, bool) {
	fsys.mu.RLock()
	defer fsys.mu.RUnlock()
	b, ok := fsys.blocks[ino>>blockShift]
	return b, ino & (1<<blockShift - 1), ok
}

// layerOf returns the layer of block b: the one its lookup resolved, or, for a block an
// earlier process numbered, what the Store resolves (ref, key) to now. A layer whose identity
// is no longer the block's answers ESTALE: its entries may be numbered otherwise, and serving
// them under the kernel's numbers could serve one file's bytes for another's.
func (fsys *filesystem) layerOf(ctx context.Context, b *block) (Layer, syscall.Errno) {
	b.used.Store(time.Now().Unix())
	if box := b.layer.Load(); box != nil {
		if r, ok := box.Layer.(Refuser); ok {
			if err := r.Refused(); err != nil {
				// Refused since its lookup: nothing of it is answered any more, though every
				// use would otherwise renew the block's hold on it (the layer logged the
				// refusal itself).
				return nil, errno(fsys.eio, err, "refused layer", "ref", b.ref, "key", b.key)
			}
		}
		return box.Layer, 0
	}
	l, err := fsys.store.Lookup(ctx, b.ref, b.key)
	if err == nil && (l == nil || l.Index() == nil) {
		err = errors.New("store returned no layer")
	}
	switch {
	case err != nil:
		return nil, staleErrno(fsys.eio, err, "lookup", "ref", b.ref, "key", b.key)
	case l.Index().Identity() != b.ident:
		fsys.log.Warn("answering ESTALE: the layer the kernel knows changed since its lookup", "ref", b.ref, "key", b.key)
		return nil, syscall.ESTALE
	}
	if b.layer.CompareAndSwap(nil, newHeldLayer(l)) {
		fsys.watchRefusal(b, l)
	}
	return l, 0
}

// synthAttr fills the attributes of a directory or file that the daemon makes up (not part
// of a layer's tree): owned by root, timestamped with the session's start.
func (fsys *filesystem) synthAttr(out *fuse.Attr, ino uint64, mode uint32, size uint64) {
	*out = fuse.Attr{Ino: ino, Mode: mode, Size: size, Nlink: 1, Owner: fsys.self}
	if mode&syscall.S_IFMT == syscall.S_IFDIR {
		out.Nlink = 2
	}
	t := fsys.started
	out.SetTimes(&t, &t, &t)
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

// privileged reports whether a FUSE request comes from the daemon's own user (root, or the
// user of a rootless daemon): the runtime, or a container's process reaching the store through
// overlayfs, which accesses its lower layers with the credentials of whoever mounted the
// overlay (a rootless runtime's user namespace maps its root to that user). Only such requests
// may make the Store resolve a layer or count a use, or open anything under the mount.
func privileged(c *fuse.Caller) bool { return c.Uid == daemonUID }

// daemonUID is the daemon's user: the only one the store serves.
var daemonUID = uint32(os.Geteuid())

// admit admits a request, which ends with its done. Once Stop was called it holds the request
// instead, unanswered (the next process of the session gets it again), until the mount goes.
func (fsys *filesystem) admit() admitted {
	fsys.gateMu.Lock()
	if fsys.stopping {
		fsys.gateMu.Unlock()
		<-fsys.held
		return admitted{}
	}
	fsys.active++
	fsys.gateMu.Unlock()
	return admitted{fsys}
}

// admitted is a request admit let through; the zero value (a request held until the mount
// went) has nothing to end.
type admitted struct{ fsys *filesystem }

// done ends the request: the last one ends a Stop's wait.
func (a admitted) done() {
	if a.fsys == nil {
		return
	}
	fsys := a.fsys
	fsys.gateMu.Lock()
	defer fsys.gateMu.Unlock()
	fsys.active--
	if fsys.active == 0 && fsys.idle != nil {
		close(fsys.idle)
		fsys.idle = nil
	}
}

// stop closes the gate and waits until no request is being answered, or ctx is done.
func (fsys *filesystem) stop(ctx context.Context) error {
	fsys.gateMu.Lock()
	fsys.stopping = true
	if fsys.active == 0 {
		fsys.gateMu.Unlock()
		return nil
	}
	idle := make(chan struct{})
	fsys.idle = idle
	n := fsys.active
	fsys.gateMu.Unlock()
	select {
	case <-idle:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("fs: %d requests still being answered: %w", n, ctx.Err())
	}
}

// release answers the held requests (to a connection that no longer takes answers).
func (fsys *filesystem) release() { fsys.heldOnce.Do(func() { close(fsys.held) }) }
