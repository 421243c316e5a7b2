package cache

import (
	"errors"
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

// Scratch returns an anonymous read-write file on the cache's filesystem, for transient data
// too large for memory that must not outlive its use (the verified copy of a blob being
// exported): it has no name, so it is gone once closed, and a crash leaves nothing behind. Its
// bytes do not count against the size bound.
func (c *Cache) Scratch() (*os.File, error) {
	c.mu.Lock()
	closed := c.closed
	c.mu.Unlock()
	if closed {
		return nil, ErrClosed
	}
	fd, err := unix.Open(c.root, unix.O_TMPFILE|unix.O_RDWR|unix.O_CLOEXEC, 0o600)
	if err == nil {
		return os.NewFile(uintptr(fd), c.root+"/(scratch)"), nil
	}
	if !errors.Is(err, unix.EOPNOTSUPP) && !errors.Is(err, unix.EISDIR) && !errors.Is(err, unix.EINVAL) {
		return nil, fmt.Errorf("cache: scratch file: %w", err)
	}
	// A filesystem without O_TMPFILE: a named file, removed at once.
	f, err := os.CreateTemp(c.root, ".scratch-*")
	if err != nil {
		return nil, fmt.Errorf("cache: scratch file: %w", err)
	}
	if err := os.Remove(f.Name()); err != nil {
		f.Close()
		return nil, fmt.Errorf("cache: scratch file: %w", err)
	}
	return f, nil
}
