package testfuse

import (
	"sync/atomic"
	"syscall"

	"github.com/hanwen/go-fuse/v2/fuse"
)

// Mount mounts fsys at dir, as the filesystem type "fuse."+name, serves it until the unmount,
// and returns once the mount is up. It mounts with mount(2) only (DirectMountStrict), as the
// daemon does, never through fusermount.
func Mount(dir, name string, fsys fuse.RawFileSystem) (*fuse.Server, error) {
	srv, err := fuse.NewServer(fsys, dir, &fuse.MountOptions{DirectMountStrict: true, Name: name})
	if err != nil {
		return nil, err
	}
	go srv.Serve()
	if err := srv.WaitMount(); err != nil {
		return nil, err
	}
	return srv, nil
}

// EmptyDir is a FUSE filesystem of one empty directory, served on the raw API the daemon
// uses: its root answers getattr and statfs, and every lookup in it fails with ENOENT. It
// keeps no state: safe for concurrent use.
type EmptyDir struct {
	fuse.RawFileSystem // every other operation: ENOSYS
}

// NewEmptyDir returns an EmptyDir, to mount with Mount.
func NewEmptyDir() *EmptyDir {
	return &EmptyDir{RawFileSystem: fuse.NewDefaultRawFileSystem()}
}

func (*EmptyDir) GetAttr(cancel <-chan struct{}, in *fuse.GetAttrIn, out *fuse.AttrOut) fuse.Status {
	out.Ino = fuse.FUSE_ROOT_ID
	out.Mode = syscall.S_IFDIR | 0o755
	out.Nlink = 2
	return fuse.OK
}

func (*EmptyDir) Lookup(cancel <-chan struct{}, header *fuse.InHeader, name string, out *fuse.EntryOut) fuse.Status {
	return fuse.ENOENT
}

// StatFs answers zeroes: the directory holds nothing.
func (*EmptyDir) StatFs(cancel <-chan struct{}, header *fuse.InHeader, out *fuse.StatfsOut) fuse.Status {
	return fuse.OK
}

// StuckRoot is an EmptyDir that, once Hang is set, answers no statfs until Resume is
// closed: a mount whose server does not answer, for the tests of what must not hang on one.
type StuckRoot struct {
	*EmptyDir
	Hang   atomic.Bool
	Resume chan struct{}
}

// NewStuckRoot returns a StuckRoot that answers until Hang is set.
func NewStuckRoot() *StuckRoot {
	return &StuckRoot{EmptyDir: NewEmptyDir(), Resume: make(chan struct{})}
}

func (r *StuckRoot) StatFs(cancel <-chan struct{}, header *fuse.InHeader, out *fuse.StatfsOut) fuse.Status {
	if r.Hang.Load() {
		<-r.Resume
	}
	return r.EmptyDir.StatFs(cancel, header, out)
}
