// Package svcmanager plays the service manager's side of the sd_notify protocol in tests, as
// systemd does for a Type=notify unit with FileDescriptorStoreMax=: it reads a daemon's notify
// socket, reports READY=1, keeps the descriptors the daemon stores (FDSTORE=1, FDNAME=,
// SCM_RIGHTS) or removes (FDSTOREREMOVE=1), and hands them to the next process the way systemd
// does (LISTEN_FDS, LISTEN_FDNAMES, LISTEN_PID). Tests must never start systemd itself. A
// Manager is safe for concurrent use.
package svcmanager

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

// Manager is the service manager of one daemon, across its restarts, for as long as the test
// runs. Like systemd, it drops a stored descriptor that reports an error or hang-up when it is
// handed over (a FUSE connection that ended), and keeps one descriptor per name (a second
// FDSTORE=1 under a name replaces the first; systemd removes duplicates of one file).
type Manager struct {
	Path  string        // the notify socket: NOTIFY_SOCKET
	ready chan struct{} // one value per READY=1
	conn  *net.UnixConn

	mu     sync.Mutex
	stored []Stored
}

// Stored is a descriptor in the store, with its name.
type Stored struct {
	Name string
	File *os.File
}

// New listens on dir/notify.sock until the test ends, and closes what it keeps then.
func New(t *testing.T, dir string) *Manager {
	t.Helper()
	m := &Manager{Path: filepath.Join(dir, "notify.sock"), ready: make(chan struct{}, 16)}
	os.Remove(m.Path)
	conn, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: m.Path, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	m.conn = conn
	done := make(chan struct{})
	go m.read(done)
	t.Cleanup(func() {
		conn.Close()
		<-done
		m.Drop()
	})
	return m
}

func (m *Manager) read(done chan<- struct{}) {
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
func (m *Manager) message(state string, files []*os.File) {
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
			m.remove(name)
			m.stored = append(m.stored, Stored{name, f})
		}
		files = nil
	case vars["FDSTOREREMOVE"] == "1":
		m.remove(name)
	}
	m.mu.Unlock()
	for _, f := range files {
		f.Close()
	}
	if vars["READY"] == "1" {
		m.ready <- struct{}{}
	}
}

// remove closes and forgets the descriptor called name. m.mu is held.
func (m *Manager) remove(name string) {
	kept := m.stored[:0]
	for _, s := range m.stored {
		if s.Name == name {
			s.File.Close()
		} else {
			kept = append(kept, s)
		}
	}
	m.stored = kept
}

// HandOver returns the descriptors to pass to the next process, after dropping those that
// report an error or a hang-up, as systemd does.
func (m *Manager) HandOver() []Stored {
	m.mu.Lock()
	defer m.mu.Unlock()
	kept := m.stored[:0]
	for _, s := range m.stored {
		fds := []unix.PollFd{{Fd: int32(s.File.Fd()), Events: unix.POLLIN}}
		if n, err := unix.Poll(fds, 0); err == nil && n == 1 && fds[0].Revents&(unix.POLLERR|unix.POLLHUP|unix.POLLNVAL) != 0 {
			s.File.Close()
			continue
		}
		kept = append(kept, s)
	}
	m.stored = kept
	return append([]Stored(nil), kept...)
}

// Names lists the names of the stored descriptors.
func (m *Manager) Names() []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	var ns []string
	for _, s := range m.stored {
		ns = append(ns, s.Name)
	}
	return ns
}

// Drop closes every stored descriptor, as systemd does when a service is stopped for good.
func (m *Manager) Drop() {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, s := range m.stored {
		s.File.Close()
	}
	m.stored = nil
}

// WaitReady waits for the next READY=1, or fails after timeout; exited, when closed first,
// means the daemon ended before it was ready.
func (m *Manager) WaitReady(timeout time.Duration, exited <-chan struct{}) error {
	select {
	case <-m.ready:
		return nil
	case <-exited:
		return ErrExited
	case <-time.After(timeout):
		return ErrNoReady
	}
}

var (
	ErrExited  = errors.New("the daemon exited before READY=1")
	ErrNoReady = errors.New("no READY=1 from the daemon")
)

// ListenEnv returns the environment and the files (from descriptor 3 on) that pass stored
// to a process started through Wrapper.
func ListenEnv(stored []Stored) (env []string, files []*os.File) {
	if len(stored) == 0 {
		return nil, nil
	}
	var names bytes.Buffer
	for i, s := range stored {
		if i > 0 {
			names.WriteByte(':')
		}
		names.WriteString(s.Name)
		files = append(files, s.File)
	}
	return []string{"LISTEN_FDS=" + strconv.Itoa(len(stored)), "LISTEN_FDNAMES=" + names.String()}, files
}

// Wrapper, put before a command, sets LISTEN_PID to the pid of the process it becomes, as systemd does
// between fork and exec.
var Wrapper = []string{"/bin/sh", "-c", `LISTEN_PID=$$; export LISTEN_PID; exec "$0" "$@"`}
