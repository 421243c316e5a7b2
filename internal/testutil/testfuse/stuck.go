package testfuse

import (
	"context"
	"sync/atomic"
	"syscall"

	fusefs "github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
)

// StuckRoot is the root of a go-fuse server that, once Hang is set, answers no statfs until
// Release is closed: a mount whose server does not answer, for the tests of what must not
// hang on one. Make Release before mounting.
type StuckRoot struct {
	fusefs.Inode
	Hang    atomic.Bool
	Release chan struct{}
}

var _ fusefs.NodeStatfser = (*StuckRoot)(nil)

func (r *StuckRoot) Statfs(ctx context.Context, out *fuse.StatfsOut) syscall.Errno {
	if r.Hang.Load() {
		<-r.Release
	}
	return 0
}
