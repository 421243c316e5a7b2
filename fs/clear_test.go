package storefs

import (
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/layerstore/layerstore/internal/testutil/testfuse"
)

// deadMount mounts a FUSE filesystem of type fstype at dir and closes its device at once,
// as a crashed daemon leaves it: every access answers ENOTCONN.
func deadMount(t *testing.T, dir, fstype string) {
	t.Helper()
	fd, err := syscall.Open("/dev/fuse", syscall.O_RDWR|syscall.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	data := fmt.Sprintf("fd=%d,rootmode=40000,user_id=0,group_id=0,allow_other", fd)
	if err := syscall.Mount("dead", dir, fstype, syscall.MS_NOSUID|syscall.MS_NODEV, data); err != nil {
		_ = syscall.Close(fd)
		t.Fatalf("mount %s: %v", fstype, err)
	}
	_ = syscall.Close(fd)
	t.Cleanup(func() {
		for syscall.Unmount(dir, syscall.MNT_DETACH) == nil {
		}
	})
	var st syscall.Statfs_t
	if err := syscall.Statfs(dir, &st); err != syscall.ENOTCONN {
		t.Fatalf("statfs of the dead mount = %v, want ENOTCONN", err)
	}
}

func mounted(t *testing.T, dir string) bool {
	t.Helper()
	m, err := topMount(dir)
	if err != nil {
		t.Fatal(err)
	}
	return m.mounted
}

func TestClearDeadMount(t *testing.T) {
	testfuse.Require(t)
	t.Run("healthy directory", func(t *testing.T) {
		dir := t.TempDir()
		if err := os.WriteFile(filepath.Join(dir, "keep"), nil, 0o644); err != nil {
			t.Fatal(err)
		}
		if err := ClearDeadMount(dir); err != nil {
			t.Fatalf("ClearDeadMount: %v", err)
		}
		if _, err := os.Stat(filepath.Join(dir, "keep")); err != nil {
			t.Errorf("directory content gone: %v", err)
		}
	})
	t.Run("missing path", func(t *testing.T) {
		for _, p := range []string{"missing", "missing/parent/store"} {
			if err := ClearDeadMount(filepath.Join(t.TempDir(), p)); err != nil {
				t.Errorf("ClearDeadMount(%s): %v", p, err)
			}
		}
	})
	t.Run("dead mount of ours, then mount again", func(t *testing.T) {
		dir := filepath.Join(t.TempDir(), "store with space")
		if err := os.Mkdir(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		deadMount(t, dir, "fuse."+fsName)
		deadMount(t, dir, "fuse."+fsName) // two crashes in a row
		if _, err := Mount(dir, newTestStore(), defaultConfig()); err == nil {
			t.Fatal("Mount over a dead mount succeeded")
		}
		if err := ClearDeadMount(dir); err != nil {
			t.Fatalf("ClearDeadMount: %v", err)
		}
		if mounted(t, dir) {
			t.Fatal("still mounted")
		}
		store := newTestStore()
		l := newTestLayer(t, fixture(t, "estargz"))
		store.add(testRef, l)
		srv, err := Mount(dir, store, defaultConfig())
		if err != nil {
			t.Fatalf("Mount after clearing: %v", err)
		}
		conn := testfuse.Record(t, dir)
		defer func() {
			if err := srv.Unmount(); err != nil {
				t.Error(err)
				if err := conn.Abort(); err != nil {
					t.Error(err)
				}
			}
			conn.WaitEnd(t, srv.Wait)
		}()
		if _, err := os.Stat(layerPath(dir, testRef, l.tocKey, "diff")); err != nil {
			t.Errorf("stat through the new mount: %v", err)
		}
		// A live mount of ours is another daemon's: left alone.
		if err := ClearDeadMount(dir); err == nil {
			t.Error("ClearDeadMount of a live layerstore mount succeeded")
		}
		if _, err := os.Stat(layerPath(dir, testRef, l.tocKey, "diff")); err != nil {
			t.Errorf("the live mount was disturbed: %v", err)
		}
	})
	t.Run("hung mount of ours", func(t *testing.T) {
		dir := t.TempDir()
		root := testfuse.NewStuckRoot()
		srv, err := testfuse.Mount(dir, fsName, root)
		if err != nil {
			t.Fatal(err)
		}
		conn := testfuse.Record(t, dir)
		root.Hang.Store(true)
		defer func() {
			close(root.Resume) // lets the abandoned probe return, and the server end
			conn.WaitEnd(t, srv.Wait)
		}()
		defer func(d time.Duration) { probeTimeout = d }(probeTimeout)
		probeTimeout = 200 * time.Millisecond
		if err := ClearDeadMount(dir); err != nil {
			t.Fatalf("ClearDeadMount: %v", err)
		}
		if mounted(t, dir) {
			t.Fatal("still mounted")
		}
	})
	t.Run("dead foreign FUSE mount", func(t *testing.T) {
		dir := t.TempDir()
		deadMount(t, dir, "fuse.other")
		if err := ClearDeadMount(dir); err != nil {
			t.Fatalf("ClearDeadMount: %v", err)
		}
		if mounted(t, dir) {
			t.Fatal("still mounted")
		}
	})
	t.Run("live foreign FUSE mount", func(t *testing.T) {
		dir := t.TempDir()
		srv, err := testfuse.Mount(dir, "other", testfuse.NewEmptyDir())
		if err != nil {
			t.Fatal(err)
		}
		defer testfuse.Record(t, dir).Unmount(t, srv)
		if err := ClearDeadMount(dir); err == nil {
			t.Error("ClearDeadMount of a live foreign mount succeeded")
		}
		if !mounted(t, dir) {
			t.Error("the live mount was removed")
		}
	})
	t.Run("live tmpfs", func(t *testing.T) {
		dir := t.TempDir()
		if err := syscall.Mount("tmpfs", dir, "tmpfs", 0, "size=1m"); err != nil {
			t.Fatal(err)
		}
		defer func() { _ = syscall.Unmount(dir, 0) }()
		if err := ClearDeadMount(dir); err == nil {
			t.Error("ClearDeadMount of a tmpfs succeeded")
		}
		if !mounted(t, dir) {
			t.Error("the tmpfs was removed")
		}
	})
}
