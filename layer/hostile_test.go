package layer

import (
	"archive/tar"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	iofs "io/fs"
	"log/slog"
	"net/http"
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/containerd/stargz-snapshotter/estargz"
	"github.com/opencontainers/go-digest"

	"github.com/layerstore/layerstore/chunked"
	"github.com/layerstore/layerstore/fetcher"
	"github.com/layerstore/layerstore/internal/control/protocol"
	"github.com/layerstore/layerstore/internal/testutil/testlayer"
	"github.com/layerstore/layerstore/internal/testutil/testlog"
	"github.com/layerstore/layerstore/internal/testutil/testregistry"
	"github.com/layerstore/layerstore/verify"
)

// Tests of what a hostile registry or image can try against the layers the manager shares.

// evilLayer is an eStargz layer of the reference tree with etc/hostname changed, claiming the
// DiffID diffID.
func evilLayer(t *testing.T, diffID digest.Digest) testregistry.LayerBlob {
	t.Helper()
	es := testlayer.Entries()
	for i := range es {
		if es[i].Header.Name == "etc/hostname" {
			es[i].Data = []byte("evil\n")
			es[i].Header.Size = int64(len(es[i].Data))
		}
	}
	f, err := testlayer.BuildEStargz("evil", testlayer.Build(es))
	if err != nil {
		t.Fatal(err)
	}
	l := fixtureLayer(f)
	l.DiffID = diffID
	return l
}

// manifestOf returns the raw OCI manifest of repoTag.
func (e *testEnv) manifestOf(repoTag string) map[string]any {
	e.t.Helper()
	repo, tag, _ := stringsCut(repoTag, ":")
	req, err := http.NewRequestWithContext(e.t.Context(), http.MethodGet, "http://"+e.reg.Host+"/v2/"+repo+"/manifests/"+tag, nil)
	if err != nil {
		e.t.Fatal(err)
	}
	req.Header.Set("Accept", "application/vnd.oci.image.manifest.v1+json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		e.t.Fatal(err)
	}
	defer resp.Body.Close()
	var m map[string]any
	if err := json.NewDecoder(resp.Body).Decode(&m); err != nil {
		e.t.Fatal(err)
	}
	return m
}

func (e *testEnv) putManifest(repoTag string, m map[string]any) string {
	e.t.Helper()
	b, err := json.Marshal(m)
	if err != nil {
		e.t.Fatal(err)
	}
	if err := e.reg.PutManifest(e.t.Context(), repoTag, "application/vnd.oci.image.manifest.v1+json", b); err != nil {
		e.t.Fatal(err)
	}
	return e.reg.Host + "/" + repoTag
}

func stringsCut(s, sep string) (string, string, bool) {
	before, after, ok := bytes.Cut([]byte(s), []byte(sep))
	return string(before), string(after), ok
}

// readPath reads a whole file of l by path.
func readPath(t *testing.T, l *Served, path string) string {
	t.Helper()
	id, ok := l.Index().LookupPath(path)
	if !ok {
		t.Fatalf("no %s", path)
	}
	id = l.Index().Entry(id).Inode
	buf := make([]byte, l.Index().Entry(id).Size)
	n, err := l.ReadFile(t.Context(), id, buf, 0)
	if err != nil {
		t.Fatalf("reading %s: %v", path, err)
	}
	return string(buf[:n])
}

// TestSubstitutedBlob: an image whose manifest names a legitimate layer's blob digest (with its
// own TOC, and the legitimate DiffID in its config) while its registry serves its own blob is
// looked up first; later lookups of the legitimate image, by blob digest and by TOC digest,
// still serve the legitimate files. (Live layers used to be shared by the claimed blob digest
// alone, and served the attacker's files.)
func TestSubstitutedBlob(t *testing.T) {
	e := newEnv(t)
	legit := e.fixtures[3] // eStargz
	if legit.Format != chunked.EStargz {
		t.Fatalf("fixture 3 is %v", legit.Format)
	}
	legitRef := e.push("legit/app:v1", fixtureLayer(legit))

	evil := evilLayer(t, legit.DiffID)
	e.push("evil/app:v0", evil)
	mf := e.manifestOf("evil/app:v0")
	mf["layers"].([]any)[0].(map[string]any)["digest"] = legit.Desc.Digest.String()
	evilRef := e.putManifest("evil/app:v1", mf)
	e.reg.Serve("evil/app", legit.Desc.Digest, evil.Blob)

	m := e.manager(withPrefetch(false))
	el, err := m.Lookup(t.Context(), evilRef, legit.Desc.Digest)
	if err != nil {
		t.Fatalf("the attacker's own image: %v", err)
	}
	if got := readPath(t, el, "etc/hostname"); got != "evil\n" {
		t.Fatalf("attacker's image serves %q", got)
	}
	for _, key := range []digest.Digest{legit.Desc.Digest, servedKey(legit)} {
		l, err := m.Lookup(t.Context(), legitRef, key)
		if err != nil {
			t.Fatalf("legitimate image by %s: %v", key, err)
		}
		if l == el {
			t.Errorf("legitimate image by %s: the attacker's layer", key)
		}
		if got := readPath(t, l, "etc/hostname"); got != "layerstore\n" {
			t.Errorf("legitimate image by %s serves %q", key, got)
		}
	}
	if n := len(m.Status().Layers); n != 2 {
		t.Errorf("%d live layers, want 2", n)
	}
}

// TestOtherRepositoryProbe: a layer verified through one repository is served for another
// only when that repository serves the blob too. A manifest naming a private layer exactly
// (blob, TOC, DiffID) in a repository that does not hold it gets nothing, where it used to
// get the private layer, without credentials.
func TestOtherRepositoryProbe(t *testing.T) {
	e := newEnv(t)
	f := e.fixtures[3]
	private := e.push("private/app:v1", fixtureLayer(f))
	m := e.manager(withPrefetch(false))
	pl, err := m.Lookup(t.Context(), private, f.Desc.Digest)
	if err != nil {
		t.Fatal(err)
	}

	mf := e.manifestOf("private/app:v1")
	public := e.putManifest("public/app:v1", mf)
	e.reg.Serve("public/app", f.Desc.Digest, nil) // the blob is not in public/app
	for _, key := range []digest.Digest{f.Desc.Digest, servedKey(f)} {
		if _, err := m.Lookup(t.Context(), public, key); !errors.Is(err, iofs.ErrNotExist) {
			t.Errorf("lookup through a repository without the blob, by %s: %v, want ErrNotExist", key, err)
		}
	}

	// A repository that has the blob shares the live layer, after one small request.
	copyRef := e.push("copy/app:v1", fixtureLayer(f))
	mid := e.reg.Stats(f.Desc.Digest)
	cl, err := m.Lookup(t.Context(), copyRef, f.Desc.Digest)
	if err != nil {
		t.Fatal(err)
	}
	if cl != pl {
		t.Error("a repository holding the blob did not share the live layer")
	}
	after := e.reg.Stats(f.Desc.Digest)
	if after.Ranged != mid.Ranged+1 || after.Bytes != mid.Bytes+1 {
		t.Errorf("probe: %+v then %+v, want one request of one byte", mid, after)
	}
	if _, err := m.Lookup(t.Context(), copyRef, f.Desc.Digest); err != nil {
		t.Fatal(err)
	}
	if again := e.reg.Stats(f.Desc.Digest); again != after {
		t.Errorf("a known repository was probed again: %+v then %+v", after, again)
	}
}

// TestBlobVerified: blob reads serve bytes only once the whole blob hashed to its digest; a
// registry serving a tampered blob gives a read error, never the tampered bytes, and the
// failure is counted. The honest blob is fetched in requests of the batch size, not one per
// read.
func TestBlobVerified(t *testing.T) {
	e := newEnv(t)
	f := e.fixtures[0]
	ref := e.push("blob:v1", fixtureLayer(f))

	m := e.manager(withPrefetch(false))
	l, err := m.Lookup(t.Context(), ref, servedKey(f))
	if err != nil {
		t.Fatal(err)
	}
	before := e.reg.Stats(f.Desc.Digest)
	got := readBlob(t, l, 128<<10)
	if !bytes.Equal(got, f.Blob) {
		t.Fatalf("blob differs (%d bytes, want %d)", len(got), len(f.Blob))
	}
	after := e.reg.Stats(f.Desc.Digest)
	want := (int64(len(f.Blob)) + DefaultPrefetchBatch - 1) / DefaultPrefetchBatch
	if n := after.Ranged - before.Ranged; int64(n) != want {
		t.Errorf("%d requests for a %d-byte blob, want %d", n, len(f.Blob), want)
	}
	t.Logf("blob of %d bytes read in 128 KiB reads: %d requests, %d bytes", len(f.Blob), after.Ranged-before.Ranged, after.Bytes-before.Bytes)

	m2 := e.manager(withPrefetch(false))
	l2, err := m2.Lookup(t.Context(), ref, servedKey(f))
	if err != nil {
		t.Fatal(err)
	}
	e.reg.Tamper(f.Desc.Digest, int64(len(f.Blob))/3)
	p := make([]byte, 4096)
	if _, err := l2.ReadBlob(t.Context(), p, 0); !errors.Is(err, verify.ErrDigestMismatch) {
		t.Fatalf("read of a tampered blob: %v, want ErrDigestMismatch", err)
	}
	if n := m2.Status().Counters.VerifyFailures; n != 1 {
		t.Errorf("verify failures %d, want 1", n)
	}
}

func readBlob(t *testing.T, l *Served, n int) []byte {
	t.Helper()
	var out []byte
	buf := make([]byte, n)
	for off := int64(0); off < l.BlobSize(); {
		k, err := l.ReadBlob(t.Context(), buf, off)
		if err != nil {
			t.Fatalf("blob at %d: %v", off, err)
		}
		if k == 0 {
			t.Fatalf("short blob read at %d", off)
		}
		out = append(out, buf[:k]...)
		off += int64(k)
	}
	return out
}

// TestCloseCancelsFetches: Close ends fetches waiting on a registry that hangs, at once
// rather than after the read timeout, and the reads waiting for them fail.
func TestCloseCancelsFetches(t *testing.T) {
	e := newEnv(t)
	f := e.fixtures[3]
	ref := e.push("hang:v1", fixtureLayer(f))
	m, err := newTestManager(ClientRegistry(testClient(t, e.reg)), e.cache, withPrefetch(false), withReadTimeout(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	l, err := m.Lookup(t.Context(), ref, f.Desc.Digest)
	if err != nil {
		t.Fatal(err)
	}
	e.reg.Hang(f.Desc.Digest, true)
	defer e.reg.Hang(f.Desc.Digest, false)
	before := e.reg.Stats(f.Desc.Digest).Ranged
	read := make(chan error, 2)
	go func() { _, err := l.ReadBlob(context.Background(), make([]byte, 10), 0); read <- err }()
	go func() {
		id, _ := l.Index().LookupPath("usr/share/big.bin")
		_, err := l.ReadFile(context.Background(), id, make([]byte, 10), 0)
		read <- err
	}()
	waitFor(t, "the requests", func() bool { return e.reg.Stats(f.Desc.Digest).Ranged >= before+2 })
	closed := make(chan struct{})
	go func() { m.Close(); close(closed) }()
	deadline := time.After(30 * time.Second)
	for range 2 {
		select {
		case err := <-read:
			if err == nil {
				t.Error("a read of a hanging registry succeeded")
			}
		case <-deadline:
			t.Fatal("reads still waiting 30 s after Close")
		}
	}
	select {
	case <-closed:
	case <-deadline:
		t.Fatal("Close still waiting 30 s later")
	}
}

// waitFor polls cond for up to 10 s.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !cond(); {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// blockingRegistry is a Registry whose resolutions wait until release is closed, counting
// how many are in flight.
type blockingRegistry struct {
	release       chan struct{}
	inFlight, max atomic.Int64
}

func (r *blockingRegistry) Resolve(ctx context.Context, ref string) (*fetcher.Image, error) {
	n := r.inFlight.Add(1)
	defer r.inFlight.Add(-1)
	for {
		old := r.max.Load()
		if n <= old || r.max.CompareAndSwap(old, n) {
			break
		}
	}
	select {
	case <-r.release:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	return nil, fmt.Errorf("%s: %w", ref, fetcher.ErrNotFound)
}

func (r *blockingRegistry) Platforms(context.Context, *fetcher.Image) ([]*fetcher.Manifest, error) {
	return nil, errors.New("no platforms")
}

func (r *blockingRegistry) Blob(context.Context, *fetcher.Image, *fetcher.ImageLayer) (RemoteBlob, error) {
	return nil, errors.New("no blobs")
}

// TestResolutionsBounded: lookups of many distinct layers at once never have more than
// maxResolutions resolutions in flight; the others wait their turn and all complete.
func TestResolutionsBounded(t *testing.T) {
	e := newEnv(t)
	reg := &blockingRegistry{release: make(chan struct{})}
	m, err := newTestManager(reg, e.cache, withPrefetch(false))
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	const lookups = 3 * maxResolutions
	var wg sync.WaitGroup
	for i := range lookups {
		wg.Go(func() {
			ref := fmt.Sprintf("registry.example/app%d:v1", i)
			if _, err := m.Lookup(t.Context(), ref, digest.FromString(ref)); !errors.Is(err, iofs.ErrNotExist) {
				t.Errorf("%s: %v", ref, err)
			}
		})
	}
	waitFor(t, "the resolutions", func() bool { return reg.inFlight.Load() == maxResolutions })
	time.Sleep(50 * time.Millisecond) // room for any excess to show
	if n := reg.max.Load(); n != maxResolutions {
		t.Errorf("%d resolutions in flight at once, want %d", n, maxResolutions)
	}
	close(reg.release)
	wg.Wait()
}

// zerosLayer is an eStargz layer holding one file of size bytes of zeros in chunks of
// chunkSize: a few kilobytes compressed per chunk.
func zerosLayer(t *testing.T, size, chunkSize int64) testlayer.Fixture {
	t.Helper()
	tarBlob := testlayer.Build([]testlayer.Entry{{Header: tarFile("zeros", size), Data: make([]byte, size)}})
	f, err := testlayer.BuildEStargz("zeros", tarBlob, estargzChunkSize(chunkSize))
	if err != nil {
		t.Fatal(err)
	}
	return f
}

// TestBatchBoundedByContent: a background request of a layer of zeros holds at most
// maxBatchContent of decompressed content, however small its compressed span; a cold read's
// read-ahead at most readAheadContent windows.
func TestBatchBoundedByContent(t *testing.T) {
	e := newEnv(t)
	f := zerosLayer(t, 4*maxBatchContent, 1<<20)
	ref := e.push("zeros:v1", fixtureLayer(f))
	m := e.manager(withPrefetch(false))
	l, err := m.Lookup(t.Context(), ref, f.Desc.Digest)
	if err != nil {
		t.Fatal(err)
	}
	keys, planned := l.plan()
	if planned > DefaultPrefetchBatch {
		t.Fatalf("the zeros take %d compressed bytes; the test needs them within one batch", planned)
	}
	batches := 0
	for len(keys) > 0 {
		n := l.batchLen(keys, l.idx.PrefetchEnd())
		var content int64
		for _, k := range keys[:n] {
			content += l.ref(k).Size
		}
		if content > maxBatchContent {
			t.Fatalf("a batch of %d chunks holds %d bytes of content, above %d", n, content, maxBatchContent)
		}
		keys = keys[n:]
		batches++
	}
	if batches < 4 {
		t.Errorf("%d batches for %d bytes of content", batches, 4*maxBatchContent)
	}
	id, _ := l.Index().LookupPath("zeros")
	var content int64
	for _, k := range l.readAhead(chunkKey{id, 0}) {
		content += l.ref(k).Size
	}
	if limit := int64(readAheadContent * defaultReadAhead); content > limit {
		t.Errorf("read-ahead of %d bytes of content, above %d", content, limit)
	}
}

// TestBatchBoundedByChunks: a layer of many small files (thousands within one batch's
// compressed span and content) is fetched in batches of at most maxBatchChunks chunks, each
// of which costs memory beside its content, and completes.
func TestBatchBoundedByChunks(t *testing.T) {
	e := newEnv(t)
	const files = 2*maxBatchChunks + maxBatchChunks/2
	var es []testlayer.Entry
	for i := range files {
		data := []byte(fmt.Sprintf("file %d\n", i))
		es = append(es, testlayer.Entry{Header: tarFile(fmt.Sprintf("f%05d", i), int64(len(data))), Data: data})
	}
	f, err := testlayer.BuildEStargz("small", testlayer.Build(es))
	if err != nil {
		t.Fatal(err)
	}
	ref := e.push("small:v1", fixtureLayer(f))
	m := e.manager(withPrefetch(false))
	l, err := m.Lookup(t.Context(), ref, f.Desc.Digest)
	if err != nil {
		t.Fatal(err)
	}
	keys, planned := l.plan()
	if len(keys) < files || planned > DefaultPrefetchBatch {
		t.Fatalf("%d chunks in %d compressed bytes; the test needs %d within one batch's span", len(keys), planned, files)
	}
	var sizes, want []int
	for rest := len(keys); rest > 0; rest -= maxBatchChunks {
		want = append(want, min(rest, maxBatchChunks))
	}
	for len(keys) > 0 {
		n := l.batchLen(keys, l.idx.PrefetchEnd())
		sizes = append(sizes, n)
		keys = keys[n:]
	}
	if !slices.Equal(sizes, want) {
		t.Errorf("batches of %v chunks, want %v", sizes, want)
	}
	l.startPrefetch()
	l.wait()
	if st := l.Status(); st.State != protocol.StateComplete {
		t.Fatalf("background fetch %s: %s", st.State, st.Error)
	}
}

// TestZerosBombMemory: the background fetch of a layer of 256 MiB of zeros (a few hundred
// kilobytes compressed) keeps the heap within the documented bound instead of decompressing
// the whole layer into one batch.
func TestZerosBombMemory(t *testing.T) {
	if testing.Short() {
		t.Skip("builds a 256 MiB layer")
	}
	e := newEnv(t)
	const size = 256 << 20
	f := zerosLayer(t, size, 4<<20)
	ref := e.push("bomb:v1", fixtureLayer(f))
	m := e.manager()
	peak := heapPeak(t, func() {
		l, err := m.Lookup(t.Context(), ref, f.Desc.Digest)
		if err != nil {
			t.Fatal(err)
		}
		l.wait()
		if st := l.Status(); st.State != protocol.StateComplete {
			t.Fatalf("background fetch %s: %s", st.State, st.Error)
		}
	})
	t.Logf("heap peak above the baseline during the background fetch of %d MiB of zeros (%d compressed): %d MiB", size>>20, len(f.Blob), peak>>20)
	if limit := int64(DefaultPrefetchConcurrency*maxBatchContent + 64<<20); peak > limit {
		t.Errorf("heap grew by %d MiB, above %d MiB", peak>>20, limit>>20)
	}
}

// heapPeak runs fn and returns the largest live heap seen meanwhile above the heap before it,
// sampled every millisecond, with the garbage collector kept tight so that the figure tracks
// what is held rather than what awaits collection.
func heapPeak(t *testing.T, fn func()) int64 {
	t.Helper()
	restore := setGCPercent(10)
	defer restore()
	runtime.GC()
	base := heapInUse()
	var peak atomic.Int64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		tick := time.NewTicker(time.Millisecond)
		defer tick.Stop()
		for {
			if h := heapInUse() - base; h > peak.Load() {
				peak.Store(h)
			}
			select {
			case <-stop:
				return
			case <-tick.C:
			}
		}
	})
	fn()
	close(stop)
	wg.Wait()
	return peak.Load()
}

func tarFile(name string, size int64) tar.Header {
	return tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: 0o644, Size: size, ModTime: testlayer.Epoch}
}

func estargzChunkSize(n int64) estargz.Option { return estargz.WithChunkSize(int(n)) }

func setGCPercent(p int) (restore func()) {
	old := debug.SetGCPercent(p)
	return func() { debug.SetGCPercent(old) }
}

// heapInUse reads the bytes of live and not yet swept heap objects.
func heapInUse() int64 {
	s := []metrics.Sample{{Name: "/memory/classes/heap/objects:bytes"}}
	metrics.Read(s)
	return int64(s[0].Value.Uint64())
}

// TestHangingRegistryFailsOnce: a read that waited its whole read timeout on a registry that
// hangs fails, and the read that follows at once (the kernel retries a failed readahead with
// a small read, the reader stuck in D state meanwhile) fails without waiting or asking again.
func TestHangingRegistryFailsOnce(t *testing.T) {
	e := newEnv(t)
	f := e.fixtures[3]
	ref := e.push("hang-once:v1", fixtureLayer(f))
	m := e.manager(withPrefetch(false), withReadTimeout(300*time.Millisecond), withNegativeTTL(time.Hour))
	l, err := m.Lookup(t.Context(), ref, f.Desc.Digest)
	if err != nil {
		t.Fatal(err)
	}
	e.reg.Hang(f.Desc.Digest, true)
	defer e.reg.Hang(f.Desc.Digest, false)
	id, _ := l.Index().LookupPath("usr/share/big.bin")
	if _, err := l.ReadFile(t.Context(), id, make([]byte, 128<<10), 0); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("read of a hanging registry: %v, want the read timeout", err)
	}
	before := e.reg.Stats(f.Desc.Digest)
	if _, err := l.ReadFile(t.Context(), id, make([]byte, 4096), 0); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("the retry: %v, want the remembered failure", err)
	}
	if after := e.reg.Stats(f.Desc.Digest); after != before {
		t.Errorf("the retry asked the registry again: %+v, then %+v", before, after)
	}
}

// TestLookupFailureLogs: a lookup failed by the registry logs why (the TOC could not be
// fetched), and one failed by the TOC's content says the layer was refused: one message per
// cause.
func TestLookupFailureLogs(t *testing.T) {
	e := newEnv(t)
	var f testlayer.Fixture
	for _, fx := range e.fixtures {
		if strings.HasPrefix(fx.Name, "estargz") { // its TOC lies just before the footer
			f = fx
			break
		}
	}
	for _, tc := range []struct {
		name, want, not string
		fault           func()
	}{
		{"registry", "fetching the layer's TOC failed", "layer refused", func() { e.reg.Fail(f.Desc.Digest, http.StatusServiceUnavailable) }},
		{"content", "layer refused", "fetching the layer's TOC failed", func() { e.reg.Tamper(f.Desc.Digest, int64(len(f.Blob))-60) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Cleanup(func() { e.reg.Fail(f.Desc.Digest, 0); e.reg.Untamper(f.Desc.Digest) })
			logs := &testlog.Handler{}
			m := e.manager(withLogger(slog.New(logs)), withPrefetch(false))
			ref := e.push("logs/"+tc.name+":v1", fixtureLayer(f))
			tc.fault()
			if _, err := m.Lookup(t.Context(), ref, servedKey(f)); err == nil {
				t.Fatal("the lookup succeeded")
			}
			_, lines := logs.Count()
			if !slicesContain(lines, tc.want) || slicesContain(lines, tc.not) {
				t.Errorf("logged %q, want %q and not %q", lines, tc.want, tc.not)
			}
		})
	}
}

// TestTransientFailureForgottenSoon: a read that failed because the registry kept failing
// (its retries used up) is remembered only long enough for the kernel's immediate retry: a
// reader a moment later (another container of an image sharing the layer) asks the registry
// again and gets the bytes; a chunk that did not verify is remembered for the negative TTL.
func TestTransientFailureForgottenSoon(t *testing.T) {
	e := newEnv(t)
	f := e.fixtures[0]
	ref := e.push("transient:v1", fixtureLayer(f))
	clock := newTestClock()
	m := e.manager(withPrefetch(false), withClock(clock.now), withNegativeTTL(time.Hour))
	l, err := m.Lookup(t.Context(), ref, f.Desc.Digest)
	if err != nil {
		t.Fatal(err)
	}
	id, _ := l.Index().LookupPath("usr/bin/tool")
	id = l.Index().Entry(id).Inode
	buf := make([]byte, 4096)
	e.reg.Fail(f.Desc.Digest, http.StatusServiceUnavailable)
	if _, err := l.ReadFile(t.Context(), id, buf, 0); !errors.Is(err, fetcher.ErrTransient) {
		t.Fatalf("read while the registry fails: %v, want ErrTransient", err)
	}
	e.reg.Fail(f.Desc.Digest, 0)
	before := e.reg.Stats(f.Desc.Digest)
	if _, err := l.ReadFile(t.Context(), id, buf, 0); !errors.Is(err, fetcher.ErrTransient) {
		t.Fatalf("the kernel's immediate retry: %v, want the remembered failure", err)
	}
	if after := e.reg.Stats(f.Desc.Digest); after != before {
		t.Errorf("the immediate retry asked the registry: %+v, then %+v", before, after)
	}
	clock.advance(transientNegativeTTL + time.Millisecond)
	if _, err := l.ReadFile(t.Context(), id, buf, 0); err != nil {
		t.Fatalf("a read %v later: %v, want the bytes", transientNegativeTTL, err)
	}
}

// TestReadWaitLogged: at debug level, a read that waited for the registry logs which file
// and chunk, whether it sent a request of its own and how long it waited (how an operator
// finds what a slow start waited for); a read the cache serves logs nothing, nor at info level.
func TestReadWaitLogged(t *testing.T) {
	e := newEnv(t)
	f := e.fixtures[0]
	ref := e.push("waitlog:v1", fixtureLayer(f))
	for _, level := range []slog.Level{slog.LevelDebug, slog.LevelInfo} {
		logs := &testlog.Handler{}
		m := e.manager(withLogger(slog.New(levelHandler{logs, level})), withPrefetch(false))
		l, err := m.Lookup(t.Context(), ref, f.Desc.Digest)
		if err != nil {
			t.Fatal(err)
		}
		id, buf := fileOf(t, l, "usr/bin/tool"), make([]byte, 4096)
		for range 2 { // cold, then from the cache
			if _, err := l.ReadFile(t.Context(), id, buf, 0); err != nil {
				t.Fatal(err)
			}
		}
		var waits []string
		_, lines := logs.Count()
		for _, line := range lines {
			if strings.Contains(line, "read waited for the registry") {
				waits = append(waits, line)
			}
		}
		want := 0
		if level == slog.LevelDebug {
			want = 1
		}
		if len(waits) != want {
			t.Fatalf("at %v, %d lines %q: want %d", level, len(waits), waits, want)
		}
		for _, w := range waits {
			for _, part := range []string{"path=usr/bin/tool", "chunk=0", "request=true", "waited="} {
				if !strings.Contains(w, part) {
					t.Errorf("%q lacks %q", w, part)
				}
			}
		}
	}
}

// levelHandler passes on the records at or above its level, and so do the handlers derived
// from it (a logger's With).
type levelHandler struct {
	slog.Handler
	level slog.Level
}

func (h levelHandler) Enabled(_ context.Context, l slog.Level) bool { return l >= h.level }

func (h levelHandler) WithAttrs(as []slog.Attr) slog.Handler {
	return levelHandler{h.Handler.WithAttrs(as), h.level}
}

func (h levelHandler) WithGroup(name string) slog.Handler {
	return levelHandler{h.Handler.WithGroup(name), h.level}
}
