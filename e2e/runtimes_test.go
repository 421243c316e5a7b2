package e2e

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/klauspost/compress/zstd"
	"github.com/opencontainers/go-digest"

	"github.com/layerstore/layerstore/internal/testutil/dockerregistry"
	"github.com/layerstore/layerstore/internal/testutil/testregistry"
)

// listScript prints one line per entry under /bin, /t and /w of an image, in the image's own
// busybox: path, raw mode, owner and mtime; then nlink, size and sha256 for files, the target
// for symlinks, major:minor for devices. Directory sizes and link counts depend on the
// filesystem, so they are left out. It needs no /dev (the modern harness runs it chrooted).
const listScript = `cd / && for d in bin t w; do [ ! -e $d ] || /bin/busybox find $d; done | /bin/busybox sort | while IFS= read -r f; do
  set -- $(/bin/busybox stat -c '%f %u %g %Y %h %s %t:%T' "$f")
  if [ -L "$f" ]; then x="$5 $6 -> $(/bin/busybox readlink "$f")"
  elif [ -d "$f" ]; then x=dir
  elif [ -f "$f" ]; then x="$5 $6 $(/bin/busybox sha256sum "$f" | /bin/busybox cut -d' ' -f1)"
  else x="$5 $7"; fi
  echo "$f $1 $2 $3 $4 $x"
done`

// storageConf is a private storage.conf; store, if set, is the additional layer store.
func storageConf(dir, store string) string {
	c := fmt.Sprintf("[storage]\ndriver = \"overlay\"\nrunroot = %q\ngraphroot = %q\n",
		runRoot(dir), filepath.Join(dir, "graph"))
	if store != "" {
		c += fmt.Sprintf("[storage.options]\nadditionallayerstores = [%q]\n", store+":ref")
	}
	return c
}

// runRoots maps a runtime's directory to its run root: a short path of its own, because
// podman 4.3.1 waits 20 s for the exit of every container whose run root is longer than about
// 45 characters (its conmon's socket paths), as the test's temporary directories are.
var runRoots sync.Map

// runRoot returns the run root of the runtime whose directory is dir, made on first use.
func runRoot(dir string) string {
	if r, ok := runRoots.Load(dir); ok {
		return r.(string)
	}
	r, err := os.MkdirTemp("", "lsr")
	if err != nil {
		r = filepath.Join(dir, "run")
	}
	actual, _ := runRoots.LoadOrStore(dir, r)
	return actual.(string)
}

// runtimeEnv writes private containers.conf, storage.conf and registries.conf into dir and
// returns the environment that points a runtime at them.
func (s *suite) runtimeEnv(t *testing.T, dir, store, registries string, extraEnv ...string) []string {
	t.Helper()
	containersConf := fmt.Sprintf(`[containers]
default_ulimits = ["nofile=20000:20000", "nproc=32768:32768"]
netns = "none"
[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "file"
tmp_dir = %q
[network]
network_config_dir = %q
`, filepath.Join(runRoot(dir), "libpod"), filepath.Join(dir, "networks"))
	t.Cleanup(func() { // after the runtime's own clean-up, registered later
		r := runRoot(dir)
		unmountUnder(r)
		os.RemoveAll(r)
		runRoots.Delete(dir)
	})
	files := map[string]string{"containers.conf": containersConf, "storage.conf": storageConf(dir, store), "registries.conf": registries}
	for n, c := range files {
		if err := os.WriteFile(filepath.Join(dir, n), []byte(c), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return s.env(append([]string{
		"CONTAINERS_CONF=" + filepath.Join(dir, "containers.conf"),
		"CONTAINERS_STORAGE_CONF=" + filepath.Join(dir, "storage.conf"),
		"CONTAINERS_REGISTRIES_CONF=" + filepath.Join(dir, "registries.conf"),
	}, extraEnv...)...)
}

// podman is a podman CLI with private configuration and storage: the machine's (Debian 12:
// 4.3.1, the legacy runtime, lookups by blob digest) or podman 5 (lookups by TOC digest).
type podman struct {
	bin        string // "podman" (found in $PATH) or the path of podman 5
	dir        string
	env        []string
	containers int // containers run so far, to name them
}

// newPodman returns podman using store (a daemon's mount, or "" for none).
func (s *suite) newPodman(t *testing.T, store string, extraEnv ...string) *podman {
	t.Helper()
	return s.newPodmanWith(t, store, testregistry.RegistriesConf(s.open.Host, s.private.Host), extraEnv...)
}

// newPodmanWith is newPodman with a registries.conf of the test's own.
func (s *suite) newPodmanWith(t *testing.T, store, registries string, extraEnv ...string) *podman {
	t.Helper()
	return s.newRuntime(t, "podman", store, registries, extraEnv...)
}

// newRuntime is newPodmanWith for the podman at bin ("podman" or suite.podman5).
func (s *suite) newRuntime(t *testing.T, bin, store, registries string, extraEnv ...string) *podman {
	t.Helper()
	return s.newRuntimeIn(t, t.TempDir(), bin, store, registries, extraEnv...)
}

// newRuntimeIn is newRuntime with its storage under dir (graphroot dir/graph), for a daemon
// told that graphroot before the runtime exists.
func (s *suite) newRuntimeIn(t *testing.T, dir, bin, store, registries string, extraEnv ...string) *podman {
	t.Helper()
	extraEnv = append([]string{"PODMAN_IGNORE_CGROUPSV1_WARNING=1"}, extraEnv...)
	p := &podman{bin: bin, dir: dir, env: s.runtimeEnv(t, dir, store, registries, extraEnv...)}
	t.Cleanup(func() {
		// Containers are run with --rm; this unmounts what podman left and frees the storage.
		run(context.Background(), p.env, p.bin, "system", "reset", "--force")
		unmountUnder(filepath.Join(dir, "graph"))
	})
	return p
}

func (p *podman) try(t *testing.T, args ...string) (string, error) {
	t.Helper()
	start := time.Now()
	out, err := run(t.Context(), p.env, p.bin, args...)
	t.Logf("podman %s: %s", args[0], time.Since(start).Round(time.Millisecond))
	return out, err
}

func (p *podman) must(t *testing.T, args ...string) string {
	t.Helper()
	out, err := p.try(t, args...)
	if err != nil {
		t.Fatalf("podman %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return out
}

// listing runs listScript in a container of ref.
func (p *podman) listing(t *testing.T, ref string) string {
	t.Helper()
	out, stderr, err := p.runScript(t, ref, listScript)
	if err != nil {
		t.Fatalf("podman run %s: %v\n%s", ref, err, stderr)
	}
	return out
}

// runScript runs script with the image's busybox sh in a container of ref, flags (such as
// --pull=never) added to podman run. The container is removed afterwards rather than with
// --rm: podman 4.3 sometimes misses the exit of a short-lived --rm container and waits for
// conmon's 20 s timeout.
func (p *podman) runScript(t *testing.T, ref, script string, flags ...string) (stdout, stderr string, err error) {
	t.Helper()
	p.containers++
	name := fmt.Sprintf("run-%d", p.containers)
	args := append(append([]string{"run", "--name", name, "--net=none"}, flags...), ref, "/bin/busybox", "sh", "-c", script)
	start := time.Now()
	stdout, stderr, err = output(t.Context(), p.env, false, p.bin, args...)
	t.Logf("podman run: %s", time.Since(start).Round(time.Millisecond))
	if _, rmErr := p.try(t, "rm", "--force", name); rmErr != nil && err == nil {
		t.Errorf("podman rm %s: %v", name, rmErr)
	}
	return stdout, stderr, err
}

// fromStore counts the layers c/storage took from an additional layer store: it records the
// store's path in overlay/<id>/additionallayer.
func fromStore(t *testing.T, graph string) int {
	t.Helper()
	m, err := filepath.Glob(filepath.Join(graph, "overlay", "*", "additionallayer"))
	if err != nil {
		t.Fatal(err)
	}
	return len(m)
}

// harness is the modern runtime: e2e/harness, one process per pull.
type harness struct {
	s   *suite
	dir string
	env []string
}

// newHarness returns the modern runtime using store; registries is its registries.conf.
func (s *suite) newHarness(t *testing.T, store, registries string, extraEnv ...string) *harness {
	t.Helper()
	dir := t.TempDir()
	h := &harness{s: s, dir: dir, env: s.runtimeEnv(t, dir, store, registries, extraEnv...)}
	t.Cleanup(func() { unmountUnder(filepath.Join(dir, "graph")) })
	return h
}

// pullResult is what `harness pull` prints.
type pullResult struct {
	ImageID string `json:"imageID"`
	Layers  []struct {
		ID                 string        `json:"id"`
		CompressedDigest   digest.Digest `json:"compressedDigest"`
		UncompressedDigest digest.Digest `json:"uncompressedDigest"`
		TOCDigest          digest.Digest `json:"tocDigest"`
		Additional         bool          `json:"additional"`
	} `json:"layers"`
	Listing      string          `json:"listing"`
	PushedLayers []digest.Digest `json:"pushedLayers"`
	Removed      bool            `json:"removed"`
	PullSeconds  float64         `json:"pullSeconds"`
}

// pull runs `harness pull ref args...`, which prints its result as JSON on stdout.
func (h *harness) pull(t *testing.T, ref string, args ...string) (pullResult, error) {
	t.Helper()
	var r pullResult
	out, stderr, err := output(t.Context(), h.env, false, filepath.Join(h.s.bin, "harness"), append([]string{"pull", ref}, args...)...)
	if err == nil {
		err = json.Unmarshal([]byte(out), &r)
	}
	if err != nil {
		return r, fmt.Errorf("harness pull %s: %v\n%s%s", ref, err, stderr, out)
	}
	return r, nil
}

// pullPaused runs `harness pull ref --pause FILE args...` and returns once the image is
// pulled, with a function that lets the harness go on and returns its result.
func (h *harness) pullPaused(t *testing.T, ref string, args ...string) (resume func() (pullResult, error)) {
	t.Helper()
	file := filepath.Join(t.TempDir(), "paused")
	done := make(chan struct{})
	var r pullResult
	var err error
	go func() {
		defer close(done)
		r, err = h.pull(t, ref, append([]string{"--pause", file}, args...)...)
	}()
	for deadline := time.Now().Add(2 * time.Minute); ; time.Sleep(50 * time.Millisecond) {
		if _, serr := os.Stat(file); serr == nil {
			break
		}
		select {
		case <-done:
			t.Fatalf("the harness ended before pausing: %v", err)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatal("the harness did not pause within 2 minutes")
		}
	}
	return func() (pullResult, error) {
		if err := os.Remove(file); err != nil {
			t.Fatal(err)
		}
		<-done
		return r, err
	}
}

// checkPull checks the registry log of one pull: no layer the runtime could take from the store
// downloaded in full, and every other layer downloaded normally.
func checkPull(t *testing.T, img *image, g map[digest.Digest]dockerregistry.Gets, lazy func(digest.Digest) bool) {
	t.Helper()
	for _, d := range img.layers {
		switch {
		case lazy(d) && g[d].Full > 0:
			t.Errorf("%s: lazy layer %s downloaded in full (%+v)", img.name, d, g[d])
		case !lazy(d) && g[d].Full == 0:
			t.Errorf("%s: plain layer %s not downloaded (%+v)", img.name, d, g[d])
		}
	}
	t.Logf("%s: registry requests per layer: %s", img.name, describeGets(img, g))
}

func describeGets(img *image, g map[digest.Digest]dockerregistry.Gets) string {
	var parts []string
	for _, d := range img.layers {
		kind := "plain"
		if _, ok := img.lazy[d]; ok {
			kind = "lazy"
		}
		parts = append(parts, fmt.Sprintf("%s %s: %d full, %d ranged, %d bytes", kind, d.Encoded()[:12], g[d].Full, g[d].Ranged, g[d].Bytes))
	}
	return strings.Join(parts, "; ")
}

// sameListing compares a listing with the reference one, line by line.
func sameListing(t *testing.T, what, got, want string) {
	t.Helper()
	if got == want {
		return
	}
	g, w := strings.Split(got, "\n"), strings.Split(want, "\n")
	for _, l := range w {
		if !slices.Contains(g, l) {
			t.Errorf("%s: missing or different: %q", what, l)
		}
	}
	for _, l := range g {
		if !slices.Contains(w, l) {
			t.Errorf("%s: unexpected: %q", what, l)
		}
	}
}

// checkArchive checks that the layers of a saved image (docker-archive or oci-archive) hash to
// want (the DiffIDs) once decompressed.
func checkArchive(t *testing.T, path string, want []digest.Digest) {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	files := map[string][]byte{}
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if files[h.Name], err = io.ReadAll(tr); err != nil {
			t.Fatal(err)
		}
	}
	type layerFile struct{ name, mediaType string }
	var layers []layerFile
	if b, ok := files["manifest.json"]; ok { // docker-archive: uncompressed layers
		var m []struct{ Layers []string }
		if err := json.Unmarshal(b, &m); err != nil || len(m) != 1 {
			t.Fatalf("%s: manifest.json: %v", path, err)
		}
		for _, l := range m[0].Layers {
			layers = append(layers, layerFile{name: l})
		}
	} else {
		var idx struct {
			Manifests []struct{ Digest digest.Digest }
		}
		if err := json.Unmarshal(files["index.json"], &idx); err != nil || len(idx.Manifests) != 1 {
			t.Fatalf("%s: neither a docker-archive nor an oci-archive of one image: %v", path, err)
		}
		var m struct {
			Layers []struct {
				MediaType string
				Digest    digest.Digest
			}
		}
		if err := json.Unmarshal(files["blobs/sha256/"+idx.Manifests[0].Digest.Encoded()], &m); err != nil {
			t.Fatal(err)
		}
		for _, l := range m.Layers {
			layers = append(layers, layerFile{"blobs/sha256/" + l.Digest.Encoded(), l.MediaType})
		}
	}
	var got []digest.Digest
	for _, l := range layers {
		var r io.Reader = bytes.NewReader(files[l.name])
		switch {
		case strings.HasSuffix(l.mediaType, "gzip"):
			zr, err := gzip.NewReader(r)
			if err != nil {
				t.Fatal(err)
			}
			r = zr
		case strings.HasSuffix(l.mediaType, "zstd"):
			zr, err := zstd.NewReader(r)
			if err != nil {
				t.Fatal(err)
			}
			defer zr.Close()
			r = zr
		}
		d, err := digest.SHA256.FromReader(r)
		if err != nil {
			t.Fatalf("%s: %v", l.name, err)
		}
		got = append(got, d)
	}
	if !slices.Equal(got, want) {
		t.Errorf("saved layers hash to %v, want the DiffIDs %v", got, want)
	}
}

// unmountUnder detaches every mount below dir (overlay mounts a runtime left behind).
func unmountUnder(dir string) {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return
	}
	lines := strings.Split(string(b), "\n")
	slices.Reverse(lines)
	for _, l := range lines {
		if f := strings.Fields(l); len(f) > 4 && strings.HasPrefix(f[4], dir+"/") {
			unmount(f[4])
		}
	}
}
