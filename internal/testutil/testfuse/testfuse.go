// Package testfuse holds what the tests that mount FUSE filesystems share: whether they can
// (Require), a bounded wait for a server's end after the unmount, which aborts the mount's
// connection at the bound (Record, Conn.WaitEnd), the detaching of other tests' FUSE mounts
// from the mount namespaces tests make (DetachScript, DetachForeign), and small filesystems to
// mount on the raw go-fuse API the daemon uses (Mount): an empty directory (EmptyDir) and a
// server that stops answering (StuckRoot). A copy of a mount in another namespace keeps its connection alive
// after the unmount here, and with it the server: an unbounded wait for the server would hang
// the test for as long as the copy lives.
package testfuse

import (
	"os"
	"path/filepath"
	"testing"
)

// Require skips t unless this process can mount FUSE filesystems: it must be root (mount(2)
// of /dev/fuse) and able to open /dev/fuse. It asks what storefs.Usable asks the daemon, here
// for the tests of package storefs as well, which cannot import a package that imports storefs.
func Require(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("skipping: FUSE mounts are not possible here: not running as root")
	}
	f, err := os.OpenFile("/dev/fuse", os.O_RDWR, 0)
	if err != nil {
		t.Skipf("skipping: FUSE mounts are not possible here: %v", err)
	}
	_ = f.Close()
}

// OpenTempDir returns a new temporary directory that other users may enter (mode 0755, its
// parent too): a mountpoint or a storage directory a rootless user or a container reaches.
func OpenTempDir(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	for _, d := range []string{filepath.Dir(dir), dir} {
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}
