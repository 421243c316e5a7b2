package testfuse

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hanwen/go-fuse/v2/fuse"
)

// mountEmpty mounts an EmptyDir at a new directory name under dir.
func mountEmpty(t *testing.T, dir, name string) (*fuse.Server, *Conn) {
	t.Helper()
	mnt := filepath.Join(dir, name)
	if err := os.Mkdir(mnt, 0o755); err != nil {
		t.Fatal(err)
	}
	srv, err := Mount(mnt, "testfuse", NewEmptyDir())
	if err != nil {
		t.Fatal(err)
	}
	c := Record(t, mnt)
	c.Bound = 2 * time.Second
	t.Cleanup(func() {
		if _, ok := findMount(c.mnt); ok {
			c.Unmount(t, srv)
		}
	})
	return srv, c
}

// holdCopy starts a process in a private mount namespace of its own, made while the test's
// mounts exist, that detaches the FUSE mounts but the one at keep (DetachScript) and then
// sleeps: it holds a copy of keep's mount. The process is killed when the test ends.
func holdCopy(t *testing.T, keep string) int {
	t.Helper()
	if _, err := exec.LookPath("unshare"); err != nil {
		t.Skip("skipping: needs unshare(1) (util-linux)")
	}
	// set -e as in the e2e suite's scripts: the function must not end them.
	holder := exec.Command("unshare", "--mount", "--propagation", "private", "sh", "-c", "set -e\n"+DetachScript(keep)+"exec sleep 60")
	holder.Stderr = os.Stderr
	if err := holder.Start(); err != nil {
		t.Fatal(err)
	}
	pid := holder.Process.Pid
	t.Cleanup(func() {
		_ = holder.Process.Kill()
		_ = holder.Wait()
	})
	self, _ := os.Readlink("/proc/self/ns/mnt")
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		ns, _ := os.Readlink(fmt.Sprintf("/proc/%d/ns/mnt", pid))
		comm, _ := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid))
		if ns != "" && ns != self && strings.TrimSpace(string(comm)) == "sleep" {
			return pid
		}
		if time.Now().After(deadline) {
			t.Fatal("the holder is not sleeping in a mount namespace of its own")
		}
	}
}

// TestWaitEndAbortsAConnectionHeldElsewhere: a copy of a mount in another mount namespace
// keeps its connection, and its server, alive after the unmount here; WaitEnd returns within
// its bounds anyway, by aborting the connection. The namespace was made with DetachScript,
// which detached the other mount (a name with a space: escaped in mountinfo): that one's server
// ends with its unmount.
func TestWaitEndAbortsAConnectionHeldElsewhere(t *testing.T) {
	Require(t)
	dir := t.TempDir()
	keptSrv, kept := mountEmpty(t, dir, "kept mount")
	otherSrv, other := mountEmpty(t, dir, "other mount")
	pid := holdCopy(t, kept.Mountpoint())

	ms, err := readMounts(fmt.Sprintf("/proc/%d/mountinfo", pid))
	if err != nil {
		t.Fatal(err)
	}
	held := map[string]bool{}
	for _, m := range ms {
		held[m.point] = true
	}
	if !held[kept.Mountpoint()] || held[other.Mountpoint()] {
		t.Fatalf("in the holder's namespace: %s mounted %v (want true), %s mounted %v (want false)",
			kept.Mountpoint(), held[kept.Mountpoint()], other.Mountpoint(), held[other.Mountpoint()])
	}

	if !other.Unmount(t, otherSrv) {
		t.Error("the server of the mount the holder detached did not end with its unmount")
	}
	start := time.Now()
	if kept.Unmount(t, keptSrv) {
		t.Error("the server of the mount held elsewhere ended with its unmount: the test shows nothing")
	}
	if d := time.Since(start); d > 2*kept.Bound+time.Second {
		t.Errorf("Unmount took %v, bound %v", d, kept.Bound)
	}
	// The copy in the holder's namespace is dead now.
	var st syscall.Statfs_t
	if err := syscall.Statfs(fmt.Sprintf("/proc/%d/root%s", pid, kept.Mountpoint()), &st); !errors.Is(err, syscall.ENOTCONN) {
		t.Errorf("statfs of the copy after the abort: %v, want ENOTCONN", err)
	}
}

// TestDetachScriptRefusesTheParentNamespace: outside a namespace of its own, the script
// detaches nothing and fails.
func TestDetachScriptRefusesTheParentNamespace(t *testing.T) {
	Require(t)
	dir := t.TempDir()
	srv, c := mountEmpty(t, dir, "mnt")
	if out, err := exec.Command("sh", "-c", DetachScript()).CombinedOutput(); err == nil {
		t.Errorf("the script ran in the test's namespace: %s", out)
	}
	if _, ok := findMount(c.Mountpoint()); !ok {
		t.Fatal("the script detached the test's mount")
	}
	if err := DetachForeign(); err == nil {
		t.Error("DetachForeign ran in the test's namespace")
	}
	if _, ok := findMount(c.Mountpoint()); !ok {
		t.Fatal("DetachForeign detached the test's mount")
	}
	c.Unmount(t, srv)
}
