package storefs

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/layerstore/layerstore/chunked"
)

// TestReadOnly checks that every modification answers EROFS, in the diff tree and in the
// namespace around it.
func TestReadOnly(t *testing.T) {
	l := newTestLayer(t, fixture(t, "estargz"))
	m := mountLayer(t, l, defaultConfig())
	diff := m.path("diff")
	file := filepath.Join(diff, "etc", "hostname")
	open := func(p string, flags int) error {
		f, err := os.OpenFile(p, flags, 0o644)
		if err == nil {
			_ = f.Close()
		}
		return err
	}
	for _, c := range []struct {
		what string
		op   func() error
	}{
		{"write existing file", func() error { return os.WriteFile(file, []byte("x"), 0o644) }},
		{"open O_RDWR", func() error { return open(file, os.O_RDWR) }},
		{"open O_WRONLY|O_APPEND", func() error { return open(file, os.O_WRONLY|os.O_APPEND) }},
		{"open O_RDONLY|O_TRUNC", func() error { return open(file, os.O_RDONLY|os.O_TRUNC) }},
		{"create file", func() error { return open(filepath.Join(diff, "etc", "new"), os.O_CREATE|os.O_WRONLY) }},
		{"O_TMPFILE", func() error {
			fd, err := unix.Open(filepath.Join(diff, "tmp"), unix.O_TMPFILE|unix.O_RDWR, 0o600)
			if err == nil {
				_ = unix.Close(fd)
			}
			return err
		}},
		{"mkdir", func() error { return os.Mkdir(filepath.Join(diff, "newdir"), 0o755) }},
		{"unlink", func() error { return os.Remove(file) }},
		{"rmdir empty dir", func() error { return syscall.Rmdir(filepath.Join(diff, "xdir")) }},
		{"rmdir full dir", func() error { return syscall.Rmdir(filepath.Join(diff, "etc")) }},
		{"rename", func() error { return os.Rename(file, filepath.Join(diff, "etc", "renamed")) }},
		{"symlink", func() error { return os.Symlink("target", filepath.Join(diff, "etc", "sl")) }},
		{"link", func() error { return os.Link(file, filepath.Join(diff, "etc", "hl")) }},
		{"mknod", func() error { return syscall.Mknod(filepath.Join(diff, "etc", "fifo"), syscall.S_IFIFO|0o644, 0) }},
		{"chmod", func() error { return os.Chmod(file, 0o600) }},
		{"chown", func() error { return os.Chown(file, 1, 1) }},
		{"utimes", func() error { return os.Chtimes(file, time.Now(), time.Now()) }},
		{"truncate", func() error { return os.Truncate(file, 0) }},
		{"setxattr", func() error { return unix.Setxattr(file, "user.new", []byte("v"), 0) }},
		{"removexattr", func() error { return unix.Removexattr(filepath.Join(diff, "usr", "bin", "ping"), "user.comment") }},
		{"mkdir in root", func() error { return os.Mkdir(filepath.Join(m.mnt, "x"), 0o755) }},
		{"create in root", func() error { return open(filepath.Join(m.mnt, "x"), os.O_CREATE|os.O_WRONLY) }},
		{"mkdir in ref dir", func() error {
			return os.Mkdir(filepath.Join(m.mnt, refDirName(testRef), "sha256:"+strings.Repeat("0", 64)), 0o755)
		}},
		{"create in ref dir", func() error { return open(filepath.Join(m.mnt, refDirName(testRef), "x"), os.O_CREATE|os.O_WRONLY) }},
		{"write info", func() error { return os.WriteFile(m.path("info"), []byte("{}"), 0o644) }},
		{"unlink info", func() error { return os.Remove(m.path("info")) }},
		{"rmdir diff", func() error { return syscall.Rmdir(diff) }},
		{"chmod layer dir", func() error { return os.Chmod(m.path(), 0o700) }},
	} {
		wantErrno(t, c.what, c.op(), syscall.EROFS)
	}
	// fsync of what was opened for reading succeeds: there is nothing to flush.
	for _, p := range []string{file, diff} {
		f, err := os.Open(p)
		if err != nil {
			t.Fatal(err)
		}
		if err := f.Sync(); err != nil {
			t.Errorf("fsync %s: %v", p, err)
		}
		_ = f.Close()
	}
	if data, err := os.ReadFile(file); err != nil || string(data) != "layerstore\n" {
		t.Errorf("etc/hostname after the attempts = %q, %v", data, err)
	}
}

// TestExecutingOnExecOpen: an open to execute a file (execve's, __FMODE_EXEC) tells the layer;
// an open to read it does not.
func TestExecutingOnExecOpen(t *testing.T) {
	l := newTestLayer(t, fixture(t, "estargz"))
	m := mountLayer(t, l, defaultConfig())
	diff := m.path("diff")
	tool, _ := l.Index().LookupPath("usr/bin/tool")
	b, err := os.ReadFile(filepath.Join(diff, "usr", "bin", "group-tool"))
	if err != nil || len(b) == 0 {
		t.Fatalf("read: %v", err)
	}
	// The file is text without "#!": the kernel opens it, reads it, and refuses to run it.
	// Another process executes it: this one serves the mount, and its own fork and exec of a
	// file of the mount can deadlock (the forking thread waits for the child's execve, which
	// waits for this process's answer to a lookup, which may wait for a new thread).
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, os.Args[0], filepath.Join(diff, "usr", "bin", "tool"))
	cmd.Env = append(os.Environ(), helperEnv+"=exec")
	out, err := cmd.CombinedOutput()
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != 3 {
		t.Fatalf("exec: %v, %s; want ENOEXEC", err, out)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if !slices.Equal(l.executing, []chunked.EntryID{l.Index().Entry(tool).Inode}) {
		t.Fatalf("Executing calls %v, want usr/bin/tool's (%d) alone", l.executing, tool)
	}
}
