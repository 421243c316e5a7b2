package storefs

import (
	"encoding/base64"
	"syscall"

	"github.com/hanwen/go-fuse/v2/fuse"

	"github.com/layerstore/layerstore/chunked"
)

// watchRefusal makes sure that a goroutine waits for the refusal of l, the layer block b now
// holds, when the Store may refuse it (Refuser): at most one per block, following the block's
// layer, ending when the block lets its layer go (the next one starts another), when the
// mount goes, or once it dropped what the kernel cached of the refused layer.
func (fsys *filesystem) watchRefusal(b *block, l Layer) {
	if r, ok := l.(Refuser); !ok || r.Refusal() == nil || fsys.srv == nil {
		return // never refused, or not mounted: nothing to wait for, nobody to notify
	}
	if b.watched.CompareAndSwap(false, true) {
		go fsys.awaitRefusal(b)
	}
}

func (fsys *filesystem) awaitRefusal(b *block) {
	for {
		box := b.layer.Load()
		var refusal <-chan struct{}
		if box != nil {
			if r, ok := box.Layer.(Refuser); ok {
				refusal = r.Refusal()
			}
		}
		if refusal == nil {
			// The block let its layer go: the next one starts a waiter, unless it came
			// before this one stepped down (then this one goes on).
			b.watched.Store(false)
			if b.layer.Load() == box || !b.watched.CompareAndSwap(false, true) {
				return
			}
			continue
		}
		select {
		case <-refusal:
			// watched stays set: the Store refuses the layer's identity from now on.
			fsys.dropCached(b, box.Layer)
			return
		case <-box.gone:
		case <-fsys.held:
			return
		}
	}
}

// dropCached makes the kernel drop what it may hold of block b, whose layer l was refused, so
// that the next access asks the daemon, which answers EIO (layerOf): the layer directory's
// entry in its reference directory, the entries diff, info and blob and their attributes and
// pages, and the entries, attributes and pages of l's tree. The kernel holds no entry in a
// directory whose inode it does not have (FUSE drops unused inodes at once), so the walk goes
// only into the directories it has (ENOENT otherwise): its work is bounded by what the kernel
// cached, not by the layer's size. It runs on the block's own goroutine, holding no lock
// across a notification: the kernel may wait for requests the daemon is answering.
func (fsys *filesystem) dropCached(b *block, l Layer) {
	srv := fsys.srv
	fsys.mu.RLock()
	refIno, ok := fsys.refs[base64.StdEncoding.EncodeToString([]byte(b.ref))]
	fsys.mu.RUnlock()
	if ok {
		_ = srv.EntryNotify(refIno, b.key.String())
	}
	dir := b.base + inoLayerDir
	for _, name := range []string{"diff", "info", "blob"} {
		_ = srv.EntryNotify(dir, name)
	}
	for _, off := range []uint64{inoLayerDir, inoInfo, inoBlob} {
		_ = srv.InodeNotify(b.base+off, 0, 0)
	}
	x := l.Index()
	entries := 0
	for dirs := []chunked.EntryID{x.Root()}; len(dirs) > 0; {
		select {
		case <-fsys.held:
			return // unmounted: the kernel holds nothing any more
		default:
		}
		d := dirs[len(dirs)-1]
		dirs = dirs[:len(dirs)-1]
		ino := entryIno(b, x, d)
		if srv.InodeNotify(ino, 0, 0) == fuse.ENOENT {
			continue
		}
		for i := 0; ; i += dropPage {
			kids := x.ChildrenFrom(d, i, dropPage)
			if len(kids) == 0 {
				break
			}
			for _, c := range kids {
				_ = srv.EntryNotify(ino, x.BaseName(c))
				if e := x.Meta(x.Meta(c).Inode); typeBits(&e) == syscall.S_IFDIR {
					dirs = append(dirs, c)
				} else {
					_ = srv.InodeNotify(entryIno(b, x, c), 0, 0)
				}
			}
			entries += len(kids)
		}
	}
	fsys.log.Warn("refused layer: the kernel's entries, attributes and pages of its tree dropped", "ref", b.ref, "key", b.key, "entries", entries)
}

// dropPage is how many entries of a directory dropCached takes at a time.
const dropPage = 1024
