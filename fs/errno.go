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

// errno is the one place where an error from a Store or a Layer becomes the errno a FUSE
// call answers:
//
//   - errors wrapping io/fs.ErrNotExist answer ENOENT ("not served here": the runtime then
//     pulls the layer normally);
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

// eioEvery bounds how often the EIO answers of one operation are logged.
const eioEvery = 30 * time.Second
