package storefs

import (
	"archive/tar"
	"bytes"
	"crypto/sha256"
	"fmt"
	iofs "io/fs"
	"log/slog"
	"maps"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/layerstore/layerstore/chunked"
	"github.com/layerstore/layerstore/internal/testutil/syncbuf"
	"github.com/layerstore/layerstore/internal/testutil/testlayer"
)

// scanned is what a walk of a mounted diff tree found.
type scanned struct {
	tree testlayer.Tree
	inos map[string]uint64
}

// scanTree walks root the way an overlay lower layer is read: lstat, readlink, xattrs
// (without following symlinks) and the content of every regular file.
func scanTree(t *testing.T, root string) scanned {
	t.Helper()
	s := scanned{tree: testlayer.Tree{}, inos: map[string]uint64{}}
	err := filepath.WalkDir(root, func(p string, _ iofs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(root, p)
		if err != nil {
			return err
		}
		if rel == "." {
			rel = ""
		}
		var st syscall.Stat_t
		if err := syscall.Lstat(p, &st); err != nil {
			return err
		}
		n := testlayer.Node{
			Mode:  st.Mode & 0o7777,
			UID:   st.Uid,
			GID:   st.Gid,
			MTime: st.Mtim.Sec,
			Nlink: uint32(st.Nlink),
		}
		switch st.Mode & syscall.S_IFMT {
		case syscall.S_IFREG:
			data, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			if int64(len(data)) != st.Size {
				return fmt.Errorf("%s: read %d bytes, stat says %d", rel, len(data), st.Size)
			}
			n.Type, n.Size, n.Content = "reg", st.Size, fmt.Sprintf("%x", sha256.Sum256(data))
		case syscall.S_IFDIR:
			n.Type = "dir"
		case syscall.S_IFLNK:
			target, err := os.Readlink(p)
			if err != nil {
				return err
			}
			if int64(len(target)) != st.Size {
				return fmt.Errorf("%s: link target of %d bytes, stat says %d", rel, len(target), st.Size)
			}
			n.Type, n.Link = "symlink", target
		case syscall.S_IFCHR:
			n.Type, n.Dev = "char", [2]uint32{unix.Major(st.Rdev), unix.Minor(st.Rdev)}
		case syscall.S_IFBLK:
			n.Type, n.Dev = "block", [2]uint32{unix.Major(st.Rdev), unix.Minor(st.Rdev)}
		case syscall.S_IFIFO:
			n.Type = "fifo"
		default:
			return fmt.Errorf("%s: unexpected mode %o", rel, st.Mode)
		}
		xs, err := readXattrs(p)
		if err != nil {
			return fmt.Errorf("%s: %w", rel, err)
		}
		n.Xattrs = testlayer.XattrString(xs)
		s.tree[rel], s.inos[rel] = n, st.Ino
		return nil
	})
	if err != nil {
		t.Fatalf("walking %s: %v", root, err)
	}
	return s
}

// readXattrs lists and reads the xattrs of p without following a symlink, going through
// the size queries and ERANGE the way libc users do.
func readXattrs(p string) (map[string]string, error) {
	size, err := unix.Llistxattr(p, nil)
	if err != nil {
		return nil, fmt.Errorf("llistxattr size: %w", err)
	}
	buf := make([]byte, size)
	size, err = unix.Llistxattr(p, buf)
	if err != nil {
		return nil, fmt.Errorf("llistxattr: %w", err)
	}
	xs := map[string]string{}
	for _, name := range strings.Split(string(buf[:size]), "\x00") {
		if name == "" {
			continue
		}
		vsize, err := unix.Lgetxattr(p, name, nil)
		if err != nil {
			return nil, fmt.Errorf("lgetxattr %s size: %w", name, err)
		}
		val := make([]byte, vsize)
		vsize, err = unix.Lgetxattr(p, name, val)
		if err != nil {
			return nil, fmt.Errorf("lgetxattr %s: %w", name, err)
		}
		xs[name] = string(val[:vsize])
	}
	return xs, nil
}

// compareTrees checks got against the reference: the same paths with the same nodes,
// hardlinks sharing one inode number and every other inode number distinct.
func compareTrees(t *testing.T, got scanned, want testlayer.Tree) {
	t.Helper()
	want = maps.Clone(want)
	groups := map[string][]string{} // inode owner -> paths sharing its inode
	for p, n := range want {
		if n.HardTo != "" {
			groups[n.HardTo] = append(groups[n.HardTo], p)
			n.HardTo = ""
			want[p] = n
		}
	}
	var paths []string
	for p := range want {
		paths = append(paths, p)
	}
	for p := range got.tree {
		if _, ok := want[p]; !ok {
			paths = append(paths, p)
		}
	}
	sort.Strings(paths)
	for _, p := range paths {
		g, gok := got.tree[p]
		w, wok := want[p]
		switch {
		case !gok:
			t.Errorf("%q: missing from the mount", p)
		case !wok:
			t.Errorf("%q: not in the reference tree: %+v", p, g)
		case g != w:
			t.Errorf("%q:\n got  %+v\n want %+v", p, g, w)
		}
	}
	owners := map[uint64]string{}
	for p := range got.tree {
		owner := p
		for o, ps := range groups {
			for _, q := range ps {
				if q == p {
					owner = o
				}
			}
		}
		ino := got.inos[p]
		if prev, ok := owners[ino]; ok && prev != owner {
			t.Errorf("%q and %q share inode %d but are not hardlinks", p, prev, ino)
		}
		owners[ino] = owner
	}
	for o, ps := range groups {
		for _, p := range ps {
			if got.inos[p] != got.inos[o] {
				t.Errorf("hardlink %q has inode %d, its target %q has %d", p, got.inos[p], o, got.inos[o])
			}
		}
	}
}

// TestDiffTreeMatchesReference mounts every fixture and compares its diff tree, seen
// through the kernel, with the reference layer read by an overlay-aware tar extractor.
func TestDiffTreeMatchesReference(t *testing.T) {
	want, err := testlayer.ReferenceTree(testlayer.Tar())
	if err != nil {
		t.Fatal(err)
	}
	store := newTestStore()
	layers := map[string]*testLayer{}
	for _, f := range loadFixtures(t) {
		l := newTestLayer(t, f)
		layers[f.Name] = l
		store.add("registry.example/fixtures:"+f.Name, l)
	}
	mnt, _ := mountTest(t, store, defaultConfig())
	for _, f := range loadFixtures(t) {
		t.Run(f.Name, func(t *testing.T) {
			l := layers[f.Name]
			ref := "registry.example/fixtures:" + f.Name
			got := scanTree(t, layerPath(mnt, ref, l.tocKey, "diff"))
			compareTrees(t, got, want)
			// The blob-key path serves the same tree (with its own inode numbers).
			gotBlob := scanTree(t, layerPath(mnt, ref, l.blobKey, "diff"))
			compareTrees(t, gotBlob, want)
		})
	}
}

// TestRandomReads reads regular files at random offsets and lengths, across chunk
// boundaries and past the end, and compares with the reference content.
func TestRandomReads(t *testing.T) {
	store := newTestStore()
	layers := map[string]*testLayer{}
	for _, f := range loadFixtures(t) {
		layers[f.Name] = newTestLayer(t, f)
		store.add("registry.example/reads:"+f.Name, layers[f.Name])
	}
	mnt, _ := mountTest(t, store, Config{})
	content := map[string][]byte{}
	for _, e := range testlayer.Entries() {
		if e.Header.Typeflag == '0' && len(e.Data) > 0 {
			content[e.Header.Name] = e.Data
		}
	}
	rng := rand.New(rand.NewPCG(3, 4))
	for name, l := range layers {
		for file, data := range content {
			f, err := os.Open(layerPath(mnt, "registry.example/reads:"+name, l.tocKey, "diff", file))
			if err != nil {
				t.Fatalf("%s: %v", name, err)
			}
			size := int64(len(data))
			for range 20 {
				off := rng.Int64N(size + 100)
				buf := make([]byte, rng.IntN(300<<10)+1)
				n, err := f.ReadAt(buf, off)
				want := data[min(off, size):min(off+int64(len(buf)), size)]
				if n != len(want) || !bytes.Equal(buf[:n], want) {
					t.Errorf("%s %s: ReadAt(%d bytes at %d) = %d bytes (err %v), want %d", name, file, len(buf), off, n, err, len(want))
				}
			}
			_ = f.Close()
		}
	}
}

// TestLargeDirectory lists a directory too large for one READDIR(PLUS) answer.
func TestLargeDirectory(t *testing.T) {
	var es []testlayer.Entry
	es = append(es, testlayer.Entry{Header: tar.Header{Typeflag: tar.TypeDir, Name: "many/", Mode: 0o755}})
	var want []string
	for i := range 600 {
		name := fmt.Sprintf("file-%05d-%s", i, strings.Repeat("x", i%50))
		want = append(want, name)
		es = append(es, testlayer.Entry{Header: tar.Header{Typeflag: tar.TypeReg, Name: "many/" + name, Mode: 0o644, Size: 1}, Data: []byte{byte(i)}})
	}
	sort.Strings(want)
	f, err := testlayer.BuildEStargz("many", testlayer.Build(es))
	if err != nil {
		t.Fatal(err)
	}
	f.Format = chunked.EStargz
	l := newTestLayer(t, f)
	m := mountLayer(t, l, defaultConfig())
	des, err := os.ReadDir(m.path("diff", "many"))
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, de := range des {
		got = append(got, de.Name())
	}
	if !slices.Equal(got, want) {
		t.Errorf("listed %d entries, want %d (first got %q)", len(got), len(want), got[:min(len(got), 3)])
	}
	data, err := os.ReadFile(m.path("diff", "many", want[345]))
	if err != nil || len(data) != 1 || data[0] != byte(345%256) {
		t.Errorf("read %s = %v, %v", want[345], data, err)
	}
}

// TestCloseSendsNoFlush: files of every kind are opened FOPEN_NOFLUSH, so that closing one
// costs no request (and cannot hang while the daemon is away): the mount's request log shows
// opens, reads and releases, and no FLUSH.
func TestCloseSendsNoFlush(t *testing.T) {
	store := newTestStore()
	f := loadFixtures(t)[0]
	l := newTestLayer(t, f)
	ref := "registry.example/noflush:" + f.Name
	store.add(ref, l)
	var log syncbuf.Buffer
	opts := defaultConfig()
	opts.Debug = true
	opts.Logger = slog.New(slog.NewTextHandler(&log, &slog.HandlerOptions{Level: slog.LevelDebug}))
	mnt, _ := mountTest(t, store, opts)
	var file string
	for _, e := range testlayer.Entries() {
		if e.Header.Typeflag == '0' && len(e.Data) > 0 {
			file = e.Header.Name
			break
		}
	}
	for _, p := range []string{layerPath(mnt, ref, l.tocKey, "diff", file), layerPath(mnt, ref, l.tocKey, "blob"), layerPath(mnt, ref, l.tocKey, "info")} {
		data, err := os.ReadFile(p)
		if err != nil || len(data) == 0 {
			t.Fatalf("%s: %d bytes, %v", p, len(data), err)
		}
	}
	s := log.String()
	_, s, _ = strings.Cut(s, "mounted layer store") // go-fuse's own probe before it (its epoll hack file) flushes
	if !strings.Contains(s, "OPEN") || !strings.Contains(s, "READ") {
		t.Fatalf("the request log shows no OPEN and READ: %.2000s", s)
	}
	if strings.Contains(s, ": FLUSH ") { // a request, not the NOFLUSH of an answer
		t.Errorf("a close sent FLUSH: %.4000s", s)
	}
}
