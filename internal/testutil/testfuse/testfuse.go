// Package testfuse holds what the tests that mount FUSE filesystems share.
package testfuse

import (
	"os"
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
