package e2e

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

// podman5Version is the podman 5 the suite builds from its Go module, as a user building it
// from source would, to run beside Debian 12's podman 4.3.1: the current CLI on current
// containers/image and containers/storage (lookups by TOC digest).
const podman5Version = "v5.6.2"

// podman5Tags are its build tags: seccomp (libseccomp-dev), no btrfs or devicemapper graph
// drivers, OpenPGP in Go (no gpgme).
const podman5Tags = "seccomp exclude_graphdriver_btrfs exclude_graphdriver_devicemapper containers_image_openpgp"

// buildPodman5 returns the path of a podman 5 binary: built once from the module's source
// (through the module proxy) and kept in the user's cache directory, where later runs on the
// same machine find it. The build takes a few minutes the first time.
func buildPodman5(ctx context.Context, scratch string) (string, error) {
	cache, err := os.UserCacheDir()
	if err != nil {
		return "", err
	}
	bin := filepath.Join(cache, "layerstore-e2e", "podman-"+podman5Version, "podman")
	if out, err := run(ctx, nil, bin, "--version"); err == nil && strings.Contains(out, strings.TrimPrefix(podman5Version, "v")) {
		return bin, nil
	}
	const mod = "github.com/containers/podman/v5"
	out, err := run(ctx, nil, "go", "mod", "download", "-json", mod+"@"+podman5Version)
	if err != nil {
		return "", fmt.Errorf("go mod download %s: %v\n%s", mod, err, out)
	}
	var dl struct{ Dir, Error string }
	if err := json.Unmarshal([]byte(out), &dl); err != nil || dl.Dir == "" {
		return "", fmt.Errorf("go mod download %s: %q: %v", mod, dl.Error, err)
	}
	// The module cache is read-only, and a module's zip has no vendor tree: build a writable
	// copy in module mode (its go.sum pins every dependency).
	src := filepath.Join(scratch, "podman-src")
	if out, err := run(ctx, nil, "cp", "-r", dl.Dir, src); err != nil {
		return "", fmt.Errorf("copy of %s: %v\n%s", dl.Dir, err, out)
	}
	if out, err := run(ctx, nil, "chmod", "-R", "u+w", src); err != nil {
		return "", fmt.Errorf("chmod: %v\n%s", err, out)
	}
	if err := os.RemoveAll(filepath.Join(src, "vendor")); err != nil {
		return "", err
	}
	if err := os.MkdirAll(filepath.Dir(bin), 0o755); err != nil {
		return "", err
	}
	tmp := bin + ".new"
	cmd := exec.CommandContext(ctx, "go", "build", "-C", src, "-tags", podman5Tags, "-o", tmp, "./cmd/podman")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=1", "GOFLAGS=-mod=mod")
	cmd.WaitDelay = 10 * time.Second
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build podman %s: %v\n%s", podman5Version, err, out)
	}
	os.RemoveAll(src)
	return bin, os.Rename(tmp, bin)
}
