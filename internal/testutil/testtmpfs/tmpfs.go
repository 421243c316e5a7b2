//go:build linux

// Package testtmpfs gives tests a small filesystem of their own, to fill up: a tmpfs mounted
// in a private mount namespace, never seen by the rest of the machine.
package testtmpfs

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/layerstore/layerstore/internal/testutil/testfuse"
)

// env names the directory on which a test re-executed by Run mounts its tmpfs.
const env = "LAYERSTORE_TEST_TMPFS_DIR"

// Run runs fn with dir on a tmpfs of the given size (mount's size= option), in a child
// process of the test binary in a private mount namespace (unshare -m), so that the mount is
// never seen outside it and goes away with the child. It skips when not root or without
// unshare(1). fn runs only in the child; the parent reports the child's output.
func Run(t *testing.T, size string, fn func(t *testing.T, dir string)) {
	t.Helper()
	if dir := os.Getenv(env); dir != "" {
		// The namespace's copies of other tests' FUSE mounts would keep their connections
		// alive after their unmounts, for as long as this child runs.
		if err := testfuse.DetachForeign(); err != nil {
			t.Fatalf("detaching FUSE mounts in the private namespace: %v", err)
		}
		if err := syscall.Mount("tmpfs", dir, "tmpfs", 0, "size="+size+",mode=0700"); err != nil {
			t.Fatalf("mounting a tmpfs in the private namespace: %v", err)
		}
		t.Cleanup(func() { _ = syscall.Unmount(dir, 0) })
		fn(t, dir)
		return
	}
	if os.Geteuid() != 0 {
		t.Skip("needs root to mount a tmpfs in a private mount namespace")
	}
	unshare, err := exec.LookPath("unshare")
	if err != nil {
		t.Skip("needs unshare(1) (util-linux)")
	}
	dir := filepath.Join(t.TempDir(), "fs")
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, unshare, "-m", "--propagation", "private", os.Args[0],
		"-test.run", "^"+regexp.QuoteMeta(t.Name())+"$", "-test.count", "1", "-test.v", "-test.timeout", "2m")
	cmd.Env = append(os.Environ(), env+"="+dir)
	out, err := cmd.CombinedOutput()
	t.Logf("in a private mount namespace:\n%s", out)
	if err != nil {
		t.Fatalf("child: %v", err)
	}
	if !strings.Contains(string(out), "--- PASS: "+t.Name()) {
		t.Fatal("child did not pass")
	}
}

// Fill writes a file in dir until its filesystem is full and returns its path: removing the
// file frees the room again.
func Fill(t *testing.T, dir string) string {
	t.Helper()
	path := filepath.Join(dir, "filler")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	buf := make([]byte, 4096)
	for {
		if _, err := f.Write(buf); err != nil {
			if !errors.Is(err, syscall.ENOSPC) {
				t.Fatal(err)
			}
			return path
		}
	}
}
