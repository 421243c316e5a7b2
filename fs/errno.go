package storefs

import (
	"context"
	"errors"
	iofs "io/fs"
	"log/slog"
	"syscall"
	"time"

	"github.com/layerstore/layerstore/internal/ratelog"
)

// errno and staleErrno are the one place where an error from a Store or a Layer becomes the
// errno a FUSE call answers:
//
//   - errors wrapping io/fs.ErrNotExist answer ENOENT ("not served here": the runtime then
//     pulls the layer normally), or ESTALE from staleErrno, for a layer the kernel already
//     holds a node of (it must drop the node, not cache a negative entry under it);
//   - context.Canceled answers EINTR (the kernel interrupted the request);
//   - everything else answers EIO, logged here at warn level with op and args saying which
//     call failed, at most once per eioEvery per op (the line counts the answers not logged
//     since the previous one: a registry down while a container walks its tree fails every
//     read). Callers never log the same error again.
//
// go-fuse's own fusefs.ToErrno does not unwrap, which is why it is not used.
func errno(log *ratelog.Logger, err error, op string, args ...any) syscall.Errno {
	switch {
	case err == nil:
		return 0
	case errors.Is(err, iofs.ErrNotExist):
		return syscall.ENOENT
	case errors.Is(err, context.Canceled):
		return syscall.EINTR
	}
	log.Log(time.Now(), op, slog.LevelWarn, "answering EIO", append([]any{"op", op, "err", err}, args...)...)
	return syscall.EIO
}

// staleErrno is errno for a layer the kernel already knows: io/fs.ErrNotExist answers ESTALE
// (logged), the rest as errno answers them.
func staleErrno(log *ratelog.Logger, err error, op string, args ...any) syscall.Errno {
	if errors.Is(err, iofs.ErrNotExist) {
		log.Log(time.Now(), op+" stale", slog.LevelWarn, "answering ESTALE: a layer the kernel knows is no longer served", append([]any{"err", err}, args...)...)
		return syscall.ESTALE
	}
	return errno(log, err, op, args...)
}

// eioEvery bounds how often the EIO answers of one operation are logged.
const eioEvery = 30 * time.Second
