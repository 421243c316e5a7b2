// Package podman5 builds podman 5 from its Go module, as a user building it from source
// would, for the end-to-end suite and the benchmarks to run beside Debian 12's podman 4.3.1:
// the current CLI on current containers/image and containers/storage (lookups by TOC
// digest). The binary is kept in the user's cache directory, where later runs on the same
// machine find it.
package podman5

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"
)

// Version is the podman 5 built.
const Version = "v5.6.2"

// Tags are its build tags: seccomp (libseccomp-dev), no btrfs or devicemapper graph drivers,
// OpenPGP in Go (no gpgme).
const Tags = "seccomp exclude_graphdriver_btrfs exclude_graphdriver_devicemapper containers_image_openpgp"

// Path is where Build keeps the binary: <user cache>/layerstore-e2e/podman-<Version>/podman.
func Path() (string, error) {
	cache, err := os.UserCacheDir()
	if err != nil {
		return "", err
	}
	return filepath.Join(cache, "layerstore-e2e", "podman-"+Version, "podman"), nil
}

// Built returns the path of the binary when a build of Version is there already.
func Built(ctx context.Context) (string, bool) {
	bin, err := Path()
	if err != nil {
		return "", false
	}
	out, err := exec.CommandContext(ctx, bin, "--version").CombinedOutput()
	return bin, err == nil && strings.Contains(string(out), strings.TrimPrefix(Version, "v"))
}

// Build returns the path of a podman 5 binary: the one built earlier (Built), or one built now
// from the module's source (through the module proxy), in a copy under scratch. The build
// takes a few minutes the first time and needs cgo and libseccomp-dev.
func Build(ctx context.Context, scratch string) (string, error) {
	if bin, ok := Built(ctx); ok {
		return bin, nil
	}
	bin, err := Path()
	if err != nil {
		return "", err
	}
	const mod = "github.com/containers/podman/v5"
	out, err := exec.CommandContext(ctx, "go", "mod", "download", "-json", mod+"@"+Version).Output()
	if err != nil {
		return "", fmt.Errorf("go mod download %s: %v\n%s", mod, err, out)
	}
	var dl struct{ Dir, Error string }
	if err := json.Unmarshal(out, &dl); err != nil || dl.Dir == "" {
		return "", fmt.Errorf("go mod download %s: %q: %v", mod, dl.Error, err)
	}
	// The module cache is read-only, and a module's zip has no vendor tree: build a writable
	// copy in module mode (its go.sum pins every dependency).
	src := filepath.Join(scratch, "podman-src")
	defer os.RemoveAll(src)
	for _, c := range [][]string{{"cp", "-r", dl.Dir, src}, {"chmod", "-R", "u+w", src}} {
		if out, err := exec.CommandContext(ctx, c[0], c[1:]...).CombinedOutput(); err != nil {
			return "", fmt.Errorf("%s: %v\n%s", strings.Join(c, " "), err, out)
		}
	}
	if err := os.RemoveAll(filepath.Join(src, "vendor")); err != nil {
		return "", err
	}
	if err := os.MkdirAll(filepath.Dir(bin), 0o755); err != nil {
		return "", err
	}
	tmp := bin + ".new"
	cmd := exec.CommandContext(ctx, "go", "build", "-C", src, "-tags", Tags, "-o", tmp, "./cmd/podman")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=1", "GOFLAGS=-mod=mod")
	cmd.WaitDelay = 10 * time.Second
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build podman %s: %v\n%s", Version, err, out)
	}
	return bin, os.Rename(tmp, bin)
}
