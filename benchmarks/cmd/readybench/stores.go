package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/opencontainers/go-digest"

	"github.com/layerstore/layerstore/benchmarks/internal/benchd"
	"github.com/layerstore/layerstore/benchmarks/internal/peer"
	"github.com/layerstore/layerstore/internal/control/protocol"
)

// store is an additional layer store under test: layerstore, or a peer given with -peer.
// Each is a column of the report.
type store interface {
	// name is the store's column in the report ("layerstore", "stargz-store").
	name() string
	// serves reports whether the store is measured with runtime rt.
	serves(rt string) bool
	// start mounts the store for runtime rt in a new directory dir, with its cache (or root)
	// in cacheDir, which may hold what an earlier run left (a warm cache).
	start(ctx context.Context, rt, dir, cacheDir string) (mountedStore, error)
}

// mountedStore is a running store.
type mountedStore interface {
	// mountpoint is what podman's storage.conf lists in additionallayerstores.
	mountpoint() string
	// waitComplete waits until the layers with these blob digests are fully local; a store
	// that cannot tell returns errCannotTell.
	waitComplete(ctx context.Context, layers []digest.Digest, timeout time.Duration) error
	// layers returns the status of the layers the store resolved, by blob digest; a store
	// that cannot tell returns errCannotTell.
	layers(ctx context.Context) (map[digest.Digest]protocol.LayerStatus, error)
	// stop ends the store by its PID and unmounts it.
	stop()
	// pid is the store's process.
	pid() int
}

var errCannotTell = errors.New("the store does not report its layers")

// layerstoreStore runs `layerstore serve` as a user would: background fetch (unless
// -no-prefetch) and FUSE passthrough on.
type layerstoreStore struct {
	bin            string
	registriesConf string
	prefetch       bool
	quiet          time.Duration // [prefetch] quiet, when set (-prefetch-quiet)
}

var _ store = (*layerstoreStore)(nil)

func (s *layerstoreStore) name() string { return "layerstore" }

func (s *layerstoreStore) serves(string) bool { return true }

func (s *layerstoreStore) start(ctx context.Context, _, dir, cacheDir string) (mountedStore, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	d, err := benchd.Start(ctx, benchd.Config{Bin: s.bin, Dir: dir, CacheDir: cacheDir,
		RegistriesConf: s.registriesConf, Prefetch: s.prefetch, Passthrough: true, Quiet: s.quiet})
	if err != nil {
		return nil, err
	}
	return &runningLayerstore{d}, nil
}

type runningLayerstore struct{ d *benchd.Daemon }

var _ mountedStore = (*runningLayerstore)(nil)

func (r *runningLayerstore) mountpoint() string { return r.d.Cfg.Mountpoint }
func (r *runningLayerstore) stop()              { r.d.Stop() }
func (r *runningLayerstore) pid() int           { return r.d.Cmd.Process.Pid }

// profiles runs `layerstore profiles VERB FILE` (export or import) against the daemon, and
// returns what it printed.
func (r *runningLayerstore) profiles(ctx context.Context, bin, verb, file string) (string, error) {
	out, err := exec.CommandContext(ctx, bin, "profiles", "--control-socket", r.d.Socket, verb, file).CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("layerstore profiles %s: %w: %s", verb, err, strings.TrimSpace(string(out)))
	}
	return strings.TrimSpace(string(out)), nil
}

func (r *runningLayerstore) layers(ctx context.Context) (map[digest.Digest]protocol.LayerStatus, error) {
	st, err := r.d.Client.Status(ctx)
	if err != nil {
		return nil, err
	}
	out := map[digest.Digest]protocol.LayerStatus{}
	for _, l := range st.Layers {
		out[digest.Digest(l.Digest)] = l
	}
	return out, nil
}

func (r *runningLayerstore) waitComplete(ctx context.Context, layers []digest.Digest, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for _, l := range layers {
		if _, err := r.d.WaitComplete(ctx, l, 50*time.Millisecond, time.Until(deadline)); err != nil {
			return fmt.Errorf("layer %s: %w", l, err)
		}
	}
	return nil
}

// peerStore runs another additional layer store with stargz-store's command line
// (benchmarks/internal/peer), a binary per runtime (stargz-store 0.15.1 for podman 4, which
// looks layers up by blob digest, and 0.16 or later for podman 5), configured as stargz-store
// ships: prefetch of the prioritized files and background fetch on, passthrough off. Its
// cache (its --root) is the cache directory, so that a warm run restarts it on the cache an
// earlier run filled.
type peerStore struct {
	bins map[string]string // runtime -> binary
}

var _ store = (*peerStore)(nil)

// name is the base name of its binaries (of podman 5's when they differ).
func (s *peerStore) name() string {
	for _, rt := range []string{rtPodman5, rtPodman4} {
		if b, ok := s.bins[rt]; ok {
			return filepath.Base(b)
		}
	}
	return "peer"
}

func (s *peerStore) serves(rt string) bool { _, ok := s.bins[rt]; return ok }

func (s *peerStore) start(ctx context.Context, rt, dir, cacheDir string) (mountedStore, error) {
	bin, ok := s.bins[rt]
	if !ok {
		return nil, fmt.Errorf("no peer binary for %s", rt)
	}
	if err := os.MkdirAll(cacheDir, 0o755); err != nil {
		return nil, err
	}
	p, err := peer.Start(ctx, peer.Config{Bin: bin, Dir: cacheDir, Mountpoint: filepath.Join(dir, "mnt"),
		Prefetch: true, Background: true})
	if err != nil {
		return nil, err
	}
	return &runningPeer{p}, nil
}

type runningPeer struct{ p *peer.Store }

var _ mountedStore = (*runningPeer)(nil)

func (r *runningPeer) mountpoint() string { return r.p.Cfg.Mountpoint }
func (r *runningPeer) stop()              { r.p.Stop() }
func (r *runningPeer) pid() int           { return r.p.Cmd.Process.Pid }

func (r *runningPeer) layers(context.Context) (map[digest.Digest]protocol.LayerStatus, error) {
	return nil, errCannotTell
}

func (r *runningPeer) waitComplete(context.Context, []digest.Digest, time.Duration) error {
	return errCannotTell
}
