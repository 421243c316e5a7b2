package storefs

import (
	"context"
	"syscall"

	fusefs "github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
)

// readOnly answers EROFS to every operation that would modify the filesystem. Every node
// embeds it: go-fuse's defaults for some of these succeed silently (Unlink, Rmdir) or answer
// other errnos. The mount is read-write at the VFS level (see the package doc), so these are
// what callers see. Nodes override the two operations of the use/rmdir protocol.
type readOnly struct{}

var (
	_ fusefs.NodeSetattrer      = readOnly{}
	_ fusefs.NodeSetxattrer     = readOnly{}
	_ fusefs.NodeRemovexattrer  = readOnly{}
	_ fusefs.NodeMkdirer        = readOnly{}
	_ fusefs.NodeMknoder        = readOnly{}
	_ fusefs.NodeLinker         = readOnly{}
	_ fusefs.NodeSymlinker      = readOnly{}
	_ fusefs.NodeCreater        = readOnly{}
	_ fusefs.NodeTmpfiler       = readOnly{}
	_ fusefs.NodeUnlinker       = readOnly{}
	_ fusefs.NodeRmdirer        = readOnly{}
	_ fusefs.NodeRenamer        = readOnly{}
	_ fusefs.NodeWriter         = readOnly{}
	_ fusefs.NodeAllocater      = readOnly{}
	_ fusefs.NodeCopyFileRanger = readOnly{}
	_ fusefs.NodeStatfser       = readOnly{}
	_ fusefs.NodeFsyncer        = readOnly{}
)

func (readOnly) Setattr(context.Context, fusefs.FileHandle, *fuse.SetAttrIn, *fuse.AttrOut) syscall.Errno {
	return syscall.EROFS
}

func (readOnly) Setxattr(context.Context, string, []byte, uint32) syscall.Errno {
	return syscall.EROFS
}

func (readOnly) Removexattr(context.Context, string) syscall.Errno { return syscall.EROFS }

func (readOnly) Mkdir(context.Context, string, uint32, *fuse.EntryOut) (*fusefs.Inode, syscall.Errno) {
	return nil, syscall.EROFS
}

func (readOnly) Mknod(context.Context, string, uint32, uint32, *fuse.EntryOut) (*fusefs.Inode, syscall.Errno) {
	return nil, syscall.EROFS
}

func (readOnly) Link(context.Context, fusefs.InodeEmbedder, string, *fuse.EntryOut) (*fusefs.Inode, syscall.Errno) {
	return nil, syscall.EROFS
}

func (readOnly) Symlink(context.Context, string, string, *fuse.EntryOut) (*fusefs.Inode, syscall.Errno) {
	return nil, syscall.EROFS
}

func (readOnly) Create(context.Context, string, uint32, uint32, *fuse.EntryOut) (*fusefs.Inode, fusefs.FileHandle, uint32, syscall.Errno) {
	return nil, nil, 0, syscall.EROFS
}

func (readOnly) Tmpfile(context.Context, uint32, uint32, *fuse.EntryOut) (*fusefs.Inode, fusefs.FileHandle, uint32, syscall.Errno) {
	return nil, nil, 0, syscall.EROFS
}

func (readOnly) Unlink(context.Context, string) syscall.Errno { return syscall.EROFS }

func (readOnly) Rmdir(context.Context, string) syscall.Errno { return syscall.EROFS }

func (readOnly) Rename(context.Context, string, fusefs.InodeEmbedder, string, uint32) syscall.Errno {
	return syscall.EROFS
}

func (readOnly) Write(context.Context, fusefs.FileHandle, []byte, int64) (uint32, syscall.Errno) {
	return 0, syscall.EROFS
}

func (readOnly) Allocate(context.Context, fusefs.FileHandle, uint64, uint64, uint32) syscall.Errno {
	return syscall.EROFS
}

func (readOnly) CopyFileRange(context.Context, fusefs.FileHandle, uint64, *fusefs.Inode, fusefs.FileHandle, uint64, uint64, uint64) (uint32, syscall.Errno) {
	return 0, syscall.EROFS
}

// Fsync has nothing to flush: it succeeds, for files and directories.
func (readOnly) Fsync(context.Context, fusefs.FileHandle, uint32) syscall.Errno { return 0 }

// Statfs reports a filesystem with no free space, so that tools dividing by the block size
// or the name length do not trip on zeros.
func (readOnly) Statfs(_ context.Context, out *fuse.StatfsOut) syscall.Errno {
	out.Bsize = 4096
	out.Frsize = 4096
	out.NameLen = 255
	return 0
}

// writeAccess reports open flags that ask for write access to a file.
func writeAccess(flags uint32) bool {
	return flags&syscall.O_ACCMODE != syscall.O_RDONLY || flags&(syscall.O_TRUNC|syscall.O_APPEND) != 0
}
