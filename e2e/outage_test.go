package e2e

import (
	"archive/tar"
	"bytes"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/opencontainers/go-digest"

	"github.com/layerstore/layerstore/internal/control/protocol"
	"github.com/layerstore/layerstore/internal/testutil/dockerregistry"
	"github.com/layerstore/layerstore/internal/testutil/testlayer"
	"github.com/layerstore/layerstore/internal/testutil/testregistry"
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
		if served[digest.Digest(l.Digest)] && l.State != protocol.StateComplete {
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
	out, stderr, err := p.runScript(t, img.ref, listScript, "--pull=never")
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
// would not know the image without the daemon's records (docs/upstream-cstorage.md), which this
// daemon does not write.
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

// fillerFiles is how many files the filler image has: more than the daemon keeps open (512),
// so that reading them all leaves files the cache can evict.
const fillerFiles = 600

// pushFiller pushes to the registry an image of one eStargz layer holding fillerFiles files of
// size random bytes, f0 to f599, content no other image shares, and describes it.
func (o *outage) pushFiller(t *testing.T, size int) *image {
	t.Helper()
	var es []tarEntry
	for i := range fillerFiles {
		data := make([]byte, size)
		rand.Read(data)
		es = append(es, tarEntry{Header: tar.Header{Typeflag: tar.TypeReg, Name: fmt.Sprintf("f%d", i), Mode: 0o644,
			Size: int64(size), ModTime: testlayer.Epoch, Format: tar.FormatPAX}, Data: data})
	}
	l, err := stargzLayer()("filler", testlayer.Build(es))
	if err != nil {
		t.Fatal(err)
	}
	img, err := testregistry.Image(testregistry.Platform{OS: runtime.GOOS, Architecture: runtime.GOARCH, Layers: []testregistry.LayerBlob{l}})
	if err != nil {
		t.Fatal(err)
	}
	ref := o.Host + "/outage/filler:v1"
	r, err := name.ParseReference(ref, name.Insecure)
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.Write(r, img, remote.WithContext(t.Context())); err != nil {
		t.Fatal(err)
	}
	out, err := describe(t.Context(), "filler", ref, nil)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// TestPinKilledAndResumed: a pin whose fetch the daemon's kill -9 interrupted is listed by
// status at once after the next start, and completed by the daemon itself, nobody pinning
// again; its content then stays in a cache filled past its bound by another image, and the
// image runs with the registry down.
func TestPinKilledAndResumed(t *testing.T) {
	s := need(t)
	refs := s.references(t)
	o := s.newOutage(t)
	img := o.img
	filler := o.pushFiller(t, 8<<10)
	// The bandwidth bound makes the pin's fetch last seconds, so that the kill comes in its
	// middle; no background fetch but the pin's; a cache bound below what is pinned.
	d := s.startDaemonWith(t, o.daemonConfig(t, "cache-max-size = \"1MiB\"\n", "[prefetch]\nenabled = false\nbandwidth = \"1MiB\"\n"))
	p := s.newPodmanWith(t, d.mnt, o.conf)
	p.must(t, "pull", img.ref)

	pin := exec.Command(filepath.Join(s.bin, "layerstore"), "pin", "--control-socket", d.socket, img.ref)
	pin.Env = d.env
	var pinOut bytes.Buffer
	pin.Stdout, pin.Stderr = &pinOut, &pinOut
	if err := pin.Start(); err != nil {
		t.Fatal(err)
	}
	pinDone := make(chan error, 1)
	go func() { pinDone <- pin.Wait() }()
	t.Cleanup(func() { pin.Process.Kill(); <-pinDone })
	var before protocol.Pin
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(20 * time.Millisecond) {
		if ps := d.status(t).Pins; len(ps) == 1 && ps[0].Present > 0 {
			before = ps[0]
			break
		}
		select {
		case err := <-pinDone:
			pinDone <- err
			t.Fatalf("layerstore pin ended before fetching anything: %v\n%s", err, pinOut.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatal("no pin fetching after a minute")
		}
	}
	d.stop(syscall.SIGKILL)
	if before.Present >= before.Bytes {
		t.Fatalf("pin complete before the kill (%+v): the test shows nothing", before)
	}
	t.Logf("killed with %d of %d bytes of the pin local", before.Present, before.Bytes)

	d.start(t)
	if ps := d.status(t).Pins; len(ps) != 1 || ps[0].Ref != img.ref {
		t.Fatalf("pins right after the start: %+v", ps)
	}
	var after protocol.Pin
	for deadline := time.Now().Add(2 * time.Minute); ; time.Sleep(100 * time.Millisecond) {
		after = d.status(t).Pins[0]
		if after.Present == after.Bytes {
			break
		}
		if after.Error != "" || time.Now().After(deadline) {
			t.Fatalf("pin not completed after the restart: %+v", after)
		}
	}
	if after.Error != "" {
		t.Errorf("complete pin with an error: %q", after.Error)
	}

	// Another image's content, far past the cache's bound, read through the store.
	fillerDiff := filepath.Join(d.layerDir(filler.ref, filler.lazy[filler.layers[0]]), "diff")
	for i := range fillerFiles {
		if b, err := os.ReadFile(filepath.Join(fillerDiff, fmt.Sprintf("f%d", i))); err != nil || len(b) != 8<<10 {
			t.Fatalf("reading the filler image: %d bytes, %v", len(b), err)
		}
	}
	for deadline := time.Now().Add(30 * time.Second); d.status(t).Cache.Evictions == 0; time.Sleep(100 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("nothing evicted from a cache past its bound: %+v", d.status(t).Cache)
		}
	}
	st := d.status(t)
	if q := st.Pins[0]; q.Present != q.Bytes {
		t.Errorf("pinned content evicted: %+v (cache %+v)", q, st.Cache)
	}
	t.Logf("cache after the filler: %+v", st.Cache)

	o.Stop()
	out, stderr, err := p.runScript(t, img.ref, listScript, "--pull=never")
	if err != nil {
		t.Fatalf("podman run --pull=never with the registry down: %v\n%s", err, stderr)
	}
	sameListing(t, "pinned, after a kill -9, with the registry down", out, refs[imgGzip])
}

// partialReadTimeout is the daemon's read timeout in TestPartialRestartDuringOutage.
const partialReadTimeout = 5 * time.Second

// partialScript reads, in the image's busybox, a file read before the restart (cached) and
// one never read (its content is not local): the first is printed with its sha256, the second
// fails with EIO. It exits 0 either way.
const partialScript = `/bin/busybox sha256sum /t/usr/bin/tool
if /bin/busybox cat /t/random.bin >/dev/null; then echo "random.bin: read"; else echo "random.bin: failed"; fi`

// TestPartialRestartDuringOutage is the reboot during a registry outage of a node whose image
// was only partly fetched (no background fetch): after a restart (a clean stop: chunks read
// just before a kill -9 may not be stored yet, and are fetched again), reads of the files read
// before it succeed with their content, reads of a file never read fail with EIO within the
// daemon's read timeout (a bound, with a margin for the runtime's own work), for both runtimes.
func TestPartialRestartDuringOutage(t *testing.T) {
	s := need(t)
	refs := s.references(t)
	var wantTool string // sha256 of /t/usr/bin/tool in the reference image
	for l := range strings.Lines(refs[imgGzip]) {
		if f := strings.Fields(l); len(f) > 0 && f[0] == "t/usr/bin/tool" {
			wantTool = f[len(f)-1]
		}
	}
	if wantTool == "" {
		t.Fatalf("no t/usr/bin/tool in the reference listing:\n%s", refs[imgGzip])
	}
	tables := fmt.Sprintf("[layers]\nread-timeout = %q\n[prefetch]\nenabled = false\n", partialReadTimeout)
	// check checks the script's output and how long the run took.
	check := func(t *testing.T, out string, elapsed time.Duration) {
		t.Helper()
		if !strings.Contains(out, wantTool+"  /t/usr/bin/tool") {
			t.Errorf("the cached file after the restart: %q, want sha256 %s", out, wantTool)
		}
		if !strings.Contains(out, "random.bin: failed") {
			t.Errorf("a file never fetched read with the registry down: %q", out)
		}
		if bound := partialReadTimeout + 30*time.Second; elapsed > bound {
			t.Errorf("the run took %s, more than the read timeout (%s) and a margin", elapsed, partialReadTimeout)
		}
		t.Logf("run with the registry down: %s", elapsed.Round(time.Millisecond))
	}
	// direct reads, through the store's mount, the cached file and the missing one, timed.
	direct := func(t *testing.T, d *daemon, img *image, key digest.Digest) {
		t.Helper()
		diff := filepath.Join(d.layerDir(img.ref, key), "diff")
		b, err := os.ReadFile(filepath.Join(diff, "t/usr/bin/tool"))
		if sum := sha256.Sum256(b); err != nil || hex.EncodeToString(sum[:]) != wantTool {
			t.Errorf("cached file through the store: %v, sha256 %x, want %s", err, sum, wantTool)
		}
		start := time.Now()
		_, err = os.ReadFile(filepath.Join(diff, "t/random.bin"))
		elapsed := time.Since(start)
		if !errors.Is(err, syscall.EIO) {
			t.Errorf("file never fetched, registry down: %v, want EIO", err)
		}
		if bound := partialReadTimeout + 5*time.Second; elapsed > bound {
			t.Errorf("the failing read took %s, more than the read timeout (%s) and a margin", elapsed, partialReadTimeout)
		}
		t.Logf("failing read through the store: %s (%v)", elapsed.Round(time.Millisecond), err)
	}
	contentLayer := func(img *image) digest.Digest { return img.layers[len(img.layers)-1] }

	t.Run("legacy", func(t *testing.T) {
		o := s.newOutage(t)
		img := o.img
		d := s.startDaemonWith(t, o.daemonConfig(t, "", tables))
		p := s.newPodmanWith(t, d.mnt, o.conf)
		p.must(t, "pull", img.ref)
		// busybox read whole (the next run executes other parts of it), and one file of /t.
		out, stderr, err := p.runScript(t, img.ref, "/bin/busybox cat /bin/busybox >/dev/null && /bin/busybox sha256sum /t/usr/bin/tool")
		if err != nil || !strings.Contains(out, wantTool) {
			t.Fatalf("podman run before the restart: %v: %s\n%s", err, out, stderr)
		}
		d.stop(syscall.SIGTERM) // content read just before is stored by then (kill -9 could lose it)
		o.Stop()
		d.start(t)
		start := time.Now()
		out, stderr, err = p.runScript(t, img.ref, partialScript, "--pull=never")
		if err != nil {
			t.Fatalf("podman run --pull=never with the registry down: %v\n%s", err, stderr)
		}
		check(t, out, time.Since(start))
		t.Logf("stderr: %s", strings.TrimSpace(stderr))
		direct(t, d, img, contentLayer(img))
	})

	t.Run("modern", func(t *testing.T) {
		o := s.newOutage(t)
		img := o.img
		d := s.startDaemonWith(t, o.daemonConfig(t, "", tables))
		h := s.newHarness(t, d.mnt, o.conf)
		resume := h.pullPaused(t, img.ref, "--list", partialScript, "--rmi")
		// What the runtime will read first, read through the store before the restart.
		for i, f := range []string{"bin/busybox", "t/usr/bin/tool"} {
			l := img.layers[i]
			if _, err := os.ReadFile(filepath.Join(d.layerDir(img.ref, img.lazy[l]), "diff", f)); err != nil {
				t.Fatal(err)
			}
		}
		d.stop(syscall.SIGTERM) // content read just before is stored by then (kill -9 could lose it)
		o.Stop()
		d.start(t)
		start := time.Now()
		r, err := resume()
		if err != nil {
			t.Fatalf("the pulled image with the registry down: %v", err)
		}
		check(t, r.Listing, time.Since(start))
		direct(t, d, img, img.lazy[contentLayer(img)])
	})
}
