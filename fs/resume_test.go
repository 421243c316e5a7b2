package storefs

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"maps"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"syscall"
	"testing"
	"time"

	"github.com/opencontainers/go-digest"
	"golang.org/x/sys/unix"

	"github.com/layerstore/layerstore/chunked"
	"github.com/layerstore/layerstore/internal/testutil/testfuse"
	"github.com/layerstore/layerstore/internal/testutil/testlayer"
)

// The resume test's children: "resume-first" mounts and hands its Session over the socket on
// descriptor 3; "resume-next" resumes the session on descriptors 3 (Dev) and 4 (State), says
// so on the socket on descriptor 5 and stops gracefully when the test says "S" there.
const (
	resumeMntEnv   = "LAYERSTORE_FS_TEST_RESUME_MNT"
	resumeStoreEnv = "LAYERSTORE_FS_TEST_RESUME_STORE" // "changed": otherRef's layer changed
	resumeFixture  = "zstdchunked-modern"
	otherFixture   = "estargz"
	resumeWait     = 45 * time.Second               // a bound: children build the fixtures first, slow on a loaded machine
	resumePTEnv    = "LAYERSTORE_FS_TEST_RESUME_PT" // a local copy of bigFile: passthrough on

	bigFile     = "usr/share/big.bin" // read before and after each takeover
	blockedFile = "etc/hostname"      // the first child's read of it never returns
	otherRef    = "docker.io/library/other:latest"
)

// resumeStore is the children's store: testRef and otherRef both serve resumeFixture, whose
// index is the same in every process; with "changed", otherRef's key serves another layer.
func resumeStore(blockedPath string, sock *os.File) (*testStore, error) {
	all, err := fixtures()
	if err != nil {
		return nil, err
	}
	byName := map[string]testlayer.Fixture{}
	for _, f := range all {
		byName[f.Name] = f
	}
	l, err := openTestLayer(context.Background(), byName[resumeFixture])
	if err != nil {
		return nil, err
	}
	if p := os.Getenv(resumePTEnv); p != "" {
		id, _ := l.Index().LookupPath(bigFile)
		l.backing[id] = p
	}
	store := newTestStore()
	var served Layer = l
	if blockedPath != "" {
		blocked, ok := l.Index().LookupPath(blockedPath)
		if !ok {
			return nil, fmt.Errorf("no %s", blockedPath)
		}
		served = &blockingLayer{testLayer: l, block: func(id chunked.EntryID) bool { return id == blocked }, sock: sock}
	}
	for _, ref := range []string{testRef, otherRef} {
		store.layers[ref] = map[digest.Digest]Layer{l.tocKey: served}
	}
	if os.Getenv(resumeStoreEnv) == "changed" {
		o, err := openTestLayer(context.Background(), byName[otherFixture])
		if err != nil {
			return nil, err
		}
		store.layers[otherRef][l.tocKey] = o
	}
	return store, nil
}

// blockingLayer reports a read of a blocked file on sock and never answers it.
type blockingLayer struct {
	*testLayer
	block func(chunked.EntryID) bool
	sock  *os.File
}

func (l *blockingLayer) ReadFile(ctx context.Context, id chunked.EntryID, p []byte, off int64) (int, error) {
	if l.block(id) {
		_, _ = l.sock.Write([]byte("B"))
		select {} // until killed
	}
	return l.testLayer.ReadFile(ctx, id, p, off)
}

func resumeOptions() Options {
	opts := defaultOptions()
	opts.Passthrough = os.Getenv(resumePTEnv) != "" // else every read reaches the daemon
	return opts
}

func resumeFirst() error {
	sock := os.NewFile(3, "sock")
	store, err := resumeStore(blockedFile, sock)
	if err != nil {
		return err
	}
	srv, err := Mount(os.Getenv(resumeMntEnv), store, resumeOptions())
	if err != nil {
		return err
	}
	sess, ok := srv.Session()
	if !ok {
		return errors.New("mounted without a session")
	}
	if err := unix.Sendmsg(int(sock.Fd()), []byte("S"), unix.UnixRights(int(sess.Dev.Fd()), int(sess.State.Fd())), nil, 0); err != nil {
		return err
	}
	srv.Wait()
	return nil
}

func resumeNext() error {
	sock := os.NewFile(5, "sock")
	store, err := resumeStore("", nil)
	if err != nil {
		return err
	}
	srv, err := Resume(os.Getenv(resumeMntEnv), Session{Dev: os.NewFile(3, "dev"), State: os.NewFile(4, "state")}, store, resumeOptions())
	if err != nil {
		return err
	}
	if _, err := sock.Write([]byte("R")); err != nil {
		return err
	}
	b := make([]byte, 1)
	if _, err := sock.Read(b); err != nil || b[0] != 'S' {
		return fmt.Errorf("waiting for S: %q, %v", b, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), resumeWait)
	defer cancel()
	if err := srv.Stop(ctx); err != nil {
		return err
	}
	_, err = sock.Write([]byte("T"))
	return err
}

// resumeChild starts the test binary as a child in role; it is killed at the end of the test,
// and waited for with a bound (a child killed in the middle of a request to the mount cannot
// exit before its answer; the test holds the session's descriptor).
func resumeChild(t *testing.T, role, mnt string, env []string, files ...*os.File) *exec.Cmd {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(append(os.Environ(), helperEnv+"="+role, resumeMntEnv+"="+mnt), env...)
	cmd.ExtraFiles = files
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		exited := make(chan struct{})
		go func() {
			_ = cmd.Wait()
			close(exited)
		}()
		testfuse.WaitExit(t, mnt, exited)
	})
	return cmd
}

func seqpacket(t *testing.T) (*net.UnixConn, *os.File) {
	t.Helper()
	fds, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_SEQPACKET|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	f := os.NewFile(uintptr(fds[0]), "test end")
	c, err := net.FileConn(f)
	f.Close()
	if err != nil {
		t.Fatal(err)
	}
	theirs := os.NewFile(uintptr(fds[1]), "child end")
	t.Cleanup(func() { c.Close(); theirs.Close() })
	return c.(*net.UnixConn), theirs
}

func expectMsg(t *testing.T, c *net.UnixConn, msg string) {
	t.Helper()
	_ = c.SetReadDeadline(time.Now().Add(resumeWait))
	b := make([]byte, 16)
	n, err := c.Read(b)
	if err != nil || string(b[:n]) != msg {
		t.Fatalf("waiting for %q from a child: got %q, %v", msg, b[:n], err)
	}
}

// TestResumeAfterKillAndStop: a daemon killed with SIGKILL, and then one stopped gracefully,
// are each taken over by a new process resuming their FUSE session: the read in flight at the
// kill completes with the right bytes, files and directories opened before read and list on,
// inode numbers stay, new lookups work; a layer that changed under its (reference, key) since
// its numbers were handed out answers ESTALE (or EIO) to them, never wrong bytes.
func TestResumeAfterKillAndStop(t *testing.T) {
	testfuse.Require(t)
	content := map[string][]byte{}
	for _, e := range testlayer.Entries() {
		content[e.Header.Name] = e.Data
	}
	want := func(name string, off int64, n int) []byte {
		return content[name][off:min(off+int64(n), int64(len(content[name])))]
	}
	mnt := t.TempDir()
	for _, d := range []string{filepath.Dir(mnt), mnt} {
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	l := newTestLayer(t, fixture(t, resumeFixture))
	diff := layerPath(mnt, testRef, l.tocKey, "diff")

	conn1, end1 := seqpacket(t)
	first := resumeChild(t, "resume-first", mnt, nil, end1)
	_ = conn1.SetReadDeadline(time.Now().Add(resumeWait))
	msg, oob := make([]byte, 16), make([]byte, unix.CmsgSpace(8))
	_, oobn, _, _, err := conn1.ReadMsgUnix(msg, oob)
	if err != nil {
		t.Fatalf("receiving the session: %v", err)
	}
	scm, err := unix.ParseSocketControlMessage(oob[:oobn])
	if err != nil || len(scm) != 1 {
		t.Fatalf("control message: %v", err)
	}
	fds, err := unix.ParseUnixRights(&scm[0])
	if err != nil || len(fds) != 2 {
		t.Fatalf("rights: %v, %v", fds, err)
	}
	dev, state := os.NewFile(uintptr(fds[0]), "dev"), os.NewFile(uintptr(fds[1]), "state")
	unix.CloseOnExec(fds[0])
	unix.CloseOnExec(fds[1])

	// Whatever happens, the connection ends with the test (a hung request would hang it).
	var opened []*os.File
	watchdog := time.AfterFunc(4*time.Minute, func() { testfuse.Abort(mnt) })
	t.Cleanup(func() {
		watchdog.Stop()
		testfuse.Abort(mnt)
		for _, f := range opened {
			f.Close()
		}
		dev.Close()
		state.Close()
	})
	open := func(p string) *os.File {
		t.Helper()
		f, err := os.Open(p)
		if err != nil {
			t.Fatal(err)
		}
		opened = append(opened, f)
		return f
	}
	readAt := func(what string, f *os.File, name string, off int64, n int) {
		t.Helper()
		b := make([]byte, n)
		k, err := f.ReadAt(b, off)
		if err != nil && k != len(want(name, off, n)) {
			t.Fatalf("%s: read %s at %d: %v", what, name, off, err)
		}
		if !bytes.Equal(b[:k], want(name, off, n)) {
			t.Fatalf("%s: read %s at %d: wrong bytes", what, name, off)
		}
	}
	inos := func() map[string]uint64 {
		m := map[string]uint64{}
		for _, p := range []string{"", "usr", "usr/share", bigFile, "etc"} {
			var st syscall.Stat_t
			if err := syscall.Lstat(filepath.Join(diff, p), &st); err != nil {
				t.Fatal(err)
			}
			m[p] = st.Ino
		}
		return m
	}

	// Before the kill: an open file, an open directory partly listed, a part of the tree
	// walked, a file of the other reference open.
	big := open(filepath.Join(diff, bigFile))
	size := int64(len(content[bigFile]))
	if size < 800<<10 {
		t.Fatalf("%s has %d bytes, too few for the test", bigFile, size)
	}
	readAt("before", big, bigFile, 0, 4096)
	dirFd, err := unix.Open(diff, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(dirFd) })
	var wantNames []string
	for _, c := range l.Index().Children(l.Index().Root()) {
		wantNames = append(wantNames, l.Index().BaseName(c))
	}
	listed, _ := dirents(t, dirFd, 100, 1)
	before := inos()
	otherBig := open(layerPath(mnt, otherRef, l.tocKey, "diff", bigFile))
	readAt("other before", otherBig, bigFile, 0, 4096)

	// A read the first child takes and never answers.
	hostname := open(filepath.Join(diff, blockedFile))
	inflight := make(chan error, 1)
	go func() {
		b := make([]byte, 64)
		n, err := hostname.ReadAt(b, 0)
		if err == nil || n > 0 {
			err = nil
			if !bytes.Equal(b[:n], content[blockedFile]) {
				err = fmt.Errorf("read %q, want %q", b[:n], content[blockedFile])
			}
		}
		inflight <- err
	}()
	expectMsg(t, conn1, "B")
	if err := first.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = first.Wait()
	select {
	case err := <-inflight:
		t.Fatalf("the read in flight returned before a server took over: %v", err)
	case <-time.After(100 * time.Millisecond):
	}

	// The second process resumes after the kill.
	conn2, end2 := seqpacket(t)
	start := time.Now()
	resumeChild(t, "resume-next", mnt, nil, dev, state, end2)
	expectMsg(t, conn2, "R")
	t.Logf("second process serving %v after its start", time.Since(start))
	select {
	case err := <-inflight:
		if err != nil {
			t.Fatalf("the read in flight at the kill: %v", err)
		}
	case <-time.After(resumeWait):
		t.Fatalf("the read in flight at the kill did not complete within %v of the takeover", resumeWait)
	}
	readAt("after the kill", big, bigFile, 512<<10, 64<<10)
	rest, _ := dirents(t, dirFd, 4096, -1)
	if got := append(slices.Clone(listed), rest...); !slices.Equal(got, wantNames) {
		t.Errorf("listing across the takeover:\n got %q\nwant %q", got, wantNames)
	}
	if after := inos(); !maps.Equal(after, before) {
		t.Errorf("inode numbers after the kill: %v, were %v", after, before)
	}
	lib := open(filepath.Join(diff, "usr", "share", filepath.Base(bigFile))) // a new open
	readAt("new open after the kill", lib, bigFile, size-100, 100)

	// A graceful stop of the second; a request made meanwhile waits for the third.
	if _, err := conn2.Write([]byte("S")); err != nil {
		t.Fatal(err)
	}
	expectMsg(t, conn2, "T")
	// An open always reaches the daemon (a read might find its pages in the kernel's cache).
	var other string
	for name, data := range content {
		if name != bigFile && name != blockedFile && len(data) > 0 && filepath.Dir(name) != "." {
			if _, ok := l.Index().LookupPath(name); ok {
				other = name
				break
			}
		}
	}
	pending := make(chan error, 1)
	go func() {
		b, err := os.ReadFile(filepath.Join(diff, other))
		if err == nil && !bytes.Equal(b, content[other]) {
			err = fmt.Errorf("%s: wrong bytes", other)
		}
		pending <- err
	}()
	select {
	case err := <-pending:
		t.Fatalf("a read after the stop returned before a server took over: %v", err)
	case <-time.After(100 * time.Millisecond):
	}

	// The third resumes; the layer of otherRef changed meanwhile.
	conn3, end3 := seqpacket(t)
	resumeChild(t, "resume-next", mnt, []string{resumeStoreEnv + "=changed"}, dev, state, end3)
	expectMsg(t, conn3, "R")
	select {
	case err := <-pending:
		if err != nil {
			t.Fatalf("the read made during the stop: %v", err)
		}
	case <-time.After(resumeWait):
		t.Fatalf("the read made during the stop did not complete within %v of the takeover", resumeWait)
	}
	readAt("after the stop", big, bigFile, 256<<10, 64<<10)
	if after := inos(); !maps.Equal(after, before) {
		t.Errorf("inode numbers after the stop: %v, were %v", after, before)
	}
	b := make([]byte, 4096)
	_, err = otherBig.ReadAt(b, 768<<10)
	if e := errnoOf(err); e != syscall.ESTALE && e != syscall.EIO {
		t.Errorf("read of a file of a changed layer: %v, want ESTALE or EIO", err)
	}
}

// TestResumeKeepsPassthrough: a file open with passthrough when the daemon is killed keeps
// its backing file in the kernel, and the next process must open the same inode with the
// same backing ID: the kernel refuses (EIO) an open through the daemon of an inode open with
// passthrough.
func TestResumeKeepsPassthrough(t *testing.T) {
	testfuse.Require(t)
	var content []byte
	for _, e := range testlayer.Entries() {
		if e.Header.Name == bigFile {
			content = e.Data
		}
	}
	local := filepath.Join(t.TempDir(), "big.bin")
	if err := os.WriteFile(local, content, 0o600); err != nil {
		t.Fatal(err)
	}
	mnt := t.TempDir()
	l := newTestLayer(t, fixture(t, resumeFixture))
	path := layerPath(mnt, testRef, l.tocKey, "diff", bigFile)
	env := []string{resumePTEnv + "=" + local}

	conn1, end1 := seqpacket(t)
	first := resumeChild(t, "resume-first", mnt, env, end1)
	_ = conn1.SetReadDeadline(time.Now().Add(resumeWait))
	msg, oob := make([]byte, 16), make([]byte, unix.CmsgSpace(8))
	_, oobn, _, _, err := conn1.ReadMsgUnix(msg, oob)
	if err != nil {
		t.Fatalf("receiving the session: %v", err)
	}
	scm, err := unix.ParseSocketControlMessage(oob[:oobn])
	if err != nil || len(scm) != 1 {
		t.Fatalf("control message: %v", err)
	}
	fds, err := unix.ParseUnixRights(&scm[0])
	if err != nil || len(fds) != 2 {
		t.Fatalf("rights: %v, %v", fds, err)
	}
	dev, state := os.NewFile(uintptr(fds[0]), "dev"), os.NewFile(uintptr(fds[1]), "state")
	var opened []*os.File
	watchdog := time.AfterFunc(4*time.Minute, func() { testfuse.Abort(mnt) })
	t.Cleanup(func() {
		watchdog.Stop()
		testfuse.Abort(mnt)
		for _, f := range opened {
			f.Close()
		}
		dev.Close()
		state.Close()
	})
	read := func(what string, f *os.File) {
		t.Helper()
		b := make([]byte, len(content))
		if n, err := f.ReadAt(b, 0); n != len(content) || !bytes.Equal(b, content) {
			t.Fatalf("%s: read %d bytes, %v", what, n, err)
		}
	}
	early, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	opened = append(opened, early)
	read("before the kill", early)
	if err := first.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = first.Wait()
	read("passthrough without a daemon", early)

	conn2, end2 := seqpacket(t)
	resumeChild(t, "resume-next", mnt, env, dev, state, end2)
	expectMsg(t, conn2, "R")
	late, err := os.Open(path)
	if err != nil {
		t.Fatalf("open after the takeover of a file open with passthrough: %v", err)
	}
	opened = append(opened, late)
	read("opened after the takeover", late)
}
