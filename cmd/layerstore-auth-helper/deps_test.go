package main

import (
	"os/exec"
	"strings"
	"testing"
)

// maxNonStd bounds the packages outside the standard library the helper links, itself and
// the project's own included.
const maxNonStd = 8

// TestDependencies: the container runtime runs the helper on every pull, so it links the
// standard library and the control protocol, not the daemon's FUSE, registry and
// containers/image code.
func TestDependencies(t *testing.T) {
	goCmd, err := exec.LookPath("go")
	if err != nil {
		t.Skip("no go command on PATH")
	}
	out, err := exec.CommandContext(t.Context(), goCmd, "list", "-deps", ".").Output()
	if err != nil {
		t.Fatalf("go list -deps: %v", err)
	}
	var nonStd []string
	for _, p := range strings.Fields(string(out)) {
		// A standard package's first path element has no dot (vendor/ and internal/ ones
		// included).
		if first, _, _ := strings.Cut(p, "/"); strings.Contains(first, ".") {
			nonStd = append(nonStd, p)
		}
	}
	if len(nonStd) > maxNonStd {
		t.Errorf("the helper links %d packages outside the standard library, more than %d:\n%s",
			len(nonStd), maxNonStd, strings.Join(nonStd, "\n"))
	}
	for _, p := range nonStd {
		for _, heavy := range []string{"github.com/hanwen/go-fuse/", "github.com/google/go-containerregistry/", "go.podman.io/"} {
			if strings.HasPrefix(p, heavy) {
				t.Errorf("the helper links %s", p)
			}
		}
	}
}
