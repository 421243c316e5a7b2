package e2e

import (
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/opencontainers/go-digest"

	"github.com/layerstore/layerstore/internal/testutil/testregistry"
)

// crioVersions are the harness builds that play CRI-O's storage: c/storage as CRI-O 1.35 to
// 1.37 vendor it (go.crio.mod), and the newest (go.mod).
var crioVersions = []struct{ name, bin, storage string }{
	{"c-storage-1.61", "harness-crio", "v1.61."},
	{"c-storage-1.65", "harness", "v1.65."},
}

// TestCRIOStorage: CRI-O's storage life with lazily pulled images, each step a new process
// of the harness as after a restart of CRI-O (see e2e/harness/crio.go): pull, start
// (GarbageCollect), images, run, a clean stop and start, an unclean stop (a container left
// mounted, its process killed) and the start after it (internal_repair: Check and Repair, then
// restore and GarbageCollect), repair, images, run and rmi. The daemon records in the
// runtime's layers.json the layers c/storage takes from the store without recording them, so
// every step finds them; no step loses or changes an entry of the runtime's storage files it
// did not itself remove. Also four concurrent pulls, and the records turned off: then the
// start's GarbageCollect removes the layers and the images fail with "layer not known".
func TestCRIOStorage(t *testing.T) {
	s := need(t)
	refs := s.references(t)
	for _, v := range crioVersions {
		t.Run(v.name, func(t *testing.T) {
			for _, n := range []string{imgEStargz, imgZstdModern} {
				t.Run(n, func(t *testing.T) {
					c := s.newCRIO(t, v.bin, v.storage, true)
					crioLife(t, c, s.images[n], refs[s.images[n].ref0])
				})
			}
			t.Run("concurrent-pulls", func(t *testing.T) {
				c := s.newCRIO(t, v.bin, v.storage, true)
				crioConcurrentPulls(t, c, []*image{s.images[imgEStargz], s.images[imgStargzZstd], s.images[imgZstdModern], s.images[imgWhiteout]})
			})
			t.Run("store-down-at-unclean-start", func(t *testing.T) {
				c := s.newCRIO(t, v.bin, v.storage, true)
				crioStoreDown(t, c, s.images[imgEStargz])
			})
			t.Run("records-off", func(t *testing.T) {
				c := s.newCRIO(t, v.bin, v.storage, false)
				crioWithoutRecords(t, c, s.images[imgEStargz])
			})
		})
	}
}

// crioLife takes img through CRI-O's storage steps; want is its reference listing.
func crioLife(t *testing.T, c *crioRuntime, img *image, want string) {
	c.files = c.readFiles(t)

	r := c.pull(t, img)
	imageID, layers := r.ImageID, pulledLayers(r)
	c.checkRecorded(t, imageID, layers)

	// The first start: no clean shutdown file yet, so no repair; GarbageCollect finds nothing.
	st := c.start(t, false)
	if !st.GarbageCollect.empty() || !st.Restore.empty() {
		t.Errorf("the first start removed something: garbage collection %+v, restore %+v", st.GarbageCollect, st.Restore)
	}
	c.checkFiles(t, "crio-start", st.GarbageCollect.ids(), nil)

	c.checkImages(t, map[string][]string{imageID: layers}, img.ref)
	c.checkRun(t, img, want)

	// A clean stop and start.
	var stop struct{ StillMounted []string }
	c.must(t, &stop, "crio-stop", "--clean-shutdown-file", c.cleanFile)
	st = c.start(t, false)
	if !st.GarbageCollect.empty() || !st.Restore.empty() {
		t.Errorf("the start after a clean stop removed something: garbage collection %+v, restore %+v", st.GarbageCollect, st.Restore)
	}
	c.checkFiles(t, "crio-start after a clean stop", st.GarbageCollect.ids(), nil)

	// An unclean stop: CRI-O killed with a container of the image mounted.
	ctr := c.runKilled(t, img)
	st = c.start(t, true)
	if st.Repair == nil {
		t.Fatal("the start after an unclean stop did not check the store")
	}
	t.Logf("internal_repair after the unclean stop: check %+v, repaired %v, removed %+v", st.Repair.Check, st.Repair.Repaired, st.Repair.Removed)
	for _, id := range append([]string{imageID}, layers...) {
		if slices.Contains(st.Repair.Removed.ids(), id) || slices.Contains(st.GarbageCollect.ids(), id) {
			t.Errorf("the start after an unclean stop removed %s of the image: repair %+v, garbage collection %+v", id, st.Repair.Removed, st.GarbageCollect)
		}
	}
	if !slices.Contains(st.Restore.Containers, ctr) {
		t.Errorf("the start after an unclean stop did not remove the container left behind (%s): restore %+v", ctr, st.Restore)
	}
	c.checkFiles(t, "crio-start after an unclean stop", slices.Concat(st.Repair.Removed.ids(), st.Restore.ids(), st.GarbageCollect.ids()), nil)

	var rep crioRepairOut
	c.must(t, &rep, "crio-repair")
	if rep.HasErrors || !rep.Removed.empty() {
		t.Errorf("crio-repair after the start: check %+v, removed %+v", rep.Check, rep.Removed)
	}
	c.checkFiles(t, "crio-repair", rep.Removed.ids(), nil)

	c.checkImages(t, map[string][]string{imageID: layers}, img.ref)
	c.checkRun(t, img, want)

	// crictl rmi: the image and its layers go, nothing else.
	var rmi struct {
		ImageID string
		Deleted bool
		Removed crioRemoved
	}
	c.must(t, &rmi, "rmi", img.ref)
	if !rmi.Deleted || rmi.ImageID != imageID {
		t.Errorf("rmi: %+v, want image %s deleted", rmi, imageID)
	}
	if got, want := slices.Sorted(slices.Values(rmi.Removed.Layers)), slices.Sorted(slices.Values(layers)); !slices.Equal(got, want) {
		t.Errorf("rmi removed the layers %v, want the image's %v", got, want)
	}
	c.checkFiles(t, "rmi", rmi.Removed.ids(), nil)
	for _, f := range []string{"overlay-layers/layers.json", "overlay-images/images.json"} {
		if n := len(c.files[f]); n != 0 {
			t.Errorf("%s: %d entries left after rmi: %v", f, n, slices.Collect(maps.Keys(c.files[f])))
		}
	}
	c.checkImages(t, map[string][]string{}, "")
}

// crioConcurrentPulls pulls imgs at once, one harness process each, then starts and lists.
func crioConcurrentPulls(t *testing.T, c *crioRuntime, imgs []*image) {
	c.files = c.readFiles(t)
	results := make([]pullResult, len(imgs))
	errs := make([]error, len(imgs))
	var wg sync.WaitGroup
	for i, img := range imgs {
		wg.Go(func() { results[i], errs[i] = c.tryPull(t, img.ref) })
	}
	wg.Wait()
	want := map[string][]string{}
	for i, img := range imgs {
		if errs[i] != nil && strings.Contains(errs[i].Error(), "layer not known") {
			// c/storage's own fault with concurrent pulls through an additional layer store
			// (TestConcurrentRuns): a process that took a layer from the store keeps it in memory
			// only, and loses it when it reloads layers.json after another process wrote it,
			// before the daemon's record of it is there (a zstd:chunked layer's waits up to 10 s
			// for its size, and a retry's write of another layer can drop it again). The kubelet
			// pulls again, with a back-off; so does this, up to five times.
			for try := 1; try <= 5 && errs[i] != nil && strings.Contains(errs[i].Error(), "layer not known"); try++ {
				t.Logf("concurrent pull of %s failed, pulled again (%d): %v", img.name, try, errs[i])
				time.Sleep(time.Duration(try) * time.Second)
				results[i], errs[i] = c.tryPull(t, img.ref)
			}
		}
		if errs[i] != nil {
			t.Fatalf("concurrent pull of %s: %v", img.name, errs[i])
		}
		checkAdditional(t, img, results[i])
		want[results[i].ImageID] = pulledLayers(results[i])
	}
	for id, layers := range want {
		c.checkRecorded(t, id, layers)
	}
	// A failed pull leaves the directories of the layers it took from the store, which no
	// image uses and nobody records: GarbageCollect removes them, and nothing else.
	st := c.start(t, false)
	for _, layers := range want {
		for _, id := range layers {
			if slices.Contains(st.GarbageCollect.ids(), id) {
				t.Errorf("GarbageCollect after the concurrent pulls removed layer %s of an image: %+v", id, st.GarbageCollect)
			}
		}
	}
	if len(st.GarbageCollect.Layers)+len(st.GarbageCollect.Images)+len(st.GarbageCollect.Containers) > 0 {
		t.Errorf("GarbageCollect removed records: %+v", st.GarbageCollect)
	}
	t.Logf("GarbageCollect after the concurrent pulls removed the directories %v", st.GarbageCollect.LayerDirs)
	c.checkFiles(t, "crio-start", st.GarbageCollect.ids(), nil)
	c.checkImages(t, want, "")

	// One image removed, the others kept: c/storage rewrites layers.json with the daemon's
	// records of the others in it, which must come out unchanged.
	last := results[len(results)-1]
	var rmi struct {
		Deleted bool
		Removed crioRemoved
	}
	c.must(t, &rmi, "rmi", last.ImageID)
	if !rmi.Deleted || !slices.Equal(rmi.Removed.Images, []string{last.ImageID}) {
		t.Errorf("rmi %s: %+v", last.ImageID, rmi)
	}
	for _, id := range rmi.Removed.Layers {
		if !slices.Contains(want[last.ImageID], id) {
			t.Errorf("rmi %s removed layer %s, not one of its own", last.ImageID, id)
		}
	}
	c.checkFiles(t, "rmi", rmi.Removed.ids(), nil)
	delete(want, last.ImageID)
	c.checkImages(t, want, "")
}

// crioWithoutRecords shows why the daemon records layers: without its records, c/storage's
// layers.json lacks the layers it took from the store, so the next process's GarbageCollect
// removes their directories and the image fails with "layer not known", until internal_repair
// removes it.
func crioWithoutRecords(t *testing.T, c *crioRuntime, img *image) {
	r := c.pull(t, img)
	var additional []string
	for _, l := range r.Layers {
		if l.Additional {
			additional = append(additional, l.ID)
		}
	}
	if len(additional) == 0 {
		t.Fatalf("no layer taken from the store: %+v", r.Layers)
	}
	time.Sleep(time.Second) // time for a record, which there must not be
	files := c.readFiles(t)
	for _, id := range additional {
		if _, ok := files["overlay-layers/layers.json"][id]; ok {
			t.Fatalf("c/storage recorded layer %s taken from the store in layers.json by itself: is it fixed upstream? (then the daemon's records are a no-op: update docs/upstream-cstorage.md)", id)
		}
	}
	st := c.start(t, false)
	t.Logf("without records, the start's GarbageCollect removed %+v", st.GarbageCollect)
	for _, id := range additional {
		if !slices.Contains(st.GarbageCollect.LayerDirs, id) {
			t.Errorf("GarbageCollect kept the directory of layer %s: %+v", id, st.GarbageCollect)
		}
	}
	var imgs crioImagesOut
	err := c.do(t, &imgs, "images")
	t.Logf("without records, images: %v", err)
	if err == nil || !strings.Contains(err.Error(), "layer not known") {
		t.Errorf("images without records: %v, want a failure with \"layer not known\"", err)
	}
	var run crioRunOut
	err = c.do(t, &run, "run", img.ref, "--list", listScript)
	t.Logf("without records, run: %v", err)
	if err == nil {
		t.Error("run without records succeeded")
	}
	var rep crioRepairOut
	err = c.do(t, &rep, "crio-repair")
	t.Logf("without records, crio-repair: check %+v, repaired %v, removed %+v, would wipe %v: %v", rep.Check, rep.Repaired, rep.Removed, rep.WouldWipe, err)
	if !rep.HasErrors {
		t.Error("crio-repair without records found nothing wrong")
	}
	if !slices.Contains(rep.Removed.Images, r.ImageID) && !rep.WouldWipe {
		t.Errorf("crio-repair without records neither removed image %s nor would wipe the store: %+v", r.ImageID, rep)
	}
	if !rep.WouldWipe {
		// The image is gone: CRI-O pulls it again, in full where the registry must serve it.
		c.files = c.readFiles(t)
		c.checkImages(t, map[string][]string{}, "")
	}
}

// crioRuntime is one CRI-O's storage, with its graph root, worked on by one harness build.
type crioRuntime struct {
	s         *suite
	bin       string // the harness build
	storage   string // the c/storage version it must report (a prefix)
	dir       string
	graph     string
	env       []string
	cleanFile string    // CRI-O's clean_shutdown_file
	files     crioFiles // the storage files after the last step checked
	d         *daemon   // serving its additional layer store
	// sizeUnknown accepts images without their true size (a c/storage that records a
	// zstd:chunked layer itself, at once, before the store knows the tar's size).
	sizeUnknown bool
}

// newCRIO starts a daemon recording (or, with record false, not recording) the layers into a
// new graph root, and returns the runtime of that graph root using the daemon's store.
func (s *suite) newCRIO(t *testing.T, bin, storage string, record bool) *crioRuntime {
	t.Helper()
	dir := t.TempDir()
	c := &crioRuntime{s: s, bin: filepath.Join(s.bin, bin), storage: storage, dir: dir, graph: filepath.Join(dir, "graph"),
		cleanFile: filepath.Join(dir, "crio", "clean.shutdown")}
	c.d = s.startDaemonWith(t, daemonConfig{tables: runtimeTables(c.graph, record)})
	c.env = s.runtimeEnv(t, dir, c.d.mnt, testregistry.RegistriesConf(s.open.Host))
	t.Cleanup(func() { unmountUnder(c.graph) }) // before the daemon stops
	return c
}

// do runs one harness step and decodes the JSON it printed into out (also when it failed).
func (c *crioRuntime) do(t *testing.T, out any, args ...string) error {
	t.Helper()
	start := time.Now()
	stdout, stderr, err := output(t.Context(), c.env, false, c.bin, append(args, "--timeout", "3m")...)
	t.Logf("harness %s: %s", args[0], time.Since(start).Round(time.Millisecond))
	if strings.TrimSpace(stdout) != "" {
		if jerr := json.Unmarshal([]byte(stdout), out); jerr != nil && err == nil {
			err = jerr
		}
	}
	if err != nil {
		return fmt.Errorf("harness %s: %v\n%s%s", args[0], err, stderr, stdout)
	}
	var lib struct{ Libraries struct{ Storage string } }
	if json.Unmarshal([]byte(stdout), &lib) == nil && lib.Libraries.Storage != "" && !strings.HasPrefix(lib.Libraries.Storage, c.storage) {
		return fmt.Errorf("harness %s: built with c/storage %s, want %s*", args[0], lib.Libraries.Storage, c.storage)
	}
	return nil
}

func (c *crioRuntime) must(t *testing.T, out any, args ...string) {
	t.Helper()
	if err := c.do(t, out, args...); err != nil {
		t.Fatal(err)
	}
}

func (c *crioRuntime) tryPull(t *testing.T, ref string) (pullResult, error) {
	t.Helper()
	var r pullResult
	err := c.do(t, &r, "pull", ref)
	return r, err
}

// pull pulls img lazily and checks that the layers a modern runtime looks up came from the
// store.
func (c *crioRuntime) pull(t *testing.T, img *image) pullResult {
	t.Helper()
	mark := c.s.open.Mark()
	r, err := c.tryPull(t, img.ref)
	if err != nil {
		t.Fatal(err)
	}
	checkPull(t, img, c.s.open.BlobGets(mark), func(d digest.Digest) bool { return img.modern[d] })
	checkAdditional(t, img, r)
	return r
}

func pulledLayers(r pullResult) []string {
	var ids []string
	for _, l := range r.Layers {
		ids = append(ids, l.ID)
	}
	return ids
}

// checkRecorded waits (30 s at most) until layers.json names every layer of the image (those
// taken from the store recorded by the daemon), then checks the pull's changes to the storage
// files (additions only), and that images.json names the image.
func (c *crioRuntime) checkRecorded(t *testing.T, imageID string, layers []string) {
	t.Helper()
	start := time.Now()
	for deadline := start.Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		recorded := c.readFiles(t)["overlay-layers/layers.json"]
		var missing []string
		for _, id := range layers {
			if _, ok := recorded[id]; !ok {
				missing = append(missing, id)
			}
		}
		if len(missing) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("layers.json lacks the layers %v of image %s after 30 s", missing, imageID)
		}
	}
	t.Logf("every layer of image %.12s in layers.json %s after the pull", imageID, time.Since(start).Round(time.Millisecond))
	c.checkFiles(t, "the pull", nil, func(string, string) bool { return true })
	if _, ok := c.files["overlay-images/images.json"][imageID]; !ok {
		t.Errorf("image %s not in images.json", imageID)
	}
}

// crioRemoved is what a step removed (removedItems in the harness).
type crioRemoved struct {
	Layers, Images, Containers, LayerDirs, ImageDirs, ContainerDirs []string
}

func (r crioRemoved) ids() []string {
	return slices.Concat(r.Layers, r.Images, r.Containers, r.LayerDirs, r.ImageDirs, r.ContainerDirs)
}

func (r crioRemoved) empty() bool { return len(r.ids()) == 0 }

// crioRepairOut is what internal_repair did (crio-repair's output, crio-start's "repair").
type crioRepairOut struct {
	Check struct {
		Layers, ROLayers, Images, ROImages, Containers map[string][]string
	}
	CheckError   string
	HasErrors    bool
	Repaired     bool
	RepairErrors []string
	WouldWipe    bool
	Removed      crioRemoved
}

// crioStartOut is crio-start's output.
type crioStartOut struct {
	Unclean             bool
	Repair              *crioRepairOut
	Restore             crioRemoved
	GarbageCollect      crioRemoved
	GarbageCollectError string
}

// start runs crio-start with the clean shutdown file; unclean is whether the last stop was.
func (c *crioRuntime) start(t *testing.T, unclean bool) crioStartOut {
	t.Helper()
	var st crioStartOut
	c.must(t, &st, "crio-start", "--clean-shutdown-file", c.cleanFile)
	if st.Unclean != unclean {
		t.Errorf("crio-start: unclean %v, want %v", st.Unclean, unclean)
	}
	return st
}

// crioImagesOut is the output of "harness images".
type crioImagesOut struct {
	Images []struct {
		ID       string
		Names    []string
		RepoTags []string
		TopLayer string
		Layers   []string
		Size     *uint64
		Error    string
	}
}

// checkImages lists the images as CRI-O does: exactly want (image ID to its layers, bottom
// first), each resolving with a size; name, if set, is a tag of one of them.
func (c *crioRuntime) checkImages(t *testing.T, want map[string][]string, name string) {
	t.Helper()
	var out crioImagesOut
	c.must(t, &out, "images")
	got := map[string]bool{}
	tagged := false
	for _, img := range out.Images {
		got[img.ID] = true
		layers, ok := want[img.ID]
		if !ok {
			t.Errorf("images: unexpected image %s %v", img.ID, img.Names)
			continue
		}
		// The true size, as a normal pull's: the layers' tar sizes (the busybox of every test
		// image alone is over 1 MiB). Without the layers' sizes CRI-O reports its config's
		// and manifest's bytes, a few kB.
		if !c.sizeUnknown && (img.Size == nil || *img.Size < 1<<20) {
			t.Errorf("images: image %s without its true size: %v", img.ID, img.Size)
		}
		if top := layers[len(layers)-1]; img.TopLayer != top {
			t.Errorf("images: image %s has the top layer %s, want %s", img.ID, img.TopLayer, top)
		}
		chain := slices.Clone(img.Layers)
		slices.Reverse(chain)
		if !slices.Equal(chain, layers) {
			t.Errorf("images: image %s has the layers %v, want %v", img.ID, chain, layers)
		}
		tagged = tagged || slices.Contains(img.RepoTags, name)
		if img.Size != nil {
			t.Logf("images: %v %s: size %d", img.RepoTags, img.ID[:12], *img.Size)
		}
	}
	for id := range want {
		if !got[id] {
			t.Errorf("images: image %s missing", id)
		}
	}
	if name != "" && !tagged {
		t.Errorf("images: no image tagged %s", name)
	}
	c.checkFiles(t, "images", nil, nil)
}

// crioRunOut is the output of "harness run".
type crioRunOut struct {
	ContainerID, LayerID, Listing string
	Removed                       bool
}

// checkRun runs the listing script in a container of img and compares with want.
func (c *crioRuntime) checkRun(t *testing.T, img *image, want string) {
	t.Helper()
	var r crioRunOut
	c.must(t, &r, "run", img.ref, "--list", listScript)
	sameListing(t, img.name+" in a container", r.Listing, want)
	if !r.Removed {
		t.Errorf("run: container %s not removed", r.ContainerID)
	}
	c.checkFiles(t, "run", nil, nil)
}

// runKilled runs a container of img and kills the harness while it holds the container
// mounted: CRI-O's unclean stop. It returns the container's ID.
func (c *crioRuntime) runKilled(t *testing.T, img *image) string {
	t.Helper()
	hold := filepath.Join(t.TempDir(), "hold")
	cmd := exec.CommandContext(t.Context(), c.bin, "run", img.ref, "--list", "echo held", "--hold", hold, "--timeout", "3m")
	cmd.Env = c.env
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	for deadline := time.Now().Add(2 * time.Minute); ; time.Sleep(50 * time.Millisecond) {
		if _, err := os.Stat(hold); err == nil {
			break
		}
		select {
		case err := <-done:
			t.Fatalf("harness run --hold ended before holding: %v\n%s", err, stderr.String())
		default:
		}
		if time.Now().After(deadline) {
			cmd.Process.Kill()
			t.Fatal("harness run --hold did not hold within 2 minutes")
		}
	}
	cmd.Process.Kill()
	<-done
	files := c.readFiles(t)
	ctrs := slices.Collect(maps.Keys(files["overlay-containers/volatile-containers.json"]))
	if len(ctrs) != 1 {
		t.Fatalf("%d volatile containers after the kill, want the one left behind: %v", len(ctrs), ctrs)
	}
	// The container and its layer (both volatile, as CRI-O makes them) are the step's own.
	c.checkFiles(t, "the killed run", nil, func(f, _ string) bool { return strings.Contains(f, "volatile-") })
	return ctrs[0]
}

// crioFiles are the entries of a runtime's storage files: file (under the graph root) to
// entry ID to the entry as canonical JSON.
type crioFiles map[string]map[string]string

var crioStorageFiles = []string{
	"overlay-layers/layers.json", "overlay-layers/volatile-layers.json",
	"overlay-images/images.json",
	"overlay-containers/containers.json", "overlay-containers/volatile-containers.json",
}

func (c *crioRuntime) readFiles(t *testing.T) crioFiles {
	t.Helper()
	files := crioFiles{}
	for _, f := range crioStorageFiles {
		files[f] = map[string]string{}
		b, err := os.ReadFile(filepath.Join(c.graph, f))
		if os.IsNotExist(err) || (err == nil && strings.TrimSpace(string(b)) == "") {
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		var entries []map[string]any
		if err := json.Unmarshal(b, &entries); err != nil {
			t.Fatalf("%s does not parse: %v", f, err)
		}
		for _, e := range entries {
			id, _ := e["id"].(string)
			canonical, _ := json.Marshal(e) // map keys sorted
			files[f][id] = string(canonical)
		}
	}
	return files
}

// checkFiles compares the storage files with those after the last step: an entry may be
// lost only if the step said it removed it (removed), none may change, and one may be
// added only where mayAdd says so (nil: nowhere).
func (c *crioRuntime) checkFiles(t *testing.T, step string, removed []string, mayAdd func(file, id string) bool) {
	t.Helper()
	after := c.readFiles(t)
	for _, f := range crioStorageFiles {
		for id, e := range c.files[f] {
			a, ok := after[f][id]
			switch {
			case !ok && !slices.Contains(removed, id):
				t.Errorf("%s: %s lost %s, which it did not say it removed:\n%s", step, f, id, e)
			case ok && a != e:
				t.Errorf("%s: %s changed %s:\nbefore %s\nafter  %s", step, f, id, e, a)
			}
		}
		for id, a := range after[f] {
			if _, ok := c.files[f][id]; !ok && (mayAdd == nil || !mayAdd(f, id)) {
				t.Errorf("%s: %s added %s:\n%s", step, f, id, a)
			}
		}
	}
	c.files = after
}

// crioStoreDown: an unclean stop, then CRI-O starts while the store is not mounted (its daemon
// not started yet): internal_repair's check cannot reach the layers taken from the store and
// the repair removes the images on them, records or not. Hence the unit's ordering
// (Before=crio.service, ready once mounted): the store must serve before CRI-O starts.
func crioStoreDown(t *testing.T, c *crioRuntime, img *image) {
	c.files = c.readFiles(t)
	r := c.pull(t, img)
	c.checkRecorded(t, r.ImageID, pulledLayers(r))
	c.start(t, false)
	c.runKilled(t, img)
	c.d.stop(syscall.SIGKILL)
	c.d.manager.Close() // the session lost: the mount goes, as after a reboot
	unmount(c.d.mnt)
	var st crioStartOut
	if err := c.do(t, &st, "crio-start", "--clean-shutdown-file", c.cleanFile); err != nil {
		t.Logf("unclean start with the store down: %v", err)
	}
	if st.Repair == nil {
		t.Fatal("the start after an unclean stop did not check the store")
	}
	t.Logf("unclean start with the store down: check %+v, repaired %v, removed %+v, repair errors %v, would wipe %v",
		st.Repair.Check, st.Repair.Repaired, st.Repair.Removed, st.Repair.RepairErrors, st.Repair.WouldWipe)
	if !slices.Contains(st.Repair.Removed.Images, r.ImageID) && !st.Repair.WouldWipe {
		t.Errorf("internal_repair with the store down kept image %s: has c/storage's check changed? (then update this test and docs/upstream-cstorage.md)", r.ImageID)
	}
	c.d.manager = nil
	c.d.start(t)
	if !st.Repair.WouldWipe {
		c.files = c.readFiles(t)
		c.checkImages(t, map[string][]string{}, "") // gone: CRI-O pulls it again
	}
}
