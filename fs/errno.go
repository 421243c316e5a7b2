package storefs

import (
	"context"
	"errors"
	iofs "io/fs"
	"log/slog"
	"syscall"
)

// errno is the one place where an error from a Store or a Layer becomes the errno a FUSE
// call answers:
//
//   - errors wrapping io/fs.ErrNotExist answer ENOENT ("not served here": the runtime then
//     pulls the layer normally);
//   - context.Canceled answers EINTR (the kernel interrupted the request);
//   - everything else answers EIO, logged once here at warn level with op and args saying
//     which call failed. Callers never log the same error again.
//
// go-fuse's own fusefs.ToErrno does not unwrap, which is why it is not used.
func errno(log *slog.Logger, err error, op string, args ...any) syscall.Errno {
	switch {
	case err == nil:
		return 0
	case errors.Is(err, iofs.ErrNotExist):
		return syscall.ENOENT
	case errors.Is(err, context.Canceled):
		return syscall.EINTR
	}
	log.Warn("answering EIO", append([]any{"op", op, "err", err}, args...)...)
	return syscall.EIO
}

// quiet is the logger of answers already logged once (errno still maps their errors).
var quiet = slog.New(slog.DiscardHandler)
