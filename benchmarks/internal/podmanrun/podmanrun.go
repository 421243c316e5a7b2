// Package podmanrun is what the benchmarks that run podman (readybench, soak) share: a podman
// binary with the private configuration of podmanconf and storage of its own (Podman), the
// check of what such a benchmark needs before it starts (Preflight), the version check of a
// podman 5 binary, and the clean-up of the mounts podman leaves (UnmountUnder). A Podman holds
// no state beyond its paths and environment, and its methods are safe for concurrent use, as
// are the functions.
package podmanrun

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"

	"github.com/layerstore/layerstore/benchmarks/internal/benchenv"
	"github.com/layerstore/layerstore/benchmarks/internal/podmanconf"
	storefs "github.com/layerstore/layerstore/fs"
	"github.com/layerstore/layerstore/internal/mountinfo"
)

// Podman is one podman binary with private containers.conf, storage.conf and registries.conf
// (podmanconf) and storage of its own: its graph root below Dir, its run root at RunRoot.
type Podman struct {
	Bin     string
	Dir     string
	RunRoot string
	Env     []string // the environment pointing podman at its configuration
}

// New writes the configuration c into dir and returns podman bin run with it.
func New(bin, dir string, c podmanconf.Config) (*Podman, error) {
	env, err := podmanconf.Write(dir, c)
	if err != nil {
		return nil, err
	}
	return &Podman{Bin: bin, Dir: dir, RunRoot: c.RunRoot, Env: env}, nil
}

// Command is podman with args in its private configuration, bounded by ctx.
func (p *Podman) Command(ctx context.Context, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, p.Bin, args...)
	cmd.Env = p.Env
	return cmd
}

// FromStore counts the layers c/storage took from the additional layer store: it records the
// store's path in overlay/<id>/additionallayer.
func (p *Podman) FromStore() int {
	m, _ := filepath.Glob(filepath.Join(p.Dir, "graph", "overlay", "*", "additionallayer"))
	return len(m)
}

// Tool is a program a benchmark needs and the Debian package that has it.
type Tool struct{ Name, Package string }

// Preflight says what is missing for a benchmark running podman over a FUSE store: root (why:
// what it needs root for), FUSE, then podman, docker-registry, runc, fusermount3 and the
// benchmark's own tools, in that order.
func Preflight(why string, tools ...Tool) error {
	if os.Geteuid() != 0 {
		return errors.New("needs root: " + why)
	}
	if err := storefs.Usable(); err != nil {
		return err
	}
	need := append([]Tool{{"podman", "podman"}, {"docker-registry", "docker-registry"}, {"runc", "runc"}, {"fusermount3", "fuse3"}}, tools...)
	for _, t := range need {
		if _, err := exec.LookPath(t.Name); err != nil {
			return fmt.Errorf("%s not found: apt-get install -y %s", t.Name, t.Package)
		}
	}
	return nil
}

// Version5 is the version line of bin, and whether it is podman 5.
func Version5(bin string) (string, bool) {
	v := benchenv.ToolVersion(bin, "--version")
	return v, strings.Contains(v, "version 5.")
}

// ToolVersions are a report's lines naming the pieces the benchmark runs beside layerstore:
// podman (the one in $PATH, Debian 12's 4.3.1), runc and docker-registry.
func ToolVersions() []string {
	return []string{
		"podman 4 (podman in $PATH): " + benchenv.ToolVersion("podman", "--version"),
		"runc: " + benchenv.ToolVersion("runc", "--version"),
		"docker-registry: " + benchenv.ToolVersion("docker-registry", "--version"),
	}
}

// UnmountUnder detaches every mount below dir, deepest first.
func UnmountUnder(dir string) {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return
	}
	ms, _ := mountinfo.Parse(b)
	var mounts []string
	for _, m := range ms {
		if strings.HasPrefix(m.Point, dir+"/") {
			mounts = append(mounts, m.Point)
		}
	}
	slices.SortFunc(mounts, func(a, b string) int { return len(b) - len(a) })
	for _, m := range mounts {
		_ = syscall.Unmount(m, syscall.MNT_DETACH)
	}
}

// LastLines is the last n lines of s.
func LastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
