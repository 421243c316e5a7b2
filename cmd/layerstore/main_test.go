package main

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/layerstore/layerstore/internal/testutil/testfuse"
)

// TestDemo runs the demo as the installed package does: the daemon built as the RPM builds
// it (-trimpath, so no source path is recorded; no cgo) and run from /, far from the source
// tree.
func TestDemo(t *testing.T) {
	testfuse.Require(t)
	bin := filepath.Join(t.TempDir(), "layerstore")
	build := exec.Command("go", "build", "-trimpath", "-o", bin, ".")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute)
	defer cancel()
	var out, errb bytes.Buffer
	cmd := exec.CommandContext(ctx, bin, "demo")
	cmd.Dir, cmd.Stdout, cmd.Stderr = "/", &out, &errb
	if err := cmd.Run(); err != nil {
		t.Fatalf("layerstore demo: %v\n%s%s", err, out.String(), errb.String())
	}
	s := out.String()
	for _, want := range []string{"estargz-prioritized", "zstd:chunked", "chunks-verified", "diffid-verified", "ENOENT", "input/output error", "all local in"} {
		if !strings.Contains(s, want) {
			t.Errorf("demo output lacks %q:\n%s", want, s)
		}
	}
}

// TestNoTestCodeLinked checks that the daemon links no test utility, not the testing
// package, and no test registry: every package linked is code the idle daemon maps (its
// binary's pages are most of its resident memory), and the demo's registry is its own small
// one.
func TestNoTestCodeLinked(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", ".").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	for _, p := range strings.Fields(string(out)) {
		if p == "testing" || strings.HasPrefix(p, "github.com/layerstore/layerstore/internal/test") ||
			p == "net/http/httptest" || p == "github.com/google/go-containerregistry/pkg/registry" {
			t.Errorf("layerstore links %s", p)
		}
	}
}

func TestUnknownCommand(t *testing.T) {
	var out, errb bytes.Buffer
	if code := run(t.Context(), []string{"bogus"}, &out, &errb); code != 2 || !strings.Contains(errb.String(), "unknown command") {
		t.Fatalf("code %d, stderr %q", code, errb.String())
	}
}
