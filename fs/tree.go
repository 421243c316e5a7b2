package storefs

import (
	"os"
	"syscall"
	"time"

	"github.com/hanwen/go-fuse/v2/fuse"

	"github.com/layerstore/layerstore/chunked"
)

// entryIno returns the inode number of entry id of the diff tree of block b: that of the
// entry owning its inode, so that the paths of a hardlink share one.
func entryIno(b *block, x *chunked.Index, id chunked.EntryID) uint64 {
	return b.base + inoEntries + uint64(x.Meta(id).Inode)
}

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

// fillEntry sets the attributes of inode owner id from the index: type, size and content from
// the entry, mode, owner and times from the entry an extractor would have applied last (a
// hardlink to it may carry its own).
func (fsys *filesystem) fillEntry(out *fuse.Attr, b *block, x *chunked.Index, id chunked.EntryID) {
	e := x.Meta(id)
	aid := x.AttrEntry(id)
	a := x.Meta(aid)
	*out = fuse.Attr{
		Ino:   b.base + inoEntries + uint64(id),
		Mode:  typeBits(&e) | a.Mode&0o7777,
		Nlink: max(e.Nlink, 1),
		Owner: fuse.Owner{Uid: a.UID, Gid: a.GID},
	}
	if !fsys.ids.identity() {
		out.Owner = fuse.Owner{Uid: mapID(fsys.ids.UIDs, a.UID), Gid: mapID(fsys.ids.GIDs, a.GID)}
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

// backingFile returns the layer's local copy of regular file id, or nil.
func (fsys *filesystem) backingFile(l Layer, x *chunked.Index, id chunked.EntryID, size int64) *os.File {
	f := l.Backing(id)
	if f == nil {
		return nil
	}
	if fi, err := f.Stat(); err != nil || !fi.Mode().IsRegular() || fi.Size() != size {
		fsys.log.Warn("not using a backing file for passthrough: wrong size or type",
			"file", x.Path(id), "want_size", size, "stat_err", err)
		_ = f.Close()
		return nil
	}
	return f
}

// openFile decides how the kernel reads a regular file opened as inode ino: through the
// daemon, or with passthrough from the layer's local copy, registered with the kernel once
// per inode while it has passthrough opens. It sets the answer's backing ID and flags and
// marks a passthrough handle (ptHandle).
//
// An earlier process of the session may have left files of its blocks open either way, and
// how many is unknown: an inode it registered a backing ID for is opened with that ID again
// (never unregistered here), any other inode of its blocks through the daemon.
func (fsys *filesystem) openFile(b *block, l Layer, x *chunked.Index, id chunked.EntryID, ino uint64, size int64, out *fuse.OpenOut) {
	fsys.ptMu.Lock()
	defer fsys.ptMu.Unlock()
	if bid, ok := fsys.inherited[ino]; ok {
		setPassthrough(out, bid)
		return
	}
	if b.resumed {
		return
	}
	o := fsys.opens[ino]
	if o == nil {
		o = &fileOpens{}
		fsys.opens[ino] = o
	}
	pt := fsys.passthrough.Load() && !fsys.ptRefused.Load() && o.daemon == 0
	if pt && o.backingID == 0 {
		pt = false
		if f := fsys.backingFile(l, x, id, size); f != nil {
			bid, errno := fsys.srv.RegisterBackingFd(&fuse.BackingMap{Fd: int32(f.Fd())})
			_ = f.Close() // the kernel holds its own reference
			switch {
			case errno != 0:
				// No passthrough support, or a backing file on a stacked filesystem:
				// stop asking for the rest of the mount.
				fsys.ptRefused.Store(true)
				fsys.log.Info("FUSE passthrough not in effect: reads go through the daemon", "err", errno)
			case fsys.writeBacking(ino, bid):
				o.backingID, pt = bid, true
			}
		}
	}
	if pt {
		setPassthrough(out, o.backingID)
		o.passthrough++
	} else {
		o.daemon++
	}
}

// setPassthrough makes the answer to an open one with passthrough from backing ID bid. The
// kernel refuses FOPEN_KEEP_CACHE with it (its page cache is the backing file's).
func setPassthrough(out *fuse.OpenOut, bid int32) {
	out.BackingID = bid
	out.OpenFlags = out.OpenFlags&^fuse.FOPEN_KEEP_CACHE | fuse.FOPEN_PASSTHROUGH
	out.Fh |= ptHandle
}

// writeBacking records backing ID bid of inode ino in the session table, or unregisters it
// when that fails.
func (fsys *filesystem) writeBacking(ino uint64, bid int32) bool {
	fsys.mu.Lock()
	err := fsys.tab.appendBacking(ino, bid)
	fsys.mu.Unlock()
	if err != nil {
		fsys.log.Warn("not using passthrough", "err", err)
		fsys.srv.UnregisterBackingFd(bid)
		return false
	}
	return true
}

// releaseFile counts a handle of inode ino released, and unregisters the inode's backing
// ID once its last passthrough handle is.
func (fsys *filesystem) releaseFile(ino, fh uint64) {
	fsys.ptMu.Lock()
	defer fsys.ptMu.Unlock()
	o := fsys.opens[ino]
	if o == nil {
		return // a handle of an earlier process
	}
	if fh&ptHandle != 0 {
		o.passthrough = max(o.passthrough-1, 0)
		if o.passthrough == 0 && o.backingID != 0 {
			// Recorded first: an ID the table holds must still be registered. One that
			// cannot be recorded stays registered, and in use, until the unmount.
			fsys.mu.Lock()
			err := fsys.tab.appendUnbacking(ino)
			fsys.mu.Unlock()
			if err != nil {
				fsys.log.Warn("keeping a backing ID registered", "err", err)
				return
			}
			fsys.srv.UnregisterBackingFd(o.backingID)
			o.backingID = 0
		}
	} else {
		o.daemon = max(o.daemon-1, 0)
	}
	if o.daemon == 0 && o.passthrough == 0 && o.backingID == 0 {
		delete(fsys.opens, ino)
	}
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

// writeAccess reports open flags that ask for write access to a file.
func writeAccess(flags uint32) bool {
	return flags&syscall.O_ACCMODE != syscall.O_RDONLY || flags&(syscall.O_TRUNC|syscall.O_APPEND) != 0
}
