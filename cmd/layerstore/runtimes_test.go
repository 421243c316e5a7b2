package main

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/opencontainers/go-digest"
)

// runtimeGraph makes a runtime's graphroot with an empty layers.json and returns it.
func runtimeGraph(t *testing.T) string {
	t.Helper()
	graph := filepath.Join(t.TempDir(), "graph")
	writeFile(t, filepath.Join(graph, "overlay-layers"), "layers.json", "[]", 0o600)
	return graph
}

// takeLayer makes graph/overlay/id as the overlay driver does for a layer taken from the store
// (additionallayer, link and l/<link>, lower naming the parent's link), without recording it.
func takeLayer(t *testing.T, graph, id, parent, al string) {
	t.Helper()
	graphLayer(t, graph, id, al)
	link := strings.ToUpper(id[:26])
	writeFile(t, filepath.Join(graph, "overlay", id), "link", link, 0o644)
	if err := os.MkdirAll(filepath.Join(graph, "overlay", "l"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("../"+id+"/diff", filepath.Join(graph, "overlay", "l", link)); err != nil {
		t.Fatal(err)
	}
	if parent != "" {
		writeFile(t, filepath.Join(graph, "overlay", id), "lower", "l/"+strings.ToUpper(parent[:26]), 0o644)
	}
}

// runtimeLayers reads graph's layers.json.
func runtimeLayers(t *testing.T, graph string) []map[string]any {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(graph, "overlay-layers", "layers.json"))
	if err != nil {
		t.Fatal(err)
	}
	var layers []map[string]any
	if err := json.Unmarshal(b, &layers); err != nil {
		t.Fatalf("layers.json: %v\n%s", err, b)
	}
	return layers
}

// TestDaemonRecordsRuntimeLayers: the daemon records in a runtime's layers.json the layers it
// took from the store without recording them: one taken before the daemon started, before it
// says it is ready; one taken while it runs, once the runtime's use of it reaches the store;
// each with the store's info, its parent and its id; status and metrics count them. With
// record-layers = false nothing is written.
func TestDaemonRecordsRuntimeLayers(t *testing.T) {
	e := newServeEnv(t)
	graph := runtimeGraph(t)
	cfg, _ := os.ReadFile(e.config)
	mustWrite(t, e.config, string(cfg)+"[runtimes]\ngraphroots = [\""+graph+"\"]\n")
	toc := digest.Digest(e.fixture.Desc.Annotations["io.github.containers.zstd-chunked.manifest-checksum"])
	base, top := strings.Repeat("a", 64), strings.Repeat("b", 64)
	takeLayer(t, graph, base, "", e.layerDir(toc))

	e.start()
	layers := runtimeLayers(t, graph)
	if len(layers) != 1 || layers[0]["id"] != base {
		t.Fatalf("after the start: %v", layers)
	}
	l := layers[0]
	if l["toc-digest"] != toc.String() || l["compressed-size"] != float64(e.fixture.Desc.Size) || l["parent"] != nil ||
		l["flags"].(map[string]any)["expected-layer-diffid"] != e.fixture.DiffID.String() {
		t.Errorf("the entry: %v", l)
	}

	// The runtime takes another layer on it and tells the store (its use file).
	takeLayer(t, graph, top, base, e.layerDir(toc))
	if f, err := os.Create(filepath.Join(e.layerDir(toc), "use")); err == nil {
		f.Close()
		t.Fatal("the store let the use file be created")
	}
	deadline := time.Now().Add(20 * time.Second)
	for len(runtimeLayers(t, graph)) < 2 && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	layers = runtimeLayers(t, graph)
	if len(layers) != 2 || layers[1]["id"] != top || layers[1]["parent"] != base {
		t.Fatalf("after the use: %v", layers)
	}
	// The recorder counts an entry once its write is done, just after the file changed.
	st := e.status()
	for (st.Runtimes == nil || st.Runtimes.Recorded < 2) && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
		st = e.status()
	}
	if st.Runtimes == nil || st.Runtimes.Recorded != 2 || len(st.Runtimes.Graphroots) != 1 || st.Runtimes.Graphroots[0] != graph {
		t.Errorf("status: %+v", st.Runtimes)
	}
	var metrics bytes.Buffer
	if code := run(t.Context(), []string{"status", "--control-socket", e.socket, "--json"}, &metrics, &metrics); code != 0 {
		t.Errorf("status: %d %s", code, metrics.String())
	}
	if !strings.Contains(metrics.String(), `"recorded": 2`) {
		t.Errorf("status --json:\n%s", metrics.String())
	}
}

// TestDaemonRecordsNothingWhenOff: record-layers = false writes nothing, and status says so.
func TestDaemonRecordsNothingWhenOff(t *testing.T) {
	e := newServeEnv(t)
	graph := runtimeGraph(t)
	cfg, _ := os.ReadFile(e.config)
	mustWrite(t, e.config, string(cfg)+"[runtimes]\nrecord-layers = false\ngraphroots = [\""+graph+"\"]\n")
	toc := digest.Digest(e.fixture.Desc.Annotations["io.github.containers.zstd-chunked.manifest-checksum"])
	takeLayer(t, graph, strings.Repeat("a", 64), "", e.layerDir(toc))
	e.start()
	time.Sleep(500 * time.Millisecond)
	if layers := runtimeLayers(t, graph); len(layers) != 0 {
		t.Errorf("recorded while off: %v", layers)
	}
	if st := e.status(); st.Runtimes != nil {
		t.Errorf("status: %+v", st.Runtimes)
	}
}

// TestRuntimeGraphroots: the configured graphroots, else storage.conf's and CRI-O's root (its
// drop-ins winning), cleaned and once each.
func TestRuntimeGraphroots(t *testing.T) {
	dir := t.TempDir()
	t.Setenv(storageConfEnv, writeFile(t, dir, "storage.conf", storageConfText("overlay", "/var/lib/podman-root/"), 0o644))
	defer func(c crioPaths) { crioConf = c }(crioConf)
	crioConf.file = writeFile(t, dir, "crio.conf", "[crio]\nroot = \"/var/lib/crio-first\"\n", 0o644)
	crioConf.dir = filepath.Join(dir, "crio.conf.d")
	writeFile(t, crioConf.dir, "10-root.conf", "[crio]\nroot = \"/var/lib/crio-root\"\n", 0o644)
	writeFile(t, crioConf.dir, "20-other.conf", "[crio.api]\nlisten = \"/run/other.sock\"\n", 0o644)
	writeFile(t, crioConf.dir, "ignored.txt", "[crio]\nroot = \"/nope\"\n", 0o644)
	want := []string{"/var/lib/podman-root", "/var/lib/crio-root"}
	if os.Geteuid() != 0 {
		want = want[:1] // a rootless daemon records into its user's storage only
	}
	if got := runtimeGraphroots(&Config{}); strings.Join(got, " ") != strings.Join(want, " ") {
		t.Errorf("discovered %v, want %v", got, want)
	}
	var cfg Config
	cfg.Runtimes.Graphroots = []string{"/a/", "/a", "relative", "/b"}
	if got := runtimeGraphroots(&cfg); strings.Join(got, " ") != "/a /b" {
		t.Errorf("configured: %v", got)
	}
	if c, _ := crioConf.read(); c.Crio.API.Listen != "/run/other.sock" {
		t.Errorf("CRI-O's socket %q", c.Crio.API.Listen)
	}
}

// TestDependentsCrioSocket: where CRI-O listens on the socket its configuration names,
// dependents reads CRI-O's root and --remove runs crictl told that socket; an image that lost
// its layers is listed as broken with the pull that mends it.
func TestDependentsCrioSocket(t *testing.T) {
	dir := t.TempDir()
	graph := filepath.Join(dir, "crio-root")
	sock := writeFile(t, dir, "crio.sock", "", 0o600) // exists: CRI-O runs
	defer func(c crioPaths) { crioConf = c }(crioConf)
	crioConf.file = writeFile(t, dir, "crio.conf", "[crio]\nroot = \""+graph+"\"\n[crio.api]\nlisten = \""+sock+"\"\n", 0o644)
	crioConf.dir = filepath.Join(dir, "none")
	t.Setenv(storageConfEnv, writeFile(t, dir, "storage.conf", storageConfText("overlay", filepath.Join(dir, "podman-root"), "/store:ref"), 0o644))
	args := filepath.Join(dir, "crictl-args")
	fakePath(t, map[string]string{"crictl": `echo "$@" >> ` + args})
	id := strings.Repeat("c", 64)
	graphLayer(t, graph, id, alPath("/store", "reg.example/app:v1", digest.FromString("x")))
	writeFile(t, filepath.Join(graph, "overlay-layers"), "layers.json", `[{"id":"`+id+`"}]`, 0o600)
	writeFile(t, filepath.Join(graph, "overlay-images"), "images.json",
		`[{"id":"img1","names":["reg.example/app:v1"],"layer":"`+id+`"},{"id":"img2","names":["reg.example/lost:v1"],"layer":"`+strings.Repeat("d", 64)+`"}]`, 0o600)

	var out, errb bytes.Buffer
	if code := runDependents(t.Context(), []string{"--json"}, &out, &errb); code != 1 {
		t.Errorf("exit %d: %s", code, errb.String())
	}
	var rep dependentsReport
	if err := json.Unmarshal(out.Bytes(), &rep); err != nil {
		t.Fatal(err)
	}
	if rep.GraphRoot != graph || len(rep.Images) != 1 || rep.Images[0].ID != "img1" {
		t.Errorf("report: %+v", rep)
	}
	if len(rep.Broken) != 1 || rep.Broken[0].ID != "img2" || rep.Broken[0].Fix != "crictl pull reg.example/lost:v1" {
		t.Errorf("broken: %+v", rep.Broken)
	}
	out.Reset()
	runDependents(t.Context(), []string{"--remove"}, &out, &errb)
	got, _ := os.ReadFile(args)
	if want := "--runtime-endpoint unix://" + sock + " rmi reg.example/app:v1\n"; string(got) != want {
		t.Errorf("crictl ran with %q, want %q", got, want)
	}
	if !strings.Contains(out.String(), "broken: reg.example/lost:v1") {
		t.Errorf("human report:\n%s", out.String())
	}
}

// TestCrioPinnedRefs: CRI-O's exact, glob and keyword patterns, as CRI-O reads them.
func TestCrioPinnedRefs(t *testing.T) {
	names := []string{"quay.io/app/web:v1", "quay.io/app/db:v2", "registry.k8s.io/pause:3.10", "docker.io/library/busybox:latest"}
	got := crioPinnedRefs([]string{"quay.io/app/*", "*pause*", "example.com/preload:v9", "*", "", "quay.io/app/web:v1", "mid*dle:v1"}, names)
	want := []string{"quay.io/app/web:v1", "quay.io/app/db:v2", "registry.k8s.io/pause:3.10", "example.com/preload:v9"}
	if strings.Join(got, " ") != strings.Join(want, " ") {
		t.Errorf("got %v, want %v", got, want)
	}
}

// TestDaemonPinsCrioPinnedImages: an image CRI-O's configuration pins (written while the
// daemon runs, as the pin-and-preload enhancement does before reloading CRI-O) is pinned by
// the daemon: fetched completely and listed under the pins of its status.
func TestDaemonPinsCrioPinnedImages(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("CRI-O's pins are followed by a daemon running as root")
	}
	e := newServeEnv(t)
	dir := t.TempDir()
	crio := filepath.Join(dir, "crio.conf")
	cfg, _ := os.ReadFile(e.config)
	mustWrite(t, e.config, string(cfg)+"[runtimes]\ngraphroots = [\""+runtimeGraph(t)+"\"]\ncrio-config = \""+crio+"\"\ncrio-config-dir = \""+filepath.Join(dir, "crio.conf.d")+"\"\n")
	mustWrite(t, crio, "[crio]\nroot = \""+filepath.Join(dir, "root")+"\"\n")
	e.start()
	if st := e.status(); len(st.Pins) != 0 {
		t.Fatalf("pins before CRI-O pins anything: %+v", st.Pins)
	}
	mustWrite(t, crio, "[crio]\nroot = \""+filepath.Join(dir, "root")+"\"\n[crio.image]\npinned_images = [\""+e.ref+"\"]\n")
	deadline := time.Now().Add(60 * time.Second)
	for {
		st := e.status()
		if len(st.Pins) == 1 && st.Pins[0].Ref == e.ref && st.Pins[0].Bytes > 0 && st.Pins[0].Present == st.Pins[0].Bytes {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("CRI-O's pinned image not pinned: %+v", st.Pins)
		}
		time.Sleep(200 * time.Millisecond)
	}
}
