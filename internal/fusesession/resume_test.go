package fusesession

import (
	"bytes"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"

	"github.com/layerstore/layerstore/internal/testutil/testfuse"
	"github.com/layerstore/layerstore/internal/testutil/testproc"
)

// The test filesystem: a root directory and two files of fileSize bytes, "data" and "slow".
// Node IDs are fixed (derived from the entry, as the daemon would derive them from its layer
// records) and a file handle is derived from its node ID, so that a process that takes over
// the session serves the kernel's numbers without any table.
const (
	dataNode = 2
	slowNode = 3
	fileSize = 1 << 20
	maxWrite = 128 << 10
	wait     = 10 * time.Second

	roleEnv = "FUSESESSION_TEST_ROLE"
	mntEnv  = "FUSESESSION_TEST_MNT"
	initEnv = "FUSESESSION_TEST_INIT"
)

var names = map[string]uint64{"data": dataNode, "slow": slowNode}

func handle(node uint64) uint64 { return node<<32 | 0x5e55 }

// content is the byte at off of the file with the given node ID.
func content(node uint64, off int64) byte { return byte(off*7 + off>>9 + int64(node)) }

func want(node uint64, off int64, n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = content(node, off+int64(i))
	}
	return b
}

type testFS struct {
	fuse.RawFileSystem
	// blocked, if not nil, makes every read of "slow" report on it and never answer.
	blocked chan<- struct{}
}

func fillAttr(node uint64, a *fuse.Attr) bool {
	switch node {
	case fuse.FUSE_ROOT_ID:
		*a = fuse.Attr{Ino: node, Mode: syscall.S_IFDIR | 0o555, Nlink: 2}
	case dataNode, slowNode:
		*a = fuse.Attr{Ino: node, Mode: syscall.S_IFREG | 0o444, Nlink: 1, Size: fileSize}
	default:
		return false
	}
	return true
}

func (f *testFS) Lookup(_ <-chan struct{}, h *fuse.InHeader, name string, out *fuse.EntryOut) fuse.Status {
	node, ok := names[name]
	if h.NodeId != fuse.FUSE_ROOT_ID || !ok {
		return fuse.ENOENT
	}
	out.NodeId = node
	fillAttr(node, &out.Attr)
	return fuse.OK
}

func (f *testFS) GetAttr(_ <-chan struct{}, in *fuse.GetAttrIn, out *fuse.AttrOut) fuse.Status {
	if !fillAttr(in.NodeId, &out.Attr) {
		return fuse.ENOENT
	}
	return fuse.OK
}

func (f *testFS) Open(_ <-chan struct{}, in *fuse.OpenIn, out *fuse.OpenOut) fuse.Status {
	if in.NodeId != dataNode && in.NodeId != slowNode {
		return fuse.EISDIR
	}
	out.Fh = handle(in.NodeId)
	// Every read reaches the server. A close never does: FLUSH is a request the closing
	// process waits for uninterruptibly, so without FOPEN_NOFLUSH any close of a file of the
	// mount (the exec of a process that holds one, close-on-exec) hangs while no server runs;
	// the test's own exec of the second server would.
	out.OpenFlags = fuse.FOPEN_DIRECT_IO | fuse.FOPEN_NOFLUSH
	return fuse.OK
}

func (f *testFS) Read(_ <-chan struct{}, in *fuse.ReadIn, buf []byte) (fuse.ReadResult, fuse.Status) {
	if in.Fh != handle(in.NodeId) {
		return nil, fuse.EBADF
	}
	if in.NodeId == slowNode && f.blocked != nil {
		f.blocked <- struct{}{}
		select {} // until killed
	}
	n := int(max(0, min(int64(len(buf)), fileSize-int64(in.Offset))))
	return fuse.ReadResultData(want(in.NodeId, int64(in.Offset), n)), fuse.OK
}

func (f *testFS) String() string { return "resumetest" }

func options() *fuse.MountOptions {
	return &fuse.MountOptions{Name: "resumetest", FsName: "resumetest", MaxWrite: maxWrite}
}

func TestMain(m *testing.M) {
	switch os.Getenv(roleEnv) {
	case "":
		os.Exit(m.Run())
	case "first":
		err := first(os.Getenv(mntEnv))
		fmt.Fprintln(os.Stderr, "first:", err)
	case "second":
		err := second(os.Getenv(initEnv))
		fmt.Fprintln(os.Stderr, "second:", err)
	}
	os.Exit(1)
}

// first mounts the test filesystem on mnt with a descriptor of its own, sends the descriptor
// and the kernel's INIT to the parent over the socket on descriptor 3 (as the daemon would to
// the service manager's store), serves, and when a read of "slow" arrives says so on the socket
// and never answers it.
func first(mnt string) error {
	sock := os.NewFile(3, "sock")
	fd, err := syscall.Open("/dev/fuse", syscall.O_RDWR|syscall.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	data := fmt.Sprintf("fd=%d,rootmode=40000,user_id=0,group_id=0,max_read=%d", fd, maxWrite)
	if err := syscall.Mount("resumetest", mnt, "fuse.resumetest", syscall.MS_NOSUID|syscall.MS_NODEV, data); err != nil {
		return fmt.Errorf("mount: %w", err)
	}
	blocked := make(chan struct{})
	srv, err := fuse.NewServer(&testFS{RawFileSystem: fuse.NewDefaultRawFileSystem(), blocked: blocked},
		fmt.Sprintf("/dev/fd/%d", fd), options())
	if err != nil {
		return err
	}
	if err := unix.Sendmsg(int(sock.Fd()), EncodeInit(srv.KernelSettings()), unix.UnixRights(fd), nil, 0); err != nil {
		return fmt.Errorf("send the descriptor: %w", err)
	}
	go srv.Serve()
	for range blocked {
		if _, err := sock.Write([]byte("B")); err != nil {
			return err
		}
	}
	return nil
}

// second takes over the session on descriptor 3 with the saved INIT, has the kernel resend
// what the first process left unanswered, serves, and says "R" on the socket on descriptor 4.
func second(saved string) error {
	b, err := hex.DecodeString(saved)
	if err != nil {
		return err
	}
	in, err := DecodeInit(b)
	if err != nil {
		return err
	}
	opts := options()
	opts.ResumeInit = in
	srv, err := fuse.NewServer(&testFS{RawFileSystem: fuse.NewDefaultRawFileSystem()}, "/dev/fd/3", opts)
	if err != nil {
		return err
	}
	if err := Resend(3, in); err != nil && err != ErrNoResend {
		return err
	}
	go srv.Serve()
	if _, err := os.NewFile(4, "sock").Write([]byte("R")); err != nil {
		return err
	}
	srv.Wait()
	return nil
}

func readAt(t *testing.T, f *os.File, node uint64, off int64, n int) {
	t.Helper()
	b := make([]byte, n)
	if _, err := f.ReadAt(b, off); err != nil {
		t.Fatalf("read %s at %d: %v", f.Name(), off, err)
	}
	if !bytes.Equal(b, want(node, off, n)) {
		t.Fatalf("read %s at %d: wrong bytes", f.Name(), off)
	}
}

// TestResumeAfterKill: a process that takes over the /dev/fuse descriptor of a mounted
// filesystem whose server was killed with SIGKILL serves on without a new mount or INIT: a
// file opened before goes on reading correct bytes through the kernel's node ID and file
// handle, a read the dead server had taken completes once the kernel resent it, and lookups
// answer the same inode.
func TestResumeAfterKill(t *testing.T) {
	testfuse.Require(t)
	mnt := t.TempDir()
	var before syscall.Stat_t
	if err := syscall.Stat(mnt, &before); err != nil {
		t.Fatal(err)
	}

	// The first server mounts and hands its descriptor and INIT to the test, which keeps them
	// as a service manager's descriptor store would.
	conn1, end1 := testproc.Socketpair(t)
	first := testproc.Start(t, mnt, []string{roleEnv + "=first", mntEnv + "=" + mnt}, end1)
	msg, fds := testproc.Receive(t, conn1, 1, wait)
	stored := os.NewFile(uintptr(fds[0]), "/dev/fuse")
	in, err := DecodeInit(msg)
	if err != nil {
		t.Fatal(err)
	}
	// Whatever happens, the connection ends with the test: a forced unmount aborts it (fuse's
	// umount_begin), which fails every request still waiting, including those a process waits
	// for uninterruptibly; then the mount goes. A watchdog does the same if the test hangs.
	// Files of the mount are closed after that: a close waits for a read in flight.
	abort := func() { _ = syscall.Unmount(mnt, syscall.MNT_FORCE) }
	watchdog := time.AfterFunc(time.Minute, abort)
	var opened []*os.File
	open := func(name string) *os.File {
		t.Helper()
		f, err := os.Open(filepath.Join(mnt, name))
		if err != nil {
			t.Fatal(err)
		}
		opened = append(opened, f)
		return f
	}
	t.Cleanup(func() {
		watchdog.Stop()
		abort()
		for _, f := range opened {
			f.Close()
		}
		stored.Close()
		if err := syscall.Unmount(mnt, syscall.MNT_DETACH); err != nil {
			t.Errorf("unmount: %v", err)
		}
	})

	var st syscall.Stat_t
	if err := syscall.Stat(filepath.Join(mnt, "data"), &st); err != nil || st.Ino != dataNode {
		t.Fatalf("stat data: ino %d, %v", st.Ino, err)
	}
	data := open("data")
	readAt(t, data, dataNode, 0, 64<<10)

	// A read that the first server takes and never answers.
	slow := open("slow")
	const slowOff, slowLen = 8192 + 5, 4096
	inflight := make(chan error, 1)
	go func() {
		b := make([]byte, slowLen)
		_, err := slow.ReadAt(b, slowOff)
		if err == nil && !bytes.Equal(b, want(slowNode, slowOff, slowLen)) {
			err = fmt.Errorf("wrong bytes")
		}
		inflight <- err
	}()
	testproc.Expect(t, conn1, "B", wait)

	testproc.Kill(t, first)
	testproc.Pending(t, "the read in flight", inflight)

	// The second server takes over the descriptor; the test keeps its own.
	conn2, end2 := testproc.Socketpair(t)
	start := time.Now()
	testproc.Start(t, mnt, []string{roleEnv + "=second", initEnv + "=" + hex.EncodeToString(EncodeInit(in))}, stored, end2)
	testproc.Expect(t, conn2, "R", wait)
	t.Logf("second server serving %v after its start", time.Since(start))

	if CanResend(in) {
		testproc.Completes(t, "the read in flight at the kill", inflight, wait)
	} else {
		t.Log("the kernel cannot resend requests: the read in flight at the kill stays unanswered")
	}
	readAt(t, data, dataNode, 512<<10, 128<<10)
	readAt(t, data, dataNode, fileSize-100, 100)
	readAt(t, slow, slowNode, 0, 4096)
	if err := syscall.Stat(filepath.Join(mnt, "data"), &st); err != nil || st.Ino != dataNode {
		t.Fatalf("stat data after the takeover: ino %d, %v", st.Ino, err)
	}
	again := open("data")
	readAt(t, again, dataNode, 4096, 4096)
	// No second mount: the mountpoint is the same FUSE mount as before the kill.
	if err := syscall.Stat(mnt, &st); err != nil || st.Dev == before.Dev || st.Ino != fuse.FUSE_ROOT_ID {
		t.Fatalf("mountpoint after the takeover: dev %d (directory's %d), ino %d, %v", st.Dev, before.Dev, st.Ino, err)
	}
}
