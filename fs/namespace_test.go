package storefs

import (
	"bytes"
	"encoding/base64"
	"errors"
	"fmt"
	iofs "io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/opencontainers/go-digest"
)

const testRef = "127.0.0.1:5000/test:modern-zstdchunked"

// TestLookupByBothKeys checks that a layer resolves by its TOC digest (c/image >= 5.31)
// and by its blob digest (older runtimes), each with its own info, and that diff, info and
// blob exist with exact sizes.
func TestLookupByBothKeys(t *testing.T) {
	l := newTestLayer(t, fixture(t, "zstdchunked-modern"))
	m := mountLayer(t, l, defaultConfig())
	for _, key := range []digest.Digest{l.tocKey, l.blobKey} {
		for _, elem := range []string{"diff", "info", "blob"} {
			if _, err := os.Stat(layerPath(m.mnt, testRef, key, elem)); err != nil {
				t.Errorf("stat %s of %s: %v", elem, key, err)
			}
		}
		info, err := os.ReadFile(layerPath(m.mnt, testRef, key, "info"))
		if err != nil {
			t.Fatal(err)
		}
		if want := l.Info(key); !bytes.Equal(info, want) {
			t.Errorf("info of %s = %s, want %s", key, info, want)
		}
		fi, err := os.Stat(layerPath(m.mnt, testRef, key, "info"))
		if err != nil || fi.Size() != int64(len(info)) || fi.Mode() != 0o444 {
			t.Errorf("stat info of %s = %v, %v; want a 0444 file of %d bytes", key, fi, err, len(info))
		}
		blob, err := os.ReadFile(layerPath(m.mnt, testRef, key, "blob"))
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(blob, l.fixture.Blob) {
			t.Errorf("blob of %s differs from the layer blob (%d bytes, want %d)", key, len(blob), len(l.fixture.Blob))
		}
		fi, err = os.Stat(layerPath(m.mnt, testRef, key, "blob"))
		if err != nil || fi.Size() != int64(len(l.fixture.Blob)) {
			t.Errorf("stat blob of %s = %v, %v; want %d bytes", key, fi, err, len(l.fixture.Blob))
		}
	}
	if !strings.Contains(string(l.Info(l.tocKey)), "toc-digest") || strings.Contains(string(l.Info(l.blobKey)), "toc-digest") {
		t.Fatal("test layer serves the same info for both keys; the test would prove nothing")
	}
}

// TestInvalidNamesDoNotReachTheStore checks that names which cannot be a reference or a
// layer key answer ENOENT without asking the store.
func TestInvalidNamesDoNotReachTheStore(t *testing.T) {
	store := newTestStore()
	mnt, _ := mountTest(t, store, defaultConfig())
	hex := strings.Repeat("ab", 32)
	refDir := refDirName(testRef)
	for _, p := range []string{
		"not base64!",
		base64.StdEncoding.EncodeToString([]byte(testRef))[:10],     // truncated
		base64.RawStdEncoding.EncodeToString([]byte("docker.io/x")), // no padding
		base64.StdEncoding.EncodeToString([]byte("Not A Reference!")),
		base64.StdEncoding.EncodeToString([]byte("UPPER/case:tag")),
		base64.URLEncoding.EncodeToString([]byte("quay.io/x/y?z>")),
		refDir + "/sha256:" + hex[:63],
		refDir + "/sha256:" + hex + "0",
		refDir + "/sha256:" + strings.ToUpper(hex),
		refDir + "/sha512:" + hex + hex,
		refDir + "/md5:" + hex[:32],
		refDir + "/" + hex,
		refDir + "/use",
	} {
		_, err := os.Stat(filepath.Join(mnt, p, "diff"))
		wantErrno(t, "stat "+p, err, syscall.ENOENT)
	}
	if n := store.totalLookups(); n != 0 {
		t.Errorf("the store saw %d lookups, want 0: %v", n, store.lookups)
	}
	// A valid reference directory exists, and its layers are asked for.
	if fi, err := os.Stat(filepath.Join(mnt, refDir)); err != nil || !fi.IsDir() {
		t.Errorf("stat ref dir: %v, %v", fi, err)
	}
	key := digest.Digest("sha256:" + hex)
	for i := 1; i <= 3; i++ {
		_, err := os.Stat(layerPath(mnt, testRef, key, "diff"))
		wantErrno(t, "stat unknown layer", err, syscall.ENOENT)
		// Failed lookups are not cached: each access asks the store again.
		if got := store.count(store.lookups, testRef, key); got != i {
			t.Errorf("after %d stats of an unknown layer the store saw %d lookups", i, got)
		}
	}
}

// TestStoreErrors checks the errno mapping of Store.Lookup errors and that no failure is
// remembered by the kernel.
func TestStoreErrors(t *testing.T) {
	l := newTestLayer(t, fixture(t, "estargz"))
	m := mountLayer(t, l, defaultConfig())
	diff := m.path("diff")

	m.store.setErr(l.tocKey, fmt.Errorf("resolving: %w", iofs.ErrNotExist))
	_, err := os.Stat(diff)
	wantErrno(t, "stat with ErrNotExist", err, syscall.ENOENT)

	m.store.setErr(l.tocKey, errors.New("registry said 500"))
	_, err = os.Stat(diff)
	wantErrno(t, "stat with a registry error", err, syscall.EIO)

	m.store.setErr(l.tocKey, nil)
	if _, err := os.Stat(diff); err != nil {
		t.Errorf("stat after the error cleared: %v (a failure was cached)", err)
	}
	if got := m.store.count(m.store.lookups, testRef, l.tocKey); got != 3 {
		t.Errorf("store saw %d lookups, want 3", got)
	}
	// Layer directories are never cached either, even once resolved.
	for range 2 {
		if _, err := os.Stat(m.path()); err != nil {
			t.Fatal(err)
		}
	}
	if got := m.store.count(m.store.lookups, testRef, l.tocKey); got != 5 {
		t.Errorf("store saw %d lookups after two more stats of the layer dir, want 5", got)
	}
}

// TestReadErrors checks that content and blob read failures answer EIO.
func TestReadErrors(t *testing.T) {
	l := newTestLayer(t, fixture(t, "estargz"))
	l.readErr = errors.New("chunk fetch failed")
	m := mountLayer(t, l, Config{})
	_, err := os.ReadFile(m.path("diff", "etc", "hostname"))
	wantErrno(t, "read a file", err, syscall.EIO)
	_, err = os.ReadFile(m.path("blob"))
	wantErrno(t, "read the blob", err, syscall.EIO)
	// Metadata does not need content: it still works.
	if _, err := os.Stat(m.path("diff", "etc", "hostname")); err != nil {
		t.Errorf("stat: %v", err)
	}
}

// TestUseAndRelease checks the reference-counting protocol: every create of use reaches
// Store.Use and answers ENOENT without creating anything; every rmdir of the layer
// directory reaches Store.Release and answers ENOENT.
func TestUseAndRelease(t *testing.T) {
	l := newTestLayer(t, fixture(t, "zstdchunked-modern"))
	m := mountLayer(t, l, defaultConfig())
	for _, key := range []digest.Digest{l.tocKey, l.blobKey} {
		use := layerPath(m.mnt, testRef, key, "use")
		_, err := os.Stat(use)
		wantErrno(t, "stat use", err, syscall.ENOENT)
		for i := 1; i <= 3; i++ {
			f, err := os.OpenFile(use, os.O_CREATE|os.O_WRONLY, 0o644)
			if err == nil {
				_ = f.Close()
			}
			wantErrno(t, "create use", err, syscall.ENOENT)
			if got := m.store.count(m.store.uses, testRef, key); got != i {
				t.Errorf("after %d creates of use, Store.Use was called %d times", i, got)
			}
		}
		// os.Create is what c/storage calls.
		_, err = os.Create(use)
		wantErrno(t, "os.Create use", err, syscall.ENOENT)
		if got := m.store.count(m.store.uses, testRef, key); got != 4 {
			t.Errorf("Store.Use called %d times, want 4", got)
		}
		_, err = os.Stat(use)
		wantErrno(t, "stat use after creates", err, syscall.ENOENT)

		for i := 1; i <= 3; i++ {
			err := syscall.Rmdir(layerPath(m.mnt, testRef, key))
			wantErrno(t, "rmdir layer dir", err, syscall.ENOENT)
			if got := m.store.count(m.store.releases, testRef, key); got != i {
				t.Errorf("after %d rmdirs, Store.Release was called %d times", i, got)
			}
		}
		// os.RemoveAll is what c/storage calls on layer removal; it must not loop or fail.
		err = os.Remove(layerPath(m.mnt, testRef, key))
		wantErrno(t, "os.Remove layer dir", err, syscall.ENOENT)
		if got := m.store.count(m.store.releases, testRef, key); got != 4 {
			t.Errorf("Store.Release called %d times, want 4", got)
		}
		// The layer is still served: counts are the store's business.
		if _, err := os.Stat(layerPath(m.mnt, testRef, key, "diff")); err != nil {
			t.Errorf("stat diff after release: %v", err)
		}
	}
	// Creating anything else in a layer directory is refused.
	_, err := os.Create(m.path("other"))
	wantErrno(t, "create other", err, syscall.EROFS)
}

// TestReaddir checks the listings of the namespace directories.
func TestReaddir(t *testing.T) {
	l := newTestLayer(t, fixture(t, "estargz"))
	m := mountLayer(t, l, defaultConfig())
	for _, c := range []struct {
		dir  string
		want []string
	}{
		{m.mnt, nil},
		{filepath.Join(m.mnt, refDirName(testRef)), nil},
		{m.path(), []string{"blob", "diff", "info"}},
		{m.path("diff", "etc"), []string{"empty", "empty-link", "hostname", "hostname-link", "loop0", "null", "removed"}},
	} {
		des, err := os.ReadDir(c.dir)
		if err != nil {
			t.Errorf("readdir %s: %v", c.dir, err)
			continue
		}
		var got []string
		for _, de := range des {
			got = append(got, de.Name())
		}
		if !slices.Equal(got, c.want) {
			t.Errorf("readdir %s = %q, want %q", c.dir, got, c.want)
		}
	}
}

// TestInodeNumbers checks that inode numbers survive the kernel forgetting every inode,
// and that two paths to one layer get different numbers (the kernel allows a directory
// inode a single path).
func TestInodeNumbers(t *testing.T) {
	l := newTestLayer(t, fixture(t, "estargz"))
	m := mountLayer(t, l, defaultConfig())
	m.store.add("docker.io/library/other:latest", l)
	diff := m.path("diff")
	before := scanTree(t, diff).inos
	known := forgetAll(t, m.srv, diff, before)
	after := scanTree(t, diff).inos
	for p, ino := range before {
		if after[p] != ino {
			t.Errorf("%q: inode %d, was %d (after the kernel forgot %d inodes)", p, after[p], ino, known)
		}
	}
	other := scanTree(t, layerPath(m.mnt, "docker.io/library/other:latest", l.tocKey, "diff")).inos
	blobKey := scanTree(t, layerPath(m.mnt, testRef, l.blobKey, "diff")).inos
	for p, ino := range before {
		if other[p] == ino || blobKey[p] == ino {
			t.Errorf("%q: inode %d shared between two paths to the layer", p, ino)
		}
	}
}

// forgetAll makes the kernel drop the dentries of the diff tree at diff (paths and inode
// numbers as scanTree found them), deepest first, and waits until it has sent FORGET for
// some of the inodes they held: what drop_caches does for the whole machine, for this tree
// alone. It returns how many names it invalidated.
func forgetAll(t *testing.T, srv *Server, diff string, inos map[string]uint64) int {
	t.Helper()
	var st syscall.Stat_t
	if err := syscall.Stat(filepath.Dir(diff), &st); err != nil {
		t.Fatal(err)
	}
	paths := make([]string, 0, len(inos))
	for p := range inos {
		paths = append(paths, p)
	}
	slices.SortFunc(paths, func(a, b string) int { return strings.Count(b, "/") - strings.Count(a, "/") })
	forgets := srv.fsys.forgets.Load()
	n := 0
	for _, p := range paths {
		if p == "" {
			continue
		}
		dir, name := filepath.Split(p)
		_ = srv.fuse.EntryNotify(inos[strings.TrimSuffix(dir, "/")], name) // ENOENT: not in the kernel's cache
		n++
	}
	_ = srv.fuse.EntryNotify(st.Ino, "diff")
	for deadline := time.Now().Add(10 * time.Second); srv.fsys.forgets.Load() == forgets; {
		if time.Now().After(deadline) {
			t.Fatalf("the kernel forgot none of %d inodes", n)
		}
		time.Sleep(10 * time.Millisecond)
	}
	return n
}

// TestInfoFollowsTheLayer checks that info is not cached: when the layer's info changes
// (a DiffID proven after the pull, say), stat and read show the new content at once.
func TestInfoFollowsTheLayer(t *testing.T) {
	l := newTestLayer(t, fixture(t, "zstdchunked-modern"))
	m := mountLayer(t, l, defaultConfig())
	info := m.path("info")
	// Changes of the same size too: the kernel's own invalidation on a size change would
	// hide cached pages otherwise.
	digestA := `,"diff-digest":"` + l.fixture.DiffID.String() + `"`
	digestB := `,"diff-digest":"` + digest.FromString("other").String() + `"`
	for i, extra := range []string{"", digestA, digestB, ""} {
		l.mu.Lock()
		l.infoExtra = extra
		l.mu.Unlock()
		want := l.Info(l.tocKey)
		fi, err := os.Stat(info)
		if err != nil || fi.Size() != int64(len(want)) {
			t.Errorf("step %d: stat info = %v, %v; want %d bytes", i, fi, err, len(want))
		}
		got, err := os.ReadFile(info)
		if err != nil || !bytes.Equal(got, want) {
			t.Errorf("step %d: info = %s, %v; want %s", i, got, err, want)
		}
	}
}

// TestReferenceInodeNumbers checks that every reference directory gets its own inode
// number and serves its own reference only: go-fuse and the kernel identify nodes by
// number, so two names sharing one would serve one reference under the other's name.
func TestReferenceInodeNumbers(t *testing.T) {
	l := newTestLayer(t, fixture(t, "estargz"))
	refs := []string{testRef, "docker.io/library/a:1", "docker.io/library/b:1", "quay.io/x/y@sha256:" + strings.Repeat("12", 32)}
	m := mountLayer(t, l, defaultConfig())
	seen := map[uint64]string{}
	for _, ref := range refs {
		fi, err := os.Stat(filepath.Join(m.mnt, refDirName(ref)))
		if err != nil {
			t.Fatal(err)
		}
		ino := fi.Sys().(*syscall.Stat_t).Ino
		if other, ok := seen[ino]; ok {
			t.Errorf("%s and %s share inode %d", ref, other, ino)
		}
		seen[ino] = ref
		if ino < firstRefIno {
			t.Errorf("%s: inode %#x is in the range of the layer blocks", ref, ino)
		}
	}
	for _, ref := range refs[1:] {
		_, err := os.Stat(layerPath(m.mnt, ref, l.tocKey, "diff"))
		wantErrno(t, "stat a layer of "+ref+" served only for "+refs[0], err, syscall.ENOENT)
		if n := m.store.count(m.store.lookups, ref, l.tocKey); n != 1 {
			t.Errorf("the store saw %d lookups of %s, want 1", n, ref)
		}
	}
}

// TestRefInoAllocation checks the allocation of reference directory numbers: stable for a
// name, never handed out twice, written to the session table, and the same in a process that
// loads the table.
func TestRefInoAllocation(t *testing.T) {
	tab, err := newTable(&sessionHeader{maxWrite: 1 << 20, init: []byte{1}})
	if err != nil {
		t.Fatal(err)
	}
	defer tab.f.Close()
	fsys := newFilesystem(newTestStore(), nil, time.Second, time.Second, time.Now())
	fsys.tab = tab
	na, nb := refDirName("docker.io/library/a:1"), refDirName("docker.io/library/b:1")
	a, _ := fsys.refIno(na, "docker.io/library/a:1")
	b, _ := fsys.refIno(nb, "docker.io/library/b:1")
	a2, _ := fsys.refIno(na, "docker.io/library/a:1")
	if a == b || a2 != a || a < firstRefIno || b < firstRefIno {
		t.Fatalf("refIno: a=%#x, b=%#x, then a=%#x", a, b, a2)
	}
	st, err := readSessionState(tab.f)
	if err != nil {
		t.Fatal(err)
	}
	next := newFilesystem(newTestStore(), nil, time.Second, time.Second, time.Now())
	next.load(st)
	if got, _ := next.refIno(nb, "docker.io/library/b:1"); got != b {
		t.Errorf("b in the next process: %#x, want %#x", got, b)
	}
	if c, _ := next.refIno(refDirName("docker.io/library/c:1"), "docker.io/library/c:1"); c == a || c == b {
		t.Errorf("a new name in the next process got %#x, a number handed out before (a=%#x, b=%#x)", c, a, b)
	}
}

// TestIdleLayerDropped checks that a block lets go of a layer unused for layerIdle and gets
// it again from the Store, with the same numbers, at its next use.
func TestIdleLayerDropped(t *testing.T) {
	store := newTestStore()
	l := newTestLayer(t, fixture(t, "estargz"))
	store.add(testRef, l)
	fsys := newFilesystem(store, nil, time.Second, time.Second, time.Now())
	b, err := fsys.block(testRef, l.tocKey, l)
	if err != nil {
		t.Fatal(err)
	}
	fsys.sweep(time.Now().Add(layerIdle / 2))
	if b.layer.Load() == nil {
		t.Fatal("a layer used recently was dropped")
	}
	fsys.sweep(time.Now().Add(layerIdle + time.Second))
	if b.layer.Load() != nil {
		t.Fatal("a layer unused for layerIdle was kept")
	}
	got, errno := fsys.layerOf(t.Context(), b)
	if errno != 0 || got != Layer(l) || store.count(store.lookups, testRef, l.tocKey) != 1 {
		t.Errorf("layerOf after the drop: %v, %v, %d lookups", got, errno, store.count(store.lookups, testRef, l.tocKey))
	}
	if again, _ := fsys.block(testRef, l.tocKey, l); again != b {
		t.Error("the layer got another block")
	}
}
