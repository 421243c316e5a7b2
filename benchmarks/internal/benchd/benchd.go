// Package benchd builds, starts and stops the real `layerstore serve` for the benchmarks: the
// -daemon flag and the binary it names or one built from the checkout, a config
// file per start, the mount awaited (statfs says FUSE and the control socket answers), the
// daemon's CPU time and layer status read while it runs, and a stop by PID that never leaves
// a mount behind (package fuseproc). A Daemon's methods are safe for concurrent use.
package benchd

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/opencontainers/go-digest"

	"github.com/layerstore/layerstore/benchmarks/internal/fuseproc"
	"github.com/layerstore/layerstore/internal/control/protocol"
)

// Flag defines -daemon, the layerstore binary a benchmark runs (see Binary).
func Flag(p *string) {
	flag.StringVar(p, "daemon", "", "layerstore binary to run (default: go build ./cmd/layerstore)")
}

// Binary is the daemon to run: given (a -daemon flag) when set, else one built now into
// dir/layerstore.
func Binary(ctx context.Context, modDir, given, dir string) (string, error) {
	if given != "" {
		return given, nil
	}
	bin := filepath.Join(dir, "layerstore")
	return bin, Build(ctx, modDir, bin)
}

// Build compiles the daemon of the layerstore module at modDir (`go build ./cmd/layerstore`)
// into out.
func Build(ctx context.Context, modDir, out string) error {
	fmt.Fprintln(os.Stderr, "building the daemon")
	cmd := exec.CommandContext(ctx, "go", "build", "-o", out, "./cmd/layerstore")
	cmd.Dir, cmd.Stdout, cmd.Stderr = modDir, os.Stderr, os.Stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("building the daemon: %w", err)
	}
	return nil
}

// Config is one start of `layerstore serve`.
type Config struct {
	Bin            string // the layerstore binary
	Dir            string // holds config, socket, log and, unless CacheDir is set, the cache
	CacheDir       string // default Dir/cache
	Mountpoint     string // default Dir/mnt
	RegistriesConf string // passed as --registries-conf when set
	Prefetch       bool
	Passthrough    bool
	Quiet          time.Duration // [prefetch] quiet when non-zero; the daemon's default otherwise
}

// Daemon is a running `layerstore serve`; Stop ends it, Tail is the end of its log, CPU its
// CPU time so far.
type Daemon struct {
	*fuseproc.Proc
	Cfg    Config
	Socket string
	Client *protocol.Client
}

// Start writes the config file, starts the daemon and waits until its mount and its control
// socket answer.
func Start(ctx context.Context, cfg Config) (*Daemon, error) {
	if cfg.CacheDir == "" {
		cfg.CacheDir = filepath.Join(cfg.Dir, "cache")
	}
	if cfg.Mountpoint == "" {
		cfg.Mountpoint = filepath.Join(cfg.Dir, "mnt")
	}
	socket := filepath.Join(cfg.Dir, "control.sock")
	quiet := ""
	if cfg.Quiet > 0 {
		quiet = fmt.Sprintf("quiet = %q\n", cfg.Quiet.String())
	}
	conf := fmt.Sprintf("cache-dir = %q\ncontrol-socket = %q\nlog-level = \"info\"\n\n[prefetch]\nenabled = %t\n%s\n[fuse]\npassthrough = %t\n",
		cfg.CacheDir, socket, cfg.Prefetch, quiet, cfg.Passthrough)
	confPath := filepath.Join(cfg.Dir, "config.toml")
	if err := os.WriteFile(confPath, []byte(conf), 0o644); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(cfg.Mountpoint, 0o755); err != nil {
		return nil, err
	}
	args := []string{"serve", "--config", confPath}
	if cfg.RegistriesConf != "" {
		args = append(args, "--registries-conf", cfg.RegistriesConf)
	}
	client := protocol.NewClient(socket)
	p, err := fuseproc.Start(ctx, fuseproc.Spec{
		What:       "daemon",
		Cmd:        exec.Command(cfg.Bin, append(args, cfg.Mountpoint)...),
		Log:        filepath.Join(cfg.Dir, fmt.Sprintf("daemon-%d.log", time.Now().UnixNano())),
		Mountpoint: cfg.Mountpoint,
		Stop:       syscall.SIGTERM,
		Timeout:    20 * time.Second,
		Ready:      func(ctx context.Context) error { _, err := client.Status(ctx); return err },
	})
	if err != nil {
		return nil, err
	}
	return &Daemon{Proc: p, Cfg: cfg, Socket: socket, Client: client}, nil
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

// LayerStatus returns the status of the layer with blob digest dg, if the daemon has it.
func (d *Daemon) LayerStatus(ctx context.Context, dg digest.Digest) (protocol.LayerStatus, protocol.Status, bool, error) {
	st, err := d.Client.Status(ctx)
	if err != nil {
		return protocol.LayerStatus{}, st, false, err
	}
	for _, l := range st.Layers {
		if l.Digest == dg.String() {
			return l, st, true, nil
		}
	}
	return protocol.LayerStatus{}, st, false, nil
}

// WaitComplete polls the control socket until the layer is complete; poll is the interval.
func (d *Daemon) WaitComplete(ctx context.Context, dg digest.Digest, poll time.Duration, timeout time.Duration) (protocol.LayerStatus, error) {
	deadline := time.Now().Add(timeout)
	for {
		ls, _, ok, err := d.LayerStatus(ctx, dg)
		if err != nil {
			return ls, err
		}
		if ok {
			switch ls.State {
			case protocol.StateComplete:
				return ls, nil
			case protocol.StateFailed, protocol.StateStopped:
				return ls, fmt.Errorf("background fetch %s: %s", ls.State, ls.Error)
			}
		}
		if time.Now().After(deadline) {
			return ls, fmt.Errorf("layer not complete after %v (state %q, %d of %d bytes)", timeout, ls.State, ls.Prefetched, ls.ToFetch)
		}
		select {
		case <-ctx.Done():
			return ls, ctx.Err()
		case <-d.Exited():
			return ls, fmt.Errorf("daemon exited: %s", d.Tail())
		case <-time.After(poll):
		}
	}
}
