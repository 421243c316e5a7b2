package layer

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/opencontainers/go-digest"

	"github.com/layerstore/layerstore/fetcher"
	"github.com/layerstore/layerstore/internal/byterange"
	"github.com/layerstore/layerstore/internal/testutil/testlayer"
	"github.com/layerstore/layerstore/layer/profile"
)

// Tests of startup profiles: a registry in memory serves images by reference and logs every
// fetch of a blob, in order, so that the tests see what a background fetch fetched first and
// from which blob.

// profRegistry serves images of in-memory layers by reference. Every Fetch of a blob is
// logged; delay slows each down (a trickling registry), and so does rate (bytes per second:
// each Fetch takes its bytes' time on a link of its own).
type profRegistry struct {
	mu     sync.Mutex
	images map[string][]testlayer.Fixture
	blobs  map[digest.Digest][]byte
	events []*fetchEvent
	delay  time.Duration
	rate   float64
	starts map[string]fetcher.Start // what an image's config runs, by reference
}

// fetchEvent is one Fetch of a blob: its ranges, when it started and ended.
type fetchEvent struct {
	blob       digest.Digest
	ranges     []byterange.Range
	start, end time.Time
}

func newProfRegistry() *profRegistry {
	return &profRegistry{images: map[string][]testlayer.Fixture{}, blobs: map[digest.Digest][]byte{}, starts: map[string]fetcher.Start{}}
}

func (r *profRegistry) push(ref string, layers ...testlayer.Fixture) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.images[ref] = layers
	for _, f := range layers {
		r.blobs[f.Desc.Digest] = f.Blob
	}
}

func (r *profRegistry) Resolve(_ context.Context, ref string) (*fetcher.Image, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	fs, ok := r.images[ref]
	if !ok {
		return nil, fmt.Errorf("%s: %w", ref, fetcher.ErrNotFound)
	}
	img := &fetcher.Image{Ref: ref}
	img.Start = r.starts[ref]
	for _, f := range fs {
		img.Manifest.Layers = append(img.Manifest.Layers, fetcher.ImageLayer{Descriptor: f.Desc, DiffID: f.DiffID})
	}
	return img, nil
}

func (r *profRegistry) Platforms(context.Context, *fetcher.Image) ([]*fetcher.Manifest, error) {
	return nil, nil
}

func (r *profRegistry) Blob(_ context.Context, _ *fetcher.Image, d *fetcher.ImageLayer) (RemoteBlob, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	b, ok := r.blobs[d.Digest]
	if !ok {
		return nil, fmt.Errorf("blob %s: %w", d.Digest, fetcher.ErrNotFound)
	}
	return &profBlob{r: r, d: d.Digest, data: b}, nil
}

// log returns the fetches logged so far, in the order they started, and forgets them when
// reset is set.
func (r *profRegistry) log(reset bool) []fetchEvent {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]fetchEvent, len(r.events))
	for i, e := range r.events {
		out[i] = *e
	}
	if reset {
		r.events = nil
	}
	return out
}

type profBlob struct {
	r    *profRegistry
	d    digest.Digest
	data []byte
}

func (b *profBlob) ReadAt(_ context.Context, p []byte, off int64) (int, error) {
	if off >= int64(len(b.data)) {
		return 0, io.EOF
	}
	n := copy(p, b.data[off:])
	if n < len(p) {
		return n, io.EOF
	}
	return n, nil
}

func (b *profBlob) Fetch(ctx context.Context, ranges []byterange.Range) ([][]byte, error) {
	ev := &fetchEvent{blob: b.d, ranges: slices.Clone(ranges), start: time.Now()}
	b.r.mu.Lock()
	b.r.events = append(b.r.events, ev)
	delay := b.r.delay
	if b.r.rate > 0 {
		var n int64
		for _, rg := range ranges {
			n += rg.Length
		}
		delay += time.Duration(float64(n) / b.r.rate * float64(time.Second))
	}
	b.r.mu.Unlock()
	if delay > 0 {
		if err := sleep(ctx, delay); err != nil {
			return nil, err
		}
	}
	out := make([][]byte, len(ranges))
	for i, rg := range ranges {
		out[i] = bytes.Clone(b.data[rg.Offset : rg.Offset+rg.Length])
	}
	b.r.mu.Lock()
	ev.end = time.Now()
	b.r.mu.Unlock()
	return out, nil
}

// profEnv is a cache directory shared by successive managers resolving through one
// profRegistry.
type profEnv struct {
	t    *testing.T
	reg  *profRegistry
	root string
}

func newProfEnv(t *testing.T) *profEnv {
	return &profEnv{t: t, reg: newProfRegistry(), root: t.TempDir()}
}

// start opens the cache and a manager on it (startManager).
func (e *profEnv) start(opts ...option) (*Manager, func()) {
	e.t.Helper()
	return startManager(e.t, e.root, e.reg, opts...)
}

// evict removes every file's content from the (closed) cache, as eviction would: the layer
// records and profiles stay.
func (e *profEnv) evict() {
	for _, d := range []string{"files", "partial"} {
		if err := os.RemoveAll(filepath.Join(e.root, d)); err != nil {
			e.t.Fatal(err)
		}
	}
}

// profFiles names n files of a layer: usr/bin/f00, usr/bin/f01...
func profFiles(prefix string, from, to int) []string {
	var out []string
	for i := from; i < to; i++ {
		out = append(out, fmt.Sprintf("usr/bin/%s%02d", prefix, i))
	}
	return out
}

// profLayer builds an eStargz layer of files of 48 KiB each, of random (incompressible)
// content drawn from seed: one chunk and one range of its own per file.
func profLayer(t *testing.T, name string, seed uint64, files ...string) testlayer.Fixture {
	t.Helper()
	rng := rand.New(rand.NewPCG(seed, 7))
	var es []testlayer.Entry
	for _, f := range files {
		data := make([]byte, 48<<10)
		for i := range data {
			data[i] = byte(rng.Uint32())
		}
		es = append(es, testlayer.Entry{Header: tarFile(f, int64(len(data))), Data: data})
	}
	fx, err := testlayer.BuildEStargz(name, testlayer.Build(es))
	if err != nil {
		t.Fatal(err)
	}
	return fx
}

func profKey(f testlayer.Fixture) digest.Digest { return tocKey(f.Desc.Annotations) }

func lookupOK(t *testing.T, m *Manager, ref string, key digest.Digest) *Served {
	t.Helper()
	l, err := m.Lookup(t.Context(), ref, key)
	if err != nil {
		t.Fatalf("lookup %s: %v", ref, err)
	}
	return l
}

func readPaths(t *testing.T, l *Served, paths ...string) {
	t.Helper()
	for _, p := range paths {
		readOne(t, l, fileOf(t, l, p))
	}
}

// waitProfile waits for the profile of repo to name layer, and returns that layer's files.
func waitProfile(t *testing.T, m *Manager, repo string, layer digest.Digest) []string {
	t.Helper()
	var files []string
	waitFor(t, "the profile of "+repo, func() bool {
		p := m.profiles.Get(repo)
		if p == nil {
			return false
		}
		for _, l := range p.Layers {
			if l.Layer == layer {
				files = l.Files
				return true
			}
		}
		return false
	})
	return files
}

// fileRanges maps the blob offset of each chunk of paths in l to its path.
func fileRanges(t *testing.T, l *Served, paths ...string) map[int64]string {
	t.Helper()
	out := map[int64]string{}
	for _, p := range paths {
		for _, c := range l.Index().Chunks(fileOf(t, l, p)) {
			out[c.Offset] = p
		}
	}
	return out
}

// pathsOf returns the paths (as offs names them) of the ranges of ev, in order, "?" for
// others.
func pathsOf(ev fetchEvent, offs map[int64]string) []string {
	var out []string
	for _, r := range ev.ranges {
		p, ok := offs[r.Offset]
		if !ok {
			p = "?"
		}
		out = append(out, p)
	}
	return out
}

const profRepo = "registry.example/app"

// TestProfileRecordedPersistedReplayedFirst: the files a layer's first reads touch are
// recorded, in the order of their first read, and written to the repository's profile; after
// a restart with the layer's content evicted, the background fetch fetches those files first,
// in that order, before any other chunk of the layer, and status and the counters say so.
func TestProfileRecordedPersistedReplayedFirst(t *testing.T) {
	e := newProfEnv(t)
	a := profLayer(t, "a", 1, profFiles("f", 0, 40)...)
	ref := profRepo + ":v1"
	e.reg.push(ref, a)

	m, stop := e.start(withPrefetch(false), withReadAhead(0), withProfileWindow(200*time.Millisecond))
	l := lookupOK(t, m, ref, profKey(a))
	order := []string{"usr/bin/f17", "usr/bin/f03", "usr/bin/f25"}
	readPaths(t, l, order...)
	readPaths(t, l, "usr/bin/f03", "usr/bin/f17") // read again: recorded once
	if got := waitProfile(t, m, profRepo, a.Desc.Digest); !slices.Equal(got, order) {
		t.Fatalf("profile %q, want %q", got, order)
	}
	waitFor(t, "the status of the recording", func() bool { return l.Status().ProfileRecorded == 3 })
	stop()

	e.evict()
	e.reg.log(true)
	m, _ = e.start(withPrefetchConcurrency(1), withPrefetchBatch(64<<10), withPrefetchQuiet(0), withReadAhead(0))
	l = lookupOK(t, m, ref, profKey(a))
	waitComplete(t, l)
	log := e.reg.log(false)
	offs := fileRanges(t, l, order...)
	if len(log) < len(order)+1 {
		t.Fatalf("%d fetches", len(log))
	}
	for i, p := range order {
		if got := pathsOf(log[i], offs); !slices.Equal(got, []string{p}) {
			t.Errorf("fetch %d: %q, want %s (the profile's files first, in order)", i, got, p)
		}
	}
	for i, ev := range log[len(order):] {
		for _, p := range pathsOf(ev, offs) {
			if p != "?" {
				t.Errorf("fetch %d fetched %s again, after the profile", len(order)+i, p)
			}
		}
	}
	st := l.Status()
	if st.Profile == nil || st.Profile.Files != 3 || !st.Profile.SameLayer || st.Profile.Fetched != st.Profile.Bytes || st.Profile.Bytes == 0 {
		t.Errorf("status profile %+v, want 3 files of this layer, all fetched", st.Profile)
	}
	c := m.Status().Counters
	if c.ProfileBytes != st.Profile.Bytes || c.PrefetchBytes+c.ProfileBytes != st.Prefetched {
		t.Errorf("counters: profile %d, prefetch %d; layer prefetched %d, profile %d", c.ProfileBytes, c.PrefetchBytes, st.Prefetched, st.Profile.Bytes)
	}
	compareContent(t, readAll(t, l, 1<<20), contentOf(t, a))
}

// contentOf returns the sha256 of each regular file of a fixture, by path.
func contentOf(t *testing.T, f testlayer.Fixture) map[string]string {
	t.Helper()
	zr, err := gzip.NewReader(bytes.NewReader(f.Blob)) // eStargz: gzip members, the TOC's among them
	if err != nil {
		t.Fatal(err)
	}
	tarStream, err := io.ReadAll(zr)
	if err != nil {
		t.Fatal(err)
	}
	tree, err := testlayer.ReferenceTree(tarStream)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for p, n := range tree {
		if n.Type == "reg" {
			out[p] = n.Content
		}
	}
	return out
}

// TestProfileNewVersion: a new version of the image (its layer holds some of the same paths,
// with new content, and lacks others) has the files the profile names that it holds fetched
// first, in the profile's order; the paths it does not have are ignored; nothing of the old
// layer's blob is fetched; and a layer of another repository holding the same paths gets no
// profile.
func TestProfileNewVersion(t *testing.T) {
	e := newProfEnv(t)
	a := profLayer(t, "a", 1, profFiles("f", 0, 40)...)
	b := profLayer(t, "b", 2, append(profFiles("f", 0, 30), profFiles("g", 0, 10)...)...)
	other := profLayer(t, "other", 3, profFiles("f", 0, 40)...)
	e.reg.push(profRepo+":v1", a)
	e.reg.push(profRepo+":v2", b)
	e.reg.push("registry.example/other:v1", other)

	m, stop := e.start(withPrefetch(false), withReadAhead(0), withProfileWindow(200*time.Millisecond))
	l := lookupOK(t, m, profRepo+":v1", profKey(a))
	readPaths(t, l, "usr/bin/f05", "usr/bin/f33", "usr/bin/f12")
	waitProfile(t, m, profRepo, a.Desc.Digest)
	stop()

	e.reg.log(true)
	m, _ = e.start(withPrefetchConcurrency(1), withPrefetchBatch(64<<10), withPrefetchQuiet(0), withReadAhead(0),
		withProfileWindow(0))
	l = lookupOK(t, m, profRepo+":v2", profKey(b))
	waitComplete(t, l)
	log := e.reg.log(true)
	offs := fileRanges(t, l, "usr/bin/f05", "usr/bin/f12")
	for i, want := range []string{"usr/bin/f05", "usr/bin/f12"} {
		if got := pathsOf(log[i], offs); !slices.Equal(got, []string{want}) {
			t.Errorf("fetch %d: %q, want %s", i, got, want)
		}
	}
	for _, ev := range log {
		if ev.blob != b.Desc.Digest {
			t.Fatalf("the new version's background fetch fetched from blob %s, not its own", ev.blob)
		}
	}
	st := l.Status()
	if st.Profile == nil || st.Profile.Files != 2 || st.Profile.SameLayer {
		t.Errorf("status profile %+v, want 2 files, from another layer", st.Profile)
	}
	compareContent(t, readAll(t, l, 1<<20), contentOf(t, b))

	lo := lookupOK(t, m, "registry.example/other:v1", profKey(other))
	waitComplete(t, lo)
	if st := lo.Status(); st.Profile != nil {
		t.Errorf("a layer of another repository replayed a profile: %+v", st.Profile)
	}
	for _, ev := range e.reg.log(false) {
		if ev.blob != other.Desc.Digest {
			t.Fatalf("fetched from blob %s for another repository's layer", ev.blob)
		}
	}
}

// TestProfileBounded: a recording ends with its window, after its count of files, and after
// its bytes of content. (A repository's profile's own bounds are package profile's, tested
// there.)
func TestProfileBounded(t *testing.T) {
	files := profFiles("f", 0, 10)
	t.Run("window", func(t *testing.T) {
		e := newProfEnv(t)
		a := profLayer(t, "a", 1, files...)
		e.reg.push(profRepo+":v1", a)
		m, _ := e.start(withPrefetch(false), withReadAhead(0), withProfileWindow(150*time.Millisecond))
		l := lookupOK(t, m, profRepo+":v1", profKey(a))
		readPaths(t, l, "usr/bin/f01")
		time.Sleep(400 * time.Millisecond)
		readPaths(t, l, "usr/bin/f02")
		if got := waitProfile(t, m, profRepo, a.Desc.Digest); !slices.Equal(got, []string{"usr/bin/f01"}) {
			t.Errorf("profile %q, want only the file read within the window", got)
		}
		if !l.recording.done.Load() {
			t.Error("still recording after the window")
		}
	})
	for _, tc := range []struct {
		name  string
		limit func(*Manager)
	}{
		{"files", func(m *Manager) { m.profileMaxFiles = 3 }},
		{"content", func(m *Manager) { m.profileMaxContent = 100 << 10 }}, // 48 KiB each: the third crosses it
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newProfEnv(t)
			a := profLayer(t, "a", 1, files...)
			e.reg.push(profRepo+":v1", a)
			m, _ := e.start(withPrefetch(false), withReadAhead(0), withProfileWindow(time.Hour))
			tc.limit(m)
			l := lookupOK(t, m, profRepo+":v1", profKey(a))
			readPaths(t, l, files[:6]...)
			if got := waitProfile(t, m, profRepo, a.Desc.Digest); !slices.Equal(got, files[:3]) {
				t.Errorf("profile %q, want the first 3 files (written before the window's end)", got)
			}
		})
	}
}

// TestProfileChoice: the layer's own profile wins over another layer's that matches more of
// its paths; without one, the other layers' profile matching the most paths is replayed.
func TestProfileChoice(t *testing.T) {
	e := newProfEnv(t)
	a := profLayer(t, "a", 1, profFiles("f", 0, 20)...)
	e.reg.push(profRepo+":v1", a)
	m, _ := e.start(withPrefetch(false))
	l := lookupOK(t, m, profRepo+":v1", profKey(a))
	now := time.Now().UTC()
	add := func(d digest.Digest, ago time.Duration, files ...string) {
		t.Helper()
		if err := m.profiles.Add(profRepo, profile.LayerReads{Layer: d, Recorded: now.Add(-ago), Files: files}); err != nil {
			t.Fatal(err)
		}
	}
	add(digest.FromString("few"), 3*time.Hour, "usr/bin/f01", "usr/bin/f02", "nope")
	add(digest.FromString("most"), 2*time.Hour, "usr/bin/f05", "usr/bin/f06", "usr/bin/f07", "usr/bin/f08")
	add(digest.FromString("recent"), time.Hour, "usr/bin/f09", "other/path")
	if got := l.profileFiles(); len(got.files) != 4 || got.same || l.Index().Path(got.files[0]) != "usr/bin/f05" {
		t.Errorf("without the layer's own profile: %d files, same %v; want the 4 of the best match", len(got.files), got.same)
	}
	add(a.Desc.Digest, 4*time.Hour, "usr/bin/f19")
	if got := l.profileFiles(); len(got.files) != 1 || !got.same {
		t.Errorf("with the layer's own profile: %d files, same %v; want its 1 file", len(got.files), got.same)
	}
}

// TestProfileRecordingsMerge: a layer recorded again (resolved again, its files partly in the
// kernel's page cache) puts its new reads first and keeps the files of the earlier recording.
func TestProfileRecordingsMerge(t *testing.T) {
	e := newProfEnv(t)
	a := profLayer(t, "a", 1, profFiles("f", 0, 4)...)
	e.reg.push(profRepo+":v1", a)
	m, stop := e.start(withPrefetch(false), withProfileWindow(time.Hour))
	readPaths(t, lookupOK(t, m, profRepo+":v1", profKey(a)), "usr/bin/f01", "usr/bin/f02")
	stop()
	m, stop = e.start(withPrefetch(false), withProfileWindow(time.Hour))
	readPaths(t, lookupOK(t, m, profRepo+":v1", profKey(a)), "usr/bin/f03", "usr/bin/f01")
	stop()
	m, _ = e.start(withPrefetch(false))
	want := []string{"usr/bin/f03", "usr/bin/f01", "usr/bin/f02"}
	if got := waitProfile(t, m, profRepo, a.Desc.Digest); !slices.Equal(got, want) {
		t.Errorf("profile %q, want %q", got, want)
	}
}

// TestProfileWrittenAtClose: a manager closing within a recording's window writes what it
// recorded.
func TestProfileWrittenAtClose(t *testing.T) {
	e := newProfEnv(t)
	a := profLayer(t, "a", 1, profFiles("f", 0, 4)...)
	e.reg.push(profRepo+":v1", a)
	m, stop := e.start(withPrefetch(false), withProfileWindow(time.Hour))
	l := lookupOK(t, m, profRepo+":v1", profKey(a))
	readPaths(t, l, "usr/bin/f02", "usr/bin/f00")
	stop()
	m, _ = e.start(withPrefetch(false))
	if got := waitProfile(t, m, profRepo, a.Desc.Digest); !slices.Equal(got, []string{"usr/bin/f02", "usr/bin/f00"}) {
		t.Errorf("profile after a restart within the window: %q", got)
	}
}

// TestProfileDamagedDropped: a profile record that does not decode or check is removed, and
// the layer is fetched without it.
func TestProfileDamagedDropped(t *testing.T) {
	e := newProfEnv(t)
	a := profLayer(t, "a", 1, profFiles("f", 0, 4)...)
	e.reg.push(profRepo+":v1", a)
	m, _ := e.start(withPrefetchQuiet(0))
	bad, _ := json.Marshal(profile.Repo{Version: 1, Repository: "registry.example/someone-else",
		Layers: []profile.LayerReads{{Layer: a.Desc.Digest, Files: []string{"usr/bin/f01"}}}})
	if err := m.cache.PutRecord(profile.RecordName(profRepo), bad); err != nil {
		t.Fatal(err)
	}
	l := lookupOK(t, m, profRepo+":v1", profKey(a))
	waitComplete(t, l)
	if st := l.Status(); st.Profile != nil {
		t.Errorf("replayed a profile stored under another repository's name: %+v", st.Profile)
	}
	if _, err := m.cache.RecordMeta(profile.RecordName(profRepo)); err == nil {
		t.Error("the bad profile was kept")
	}
}

// TestOnDemandOvertakesProfileReplay: a read issued while a profile's replay runs (on a
// registry that answers slowly) is fetched at once, and the replay's next requests wait
// until it is done.
func TestOnDemandOvertakesProfileReplay(t *testing.T) {
	e := newProfEnv(t)
	a := profLayer(t, "a", 1, profFiles("f", 0, 40)...)
	ref := profRepo + ":v1"
	e.reg.push(ref, a)
	m, stop := e.start(withPrefetch(false))
	slot := profile.LayerReads{Layer: a.Desc.Digest, Recorded: time.Now().UTC(), Files: profFiles("f", 0, 10)}
	if err := m.profiles.Add(profRepo, slot); err != nil {
		t.Fatal(err)
	}
	stop()

	e.reg.mu.Lock()
	e.reg.delay = 100 * time.Millisecond
	e.reg.mu.Unlock()
	// A quiet period of an hour: nothing but the replay goes out in the background.
	m, _ = e.start(withPrefetchConcurrency(1), withPrefetchBatch(64<<10), withPrefetchQuiet(time.Hour), withReadAhead(0))
	l := lookupOK(t, m, ref, profKey(a))
	waitFor(t, "the replay's first request", func() bool { return len(e.reg.log(false)) > 0 })
	target := fileOf(t, l, "usr/bin/f39")
	readOne(t, l, target)
	done := time.Now()
	waitFor(t, "the replay", func() bool {
		st := l.Status()
		return st.Profile != nil && st.Profile.Fetched == st.Profile.Bytes
	})
	c, _ := l.Index().Chunk(target, 0)
	var demand *fetchEvent
	log := e.reg.log(false)
	for i, ev := range log {
		if ev.ranges[0].Offset == c.Offset {
			demand = &log[i]
		}
	}
	if demand == nil {
		t.Fatal("no fetch for the read")
	}
	var during, after int
	for _, ev := range log {
		switch {
		case ev.ranges[0].Offset == c.Offset || ev.start.Before(demand.start):
		case ev.start.Before(demand.end):
			during++
		default:
			after++
		}
	}
	// One request of the replay may have been on its way (past the scheduler) as the read began.
	if during > 1 {
		t.Errorf("%d requests of the replay started while the read's fetch ran", during)
	}
	if after == 0 {
		t.Error("the replay had nothing left when the read was done: the test shows nothing")
	}
	if !done.After(demand.end) {
		t.Error("the read returned before its fetch ended")
	}
	if w := demand.end.Sub(demand.start); w > time.Second {
		t.Errorf("the read's fetch took %v", w)
	}
}

// TestProfileSavesRoundTrips: a container's start reading 20 files one after another, on a
// registry that takes 30 ms per request: cold without a profile, each read waits for a
// request of its own; with the profile, the replay's one request, sent at the lookup (as a
// pull looks layers up before the container starts), brings them all and the reads share it.
func TestProfileSavesRoundTrips(t *testing.T) {
	a := profLayer(t, "a", 1, profFiles("f", 0, 40)...)
	startup := profFiles("f", 10, 30)
	run := func(withProfile bool) (requests int, elapsed time.Duration) {
		e := newProfEnv(t)
		e.reg.push(profRepo+":v1", a)
		e.reg.delay = 30 * time.Millisecond
		m, _ := e.start(withReadAhead(0), withProfileWindow(0))
		if withProfile {
			slot := profile.LayerReads{Layer: a.Desc.Digest, Recorded: time.Now().UTC(), Files: startup}
			if err := m.profiles.Add(profRepo, slot); err != nil {
				t.Fatal(err)
			}
		}
		l := lookupOK(t, m, profRepo+":v1", profKey(a))
		time.Sleep(10 * time.Millisecond) // the runtime creates the container
		start := time.Now()
		readPaths(t, l, startup...)
		elapsed = time.Since(start)
		offs := fileRanges(t, l, startup...)
		for _, ev := range e.reg.log(false) {
			if slices.ContainsFunc(pathsOf(ev, offs), func(p string) bool { return p != "?" }) {
				requests++
			}
		}
		return requests, elapsed
	}
	coldN, coldT := run(false)
	profN, profT := run(true)
	t.Logf("20 files read in sequence: without a profile %d requests, %v; with it %d requests, %v", coldN, coldT, profN, profT)
	if coldN < len(startup) {
		t.Errorf("without a profile: %d requests for %d files", coldN, len(startup))
	}
	if profN > 3 {
		t.Errorf("with the profile: %d requests for the startup files, want the replay's (and at most a read racing it)", profN)
	}
}

// TestProfileExportImport: profiles exported by one daemon and imported by another are
// replayed there; an import is untrusted: it is read line by line within the bound of one
// profile, checked, and refused with an error naming the line.
func TestProfileExportImport(t *testing.T) {
	e := newProfEnv(t)
	a := profLayer(t, "a", 1, profFiles("f", 0, 20)...)
	ref := profRepo + ":v1"
	e.reg.push(ref, a)
	m, _ := e.start(withPrefetch(false))
	slot := profile.LayerReads{Layer: a.Desc.Digest, Recorded: time.Now().UTC(), Files: []string{"usr/bin/f07", "usr/bin/f02", "usr/bin/nope"}}
	if err := m.profiles.Add(profRepo, slot); err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	n, err := m.ExportProfiles(&buf)
	if err != nil || n != 1 {
		t.Fatalf("export: %d, %v", n, err)
	}
	export := buf.String()
	if !strings.HasPrefix(export, `{"format":"layerstore-profiles","version":1}`+"\n") || strings.Count(export, "\n") != 2 {
		t.Fatalf("export:\n%s", export)
	}

	e2 := newProfEnv(t)
	e2.reg = e.reg
	m2, _ := e2.start(withPrefetchQuiet(0))
	imp, err := m2.ImportProfiles(strings.NewReader(export))
	if err != nil || imp.Repositories != 1 || imp.Layers != 1 {
		t.Fatalf("import: %+v, %v", imp, err)
	}
	l := lookupOK(t, m2, ref, profKey(a))
	waitComplete(t, l)
	if st := l.Status(); st.Profile == nil || st.Profile.Files != 2 {
		t.Errorf("imported profile replayed as %+v, want 2 files", st.Profile)
	}
}
