package e2e

import (
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/opencontainers/go-digest"

	"github.com/layerstore/layerstore/internal/testutil/dockerregistry"
	"github.com/layerstore/layerstore/internal/testutil/testregistry"
	"github.com/layerstore/layerstore/layer"
)

// outage is a registry of one test's own, which the test stops, with the eStargz image on it.
type outage struct {
	*dockerregistry.Registry
	img  *image
	conf string // registries.conf text that lets the runtimes and the daemon reach it
}

func (s *suite) newOutage(t *testing.T) *outage {
	t.Helper()
	dir := t.TempDir()
	reg, err := dockerregistry.Start(t.Context(), dockerregistry.Config{DataDir: filepath.Join(dir, "data"), ConfDir: dir})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(reg.Stop)
	img, err := copyImage(t.Context(), reg, "outage/estargz:v1", authn.Anonymous, s.images[imgEStargz])
	if err != nil {
		t.Fatal(err)
	}
	return &outage{Registry: reg, img: img, conf: testregistry.RegistriesConf(reg.Host)}
}

// daemonConfig returns a daemon configuration reaching the registry, plus tables.
func (o *outage) daemonConfig(t *testing.T, top, tables string) daemonConfig {
	t.Helper()
	path := filepath.Join(t.TempDir(), "registries.conf")
	if err := os.WriteFile(path, []byte(o.conf), 0o644); err != nil {
		t.Fatal(err)
	}
	return daemonConfig{registries: path, top: top, tables: tables}
}

// checkComplete fails unless every layer of img the store serves is complete.
func checkComplete(t *testing.T, d *daemon, img *image, served map[digest.Digest]bool) {
	t.Helper()
	d.waitComplete(t, img)
	for _, l := range d.status(t).Layers {
		if served[l.Digest] && l.State != layer.StateComplete {
			t.Fatalf("layer %s: %s before the outage: %s", l.Digest, l.State, l.Error)
		}
	}
}

// checkNoRegistry checks the counters of a daemon that ran with its registry down: lookups
// answered from records, no failure (a request to the registry would have failed).
func checkNoRegistry(t *testing.T, d *daemon) {
	t.Helper()
	st := d.status(t)
	if st.Counters.FromRecords == 0 {
		t.Errorf("no lookup answered from a record: %+v", st.Counters)
	}
	if st.Counters.Failures != 0 {
		t.Errorf("%d failures with the registry down: the daemon asked it", st.Counters.Failures)
	}
	t.Logf("after the restart: %+v", st.Counters)
}

// TestRestartDuringOutage is the reboot of a node while its registry is down: an image pulled
// lazily and fetched completely runs after the daemon restarted with the registry stopped,
// its layers answered from their records and the cache (a stopped registry answers nothing,
// so any request would fail the run).
func TestRestartDuringOutage(t *testing.T) {
	s := need(t)
	refs := s.references(t)
	o := s.newOutage(t)
	img := o.img
	d := s.startDaemonWith(t, o.daemonConfig(t, "", ""))
	p := s.newPodmanWith(t, d.mnt, o.conf)
	mark := o.Mark()
	p.must(t, "pull", img.ref)
	checkPull(t, img, o.BlobGets(mark), func(d digest.Digest) bool { return img.legacy[d] })
	checkComplete(t, d, img, img.legacy)
	d.stop(syscall.SIGTERM)
	o.Stop()
	d.start(t)
	out, stderr, err := output(t.Context(), p.env, false, "podman", "run", "--rm", "--pull=never", "--net=none", img.ref,
		"/bin/busybox", "sh", "-c", listScript)
	if err != nil {
		t.Fatalf("podman run --pull=never with the registry down: %v\n%s", err, stderr)
	}
	sameListing(t, "after a restart during an outage", out, refs[imgGzip])
	checkNoRegistry(t, d)
}

// TestModernRestartDuringOutage is TestRestartDuringOutage with the modern runtime: the image
// pulled lazily is read after the daemon restarted with the registry stopped. The runtime
// reads it in the process that pulled it, as a CRI-O that outlives the daemon would: modern
// c/storage does not record layers taken from an additional layer store, so another process
// would not know the image (the README's known upstream issue).
func TestModernRestartDuringOutage(t *testing.T) {
	s := need(t)
	refs := s.references(t)
	o := s.newOutage(t)
	img := o.img
	d := s.startDaemonWith(t, o.daemonConfig(t, "", ""))
	h := s.newHarness(t, d.mnt, o.conf)
	mark := o.Mark()
	resume := h.pullPaused(t, img.ref, "--list", listScript, "--rmi")
	checkPull(t, img, o.BlobGets(mark), func(d digest.Digest) bool { return img.modern[d] })
	checkComplete(t, d, img, img.modern)
	d.stop(syscall.SIGTERM)
	o.Stop()
	d.start(t)
	r, err := resume()
	if err != nil {
		t.Fatalf("the pulled image with the registry down: %v", err)
	}
	checkAdditional(t, img, r)
	sameListing(t, "after a restart during an outage", r.Listing, refs[imgGzip])
	checkNoRegistry(t, d)
}
