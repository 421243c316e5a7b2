package e2e

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/opencontainers/go-digest"

	"github.com/layerstore/layerstore/internal/testutil/testregistry"
)

// runtimeTables is the daemon's [runtimes] table recording into graphroot.
func runtimeTables(graphroot string, record bool) string {
	return fmt.Sprintf("[runtimes]\nrecord-layers = %t\ngraphroots = [%q]\n", record, graphroot)
}

// storageFiles are the runtime's record files, by path under the graphroot.
var storageFiles = []string{"overlay-layers/layers.json", "overlay-images/images.json", "overlay-containers/containers.json"}

// storageSnapshot is each record file's entries, by id, as raw JSON.
type storageSnapshot map[string]map[string]json.RawMessage

// snapshotStorage reads graph's record files (a missing file is empty).
func snapshotStorage(t *testing.T, graph string) storageSnapshot {
	t.Helper()
	snap := storageSnapshot{}
	for _, f := range storageFiles {
		snap[f] = map[string]json.RawMessage{}
		b, err := os.ReadFile(filepath.Join(graph, f))
		if os.IsNotExist(err) || len(bytes.TrimSpace(b)) == 0 {
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		var entries []json.RawMessage
		if err := json.Unmarshal(b, &entries); err != nil {
			t.Fatalf("%s does not parse: %v", f, err)
		}
		for _, e := range entries {
			var id struct {
				ID string `json:"id"`
			}
			if err := json.Unmarshal(e, &id); err != nil {
				t.Fatalf("%s: %v", f, err)
			}
			snap[f][id.ID] = e
		}
	}
	return snap
}

// lostOrChanged lists the entries of before that after lacks or holds changed, but for the
// ids in mayChange (entries a step itself changes, as podman does to an image it runs).
func lostOrChanged(before, after storageSnapshot, mayChange map[string]bool) []string {
	var bad []string
	for f, entries := range before {
		for id, e := range entries {
			switch a, ok := after[f][id]; {
			case !ok:
				bad = append(bad, f+": lost "+id)
			case !bytes.Equal(a, e) && !mayChange[id]:
				bad = append(bad, f+": changed "+id)
			}
		}
	}
	return bad
}

// imageIDs are the ids of the images in snap: podman rewrites an image's record when it runs
// it (its digests, names).
func imageIDs(snap storageSnapshot) map[string]bool {
	ids := map[string]bool{}
	for id := range snap["overlay-images/images.json"] {
		ids[id] = true
	}
	return ids
}

// TestPodman5NewProcess: podman 5 (c/storage 1.59) pulls each lazy image through the store
// with `podman pull`; then, in new processes as after any restart, `podman images` lists it,
// `podman run --pull=never` runs it with the reference content, and `podman rmi` removes it:
// the daemon recorded in podman's layers.json the layers podman took from the store and did
// not record. No entry of podman's storage is lost or changed by the daemon. With the records
// turned off, the new process fails as the upstream issue says.
func TestPodman5NewProcess(t *testing.T) {
	s := need(t)
	refs := s.references(t)
	dir := t.TempDir()
	graph := filepath.Join(dir, "graph")
	d := s.startDaemonWith(t, daemonConfig{tables: runtimeTables(graph, true)})
	p := s.newRuntimeIn(t, dir, s.podman5, d.mnt, testregistry.RegistriesConf(s.open.Host, s.private.Host))
	for _, n := range []string{imgEStargz, imgZstdModern, imgWhiteout} {
		t.Run(n, func(t *testing.T) {
			img := s.images[n]
			before := snapshotStorage(t, graph)
			mark := s.open.Mark()
			p.must(t, "pull", img.ref)
			checkPull(t, img, s.open.BlobGets(mark), func(d digest.Digest) bool { return img.modern[d] })
			waitRecorded(t, graph, count(img.modern))
			pulled := snapshotStorage(t, graph)
			if bad := lostOrChanged(before, pulled, nil); len(bad) > 0 {
				t.Errorf("the pull: %v", bad)
			}
			out := p.must(t, "images", "--format", "{{.Repository}}:{{.Tag}} {{.Size}}")
			if !strings.Contains(out, img.ref) {
				t.Errorf("podman images in a new process:\n%s", out)
			}
			t.Logf("podman images: %s", out)
			out, stderr, err := p.runScript(t, img.ref, listScript, "--pull=never")
			if err != nil {
				t.Fatalf("podman run --pull=never in a new process: %v\n%s", err, stderr)
			}
			sameListing(t, n, out, refs[img.ref0])
			if bad := lostOrChanged(pulled, snapshotStorage(t, graph), imageIDs(pulled)); len(bad) > 0 {
				t.Errorf("the run: %v", bad)
			}
			p.must(t, "rmi", img.ref)
			if after := snapshotStorage(t, graph); len(after["overlay-layers/layers.json"]) != len(before["overlay-layers/layers.json"]) {
				t.Errorf("layers after rmi: %d, before the pull: %d", len(after["overlay-layers/layers.json"]), len(before["overlay-layers/layers.json"]))
			}
		})
	}
	t.Run("records off", func(t *testing.T) {
		dir := t.TempDir()
		d := s.startDaemonWith(t, daemonConfig{tables: runtimeTables(filepath.Join(dir, "graph"), false)})
		p := s.newRuntimeIn(t, dir, s.podman5, d.mnt, testregistry.RegistriesConf(s.open.Host, s.private.Host))
		img := s.images[imgEStargz]
		p.must(t, "pull", img.ref)
		_, stderr, err := p.runScript(t, img.ref, listScript, "--pull=never")
		t.Logf("without the daemon's records, podman run --pull=never in a new process: %v\n%s", err, stderr)
		if err == nil {
			t.Errorf("podman 5 ran the image from a new process without the daemon's records: is its c/storage fixed? (then the records are a no-op there: update docs/upstream-cstorage.md)")
		}
	})
}

// waitRecorded waits until graph's layers.json names n layers taken from the store.
func waitRecorded(t *testing.T, graph string, n int) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		marks, _ := filepath.Glob(filepath.Join(graph, "overlay", "*", "additionallayer"))
		layers := snapshotStorage(t, graph)["overlay-layers/layers.json"]
		recorded := 0
		for _, m := range marks {
			if _, ok := layers[filepath.Base(filepath.Dir(m))]; ok {
				recorded++
			}
		}
		if recorded >= n && recorded == len(marks) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d layers taken from the store recorded in layers.json, want %d", recorded, len(marks), n)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// TestPodman5RestartDuringOutage is TestRestartDuringOutage with podman 5: an image pulled
// lazily with `podman pull` and fetched completely runs with `podman run --pull=never`, a new
// process, after the daemon restarted with the registry stopped (a node's reboot during an
// outage), its layers answered from their records.
func TestPodman5RestartDuringOutage(t *testing.T) {
	s := need(t)
	refs := s.references(t)
	o := s.newOutage(t)
	img := o.img
	dir := t.TempDir()
	graph := filepath.Join(dir, "graph")
	d := s.startDaemonWith(t, o.daemonConfig(t, "", runtimeTables(graph, true)))
	p := s.newRuntimeIn(t, dir, s.podman5, d.mnt, o.conf)
	mark := o.Mark()
	p.must(t, "pull", img.ref)
	checkPull(t, img, o.BlobGets(mark), func(d digest.Digest) bool { return img.modern[d] })
	checkComplete(t, d, img, img.modern)
	waitRecorded(t, graph, count(img.modern))
	d.stop(syscall.SIGTERM)
	o.Stop()
	d.start(t)
	out, stderr, err := p.runScript(t, img.ref, listScript, "--pull=never")
	if err != nil {
		t.Fatalf("podman 5 run --pull=never with the registry down: %v\n%s", err, stderr)
	}
	sameListing(t, "podman 5 after a restart during an outage", out, refs[imgGzip])
	checkNoRegistry(t, d)
}

// killSteps are the steps of a record's write (internal/runtimestore's hook).
var killSteps = []string{"locked", "recorded-write", "temp-created", "temp-written", "temp-synced", "renamed"}

// TestRecordKilledAtEachStep: the daemon's write of a runtime's records killed (kill -9) at
// each of its steps, on real storage (c/storage 1.65, a lazily pulled eStargz image that no
// one recorded): layers.json still parses with every entry it had, and after the pass the
// next daemon makes at its start, CRI-O's steps pass (its start's GarbageCollect removes
// nothing of the image, images resolves it, a container of it lists the reference content).
// The write is internal/runtimestore's own, run by its test binary's helper process.
func TestRecordKilledAtEachStep(t *testing.T) {
	s := need(t)
	refs := s.references(t)
	helper := filepath.Join(t.TempDir(), "runtimestore.test")
	if out, err := run(t.Context(), nil, "go", "test", "-C", "..", "-c", "-o", helper, "./internal/runtimestore"); err != nil {
		t.Fatalf("building the runtimestore test binary: %v\n%s", err, out)
	}
	img := s.images[imgEStargz]
	for _, step := range killSteps {
		t.Run(step, func(t *testing.T) {
			c := s.newCRIO(t, "harness", "v1.65.", false)
			c.files = c.readFiles(t)
			r := c.pull(t, img)
			before := snapshotStorage(t, c.graph)
			recordStep := func(what string) (string, error) {
				cmd := exec.CommandContext(t.Context(), helper, "-test.run=^TestHelperProcess$")
				cmd.Env = append(os.Environ(), "RUNTIMESTORE_HELPER="+what, "RUNTIMESTORE_ARGS="+c.graph+"\x1f"+c.d.mnt+"\x1f"+step)
				out, err := cmd.CombinedOutput()
				return string(out), err
			}
			out, err := recordStep("kill")
			if ws, ok := waitStatusOf(err); !ok || ws.Signal() != syscall.SIGKILL {
				t.Fatalf("the write was not killed at %s: %v\n%s", step, err, out)
			}
			if bad := lostOrChanged(before, snapshotStorage(t, c.graph), nil); len(bad) > 0 {
				t.Errorf("after the kill: %v", bad)
			}
			if out, err := recordStep("record"); err != nil {
				t.Fatalf("the next pass: %v\n%s", err, out)
			}
			recorded := snapshotStorage(t, c.graph)
			if bad := lostOrChanged(before, recorded, nil); len(bad) > 0 {
				t.Errorf("after the next pass: %v", bad)
			}
			layers := pulledLayers(r)
			for _, id := range layers {
				if _, ok := recorded["overlay-layers/layers.json"][id]; !ok {
					t.Errorf("layer %s not recorded after the next pass", id)
				}
			}
			c.files = c.readFiles(t)
			st := c.start(t, false)
			if !st.GarbageCollect.empty() {
				t.Errorf("the start removed %+v", st.GarbageCollect)
			}
			c.checkImages(t, map[string][]string{r.ImageID: layers}, img.ref)
			c.checkRun(t, img, refs[img.ref0])
		})
	}
}

// waitStatusOf is the wait status of a command's error, when it exited or was killed.
func waitStatusOf(err error) (syscall.WaitStatus, bool) {
	var ee *exec.ExitError
	if !errors.As(err, &ee) {
		return 0, false
	}
	ws, ok := ee.Sys().(syscall.WaitStatus)
	return ws, ok
}

// TestRecordsNoOpOnPodman4: podman 4.3.1 (c/storage 1.45) records the layers it takes from
// the store itself: the daemon, recording into its graphroot, writes nothing (the runtime's
// entries are there when it looks), and a new podman process runs the image.
func TestRecordsNoOpOnPodman4(t *testing.T) {
	s := need(t)
	refs := s.references(t)
	dir := t.TempDir()
	graph := filepath.Join(dir, "graph")
	d := s.startDaemonWith(t, daemonConfig{tables: runtimeTables(graph, true)})
	p := s.newRuntimeIn(t, dir, "podman", d.mnt, testregistry.RegistriesConf(s.open.Host, s.private.Host))
	img := s.images[imgEStargz]
	p.must(t, "pull", img.ref)
	waitRecorded(t, graph, count(img.legacy))
	time.Sleep(time.Second) // the daemon's pass after the runtime's use of the layers
	if st := d.status(t); st.Runtimes == nil || st.Runtimes.Recorded != 0 || st.Runtimes.Failures != 0 {
		t.Errorf("the daemon wrote into podman 4's storage: %+v", st.Runtimes)
	}
	out, stderr, err := p.runScript(t, img.ref, listScript, "--pull=never")
	if err != nil {
		t.Fatalf("podman 4 run --pull=never: %v\n%s", err, stderr)
	}
	sameListing(t, "podman 4", out, refs[img.ref0])
}

// upstreamFix is the one line docs/upstream-cstorage.md proposes for c/storage's
// PutAdditionalLayer, and the line it follows.
const (
	upstreamFixAfter = "\tlayer.Created = time.Now().UTC()\n\n\tif err := aLayer.CreateAs(id, parent); err != nil {"
	upstreamFix      = "\tlayer.Created = time.Now().UTC()\n\tlayer.location = r.pickStoreLocation(false, false)\n\n\tif err := aLayer.CreateAs(id, parent); err != nil {"
)

// TestUpstreamFix: the harness built on c/storage 1.65 with the one-line fix of
// docs/upstream-cstorage.md (applied at build time to a copy of the module, through a replace
// in a module file of the test's own) runs CRI-O's storage life with the daemon's records
// turned off: c/storage records the layers itself and every step passes. A zstd:chunked
// image's size is then unknown to CRI-O: c/storage records the layer at once, with the size
// the lookup gave, before the tar-split is compared (docs/upstream-cstorage.md).
func TestUpstreamFix(t *testing.T) {
	s := need(t)
	refs := s.references(t)
	tmp := t.TempDir()
	out, err := run(t.Context(), nil, "go", "list", "-C", "harness", "-m", "-f", "{{.Dir}}", "go.podman.io/storage")
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	fixed := filepath.Join(tmp, "storage")
	if out, err := run(t.Context(), nil, "cp", "-r", strings.TrimSpace(out), fixed); err != nil {
		t.Fatal(err, out)
	}
	if out, err := run(t.Context(), nil, "chmod", "-R", "u+w", fixed); err != nil {
		t.Fatal(err, out)
	}
	layersGo := filepath.Join(fixed, "layers.go")
	src, err := os.ReadFile(layersGo)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Count(string(src), upstreamFixAfter) != 1 {
		t.Fatalf("c/storage's PutAdditionalLayer changed: the fix's place is not found once in %s", layersGo)
	}
	if err := os.WriteFile(layersGo, []byte(strings.Replace(string(src), upstreamFixAfter, upstreamFix, 1)), 0o644); err != nil {
		t.Fatal(err)
	}
	mod, err := os.ReadFile("harness/go.mod")
	if err != nil {
		t.Fatal(err)
	}
	sum, err := os.ReadFile("harness/go.sum")
	if err != nil {
		t.Fatal(err)
	}
	modfile := filepath.Join(tmp, "go.fixed.mod")
	if err := os.WriteFile(modfile, append(mod, "\nreplace go.podman.io/storage => "+fixed+"\n"...), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(strings.TrimSuffix(modfile, ".mod")+".sum", sum, 0o644); err != nil {
		t.Fatal(err)
	}
	bin := "harness-upstream-fix"
	if out, err := run(t.Context(), nil, "go", "build", "-C", "harness", "-modfile", modfile, "-o", filepath.Join(s.bin, bin),
		"-tags", "exclude_graphdriver_btrfs exclude_graphdriver_devicemapper containers_image_openpgp", "."); err != nil {
		t.Fatalf("building the harness with the fix: %v\n%s", err, out)
	}
	for _, n := range []string{imgEStargz, imgZstdModern} {
		t.Run(n, func(t *testing.T) {
			c := s.newCRIO(t, bin, "", false)
			c.sizeUnknown = n == imgZstdModern
			crioLife(t, c, s.images[n], refs[s.images[n].ref0])
			if st := c.d.status(t); st.Runtimes != nil {
				t.Errorf("the daemon recorded: %+v", st.Runtimes)
			}
		})
	}
}
