package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/layerstore/layerstore/benchmarks/internal/podmanconf"
	"github.com/layerstore/layerstore/benchmarks/internal/podmanrun"
)

// podman is a podman binary (Debian's 4.3.1, or podman 5 built from its module) with private
// configuration and an empty storage of its own.
type podman struct {
	*podmanrun.Podman
	// oneCommand: pull and run in one `podman run`. podman 5 (c/storage up to at least 1.65)
	// does not record a layer taken from an additional layer store in layers.json, so that
	// the command after `podman pull` finds the image corrupted and pulls it again (docs/upstream-cstorage.md, when the daemon does not record the layers for it);
	// `podman run IMAGE` is one command either way.
	oneCommand bool
	removed    map[string]bool // containers removed already
}

// newPodman writes containers.conf, storage.conf (with store, a mountpoint, as the additional
// layer store unless empty) and registries.conf (registryHost is plain HTTP) into dir; the
// graph root is there too. runroot (c/storage's run root and libpod's tmp_dir) must be a short
// path: podman 4.3.1 waits 20 s for the exit of every container whose run root is longer than
// about 45 characters (measured here: 41 fine, 49 not).
func newPodman(bin string, oneCommand bool, dir, runroot, store, registryHost string) (*podman, error) {
	pm, err := podmanrun.New(bin, dir, podmanconf.Config{RunRoot: runroot, Store: store, RegistryHost: registryHost,
		IgnoreCgroupsV1Warning: true})
	if err != nil {
		return nil, err
	}
	return &podman{Podman: pm, oneCommand: oneCommand, removed: map[string]bool{}}, nil
}

// command is podman with args, bounded by ctx, its output appended to the log file. Files,
// not pipes: conmon inherits podman's descriptors and outlives it by many seconds after a
// short container, and exec.Cmd would wait for a pipe until conmon closes it.
func (p *podman) command(ctx context.Context, args ...string) (*exec.Cmd, func() string, error) {
	log, err := os.OpenFile(filepath.Join(p.Dir, "podman.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, nil, err
	}
	fmt.Fprintf(log, "\n$ podman %s\n", strings.Join(args, " "))
	off, _ := log.Seek(0, io.SeekEnd)
	cmd := p.Command(ctx, args...)
	cmd.Stdout, cmd.Stderr = log, log
	output := func() string {
		log.Close()
		b, _ := os.ReadFile(filepath.Join(p.Dir, "podman.log"))
		if int(off) <= len(b) {
			b = b[off:]
		}
		return podmanrun.LastLines(string(b), 20)
	}
	return cmd, output, nil
}

func (p *podman) do(ctx context.Context, args ...string) error {
	cmd, output, err := p.command(ctx, args...)
	if err != nil {
		return err
	}
	err = cmd.Run()
	out := output()
	if err != nil {
		return fmt.Errorf("podman %s: %w\n%s", strings.Join(args, " "), err, out)
	}
	return nil
}

// pull runs `podman pull ref` and returns how long it took.
func (p *podman) pull(ctx context.Context, ref string) (time.Duration, error) {
	start := time.Now()
	err := p.do(ctx, "pull", ref)
	return time.Since(start), err
}

// pullAndRun pulls ref and runs it (pull and run), or runs it at once, pulling it
// (oneCommand; pull is then 0).
func (p *podman) pullAndRun(ctx context.Context, ref, name, ready string, atReady func()) (pull, toReady, toExit time.Duration, err error) {
	if !p.oneCommand {
		if pull, err = p.pull(ctx, ref); err != nil {
			return 0, 0, 0, err
		}
	}
	toReady, toExit, err = p.run(ctx, ref, name, ready, atReady)
	return pull, toReady, toExit, err
}

// run runs `podman run --name name ref` (the image's own command) and returns how long until
// the workload printed a line starting with ready, and until podman exited. atReady, when not
// nil, is called when that line comes, before run returns.
func (p *podman) run(ctx context.Context, ref, name, ready string, atReady func()) (toReady, toExit time.Duration, err error) {
	cmd, output, err := p.command(ctx, "run", "--name", name, "--net=none", ref)
	if err != nil {
		return 0, 0, err
	}
	r, w, err := os.Pipe()
	if err != nil {
		output()
		return 0, 0, err
	}
	defer r.Close()
	cmd.Stdout = w
	start := time.Now()
	err = cmd.Start()
	w.Close()
	if err != nil {
		output()
		return 0, 0, err
	}
	var lines []string
	readerDone := make(chan struct{})
	go func() {
		defer close(readerDone)
		sc := bufio.NewScanner(r)
		for sc.Scan() {
			lines = append(lines, sc.Text())
			if toReady == 0 && strings.HasPrefix(sc.Text(), ready) {
				toReady = time.Since(start)
				if atReady != nil {
					atReady()
				}
			}
		}
	}()
	err = cmd.Wait()
	toExit = time.Since(start)
	// What podman wrote is in the pipe; conmon may hold its write end for a while yet.
	r.SetReadDeadline(time.Now().Add(time.Second))
	<-readerDone
	out := output()
	if err == nil && toReady == 0 {
		err = fmt.Errorf("no line starting with %q", ready)
	}
	if err != nil {
		return 0, 0, fmt.Errorf("podman run %s: %w\nstdout: %s\nstderr: %s", ref, err,
			podmanrun.LastLines(strings.Join(lines, "\n"), 10), out)
	}
	return toReady, toExit, nil
}

// remove removes the container (podman unmounts it) and then detaches any mount podman left
// under its directory. The storage itself is removed with the directory.
func (p *podman) remove(name string) {
	if p.removed[name] {
		return
	}
	p.removed[name] = true
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	p.do(ctx, "rm", "--force", "--time", "0", name)
	podmanrun.UnmountUnder(p.RunRoot)
	podmanrun.UnmountUnder(p.Dir)
	os.RemoveAll(p.RunRoot)
}
