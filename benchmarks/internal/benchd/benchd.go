// Package benchd starts and stops the real `layerstore serve` for the benchmarks: a config
// file per start, the mount awaited (statfs says FUSE and the control socket answers), the
// daemon's CPU time and layer status read while it runs, and a stop by PID that never leaves
// a mount behind.
package benchd

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/opencontainers/go-digest"
	"golang.org/x/sys/unix"

	storefs "github.com/layerstore/layerstore/fs"
	"github.com/layerstore/layerstore/internal/control"
	"github.com/layerstore/layerstore/layer"
)

// Config is one start of `layerstore serve`.
type Config struct {
	Bin            string // the layerstore binary
	Dir            string // holds config, socket, log and, unless CacheDir is set, the cache
	CacheDir       string // default Dir/cache
	Mountpoint     string // default Dir/mnt
	RegistriesConf string // passed as --registries-conf when set
	Prefetch       bool
	Passthrough    bool
}

// Daemon is a running `layerstore serve`.
type Daemon struct {
	Cfg     Config
	Cmd     *exec.Cmd
	LogPath string
	Socket  string
	Client  *control.Client
	log     *os.File
	exited  chan struct{}
}

// Start writes the config file, starts the daemon and waits until its mount answers.
func Start(ctx context.Context, cfg Config) (*Daemon, error) {
	if cfg.CacheDir == "" {
		cfg.CacheDir = filepath.Join(cfg.Dir, "cache")
	}
	if cfg.Mountpoint == "" {
		cfg.Mountpoint = filepath.Join(cfg.Dir, "mnt")
	}
	socket := filepath.Join(cfg.Dir, "control.sock")
	conf := fmt.Sprintf("cache-dir = %q\ncontrol-socket = %q\nlog-level = \"info\"\n\n[prefetch]\nenabled = %t\n\n[fuse]\npassthrough = %t\n",
		cfg.CacheDir, socket, cfg.Prefetch, cfg.Passthrough)
	confPath := filepath.Join(cfg.Dir, "config.toml")
	if err := os.WriteFile(confPath, []byte(conf), 0o644); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(cfg.Mountpoint, 0o755); err != nil {
		return nil, err
	}
	logPath := filepath.Join(cfg.Dir, fmt.Sprintf("daemon-%d.log", time.Now().UnixNano()))
	lf, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	args := []string{"serve", "--config", confPath}
	if cfg.RegistriesConf != "" {
		args = append(args, "--registries-conf", cfg.RegistriesConf)
	}
	cmd := exec.Command(cfg.Bin, append(args, cfg.Mountpoint)...)
	cmd.Stdout, cmd.Stderr = lf, lf
	// Its own process group, so that a ^C to the harness reaches the daemon only through
	// stop, which unmounts first.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		lf.Close()
		return nil, err
	}
	d := &Daemon{Cfg: cfg, Cmd: cmd, log: lf, LogPath: logPath, Socket: socket, Client: control.NewClient(socket), exited: make(chan struct{})}
	go func() { _ = cmd.Wait(); close(d.exited) }()
	deadline := time.Now().Add(20 * time.Second)
	for {
		var st unix.Statfs_t
		if unix.Statfs(cfg.Mountpoint, &st) == nil && st.Type == storefs.SuperMagic {
			if _, err := d.Client.Status(ctx); err == nil {
				return d, nil
			}
		}
		select {
		case <-d.exited:
			d.Stop()
			return nil, fmt.Errorf("daemon exited: %s", d.Tail())
		case <-ctx.Done():
			d.Stop()
			return nil, ctx.Err()
		case <-time.After(10 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			d.Stop()
			return nil, fmt.Errorf("daemon not ready after 20s: %s", d.Tail())
		}
	}
}

// Stop ends the daemon by its PID: SIGTERM (it unmounts), then SIGKILL after 10 s; a mount
// left behind is detached. Safe to call twice.
func (d *Daemon) Stop() {
	if d.Cmd.Process != nil {
		select {
		case <-d.exited:
		default:
			_ = d.Cmd.Process.Signal(syscall.SIGTERM)
			select {
			case <-d.exited:
			case <-time.After(10 * time.Second):
				_ = d.Cmd.Process.Kill()
				<-d.exited
			}
		}
	}
	for range 5 {
		var st unix.Statfs_t
		if unix.Statfs(d.Cfg.Mountpoint, &st) != nil || st.Type != storefs.SuperMagic {
			break
		}
		_ = unix.Unmount(d.Cfg.Mountpoint, unix.MNT_DETACH)
	}
	d.log.Close()
}

// Tail is the end of the daemon's log, for error messages.
func (d *Daemon) Tail() string {
	b, _ := os.ReadFile(d.LogPath)
	if len(b) > 2000 {
		b = b[len(b)-2000:]
	}
	return string(b)
}

// Passthrough reports what the daemon logged about passthrough at mount.
func (d *Daemon) Passthrough() string {
	b, _ := os.ReadFile(d.LogPath)
	for _, line := range bytes.Split(b, []byte("\n")) {
		if bytes.Contains(line, []byte("mounted layer store")) {
			if i := bytes.Index(line, []byte("passthrough=")); i >= 0 {
				return strings.Fields(string(line[i+len("passthrough="):]))[0]
			}
		}
	}
	return "?"
}

// CPU returns the daemon's user and system CPU time so far.
func (d *Daemon) CPU() (float64, error) {
	return ProcCPU(d.Cmd.Process.Pid)
}

// ProcCPU reads utime+stime of a process from /proc (in USER_HZ, 100 on Linux).
func ProcCPU(pid int) (float64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
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
	// Fields after ")" start at field 3 (state); utime is field 14, stime 15.
	ut, err1 := strconv.ParseFloat(f[11], 64)
	st, err2 := strconv.ParseFloat(f[12], 64)
	if err := errors.Join(err1, err2); err != nil {
		return 0, err
	}
	return (ut + st) / 100, nil
}

// LayerStatus returns the status of the layer with blob digest dg, if the daemon has it.
func (d *Daemon) LayerStatus(ctx context.Context, dg digest.Digest) (layer.LayerStatus, layer.Status, bool, error) {
	st, err := d.Client.Status(ctx)
	if err != nil {
		return layer.LayerStatus{}, st, false, err
	}
	for _, l := range st.Layers {
		if l.Digest == dg {
			return l, st, true, nil
		}
	}
	return layer.LayerStatus{}, st, false, nil
}

// WaitComplete polls the control socket until the layer is complete; poll is the interval.
func (d *Daemon) WaitComplete(ctx context.Context, dg digest.Digest, poll time.Duration, timeout time.Duration) (layer.LayerStatus, error) {
	deadline := time.Now().Add(timeout)
	for {
		ls, _, ok, err := d.LayerStatus(ctx, dg)
		if err != nil {
			return ls, err
		}
		if ok {
			switch ls.State {
			case layer.StateComplete:
				return ls, nil
			case layer.StateFailed, layer.StateStopped:
				return ls, fmt.Errorf("background fetch %s: %s", ls.State, ls.Error)
			}
		}
		if time.Now().After(deadline) {
			return ls, fmt.Errorf("layer not complete after %v (state %q, %d of %d bytes)", timeout, ls.State, ls.Prefetched, ls.ToFetch)
		}
		select {
		case <-ctx.Done():
			return ls, ctx.Err()
		case <-d.exited:
			return ls, fmt.Errorf("daemon exited: %s", d.Tail())
		case <-time.After(poll):
		}
	}
}
