package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/layerstore/layerstore/benchmarks/internal/podmanconf"
	"github.com/layerstore/layerstore/benchmarks/internal/podmanrun"
)

// podman is one podman binary with private containers.conf, storage.conf and registries.conf
// (CONTAINERS_CONF, CONTAINERS_STORAGE_CONF, CONTAINERS_REGISTRIES_CONF) and storage of its own:
// nothing under /etc/containers is read or changed.
type podman struct {
	*podmanrun.Podman
	name    string // "podman 4.3.1"
	timeout time.Duration
}

// newPodman writes the configuration into dir; store, when set, is the additional layer store.
// runroot must be a short path: podman 4.3.1 waits 20 s for the exit of every container whose
// run root is longer than about 45 characters.
func newPodman(name, bin, dir, runroot, store, registryHost string, timeout time.Duration) (*podman, error) {
	pm, err := podmanrun.New(bin, dir, podmanconf.Config{RunRoot: runroot, Store: store, RegistryHost: registryHost,
		IgnoreCgroupsV1Warning: true, Drop: podmanconf.SocketActivation})
	if err != nil {
		return nil, err
	}
	return &podman{Podman: pm, name: name, timeout: timeout}, nil
}

// result of one podman command.
type result struct {
	Stdout, Stderr string
	Err            error
	TimedOut       bool
	Took           time.Duration
}

// do runs podman with args, bounded by its timeout. Output goes to files, not pipes: conmon
// inherits podman's descriptors and may outlive it.
func (p *podman) do(ctx context.Context, args ...string) result {
	ctx, cancel := context.WithTimeout(ctx, p.timeout)
	defer cancel()
	outF, err := os.CreateTemp(p.Dir, "stdout-")
	if err != nil {
		return result{Err: err}
	}
	errF, err := os.CreateTemp(p.Dir, "stderr-")
	if err != nil {
		outF.Close()
		return result{Err: err}
	}
	defer func() {
		outF.Close()
		errF.Close()
		os.Remove(outF.Name())
		os.Remove(errF.Name())
	}()
	cmd := p.Command(ctx, args...)
	cmd.Stdout, cmd.Stderr = outF, errF
	cmd.WaitDelay = 10 * time.Second
	start := time.Now()
	err = cmd.Run()
	r := result{Err: err, Took: time.Since(start), TimedOut: ctx.Err() == context.DeadlineExceeded}
	o, _ := os.ReadFile(outF.Name())
	e, _ := os.ReadFile(errF.Name())
	r.Stdout, r.Stderr = string(o), string(e)
	if err != nil {
		r.Err = fmt.Errorf("%s %s: %w", p.name, args[0], err)
	}
	return r
}

// runWorkload runs the workload in a new container of ref.
func (p *podman) runWorkload(ctx context.Context, ref string) result {
	return p.do(ctx, "run", "--rm", "--net=none", ref, "/bin/busybox", "sh", "-c", workload)
}

// removeImages removes every container and image from the private storage. When podman fails
// to, or leaves layers taken from the store behind (podman 5 does not record them in
// layers.json, see docs/upstream-cstorage.md), the storage is wiped (its mounts
// detached, its directories removed), so that fromStore counts the next run's layers alone.
func (p *podman) removeImages(ctx context.Context) (wiped bool, why string) {
	r := p.do(ctx, "rmi", "--all", "--force")
	if r.Err != nil {
		p.wipe(ctx)
		return true, fmt.Sprintf("%v: %s", r.Err, podmanrun.LastLines(r.Stderr, 3))
	}
	if l := p.do(ctx, "images", "--quiet"); l.Err != nil || strings.TrimSpace(l.Stdout) != "" {
		p.wipe(ctx)
		return true, "images left after podman rmi --all"
	}
	if n := p.FromStore(); n > 0 {
		p.wipe(ctx)
		return true, fmt.Sprintf("%d layers taken from the store left after podman rmi --all", n)
	}
	return false, ""
}

// wipe removes the whole storage.
func (p *podman) wipe(ctx context.Context) {
	p.do(ctx, "rm", "--all", "--force", "--time", "0")
	podmanrun.UnmountUnder(p.RunRoot)
	podmanrun.UnmountUnder(filepath.Join(p.Dir, "graph"))
	os.RemoveAll(p.RunRoot)
	os.RemoveAll(filepath.Join(p.Dir, "graph"))
}

// command runs name with args and extra environment, bounded by ctx and 15 minutes, and
// returns its combined output.
func command(ctx context.Context, env []string, name string, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 15*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Env = podmanconf.CleanEnv(podmanconf.SocketActivation, env...)
	cmd.WaitDelay = 10 * time.Second
	out, err := cmd.CombinedOutput()
	return string(out), err
}
