// Package testproc holds what tests share about processes: the test binary started again as a
// child that serves a FUSE mount in a role its TestMain reads from the environment (Start), the
// socket pair the test talks with such a child over (Socketpair, Expect, Receive), the checks
// of a takeover, in which a test kills a child in the middle of a request and has another one
// resume its session (Kill, Pending, Completes), and the test process's own resident file pages
// (RSSFile). Every wait on a child is bounded, so that a child that hangs fails the test
// instead of hanging it.
//
// Its functions are safe for concurrent use by the tests of a package.
package testproc

import (
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/layerstore/layerstore/internal/testutil/testfuse"
)

// Start starts the test binary, running no test, with env added to its environment and files
// as its descriptors 3 and up. When the test ends the child is killed and waited for with a
// bound (testfuse.WaitExit): a child killed in the middle of a request to the FUSE mount at mnt
// cannot exit before its answer, and the test may hold the session's descriptor.
func Start(t testing.TB, mnt string, env []string, files ...*os.File) *exec.Cmd {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), env...)
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

// Socketpair returns a pair of connected SOCK_SEQPACKET sockets: the test's end as a
// connection with deadlines, the child's as a file to pass to Start. Both are closed when the
// test ends.
func Socketpair(t testing.TB) (*net.UnixConn, *os.File) {
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

// Expect fails the test unless the next message on c, within wait, is msg.
func Expect(t testing.TB, c *net.UnixConn, msg string, wait time.Duration) {
	t.Helper()
	_ = c.SetReadDeadline(time.Now().Add(wait))
	b := make([]byte, 16)
	n, err := c.Read(b)
	if err != nil || string(b[:n]) != msg {
		t.Fatalf("waiting for %q from a child: got %q, %v", msg, b[:n], err)
	}
}

// Receive returns the next message on c, within wait, and the n descriptors it carries, which
// are closed on exec (the test's own children inherit only what Start passes them).
func Receive(t testing.TB, c *net.UnixConn, n int, wait time.Duration) ([]byte, []int) {
	t.Helper()
	_ = c.SetReadDeadline(time.Now().Add(wait))
	msg, oob := make([]byte, 256), make([]byte, unix.CmsgSpace(4*n))
	k, oobn, _, _, err := c.ReadMsgUnix(msg, oob)
	if err != nil {
		t.Fatalf("receiving descriptors from a child: %v", err)
	}
	scm, err := unix.ParseSocketControlMessage(oob[:oobn])
	if err != nil || len(scm) != 1 {
		t.Fatalf("control message: %d, %v", len(scm), err)
	}
	fds, err := unix.ParseUnixRights(&scm[0])
	if err != nil || len(fds) != n {
		t.Fatalf("rights: %v, %v", fds, err)
	}
	for _, fd := range fds {
		unix.CloseOnExec(fd)
	}
	return msg[:k], fds
}

// Kill kills the child cmd and waits for its end: a request it took and did not answer is
// left to the process that takes its session over.
func Kill(t testing.TB, cmd *exec.Cmd) {
	t.Helper()
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()
}

// Pending fails the test if what, a request that must wait for a server to take the session
// over, reports on done within 100 ms.
func Pending(t testing.TB, what string, done <-chan error) {
	t.Helper()
	select {
	case err := <-done:
		t.Fatalf("%s returned before a server took over: %v", what, err)
	case <-time.After(100 * time.Millisecond):
	}
}

// Completes fails the test unless what, a request waiting for a takeover, reports on done
// without an error within wait.
func Completes(t testing.TB, what string, done <-chan error, wait time.Duration) {
	t.Helper()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	case <-time.After(wait):
		t.Fatalf("%s did not complete within %v of the takeover", what, wait)
	}
}

// RSSFile returns the test process's resident pages of files (RssFile in /proc/self/status),
// in bytes; it skips the test where the kernel does not tell.
func RSSFile(t testing.TB) int64 {
	t.Helper()
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		t.Skip(err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "RssFile:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			if err != nil {
				t.Fatal(err)
			}
			return kb << 10
		}
	}
	t.Skip("no RssFile in /proc/self/status")
	return 0
}
