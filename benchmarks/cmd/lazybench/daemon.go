package main

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

	"github.com/layerstore/layerstore/internal/control"
	"github.com/layerstore/layerstore/layer"
)

const fuseSuperMagic = 0x65735546

// daemonConfig is one start of `layerstore serve`.
type daemonConfig struct {
	bin            string
	dir            string // holds config, socket, log and, unless cacheDir is set, the cache
	cacheDir       string
	mountpoint     string
	registriesConf string
	prefetch       bool
	passthrough    bool
}

// daemon is a running `layerstore serve`.
type daemon struct {
	cfg     daemonConfig
	cmd     *exec.Cmd
	log     *os.File
	logPath string
	socket  string
	client  *control.Client
	exited  chan struct{}
}

// startDaemon writes the config file, starts the daemon and waits until its mount answers.
func startDaemon(ctx context.Context, cfg daemonConfig) (*daemon, error) {
	if cfg.cacheDir == "" {
		cfg.cacheDir = filepath.Join(cfg.dir, "cache")
	}
	if cfg.mountpoint == "" {
		cfg.mountpoint = filepath.Join(cfg.dir, "mnt")
	}
	socket := filepath.Join(cfg.dir, "control.sock")
	conf := fmt.Sprintf("cache-dir = %q\ncontrol-socket = %q\nlog-level = \"info\"\n\n[prefetch]\nenabled = %t\n\n[fuse]\npassthrough = %t\n",
		cfg.cacheDir, socket, cfg.prefetch, cfg.passthrough)
	confPath := filepath.Join(cfg.dir, "config.toml")
	if err := os.WriteFile(confPath, []byte(conf), 0o644); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(cfg.mountpoint, 0o755); err != nil {
		return nil, err
	}
	logPath := filepath.Join(cfg.dir, fmt.Sprintf("daemon-%d.log", time.Now().UnixNano()))
	lf, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(cfg.bin, "serve", "--config", confPath, "--registries-conf", cfg.registriesConf, cfg.mountpoint)
	cmd.Stdout, cmd.Stderr = lf, lf
	// Its own process group, so that a ^C to the harness reaches the daemon only through
	// stop, which unmounts first.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		lf.Close()
		return nil, err
	}
	d := &daemon{cfg: cfg, cmd: cmd, log: lf, logPath: logPath, socket: socket, client: control.NewClient(socket), exited: make(chan struct{})}
	go func() { _ = cmd.Wait(); close(d.exited) }()
	deadline := time.Now().Add(20 * time.Second)
	for {
		var st unix.Statfs_t
		if unix.Statfs(cfg.mountpoint, &st) == nil && st.Type == fuseSuperMagic {
			if _, err := d.client.Status(ctx); err == nil {
				return d, nil
			}
		}
		select {
		case <-d.exited:
			d.stop()
			return nil, fmt.Errorf("daemon exited: %s", d.tail())
		case <-ctx.Done():
			d.stop()
			return nil, ctx.Err()
		case <-time.After(10 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			d.stop()
			return nil, fmt.Errorf("daemon not ready after 20s: %s", d.tail())
		}
	}
}

// stop ends the daemon by its PID: SIGTERM (it unmounts), then SIGKILL after 10 s; a mount
// left behind is detached. Safe to call twice.
func (d *daemon) stop() {
	if d.cmd.Process != nil {
		select {
		case <-d.exited:
		default:
			_ = d.cmd.Process.Signal(syscall.SIGTERM)
			select {
			case <-d.exited:
			case <-time.After(10 * time.Second):
				_ = d.cmd.Process.Kill()
				<-d.exited
			}
		}
	}
	for range 5 {
		var st unix.Statfs_t
		if unix.Statfs(d.cfg.mountpoint, &st) != nil || st.Type != fuseSuperMagic {
			break
		}
		_ = unix.Unmount(d.cfg.mountpoint, unix.MNT_DETACH)
	}
	d.log.Close()
}

func (d *daemon) tail() string {
	b, _ := os.ReadFile(d.logPath)
	if len(b) > 2000 {
		b = b[len(b)-2000:]
	}
	return string(b)
}

// passthrough reports what the daemon logged about passthrough at mount.
func (d *daemon) passthrough() string {
	b, _ := os.ReadFile(d.logPath)
	for _, line := range bytes.Split(b, []byte("\n")) {
		if bytes.Contains(line, []byte("mounted layer store")) {
			if i := bytes.Index(line, []byte("passthrough=")); i >= 0 {
				return strings.Fields(string(line[i+len("passthrough="):]))[0]
			}
		}
	}
	return "?"
}

// cpu returns the daemon's user and system CPU time so far.
func (d *daemon) cpu() (float64, error) {
	return procCPU(d.cmd.Process.Pid)
}

// procCPU reads utime+stime of a process from /proc (in USER_HZ, 100 on Linux).
func procCPU(pid int) (float64, error) {
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

// layerStatus returns the status of the layer with blob digest dg, if the daemon has it.
func (d *daemon) layerStatus(ctx context.Context, dg digest.Digest) (layer.LayerStatus, layer.Status, bool, error) {
	st, err := d.client.Status(ctx)
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

// waitComplete polls the control socket until the layer is complete; poll is the interval.
func (d *daemon) waitComplete(ctx context.Context, dg digest.Digest, poll time.Duration, timeout time.Duration) (layer.LayerStatus, error) {
	deadline := time.Now().Add(timeout)
	for {
		ls, _, ok, err := d.layerStatus(ctx, dg)
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
			return ls, fmt.Errorf("daemon exited: %s", d.tail())
		case <-time.After(poll):
		}
	}
}
