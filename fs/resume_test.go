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
	"github.com/layerstore/layerstore/internal/testutil/testproc"
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

func resumeOptions() Config {
	opts := defaultConfig()
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

// resumeChild starts the test binary as a child in role serving mnt (testproc.Start).
func resumeChild(t *testing.T, role, mnt string, env []string, files ...*os.File) *exec.Cmd {
	t.Helper()
	return testproc.Start(t, mnt, append([]string{helperEnv + "=" + role, resumeMntEnv + "=" + mnt}, env...), files...)
}

// receiveSession receives the session the first child sends on c. Whatever happens, the FUSE
// connection at mnt ends with the test (a hung request would hang it), and then the session
// and the files in *opened are closed.
func receiveSession(t *testing.T, c *net.UnixConn, mnt string, opened *[]*os.File) (dev, state *os.File) {
	t.Helper()
	_, fds := testproc.Receive(t, c, 2, resumeWait)
	dev, state = os.NewFile(uintptr(fds[0]), "dev"), os.NewFile(uintptr(fds[1]), "state")
	watchdog := time.AfterFunc(4*time.Minute, func() { testfuse.Abort(mnt) })
	t.Cleanup(func() {
		watchdog.Stop()
		testfuse.Abort(mnt)
		for _, f := range *opened {
			f.Close()
		}
		dev.Close()
		state.Close()
	})
	return dev, state
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
	mnt := testfuse.OpenTempDir(t)
	l := newTestLayer(t, fixture(t, resumeFixture))
	diff := layerPath(mnt, testRef, l.tocKey, "diff")

	conn1, end1 := testproc.Socketpair(t)
	first := resumeChild(t, "resume-first", mnt, nil, end1)
	var opened []*os.File
	dev, state := receiveSession(t, conn1, mnt, &opened)
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
	for _, c := range l.Index().ChildrenFrom(l.Index().Root(), 0, l.Index().Len()) {
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
	testproc.Expect(t, conn1, "B", resumeWait)
	testproc.Kill(t, first)
	testproc.Pending(t, "the read in flight", inflight)

	// The second process resumes after the kill.
	conn2, end2 := testproc.Socketpair(t)
	start := time.Now()
	resumeChild(t, "resume-next", mnt, nil, dev, state, end2)
	testproc.Expect(t, conn2, "R", resumeWait)
	t.Logf("second process serving %v after its start", time.Since(start))
	testproc.Completes(t, "the read in flight at the kill", inflight, resumeWait)
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
	testproc.Expect(t, conn2, "T", resumeWait)
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
	testproc.Pending(t, "a read after the stop", pending)

	// The third resumes; the layer of otherRef changed meanwhile.
	conn3, end3 := testproc.Socketpair(t)
	resumeChild(t, "resume-next", mnt, []string{resumeStoreEnv + "=changed"}, dev, state, end3)
	testproc.Expect(t, conn3, "R", resumeWait)
	testproc.Completes(t, "the read made during the stop", pending, resumeWait)
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
	local, content := localCopy(t, bigFile)
	mnt := t.TempDir()
	l := newTestLayer(t, fixture(t, resumeFixture))
	path := layerPath(mnt, testRef, l.tocKey, "diff", bigFile)
	env := []string{resumePTEnv + "=" + local}

	conn1, end1 := testproc.Socketpair(t)
	first := resumeChild(t, "resume-first", mnt, env, end1)
	var opened []*os.File
	dev, state := receiveSession(t, conn1, mnt, &opened)
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
	testproc.Kill(t, first)
	read("passthrough without a daemon", early)

	conn2, end2 := testproc.Socketpair(t)
	resumeChild(t, "resume-next", mnt, env, dev, state, end2)
	testproc.Expect(t, conn2, "R", resumeWait)
	late, err := os.Open(path)
	if err != nil {
		t.Fatalf("open after the takeover of a file open with passthrough: %v", err)
	}
	opened = append(opened, late)
	read("opened after the takeover", late)
}
