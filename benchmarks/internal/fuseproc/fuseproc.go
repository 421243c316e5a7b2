// Package fuseproc runs, for the benchmarks, a process that serves a FUSE mount (layerstore's
// daemon through benchd, a peer store through peer): started in its own process group (a ^C to
// the benchmark reaches it only through Stop, which lets it unmount first) with its output in a
// log file, its mount awaited, its CPU time read, and a stop by PID that never leaves a mount
// behind. A Proc's methods are safe for concurrent use; Stop may be called more than once.
package fuseproc

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	storefs "github.com/layerstore/layerstore/fs"
)

// Spec is one start of a process serving a mount.
type Spec struct {
	What       string    // names the process in errors ("daemon", "peer")
	Cmd        *exec.Cmd // not started; its output goes to Log
	Log        string    // the file created for the process's output
	Mountpoint string
	Stop       os.Signal     // the signal on which the process unmounts and exits
	Timeout    time.Duration // for the mount to answer
	// Ready, when set, must also succeed before Start returns (e.g. a control socket answers).
	Ready func(context.Context) error
}

// Proc is a running process serving a mount.
type Proc struct {
	Cmd        *exec.Cmd
	Mountpoint string
	LogPath    string
	what       string
	stop       os.Signal
	log        *os.File
	exited     chan struct{}
	stopOnce   sync.Once
}

// Start starts the process and waits until its mountpoint is a FUSE mount and s.Ready
// succeeds; when the process exits first, ctx ends or s.Timeout passes, it stops it and fails
// with the end of its log.
func Start(ctx context.Context, s Spec) (*Proc, error) {
	lf, err := os.Create(s.Log)
	if err != nil {
		return nil, err
	}
	s.Cmd.Stdout, s.Cmd.Stderr = lf, lf
	s.Cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := s.Cmd.Start(); err != nil {
		lf.Close()
		return nil, err
	}
	p := &Proc{Cmd: s.Cmd, Mountpoint: s.Mountpoint, LogPath: s.Log, what: s.What, stop: s.Stop, log: lf, exited: make(chan struct{})}
	go func() { _ = s.Cmd.Wait(); close(p.exited) }()
	deadline := time.Now().Add(s.Timeout)
	for {
		if Mounted(s.Mountpoint) && (s.Ready == nil || s.Ready(ctx) == nil) {
			return p, nil
		}
		select {
		case <-p.exited:
			p.Stop()
			return nil, fmt.Errorf("%s exited: %s", s.What, p.Tail())
		case <-ctx.Done():
			p.Stop()
			return nil, ctx.Err()
		case <-time.After(10 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			p.Stop()
			return nil, fmt.Errorf("%s not ready after %v: %s", s.What, s.Timeout, p.Tail())
		}
	}
}

// Mounted reports whether statfs of path says FUSE.
func Mounted(path string) bool {
	var st unix.Statfs_t
	return unix.Statfs(path, &st) == nil && st.Type == storefs.SuperMagic
}

// Exited is closed when the process has exited.
func (p *Proc) Exited() <-chan struct{} { return p.exited }

// Stop ends the process by its PID: its stop signal (it unmounts), then SIGKILL after 10 s;
// a mount left behind is detached.
func (p *Proc) Stop() {
	p.stopOnce.Do(func() {
		select {
		case <-p.exited:
		default:
			_ = p.Cmd.Process.Signal(p.stop)
			select {
			case <-p.exited:
			case <-time.After(10 * time.Second):
				_ = p.Cmd.Process.Kill()
				<-p.exited
			}
		}
		for range 5 {
			if !Mounted(p.Mountpoint) {
				break
			}
			_ = unix.Unmount(p.Mountpoint, unix.MNT_DETACH)
		}
		p.log.Close()
	})
}

// Tail is the end of the process's log, for error messages.
func (p *Proc) Tail() string {
	b, _ := os.ReadFile(p.LogPath)
	if len(b) > 2000 {
		b = b[len(b)-2000:]
	}
	return string(b)
}

// CPU returns the process's user and system CPU time so far, from /proc (in USER_HZ, 100 on
// Linux).
func (p *Proc) CPU() (float64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", p.Cmd.Process.Pid))
	if err != nil {
		return 0, err
	}
	// The command name is in parentheses and may hold spaces: fields start after ")".
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0, errors.New("bad /proc stat")
	}
	f := strings.Fields(s[i+1:])
	if len(f) < 13 {
		return 0, errors.New("short /proc stat")
	}
	// Fields after ")" start at field 3 (state); utime is field 14, stime 15.
	ut, err1 := strconv.ParseFloat(f[11], 64)
	st, err2 := strconv.ParseFloat(f[12], 64)
	if err := errors.Join(err1, err2); err != nil {
		return 0, err
	}
	return (ut + st) / 100, nil
}

// Memory is a process's resident memory, in bytes.
type Memory struct {
	RSS, HWM, Anon int64 // VmRSS, VmHWM (the peak VmRSS), RssAnon
}

// Memory reads the process's VmRSS, VmHWM and RssAnon from /proc/<pid>/status.
func (p *Proc) Memory() (Memory, error) {
	var m Memory
	pid := p.Cmd.Process.Pid
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return m, err
	}
	defer f.Close()
	fields := map[string]*int64{"VmRSS": &m.RSS, "VmHWM": &m.HWM, "RssAnon": &m.Anon}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		dst := fields[k]
		if !ok || dst == nil {
			continue
		}
		fs := strings.Fields(v)
		if len(fs) != 2 || fs[1] != "kB" {
			return m, fmt.Errorf("/proc/%d/status: %s: %q", pid, k, v)
		}
		n, err := strconv.ParseInt(fs[0], 10, 64)
		if err != nil {
			return m, err
		}
		*dst = n << 10
	}
	if m.RSS == 0 || m.HWM == 0 || m.Anon == 0 {
		return m, fmt.Errorf("/proc/%d/status: no VmRSS, VmHWM or RssAnon", pid)
	}
	return m, sc.Err()
}
