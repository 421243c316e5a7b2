package testfuse

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hanwen/go-fuse/v2/fuse"
)

// DefaultBound is how long Conn.WaitEnd waits for a server to end after the unmount, and again
// after aborting its connection, as the daemon bounds its own (unmountGrace in cmd/layerstore).
const DefaultBound = 20 * time.Second

// Conn is the kernel connection of a FUSE mount, recorded while the mount is in this process's
// mount namespace. The connection outlives the unmount here while a copy of the mount lives in
// another namespace (one made by unshare --mount or a rootless runtime while the mount was
// there), and the server serves until the connection ends: a wait for the server must be
// bounded, and the connection aborted at the bound.
type Conn struct {
	// Bound overrides DefaultBound when not zero.
	Bound time.Duration

	mnt   string // the mount point, as mountinfo shows it
	dev   string // "major:minor" of the mount, as mountinfo shows it
	minor string // the name of the connection in fusectl
}

// Record returns the connection of the FUSE mount at mnt: call it right after mounting, since
// the mount is gone from this namespace after the unmount. Without a FUSE mount at mnt the test
// fails, and the Conn returned only detaches mnt when aborted.
func Record(t testing.TB, mnt string) *Conn {
	t.Helper()
	c := &Conn{mnt: resolveParent(mnt)}
	m, ok := findMount(c.mnt)
	if !ok {
		t.Errorf("testfuse: no FUSE mount at %s in /proc/self/mountinfo", c.mnt)
		return c
	}
	c.dev, c.minor = m.dev, m.minor
	return c
}

// Mountpoint returns the mount point of the connection, as mountinfo shows it.
func (c *Conn) Mountpoint() string { return c.mnt }

// WaitEnd waits, after the unmount, for wait (the server's Wait) to return. If it has not
// within the bound, the connection outlived its unmount: WaitEnd logs that and the mount
// namespaces still holding it, aborts the connection, waits up to the bound again and fails the
// test if the server still did not end. It reports whether the server ended without the abort.
func (c *Conn) WaitEnd(t testing.TB, wait func()) bool {
	t.Helper()
	done := make(chan struct{})
	go func() {
		wait()
		close(done)
	}()
	bound := c.bound()
	select {
	case <-done:
		return true
	case <-time.After(bound):
	}
	t.Logf("testfuse: the FUSE connection of %s outlived its unmount by %v: a copy of the mount in another mount namespace (%s); aborting it",
		c.mnt, bound, c.holders())
	if err := c.Abort(); err != nil {
		t.Errorf("testfuse: %v", err)
	}
	select {
	case <-done:
	case <-time.After(bound):
		t.Errorf("testfuse: the server of %s did not end %v after the abort of its connection", c.mnt, bound)
	}
	return false
}

// Unmount unmounts the mount of srv, a go-fuse server whose Unmount waits for the server to
// end, with the bound of WaitEnd; when the unmount fails, the test fails and the connection is
// aborted. It reports whether the server ended without an abort.
func (c *Conn) Unmount(t testing.TB, srv *fuse.Server) bool {
	t.Helper()
	errc := make(chan error, 1)
	if !c.WaitEnd(t, func() { errc <- srv.Unmount() }) {
		return false
	}
	if err := <-errc; err != nil {
		t.Errorf("testfuse: unmount %s: %v", c.mnt, err)
		if err := c.Abort(); err != nil {
			t.Errorf("testfuse: %v", err)
		}
		c.WaitEnd(t, srv.Wait)
		return false
	}
	return true
}

// Abort aborts the connection through fusectl, which fails every pending and future request
// and ends the server's reads wherever copies of the mount are, then detaches the mount from
// this namespace if it is still here.
func (c *Conn) Abort() error {
	var err error
	if c.minor != "" {
		err = abortConnection(c.minor)
	}
	if m, ok := findMount(c.mnt); ok && (c.dev == "" || m.dev == c.dev) {
		_ = syscall.Unmount(c.mnt, syscall.MNT_DETACH)
	}
	return err
}

func (c *Conn) bound() time.Duration {
	if c.Bound > 0 {
		return c.Bound
	}
	return DefaultBound
}

// holders lists one process of each other mount namespace that holds a copy of the mount, for
// the log.
func (c *Conn) holders() string {
	if c.dev == "" {
		return "connection unknown"
	}
	self, _ := os.Readlink("/proc/self/ns/mnt")
	seen := map[string]bool{self: true}
	var found []string
	pids, _ := filepath.Glob("/proc/[0-9]*")
	for _, p := range pids {
		ns, err := os.Readlink(filepath.Join(p, "ns", "mnt"))
		if err != nil || seen[ns] {
			continue
		}
		seen[ns] = true
		ms, _ := readMounts(filepath.Join(p, "mountinfo"))
		for _, m := range ms {
			if m.dev == c.dev {
				comm, _ := os.ReadFile(filepath.Join(p, "comm"))
				found = append(found, fmt.Sprintf("pid %s (%s) in %s", filepath.Base(p), trimNewline(comm), ns))
				break
			}
		}
	}
	if len(found) == 0 {
		return "no holder found"
	}
	return strings.Join(found, ", ")
}

// Abort aborts the FUSE connection of the mount at mnt (failing every pending and future
// request) and detaches the mount: for a test that did not record the connection, while the
// mount is still in this namespace.
func Abort(mnt string) {
	mnt = resolveParent(mnt)
	if m, ok := findMount(mnt); ok {
		_ = abortConnection(m.minor)
	}
	_ = syscall.Unmount(mnt, syscall.MNT_DETACH)
}

// Connection returns the fusectl name (the device minor) of the connection of the FUSE mount
// at mnt, if there is one in this namespace.
func Connection(mnt string) (string, bool) {
	m, ok := findMount(resolveParent(mnt))
	return m.minor, ok
}

// fusectlDir is where fusectl is usually mounted.
const fusectlDir = "/sys/fs/fuse/connections"

// abortConnection writes to the abort file of connection minor in fusectl; where fusectl is
// not mounted at fusectlDir, it mounts a private instance for the time of the write. A
// connection already gone is not an error.
func abortConnection(minor string) error {
	ctl := fusectlDir
	if _, err := os.Stat(filepath.Join(ctl, minor)); err != nil {
		dir, err := os.MkdirTemp("", "fusectl-")
		if err != nil {
			return fmt.Errorf("abort FUSE connection %s: %w", minor, err)
		}
		defer func() { _ = os.Remove(dir) }() // after the unmount below (defers run last first)
		if err := syscall.Mount("fusectl", dir, "fusectl", 0, ""); err != nil {
			return fmt.Errorf("abort FUSE connection %s: mount fusectl: %w", minor, err)
		}
		defer func() { _ = syscall.Unmount(dir, syscall.MNT_DETACH) }()
		ctl = dir
	}
	f, err := os.OpenFile(filepath.Join(ctl, minor, "abort"), os.O_WRONLY, 0)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("abort FUSE connection %s: %w", minor, err)
	}
	defer f.Close()
	if _, err := f.Write([]byte("1")); err != nil {
		return fmt.Errorf("abort FUSE connection %s: %w", minor, err)
	}
	return nil
}

// resolveParent resolves the symbolic links of the parent directory of mnt, as mountinfo
// shows mount points, without touching the mount itself (its server may not answer).
func resolveParent(mnt string) string {
	mnt = filepath.Clean(mnt)
	if dir, err := filepath.EvalSymlinks(filepath.Dir(mnt)); err == nil {
		return filepath.Join(dir, filepath.Base(mnt))
	}
	return mnt
}

func trimNewline(b []byte) string {
	if n := len(b); n > 0 && b[n-1] == '\n' {
		b = b[:n-1]
	}
	return string(b)
}

// WaitExit waits for exited to be closed, at a process's exit, up to DefaultBound. If it is
// not, the process is stuck, as a process killed while a FUSE server served one of its
// requests is until the answer: WaitExit aborts the connection of the mount at mnt (Abort),
// waits up to the bound again and fails the test if the process still did not exit. It reports
// whether the process exited without the abort.
func WaitExit(t testing.TB, mnt string, exited <-chan struct{}) bool {
	t.Helper()
	select {
	case <-exited:
		return true
	case <-time.After(DefaultBound):
	}
	t.Logf("testfuse: a process of the test did not exit within %v: aborting the FUSE connection of %s", DefaultBound, mnt)
	Abort(mnt)
	select {
	case <-exited:
	case <-time.After(DefaultBound):
		t.Errorf("testfuse: a process of the test did not exit %v after the abort of the FUSE connection of %s", DefaultBound, mnt)
	}
	return false
}
