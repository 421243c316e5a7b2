// Package harness builds the e2e suite's modern-runtime program (e2e/harness, its own module
// on current containers/image and containers/storage) for the benchmarks, which use it to
// produce zstd:chunked the way podman and buildah do (convert, compress).
package harness

import (
	"context"
	"fmt"
	"os/exec"
	"path/filepath"
)

// Tags are the build tags the harness needs: no btrfs or devicemapper headers, and c/image's
// pure-Go OpenPGP instead of gpgme.
const Tags = "exclude_graphdriver_btrfs exclude_graphdriver_devicemapper containers_image_openpgp"

// Build compiles the harness of the layerstore module at modDir into out; its modules come
// from the module cache or the proxy.
func Build(ctx context.Context, modDir, out string) error {
	cmd := exec.CommandContext(ctx, "go", "build", "-C", filepath.Join(modDir, "e2e", "harness"), "-o", out, "-tags", Tags, ".")
	if b, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("building the e2e harness: %v\n%s", err, b)
	}
	return nil
}
