package e2e

import (
	"bytes"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// manager plays the service manager's side of the sd_notify protocol for one daemon, as
// systemd does for a Type=notify unit with FileDescriptorStoreMax=: it reads the daemon's
// notify socket for as long as the test runs, reports READY=1, and keeps the descriptors the
// daemon stores (FDSTORE=1, FDNAME=, SCM_RIGHTS) or removes (FDSTOREREMOVE=1), to hand them to
// the next process (LISTEN_FDS, see daemon.start). Like systemd, it drops a stored descriptor
// that reports an error or hang-up when it is handed over (a FUSE connection that ended).
type manager struct {
	path  string
	conn  *net.UnixConn
	ready chan struct{} // one value per READY=1

	mu     sync.Mutex
	stored []storedFD
}

type storedFD struct {
	name string
	file *os.File
}

// newManager listens on dir/notify.sock until the test ends, and closes what it keeps then.
func newManager(t *testing.T, dir string) *manager {
	t.Helper()
	m := &manager{path: filepath.Join(dir, "notify.sock"), ready: make(chan struct{}, 16)}
	os.Remove(m.path)
	conn, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: m.path, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	m.conn = conn
	done := make(chan struct{})
	go m.read(done)
	t.Cleanup(func() {
		conn.Close()
		<-done
		m.drop()
	})
	return m
}

func (m *manager) read(done chan<- struct{}) {
	defer close(done)
	buf, oob := make([]byte, 4096), make([]byte, unix.CmsgSpace(4*16))
	for {
		n, oobn, _, _, err := m.conn.ReadMsgUnix(buf, oob)
		if err != nil {
			return
		}
		var files []*os.File
		if msgs, err := unix.ParseSocketControlMessage(oob[:oobn]); err == nil {
			for _, msg := range msgs {
				if fds, err := unix.ParseUnixRights(&msg); err == nil {
					for _, fd := range fds {
						files = append(files, os.NewFile(uintptr(fd), "stored"))
					}
				}
			}
		}
		m.message(string(buf[:n]), files)
	}
}

// message handles one datagram: a state string of newline-separated assignments.
func (m *manager) message(state string, files []*os.File) {
	vars := map[string]string{}
	for _, line := range strings.Split(state, "\n") {
		if k, v, ok := strings.Cut(line, "="); ok {
			vars[k] = v
		}
	}
	name := vars["FDNAME"]
	if name == "" {
		name = "stored"
	}
	m.mu.Lock()
	switch {
	case vars["FDSTORE"] == "1":
		for _, f := range files {
			m.stored = append(m.stored, storedFD{name, f})
		}
		files = nil
	case vars["FDSTOREREMOVE"] == "1":
		kept := m.stored[:0]
		for _, s := range m.stored {
			if s.name == name {
				s.file.Close()
			} else {
				kept = append(kept, s)
			}
		}
		m.stored = kept
	}
	m.mu.Unlock()
	for _, f := range files {
		f.Close()
	}
	if vars["READY"] == "1" {
		m.ready <- struct{}{}
	}
}

// handOver returns the descriptors to pass to the next process, after dropping those that
// report an error or a hang-up, as systemd does.
func (m *manager) handOver() []storedFD {
	m.mu.Lock()
	defer m.mu.Unlock()
	kept := m.stored[:0]
	for _, s := range m.stored {
		fds := []unix.PollFd{{Fd: int32(s.file.Fd()), Events: unix.POLLIN}}
		if n, err := unix.Poll(fds, 0); err == nil && n == 1 && fds[0].Revents&(unix.POLLERR|unix.POLLHUP|unix.POLLNVAL) != 0 {
			s.file.Close()
			continue
		}
		kept = append(kept, s)
	}
	m.stored = kept
	return append([]storedFD(nil), kept...)
}

// names lists the names of the stored descriptors.
func (m *manager) names() []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	var ns []string
	for _, s := range m.stored {
		ns = append(ns, s.name)
	}
	return ns
}

// drop closes every stored descriptor, as systemd does when a service is stopped for good.
func (m *manager) drop() {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, s := range m.stored {
		s.file.Close()
	}
	m.stored = nil
}

// waitReady waits for the next READY=1, or fails after timeout; exited, when closed first,
// means the daemon ended before it was ready.
func (m *manager) waitReady(timeout time.Duration, exited <-chan struct{}) error {
	select {
	case <-m.ready:
		return nil
	case <-exited:
		return errDaemonExited
	case <-time.After(timeout):
		return errNoReady
	}
}

var (
	errDaemonExited = errors.New("the daemon exited before READY=1")
	errNoReady      = errors.New("no READY=1 from the daemon")
)

// listenEnv returns the environment and the files (from descriptor 3 on) that pass stored
// to a process started through listenWrapper.
func listenEnv(stored []storedFD) (env []string, files []*os.File) {
	if len(stored) == 0 {
		return nil, nil
	}
	var names bytes.Buffer
	for i, s := range stored {
		if i > 0 {
			names.WriteByte(':')
		}
		names.WriteString(s.name)
		files = append(files, s.file)
	}
	return []string{"LISTEN_FDS=" + strconv.Itoa(len(stored)), "LISTEN_FDNAMES=" + names.String()}, files
}

// listenWrapper sets LISTEN_PID to the pid of the process it becomes, as systemd does
// between fork and exec.
var listenWrapper = []string{"/bin/sh", "-c", `LISTEN_PID=$$; export LISTEN_PID; exec "$0" "$@"`}
