package layer

import (
	"os/exec"
	"strings"
	"testing"
)

// TestNoFUSE: the namespace's interfaces belong to package storefs, which wires FUSE; the
// layers it serves satisfy them without importing it, so that the core links no FUSE.
func TestNoFUSE(t *testing.T) {
	gobin, err := exec.LookPath("go")
	if err != nil {
		t.Skip("go is not on PATH")
	}
	out, err := exec.Command(gobin, "list", "-deps", ".").Output()
	if err != nil {
		t.Fatalf("go list -deps: %v", err)
	}
	for dep := range strings.FieldsSeq(string(out)) {
		if strings.Contains(dep, "go-fuse") || dep == "github.com/layerstore/layerstore/fs" {
			t.Errorf("package layer depends on %s", dep)
		}
	}
}
