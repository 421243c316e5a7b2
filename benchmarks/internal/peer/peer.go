// Package peer runs another additional layer store beside layerstore for the benchmarks' side
// by side figures: a binary with stargz-store's command line (`BIN --root DIR --config FILE
// [--addr SOCKET] MOUNTPOINT`), such as stargz-store itself. It owns that process: its config
// file (prefetch, background fetch, passthrough), the wait for its mount, its CPU time, and a
// stop by PID that never leaves a mount behind (package fuseproc; SIGINT is what
// stargz-store handles, SIGTERM would leave a dead mount).
//
// A store of this family serves a layer at <mountpoint>/<base64 ref>/<key>/diff, where key is
// the TOC digest (stargz-store 0.16 and later) or the blob digest (earlier versions, and what
// podman 4.x asks for); LayerDir finds which one answers.
package peer

import (
	"context"
	"encoding/base64"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/opencontainers/go-digest"

	"github.com/layerstore/layerstore/benchmarks/internal/fuseproc"
)

// Config is one start of the peer.
type Config struct {
	Bin        string // the peer's binary
	Dir        string // holds config, log, socket and the root (caches); removed by nobody here
	Mountpoint string // default Dir/mnt
	// Prefetch fetches the layer's prioritized part when it is resolved (stargz-store's
	// landmark prefetch); Background fetches the rest of the layer in the background.
	Prefetch, Background bool
	// Passthrough asks for FUSE passthrough (stargz-store 0.17 and later; older ones ignore it).
	Passthrough bool
}

// Store is a running peer; Stop ends it, Tail is the end of its log, CPU its CPU time so far.
type Store struct {
	*fuseproc.Proc
	Cfg Config
}

// Start writes the config, starts the peer and waits until its mount answers.
func Start(ctx context.Context, cfg Config) (*Store, error) {
	dir, err := filepath.Abs(cfg.Dir) // the peer runs in it
	if err != nil {
		return nil, err
	}
	cfg.Dir = dir
	if cfg.Mountpoint == "" {
		cfg.Mountpoint = filepath.Join(cfg.Dir, "mnt")
	}
	root := filepath.Join(cfg.Dir, "root")
	for _, d := range []string{root, cfg.Mountpoint} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return nil, err
		}
	}
	// Registries on 127.0.0.1 are plain HTTP to stargz-store without configuration.
	conf := fmt.Sprintf("noprefetch = %t\nno_background_fetch = %t\nno_prometheus = true\n\n[fuse]\npassthrough = %t\n",
		!cfg.Prefetch, !cfg.Background, cfg.Passthrough)
	confPath := filepath.Join(cfg.Dir, "config.toml")
	if err := os.WriteFile(confPath, []byte(conf), 0o644); err != nil {
		return nil, err
	}
	args := []string{"--root", root, "--config", confPath, "--log-level", "info"}
	// --addr (stargz-store 0.16+) defaults to a socket under /var/lib/stargz-store, and a
	// store that cannot bind it exits after mounting, leaving a dead mount.
	// The socket is named relative to the store's directory, its working directory: a unix
	// socket's path is at most 107 bytes, which a deep Dir exceeds (bind: invalid argument).
	if help, _ := exec.Command(cfg.Bin, "--help").CombinedOutput(); strings.Contains(string(help), "-addr") {
		args = append(args, "--addr", "store.sock")
	}
	cmd := exec.Command(cfg.Bin, append(args, cfg.Mountpoint)...)
	cmd.Dir = cfg.Dir
	p, err := fuseproc.Start(ctx, fuseproc.Spec{
		What:       "peer",
		Cmd:        cmd,
		Log:        filepath.Join(cfg.Dir, fmt.Sprintf("peer-%d.log", time.Now().UnixNano())),
		Mountpoint: cfg.Mountpoint,
		Stop:       os.Interrupt,
		Timeout:    30 * time.Second,
	})
	if err != nil {
		return nil, err
	}
	return &Store{Proc: p, Cfg: cfg}, nil
}

// LayerDir resolves the layer of ref in a store mounted at mnt: the directory
// <mnt>/<base64 ref>/<key> of the first key whose diff answers. Keys are tried in order (give
// the TOC digest and the blob digest); the error names every key's answer.
func LayerDir(mnt, ref string, keys ...digest.Digest) (string, error) {
	var errs []string
	for _, k := range keys {
		dir := filepath.Join(mnt, base64.StdEncoding.EncodeToString([]byte(ref)), k.String())
		if _, err := os.Stat(filepath.Join(dir, "diff")); err != nil {
			errs = append(errs, fmt.Sprintf("%s: %v", k, err))
			continue
		}
		return dir, nil
	}
	return "", fmt.Errorf("no key of %s answers: %s", ref, strings.Join(errs, "; "))
}
