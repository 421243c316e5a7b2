package fdstore

import (
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"

	"golang.org/x/sys/unix"
)

// Keeper plays the service manager's side of the protocol for a process it starts, as systemd
// does for a Type=notify unit with FileDescriptorStoreMax=: it listens on a notify socket,
// reports READY=1, keeps the descriptors the process stores (FDSTORE=1, FDNAME=, SCM_RIGHTS)
// or removes (FDSTOREREMOVE=1), and passes them to the next process it starts (LISTEN_FDS,
// LISTEN_FDNAMES, LISTEN_PID). It keeps one descriptor per name (a second FDSTORE=1 under a
// name replaces the first: systemd removes duplicates of one file), at most MaxFiles, and,
// like systemd, drops a descriptor that reports an error or a hang-up when it hands them over
// (a FUSE connection that ended). It is what `layerstore keep` runs the daemon under where no
// systemd does, and what the tests play systemd with.
//
// The notify socket lives in a directory only its owner can enter: only processes of the same
// user (root, for the daemon) can send to it. A Keeper is safe for concurrent use.
type Keeper struct {
	path  string
	conn  *net.UnixConn
	ready chan struct{} // a value when READY=1 came and nobody took it yet
	done  chan struct{} // closed when the reader ends

	mu     sync.Mutex
	stored []Named
	status string // the STATUS= sent with the last READY=1
}

// NewKeeper listens on dir/notify.sock; dir must exist, owned by the caller and closed to
// others.
func NewKeeper(dir string) (*Keeper, error) {
	k := &Keeper{path: filepath.Join(dir, "notify.sock"), ready: make(chan struct{}, 1), done: make(chan struct{})}
	if err := os.Remove(k.path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, err
	}
	conn, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: k.path, Net: "unixgram"})
	if err != nil {
		return nil, err
	}
	k.conn = conn
	go k.read()
	return k, nil
}

// Path is the notify socket, for NOTIFY_SOCKET.
func (k *Keeper) Path() string { return k.path }

// Ready receives a value for each READY=1 (coalesced while nobody receives).
func (k *Keeper) Ready() <-chan struct{} { return k.ready }

// Close stops listening and closes every stored descriptor, as systemd does when a service is
// stopped for good.
func (k *Keeper) Close() {
	k.conn.Close()
	<-k.done
	k.mu.Lock()
	defer k.mu.Unlock()
	for _, s := range k.stored {
		s.File.Close()
	}
	k.stored = nil
}

func (k *Keeper) read() {
	defer close(k.done)
	buf, oob := make([]byte, 4096), make([]byte, unix.CmsgSpace(4*MaxFiles))
	for {
		n, oobn, flags, _, err := k.conn.ReadMsgUnix(buf, oob)
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
		if flags&(unix.MSG_TRUNC|unix.MSG_CTRUNC) != 0 { // not a message systemd would take either
			for _, f := range files {
				f.Close()
			}
			continue
		}
		k.message(string(buf[:n]), files)
	}
}

// message handles one datagram: newline-separated assignments, and the descriptors with it.
func (k *Keeper) message(state string, files []*os.File) {
	vars := map[string]string{}
	for _, line := range strings.Split(state, "\n") {
		if key, v, ok := strings.Cut(line, "="); ok {
			vars[key] = v
		}
	}
	name := vars["FDNAME"]
	if checkName(name) != nil {
		name = "stored" // systemd's name for a descriptor stored without one
	}
	k.mu.Lock()
	if st, ok := vars["STATUS"]; ok && vars["READY"] == "1" {
		k.status = st
	}
	switch {
	case vars["FDSTORE"] == "1":
		for _, f := range files {
			k.remove(name)
			if len(k.stored) >= MaxFiles {
				f.Close()
				continue
			}
			k.stored = append(k.stored, Named{Name: name, File: f})
		}
		files = nil
	case vars["FDSTOREREMOVE"] == "1":
		k.remove(name)
	}
	k.mu.Unlock()
	for _, f := range files {
		f.Close()
	}
	if vars["READY"] == "1" {
		select {
		case k.ready <- struct{}{}:
		default:
		}
	}
}

// remove closes and forgets the descriptor called name. k.mu is held.
func (k *Keeper) remove(name string) {
	kept := k.stored[:0]
	for _, s := range k.stored {
		if s.Name == name {
			s.File.Close()
		} else {
			kept = append(kept, s)
		}
	}
	k.stored = kept
}

// Stored returns the descriptors to pass to the next process, after dropping those that report
// an error or a hang-up. They stay in the store: the caller must not close them.
func (k *Keeper) Stored() []Named {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.live()
}

// live drops the stored descriptors that report an error or a hang-up and returns the others.
// k.mu is held.
func (k *Keeper) live() []Named {
	kept := k.stored[:0]
	for _, s := range k.stored {
		fds := []unix.PollFd{{Fd: int32(s.File.Fd()), Events: unix.POLLIN}}
		if n, err := unix.Poll(fds, 0); err == nil && n == 1 && fds[0].Revents&(unix.POLLERR|unix.POLLHUP|unix.POLLNVAL) != 0 {
			s.File.Close()
			continue
		}
		kept = append(kept, s)
	}
	k.stored = kept
	return append([]Named(nil), kept...)
}

// Status returns the STATUS= the process sent with its last READY=1.
func (k *Keeper) Status() string {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.status
}

// Names lists the names of the stored descriptors.
func (k *Keeper) Names() []string {
	k.mu.Lock()
	defer k.mu.Unlock()
	var ns []string
	for _, s := range k.stored {
		ns = append(ns, s.Name)
	}
	return ns
}

// Command returns argv as a command that gets NOTIFY_SOCKET and the stored descriptors
// (descriptors 3 on, LISTEN_FDS, LISTEN_FDNAMES, and LISTEN_PID set to its own pid by a
// /bin/sh that execs argv, as systemd sets it between fork and exec), with env (nil: this
// process's environment) minus any LISTEN_* variables. The descriptors in cmd.ExtraFiles are
// duplicates of the stored ones (the process may replace what it stored while it starts): the
// caller closes them once the command started.
func (k *Keeper) Command(argv []string, env []string) (*exec.Cmd, error) {
	if env == nil {
		env = os.Environ()
	}
	var out []string
	for _, kv := range env {
		key, _, _ := strings.Cut(kv, "=")
		if key != envPID && key != envFDs && key != envNames && key != envNums && key != "NOTIFY_SOCKET" {
			out = append(out, kv)
		}
	}
	out = append(out, "NOTIFY_SOCKET="+k.path)
	k.mu.Lock()
	stored := k.live()
	names := make([]string, len(stored))
	files := make([]*os.File, len(stored))
	var err error
	for i, s := range stored {
		names[i] = s.Name
		var fd int
		if fd, err = unix.FcntlInt(s.File.Fd(), unix.F_DUPFD_CLOEXEC, 3); err != nil {
			break
		}
		files[i] = os.NewFile(uintptr(fd), s.Name)
	}
	k.mu.Unlock()
	if err != nil {
		for _, f := range files {
			if f != nil {
				f.Close()
			}
		}
		return nil, fmt.Errorf("fdstore: duplicating a stored descriptor: %w", err)
	}
	if len(stored) == 0 {
		cmd := exec.Command(argv[0], argv[1:]...)
		cmd.Env = out
		return cmd, nil
	}
	out = append(out, envFDs+"="+strconv.Itoa(len(stored)), envNames+"="+strings.Join(names, ":"))
	cmd := exec.Command("/bin/sh", append([]string{"-c", `LISTEN_PID=$$; export LISTEN_PID; exec "$0" "$@"`}, argv...)...)
	cmd.Env = out
	cmd.ExtraFiles = files
	return cmd, nil
}

// CloseExtra closes the duplicates a command from Command was given, once it started.
func CloseExtra(cmd *exec.Cmd) {
	for _, f := range cmd.ExtraFiles {
		f.Close()
	}
}
