// Package fdstore keeps file descriptors outside the process while it restarts, so that what
// they refer to (the FUSE connection of the store) outlives the process.
//
// It speaks the two halves of systemd's protocol, and nothing else:
//
//   - [Store] and [Remove] put a named descriptor in, or take it out of, the service manager's
//     file descriptor store: an sd_notify(3) datagram "FDSTORE=1" with "FDNAME=", the descriptor
//     attached as SCM_RIGHTS, sent to $NOTIFY_SOCKET (FileDescriptorStoreMax= must be set in
//     the unit, or the manager drops it).
//   - [Listen] takes the descriptors a process was started with (sd_listen_fds(3)):
//     LISTEN_FDS descriptors from 3 on, named by LISTEN_FDNAMES, meant for the process whose
//     pid is LISTEN_PID. It marks them close-on-exec and removes the variables from the
//     environment, so that children inherit neither.
//   - [Exec] replaces the process with a program (a new binary at the same path) that receives
//     the descriptors through the same variables, keeping the pid: the next process takes them
//     with Listen whether systemd or its predecessor started it, and the service manager sees
//     no change of main process. The one difference: the descriptors keep the numbers they
//     have (FDSTORE_FDNUMS lists them), since a Go process cannot move descriptors to 3 on
//     under its own runtime.
//
// See docs/design/fd-store.md for what survives what. Store, Remove and Listen are safe for
// concurrent use (Listen takes the descriptors once); Exec does not return on success.
package fdstore

import (
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"
)

// listenFDsStart is the first descriptor number of the LISTEN_FDS convention (SD_LISTEN_FDS_START).
const listenFDsStart = 3

// MaxFiles bounds how many descriptors Listen accepts and Exec passes, far above what the
// daemon uses (its FUSE connection), so that a garbage LISTEN_FDS is refused rather than walked.
const MaxFiles = 64

// ErrNoManager is returned by Store and Remove when $NOTIFY_SOCKET is not set: no service
// manager will keep the descriptor.
var ErrNoManager = errors.New("fdstore: no service manager ($NOTIFY_SOCKET is not set)")

// A Named is a descriptor with the name it is stored and passed under (FDNAME=, LISTEN_FDNAMES).
type Named struct {
	Name string
	File *os.File
}

// checkName checks a name as systemd does (sd_notify(3), FDNAME=): ASCII without control
// characters or ':', 1 to 255 bytes. systemd silently ignores a bad name; here it is an error.
func checkName(name string) error {
	if name == "" || len(name) > 255 {
		return fmt.Errorf("fdstore: name %q: want 1 to 255 characters", name)
	}
	for i := 0; i < len(name); i++ {
		if c := name[i]; c < 0x20 || c >= 0x7f || c == ':' {
			return fmt.Errorf("fdstore: name %q: only printable ASCII without ':'", name)
		}
	}
	return nil
}

// Store puts f in the service manager's file descriptor store under name. The manager keeps a
// duplicate: f stays open and usable here. It hands the descriptor back through LISTEN_FDS
// when it starts the service again, and drops it when it reports an error or hang-up (for a
// FUSE connection: once it is aborted or unmounted), or when the service is stopped for good.
// Storing the same descriptor again is harmless (the manager removes duplicates).
func Store(name string, f *os.File) error {
	if err := checkName(name); err != nil {
		return err
	}
	fd, err := rawFd(f)
	if err != nil {
		return err
	}
	return notify("FDSTORE=1\nFDNAME="+name, unix.UnixRights(fd))
}

// Remove takes every descriptor stored under name out of the service manager's store.
func Remove(name string) error {
	if err := checkName(name); err != nil {
		return err
	}
	return notify("FDSTOREREMOVE=1\nFDNAME="+name, nil)
}

// notify sends state, with the descriptors in oob, to $NOTIFY_SOCKET: a path, or an abstract
// socket when it starts with '@'.
func notify(state string, oob []byte) error {
	path := os.Getenv("NOTIFY_SOCKET")
	if path == "" {
		return ErrNoManager
	}
	if path[0] != '/' && path[0] != '@' {
		return fmt.Errorf("fdstore: NOTIFY_SOCKET=%q: only paths and abstract sockets (@name) are supported", path)
	}
	// An unbound datagram socket, as sd_notify uses: the net package refuses ancillary data on
	// a connected one.
	s, err := unix.Socket(unix.AF_UNIX, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("fdstore: %w", err)
	}
	defer unix.Close(s)
	// x/sys/unix maps a leading '@' to an abstract address.
	if err := unix.Sendmsg(s, []byte(state), oob, &unix.SockaddrUnix{Name: path}, unix.MSG_NOSIGNAL); err != nil {
		return fmt.Errorf("fdstore: sending %q to %s: %w", strings.ReplaceAll(state, "\n", " "), path, err)
	}
	return nil
}

// rawFd returns f's descriptor number without f.Fd's side effect (it puts f in blocking mode).
func rawFd(f *os.File) (int, error) {
	if f == nil {
		return 0, errors.New("fdstore: nil file")
	}
	sc, err := f.SyscallConn()
	if err != nil {
		return 0, fmt.Errorf("fdstore: %s: %w", f.Name(), err)
	}
	fd := -1
	if err := sc.Control(func(u uintptr) { fd = int(u) }); err != nil {
		return 0, fmt.Errorf("fdstore: %s: %w", f.Name(), err)
	}
	return fd, nil
}

// The variables of the LISTEN_FDS convention.
const (
	envPID   = "LISTEN_PID"
	envFDs   = "LISTEN_FDS"
	envNames = "LISTEN_FDNAMES"
	// envNums lists the numbers of the descriptors when they are not at 3 on: set by Exec.
	envNums = "FDSTORE_FDNUMS"
)

// listenMu makes Listen take the descriptors once: a second call finds the variables gone and
// returns nothing.
var listenMu sync.Mutex

// Listen returns the descriptors the process was started with, in order, each *os.File named
// by its LISTEN_FDNAMES entry ("unknown" without LISTEN_FDNAMES, as systemd says). It returns
// nothing when LISTEN_PID is unset or names another process (the variables were inherited,
// not meant for this process). It removes the variables from the environment in every case,
// and marks the descriptors close-on-exec. Malformed variables (LISTEN_FDS not a number, as
// many names as descriptors, a descriptor that is not open) are an error, and no descriptor
// is taken.
func Listen() ([]Named, error) {
	listenMu.Lock()
	defer listenMu.Unlock()
	pidS, pidSet := os.LookupEnv(envPID)
	fdsS := os.Getenv(envFDs)
	namesS, namesSet := os.LookupEnv(envNames)
	numsS, numsSet := os.LookupEnv(envNums)
	for _, k := range []string{envPID, envFDs, envNames, envNums} {
		os.Unsetenv(k)
	}
	if !pidSet {
		return nil, nil
	}
	pid, err := strconv.Atoi(pidS)
	if err != nil || pid <= 0 {
		return nil, fmt.Errorf("fdstore: %s=%q: not a process id", envPID, pidS)
	}
	if pid != os.Getpid() {
		return nil, nil
	}
	n, err := strconv.Atoi(fdsS)
	if err != nil || n < 0 || n > MaxFiles {
		return nil, fmt.Errorf("fdstore: %s=%q: want a number of descriptors from 0 to %d", envFDs, fdsS, MaxFiles)
	}
	names := make([]string, n)
	if namesSet {
		var got []string
		if namesS != "" { // systemd splits "" into no names
			got = strings.Split(namesS, ":")
		}
		if len(got) != n {
			return nil, fmt.Errorf("fdstore: %s=%q names %d descriptors, %s=%d", envNames, namesS, len(got), envFDs, n)
		}
		copy(names, got)
	} else {
		for i := range names {
			names[i] = "unknown"
		}
	}
	fds := make([]int, n)
	for i := range fds {
		fds[i] = listenFDsStart + i
	}
	if numsSet {
		var got []string
		if numsS != "" {
			got = strings.Split(numsS, ":")
		}
		if len(got) != n {
			return nil, fmt.Errorf("fdstore: %s=%q numbers %d descriptors, %s=%d", envNums, numsS, len(got), envFDs, n)
		}
		for i, v := range got {
			fd, err := strconv.Atoi(v)
			if err != nil || fd < listenFDsStart || slices.Contains(fds[:i], fd) {
				return nil, fmt.Errorf("fdstore: %s=%q: want distinct descriptor numbers from %d on", envNums, numsS, listenFDsStart)
			}
			fds[i] = fd
		}
	}
	for _, fd := range fds {
		if _, err := unix.FcntlInt(uintptr(fd), unix.F_GETFD, 0); err != nil {
			return nil, fmt.Errorf("fdstore: %s=%d but descriptor %d: %w", envFDs, n, fd, err)
		}
	}
	out := make([]Named, n)
	for i, fd := range fds {
		if _, err := unix.FcntlInt(uintptr(fd), unix.F_SETFD, unix.FD_CLOEXEC); err != nil {
			return nil, fmt.Errorf("fdstore: descriptor %d: %w", fd, err)
		}
		out[i] = Named{Name: names[i], File: os.NewFile(uintptr(fd), names[i])}
	}
	return out, nil
}

// Exec replaces the process with the program at path (argv, env as for execve), passing files
// with LISTEN_FDS, LISTEN_FDNAMES and LISTEN_PID (the pid does not change, so a service
// manager sees the same main process), and envNums listing their numbers: a Go process cannot
// move descriptors to 3 on under its own runtime (which holds descriptors there, and reads
// them), so they keep numbers of their own, which Listen reads from envNums. Any LISTEN_* and
// envNums variables in env are replaced. Every other descriptor of a Go program is
// close-on-exec and is not passed.
//
// Exec duplicates the files to free numbers and never writes over a descriptor in use. On
// success it does not return; on failure the duplicates are closed and the process is as
// before.
func Exec(path string, argv, env []string, files []Named) error {
	if len(files) > MaxFiles {
		return fmt.Errorf("fdstore: passing %d descriptors: at most %d", len(files), MaxFiles)
	}
	var names, nums []string
	// No fork while the duplicates are not close-on-exec: a child would inherit them.
	syscall.ForkLock.Lock()
	defer syscall.ForkLock.Unlock()
	var dups []int
	defer func() {
		for _, fd := range dups {
			unix.Close(fd)
		}
	}()
	for _, f := range files {
		if err := checkName(f.Name); err != nil {
			return err
		}
		fd, err := rawFd(f.File)
		if err != nil {
			return err
		}
		d, err := unix.FcntlInt(uintptr(fd), unix.F_DUPFD, listenFDsStart) // without FD_CLOEXEC
		if err != nil {
			return fmt.Errorf("fdstore: %s: %w", f.Name, err)
		}
		dups = append(dups, d)
		names, nums = append(names, f.Name), append(nums, strconv.Itoa(d))
	}
	next := make([]string, 0, len(env)+4)
	for _, kv := range env {
		k, _, _ := strings.Cut(kv, "=")
		if k != envPID && k != envFDs && k != envNames && k != envNums {
			next = append(next, kv)
		}
	}
	next = append(next, envFDs+"="+strconv.Itoa(len(files)), envPID+"="+strconv.Itoa(os.Getpid()))
	if len(files) > 0 {
		next = append(next, envNames+"="+strings.Join(names, ":"), envNums+"="+strings.Join(nums, ":"))
	}
	err := syscall.Exec(path, argv, next)
	return fmt.Errorf("fdstore: exec %s: %w", path, err)
}
