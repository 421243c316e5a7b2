package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"time"

	"github.com/opencontainers/go-digest"
	"golang.org/x/sys/unix"

	"github.com/layerstore/layerstore/benchmarks/internal/benchd"
)

// store is an additional layer store under test: layerstore, or a peer given with -peer.
// Each is a column of the report.
type store interface {
	// name is the store's column in the report ("layerstore", "stargz-store").
	name() string
	// start mounts the store in a new directory dir, with its cache (or root) in cacheDir,
	// which may hold what an earlier run left (a warm cache).
	start(ctx context.Context, dir, cacheDir string) (mountedStore, error)
}

// mountedStore is a running store.
type mountedStore interface {
	// mountpoint is what podman's storage.conf lists in additionallayerstores.
	mountpoint() string
	// waitComplete waits until the layers with these blob digests are fully local; a store
	// that cannot tell returns errCannotTell.
	waitComplete(ctx context.Context, layers []digest.Digest, timeout time.Duration) error
	// stop ends the store by its PID and unmounts it.
	stop()
}

var errCannotTell = errors.New("the store does not report its layers")

// layerstoreStore runs `layerstore serve` as a user would (background fetch on), with FUSE
// passthrough as -passthrough says.
type layerstoreStore struct {
	bin            string
	registriesConf string
	passthrough    bool
	prefetch       bool
}

var _ store = (*layerstoreStore)(nil)

func (s *layerstoreStore) name() string { return "layerstore" }

func (s *layerstoreStore) start(ctx context.Context, dir, cacheDir string) (mountedStore, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	d, err := benchd.Start(ctx, benchd.Config{Bin: s.bin, Dir: dir, CacheDir: cacheDir,
		RegistriesConf: s.registriesConf, Prefetch: s.prefetch, Passthrough: s.passthrough})
	if err != nil {
		return nil, err
	}
	return &runningLayerstore{d}, nil
}

type runningLayerstore struct{ d *benchd.Daemon }

var _ mountedStore = (*runningLayerstore)(nil)

func (r *runningLayerstore) mountpoint() string { return r.d.Cfg.Mountpoint }
func (r *runningLayerstore) stop()              { r.d.Stop() }

func (r *runningLayerstore) waitComplete(ctx context.Context, layers []digest.Digest, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for _, l := range layers {
		if _, err := r.d.WaitComplete(ctx, l, 50*time.Millisecond, time.Until(deadline)); err != nil {
			return fmt.Errorf("layer %s: %w", l, err)
		}
	}
	return nil
}

// peerStore runs another additional layer store binary with the command line of
// stargz-store (containerd/stargz-snapshotter's store for CRI-O and podman):
//
//	PEER --root CACHEDIR --config DIR/config.toml MOUNTPOINT
//
// with a config marking the registry's (shaped) address as plain HTTP. It is written to that
// documented interface but has not been run here: no stargz-store binary was available.
type peerStore struct {
	bin          string
	registryHost string
}

var _ store = (*peerStore)(nil)

func (s *peerStore) name() string { return filepath.Base(s.bin) }

func (s *peerStore) start(ctx context.Context, dir, cacheDir string) (mountedStore, error) {
	mnt := filepath.Join(dir, "mnt")
	for _, d := range []string{mnt, cacheDir} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return nil, err
		}
	}
	conf := filepath.Join(dir, "config.toml")
	c := fmt.Sprintf("[[resolver.host.%q.mirrors]]\nhost = %q\ninsecure = true\n", s.registryHost, s.registryHost)
	if err := os.WriteFile(conf, []byte(c), 0o644); err != nil {
		return nil, err
	}
	logPath := filepath.Join(dir, "peer.log")
	lf, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(s.bin, "--root", cacheDir, "--config", conf, mnt)
	cmd.Stdout, cmd.Stderr = lf, lf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		lf.Close()
		return nil, err
	}
	r := &runningPeer{cmd: cmd, mnt: mnt, log: lf, logPath: logPath, exited: make(chan struct{})}
	go func() { cmd.Wait(); close(r.exited) }()
	deadline := time.Now().Add(30 * time.Second)
	for !isFUSE(mnt) {
		select {
		case <-r.exited:
			r.stop()
			return nil, fmt.Errorf("%s exited: %s", s.bin, tail(logPath, 2000))
		case <-ctx.Done():
			r.stop()
			return nil, ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			r.stop()
			return nil, fmt.Errorf("%s: no FUSE mount on %s after 30s: %s", s.bin, mnt, tail(logPath, 2000))
		}
	}
	return r, nil
}

type runningPeer struct {
	cmd     *exec.Cmd
	mnt     string
	log     *os.File
	logPath string
	exited  chan struct{}
}

var _ mountedStore = (*runningPeer)(nil)

func (r *runningPeer) mountpoint() string { return r.mnt }

func (r *runningPeer) waitComplete(context.Context, []digest.Digest, time.Duration) error {
	return errCannotTell
}

// stop: SIGTERM, SIGKILL after 10 s, then a lazy unmount of whatever is left.
func (r *runningPeer) stop() {
	select {
	case <-r.exited:
	default:
		r.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-r.exited:
		case <-time.After(10 * time.Second):
			r.cmd.Process.Kill()
			<-r.exited
		}
	}
	for range 5 {
		if !isFUSE(r.mnt) {
			break
		}
		unix.Unmount(r.mnt, unix.MNT_DETACH)
	}
	r.log.Close()
}

func isFUSE(p string) bool {
	var st unix.Statfs_t
	return unix.Statfs(p, &st) == nil && st.Type == benchd.FuseSuperMagic
}
