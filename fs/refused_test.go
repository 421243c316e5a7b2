package storefs

import (
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/hanwen/go-fuse/v2/fuse"
	"github.com/opencontainers/go-digest"
	"golang.org/x/sys/unix"

	"github.com/layerstore/layerstore/chunked"
	"github.com/layerstore/layerstore/internal/testutil/testlog"
)

// refusingLayer is a test layer that the Store refuses from some point on, as the layer
// package refuses a zstd:chunked layer whose tar-split contradicts its TOC (Refused).
type refusingLayer struct {
	*testLayer
	err     atomic.Pointer[error]
	refusal chan struct{} // closed by refuse; nil: Refusal never fires
}

func (l *refusingLayer) Refused() error {
	if p := l.err.Load(); p != nil {
		return *p
	}
	return nil
}

func (l *refusingLayer) Refusal() <-chan struct{} { return l.refusal }

// refuse refuses the layer with err, as checkTarSplit does.
func (l *refusingLayer) refuse(err error) {
	l.err.Store(&err)
	close(l.refusal)
}

// mountRefusing mounts a Store holding one zstd:chunked test layer that refuse refuses as the
// layer package does: the Store fails its lookups, the layer's Refused answers the error and
// its Refusal channel closes.
func mountRefusing(t *testing.T) (mnt string, store *testStore, l *refusingLayer, refuse func()) {
	t.Helper()
	tl := newTestLayer(t, fixture(t, "zstdchunked-modern"))
	l = &refusingLayer{testLayer: tl, refusal: make(chan struct{})}
	store = newTestStore()
	store.layers[testRef] = map[digest.Digest]Layer{tl.tocKey: l}
	mnt, _ = mountTest(t, store, defaultConfig())
	return mnt, store, l, func() {
		err := errors.Join(chunked.ErrInvalid, errors.New("TOC and tar-split disagree"))
		store.setErr(tl.tocKey, err)
		l.refuse(err)
	}
}

// failsBy retries do until it fails or the deadline passes, and returns its last error: the
// kernel would answer from its caches for an hour, so a failure within seconds means it asked.
func failsBy(deadline time.Time, do func() error) error {
	err := do()
	for err == nil && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
		err = do()
	}
	return err
}

// TestRefusedLayerTreeNotServed: once the Store refuses a layer it handed out (the layer
// package refuses a zstd:chunked layer whose tar-split contradicts its TOC, after a lookup by
// TOC digest was answered), the mount answers nothing of its tree any more, though the block
// still holds the layer (every use renews that hold): lookups, attributes, opens (passthrough
// ones would reuse a backing ID registered before the refusal) and info fail, so that the
// contradicted metadata (a setuid bit the tar does not have) is not served from then on.
func TestRefusedLayerTreeNotServed(t *testing.T) {
	tl := newTestLayer(t, fixture(t, "zstdchunked-modern"))
	l := &refusingLayer{testLayer: tl}
	store := newTestStore()
	store.layers[testRef] = map[digest.Digest]Layer{tl.tocKey: l}
	var logged testlog.Handler
	r := newRawFS(newFilesystem(store, slog.New(&logged), time.Hour, time.Hour, time.Now()))
	in := func(ino uint64) *fuse.InHeader {
		return &fuse.InHeader{NodeId: ino, Caller: fuse.Caller{Owner: fuse.Owner{Uid: daemonUID}}}
	}
	lookup := func(parent uint64, name string) (uint64, fuse.Status) {
		var out fuse.EntryOut
		st := r.Lookup(nil, in(parent), name, &out)
		return out.NodeId, st
	}
	must := func(ino uint64, st fuse.Status) uint64 {
		t.Helper()
		if !st.Ok() || ino == 0 {
			t.Fatalf("lookup: %v (ino %d)", st, ino)
		}
		return ino
	}
	refIno := must(lookup(rootIno, refDirName(testRef)))
	dir := must(lookup(refIno, tl.tocKey.String()))
	diff := must(lookup(dir, "diff"))
	usr := must(lookup(diff, "usr"))
	id, ok := tl.Index().LookupPath(backedFile)
	if !ok {
		t.Fatalf("no %s", backedFile)
	}
	x := tl.Index()
	file := diff - uint64(x.Root()) + uint64(x.Meta(id).Inode)

	l.err.Store(new(error(errors.Join(chunked.ErrInvalid, errors.New("TOC and tar-split disagree")))))

	var attr fuse.AttrOut
	if st := r.GetAttr(nil, &fuse.GetAttrIn{InHeader: *in(usr)}, &attr); st.Ok() {
		t.Errorf("getattr of a refused layer's directory answered %o", attr.Mode)
	}
	if ino, st := lookup(usr, "share"); st.Ok() && ino != 0 {
		t.Error("a lookup in a refused layer's tree answered")
	}
	var open fuse.OpenOut
	if st := r.Open(nil, &fuse.OpenIn{InHeader: *in(file)}, &open); st.Ok() {
		t.Error("an open of a refused layer's file succeeded")
	}
	if _, st := lookup(dir, "info"); st.Ok() {
		t.Error("info of a refused layer answered")
	}
	// One line for the refusal's answers, not one per call.
	if warns, lines := logged.Count(); warns != 1 {
		t.Errorf("%d warnings for four answers of a refused layer, want 1: %q", warns, lines)
	}
}

// TestRefusedLayerCacheDropped: what the kernel cached of a layer's tree before the Store
// refused it (entries and attributes for an hour, pages kept) is dropped at the refusal, so
// that a container whose overlay holds the layer's diff directory (as this test holds a
// descriptor of it) stops seeing the contradicted metadata at once, not an hour later: its
// path walks, stats of files it opened, reads of their cached pages and listings of
// directories it opened fail with EIO.
func TestRefusedLayerCacheDropped(t *testing.T) {
	mnt, store, l, refuse := mountRefusing(t)
	diff, err := os.Open(layerPath(mnt, testRef, l.tocKey, "diff"))
	if err != nil {
		t.Fatal(err)
	}
	defer diff.Close()
	// A file only looked up and stat'd: a read would make the kernel ask for its atime again.
	const statted = "usr/bin/tool"
	stat := func() error {
		var st unix.Stat_t
		return unix.Fstatat(int(diff.Fd()), statted, &st, 0)
	}
	if err := stat(); err != nil {
		t.Fatalf("stat of %s before the refusal: %v", statted, err)
	}
	f, err := os.Open(filepath.Join(diff.Name(), backedFile))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	buf := make([]byte, 4096)
	if _, err := f.ReadAt(buf, 0); err != nil {
		t.Fatalf("read of %s before the refusal: %v", backedFile, err)
	}
	// A directory opened and listed: the kernel keeps the listing (the mount answers OPENDIR
	// with ENOSYS, so FOPEN_CACHE_DIR holds) and would list it again from that copy.
	listed, err := os.Open(filepath.Join(diff.Name(), "usr/bin"))
	if err != nil {
		t.Fatal(err)
	}
	defer listed.Close()
	list := func() error {
		if _, err := listed.Seek(0, 0); err != nil {
			return err
		}
		_, err := listed.Readdirnames(-1)
		return err
	}
	if err := list(); err != nil {
		t.Fatalf("listing usr/bin before the refusal: %v", err)
	}
	lookups := store.totalLookups()
	refuse()

	checks := []struct {
		what string
		do   func() error
	}{
		{"stat of a refused layer's file, looked up before the refusal", stat},
		{"fstat of a refused layer's file opened before the refusal", func() error { _, err := f.Stat(); return err }},
		{"read of a refused layer's file's cached pages", func() error { _, err := f.ReadAt(buf, 0); return err }},
		{"listing of a refused layer's directory, kept by the kernel since before the refusal", list},
	}
	deadline := time.Now().Add(5 * time.Second)
	for _, c := range checks {
		wantErrno(t, c.what, failsBy(deadline, c.do), syscall.EIO)
	}
	if _, err := os.Stat(layerPath(mnt, testRef, l.tocKey, "info")); errnoOf(err) != syscall.EIO {
		t.Errorf("stat of a refused layer's info: %v, want EIO", err)
	}
	if store.totalLookups() == lookups {
		t.Error("the layer directory was not looked up again")
	}
}

// TestRefusedLayerThroughOverlay: a container sees the layer through overlayfs, which keeps
// its own dentries over the layer's diff directory; after the refusal, a stat of a path it
// looked up before and a read of a file it opened before fail (overlayfs revalidates its
// lower entries, which the kernel's FUSE cache no longer holds), where without the
// notifications both are answered from the caches.
func TestRefusedLayerThroughOverlay(t *testing.T) {
	mnt, _, l, refuse := mountRefusing(t)
	dir := t.TempDir()
	upper, work, merged := filepath.Join(dir, "upper"), filepath.Join(dir, "work"), filepath.Join(dir, "merged")
	for _, d := range []string{upper, work, merged} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	lower := strings.ReplaceAll(layerPath(mnt, testRef, l.tocKey, "diff"), ":", `\:`)
	if err := unix.Mount("overlay", merged, "overlay", 0, "lowerdir="+lower+",upperdir="+upper+",workdir="+work); err != nil {
		t.Skipf("no overlay mount here: %v", err)
	}
	t.Cleanup(func() { _ = unix.Unmount(merged, unix.MNT_DETACH) })
	statted := filepath.Join(merged, "usr/bin/tool")
	stat := func() error { var st unix.Stat_t; return unix.Stat(statted, &st) }
	if err := stat(); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(filepath.Join(merged, backedFile))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	buf := make([]byte, 4096)
	if _, err := f.ReadAt(buf, 0); err != nil {
		t.Fatal(err)
	}
	refuse()
	deadline := time.Now().Add(5 * time.Second)
	for _, c := range []struct {
		what string
		do   func() error
	}{
		{"stat through overlayfs of a path looked up before the refusal", stat},
		{"read through overlayfs of a file opened before the refusal", func() error { _, err := f.ReadAt(buf, 0); return err }},
	} {
		if failsBy(deadline, c.do) == nil {
			t.Errorf("%s: answered", c.what)
		}
	}
}
