package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/opencontainers/go-digest"

	"github.com/layerstore/layerstore/internal/control/protocol"
)

// TestProfileThroughMount: files read through the mount are recorded as the layer's startup
// profile (written when the daemon stops within the recording's window); after the cache lost
// the layer's content, the next daemon replays them first, says so in status and metrics, and
// `layerstore profiles export` and `import` carry the profile through a file.
func TestProfileThroughMount(t *testing.T) {
	e := newServeEnv(t)
	d := e.start()
	toc := digest.Digest(e.fixture.Desc.Annotations["io.github.containers.zstd-chunked.manifest-checksum"])
	diff := filepath.Join(e.layerDir(toc), "diff")
	for _, p := range []string{"usr/share/doc/deep/er/README", "usr/bin/tool"} {
		if _, err := os.ReadFile(filepath.Join(diff, p)); err != nil {
			t.Fatal(err)
		}
	}
	d.stop()
	for _, dir := range []string{"files", "partial"} {
		if err := os.RemoveAll(filepath.Join(e.dir, "cache", dir)); err != nil {
			t.Fatal(err)
		}
	}

	d = e.start()
	file := filepath.Join(t.TempDir(), "profiles.jsonl")
	var out, errb bytes.Buffer
	if code := run(t.Context(), []string{"profiles", "--control-socket", e.socket, "export", file}, &out, &errb); code != 0 {
		t.Fatalf("profiles export: %d %s", code, errb.String())
	}
	export, err := os.ReadFile(file)
	if err != nil || !strings.Contains(string(export), `"files":["usr/share/doc/deep/er/README","usr/bin/tool"]`) {
		t.Fatalf("export (%v):\n%s", err, export)
	}
	if _, err := os.Stat(diff); err != nil {
		t.Fatal(err)
	}
	e.waitComplete()
	st := e.status().Layers[0]
	if p := st.Profile; p == nil || p.Files != 2 || !p.SameLayer || p.Fetched == 0 {
		t.Errorf("status profile %+v, want 2 files of this layer replayed", p)
	}
	out.Reset()
	if code := run(t.Context(), []string{"status", "--control-socket", e.socket}, &out, &errb); code != 0 ||
		!strings.Contains(out.String(), "startup profile replayed first: 2 files") {
		t.Errorf("status: %d\n%s", code, out.String())
	}
	metrics, err := protocol.NewClient(e.socket).Metrics(t.Context())
	if err != nil || !strings.Contains(metrics, `layerstore_fetched_bytes_total{kind="profile"} `) ||
		strings.Contains(metrics, `layerstore_fetched_bytes_total{kind="profile"} 0`+"\n") {
		t.Errorf("metrics (%v): no profile bytes\n%s", err, metrics)
	}

	out.Reset()
	if code := run(t.Context(), []string{"profiles", "--control-socket", e.socket, "import", file}, &out, &errb); code != 0 ||
		!strings.Contains(out.String(), "imported the startup profiles of 1 repositories (1 layers)") {
		t.Errorf("profiles import: %d %s %s", code, out.String(), errb.String())
	}
	bad := filepath.Join(t.TempDir(), "bad")
	mustWrite(t, bad, "{\"format\":\"layerstore-profiles\",\"version\":1}\n{\"version\":1,\"repository\":\"x\",\"layers\":[{\"layer\":\"nope\",\"files\":[\"a\"]}]}\n")
	errb.Reset()
	if code := run(t.Context(), []string{"profiles", "--control-socket", e.socket, "import", bad}, &out, &errb); code != 1 ||
		!strings.Contains(errb.String(), "line 2") {
		t.Errorf("import of a bad file: %d %s", code, errb.String())
	}
	if code := run(t.Context(), []string{"profiles", "export"}, &out, &errb); code != 2 {
		t.Errorf("profiles export without a file: %d", code)
	}
	d.stop()
}
