package storefs

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"io"
	iofs "io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/opencontainers/go-digest"
	"golang.org/x/sys/unix"

	"github.com/layerstore/layerstore/chunked"
	"github.com/layerstore/layerstore/internal/byterange"
	"github.com/layerstore/layerstore/internal/testutil/testlayer"
)

// indexLayer is a Layer that has only an index: its tree can be walked, not read.
type indexLayer struct{ x *chunked.Index }

func (l indexLayer) Index() *chunked.Index            { return l.x }
func (l indexLayer) Info(digest.Digest) []byte        { return []byte("{}") }
func (l indexLayer) Backing(chunked.EntryID) *os.File { return nil }
func (l indexLayer) Executing(chunked.EntryID)        {}
func (l indexLayer) BlobSize() int64                  { return 0 }
func (l indexLayer) ReadFile(context.Context, chunked.EntryID, []byte, int64) (int, error) {
	return 0, iofs.ErrInvalid
}
func (l indexLayer) ReadBlob(context.Context, []byte, int64) (int, error) { return 0, iofs.ErrInvalid }

// syntheticLayer returns a store serving a layer of n entries (testlayer.SyntheticTOC:
// directories of 40 entries, 2 500 of them in one directory per 100 000 entries) under ref
// and key, and its index.
func syntheticLayer(t testing.TB, n int) (*testStore, string, digest.Digest, *chunked.Index) {
	t.Helper()
	js, end := testlayer.SyntheticTOC(n)
	layout := &chunked.Layout{Format: chunked.ZstdChunked, TOC: byterange.Range{Offset: end + 8, Length: 1}}
	x, err := chunked.Parse(context.Background(), layout, js, chunked.Limits{})
	if err != nil {
		t.Fatal(err)
	}
	s := newTestStore()
	ref, key := "127.0.0.1:5000/walk:v1", digest.FromString("walk"+strconv.Itoa(n))
	s.layers[ref] = map[digest.Digest]Layer{key: indexLayer{x}}
	return s, ref, key, x
}

// walkFd lists the directory open as fd (named dir) and every directory under it, and lstats
// every entry relative to its directory, as find does and as overlayfs does for a container.
// It closes fd and returns the entries seen below dir.
func walkFd(t testing.TB, fd int, dir string) int {
	f := os.NewFile(uintptr(fd), dir)
	defer f.Close()
	names, err := f.Readdirnames(-1)
	if err != nil {
		t.Fatalf("readdir %s: %v", dir, err)
	}
	n := len(names)
	for _, name := range names {
		var st unix.Stat_t
		if err := unix.Fstatat(fd, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			t.Fatalf("lstat %s/%s: %v", dir, name, err)
		}
		if st.Mode&unix.S_IFMT == unix.S_IFDIR {
			sub, err := unix.Openat(fd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
			if err != nil {
				t.Fatalf("open %s/%s: %v", dir, name, err)
			}
			n += walkFd(t, sub, dir+"/"+name)
		}
	}
	return n
}

func openDir(t testing.TB, dir string) int {
	t.Helper()
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatalf("open %s: %v", dir, err)
	}
	return fd
}

// walkPaths walks root with filepath.WalkDir and lstats every entry by its path, as a scanner
// of the runtime's storage does; it returns the entries seen, root included.
func walkPaths(t testing.TB, root string) int {
	n := 0
	err := filepath.WalkDir(root, func(p string, _ iofs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		n++
		_, err = os.Lstat(p)
		return err
	})
	if err != nil {
		t.Fatalf("walk: %v", err)
	}
	return n
}

// opCounter is a slog.Handler that counts the FUSE requests go-fuse logs in debug mode
// ("rx 12: LOOKUP n2 ..."), by opcode.
type opCounter struct {
	mu  sync.Mutex
	ops map[string]int
}

func (c *opCounter) Enabled(context.Context, slog.Level) bool { return true }
func (c *opCounter) WithAttrs([]slog.Attr) slog.Handler       { return c }
func (c *opCounter) WithGroup(string) slog.Handler            { return c }

func (c *opCounter) Handle(_ context.Context, r slog.Record) error {
	rest, ok := strings.CutPrefix(r.Message, "rx ")
	if !ok {
		return nil
	}
	if _, op, ok := strings.Cut(rest, ": "); ok {
		op, _, _ = strings.Cut(op, " ")
		c.mu.Lock()
		c.ops[op]++
		c.mu.Unlock()
	}
	return nil
}

// take returns the counts since the last take.
func (c *opCounter) take() map[string]int {
	c.mu.Lock()
	defer c.mu.Unlock()
	ops := c.ops
	c.ops = map[string]int{}
	return ops
}

// TestWalkFromKernelCaches checks that walking a diff tree (readdir and lstat of every entry)
// is answered from the kernel's caches wherever the tree allows it: a first walk lists each
// directory with READDIRPLUS and makes no LOOKUP or GETATTR of its own, and opens none
// through the daemon; a second walk reaches the daemon only for the attributes of the
// directories it lists, whose listings the kernel kept; and a walk by paths from the mount's
// root does not ask for the root's or the layer directory's attributes once per path.
func TestWalkFromKernelCaches(t *testing.T) {
	const n = 5000
	store, ref, key, x := syntheticLayer(t, n)
	ops := &opCounter{ops: map[string]int{}}
	opts := defaultConfig()
	opts.Debug = true
	opts.Logger = slog.New(ops)
	mnt, _ := mountTest(t, store, opts)
	diff := layerPath(mnt, ref, key, "diff")
	dirs := 0
	for id := range chunked.EntryID(x.Len()) {
		if m := x.Meta(id); m.Type == chunked.TypeDir && m.Visible() {
			dirs++
		}
	}

	for i, what := range []string{"first walk", "second walk"} {
		fd := openDir(t, diff)
		ops.take()
		if got := 1 + walkFd(t, fd, diff); got != x.Len() {
			t.Fatalf("%s: %d entries, the index has %d", what, got, x.Len())
		}
		got := ops.take()
		t.Logf("%s: %v", what, got)
		if got["LOOKUP"] != 0 || got["READDIR"] != 0 {
			t.Errorf("%s: %d LOOKUP, %d READDIR, want none: READDIRPLUS answers every lstat", what, got["LOOKUP"], got["READDIR"])
		}
		// The first OPENDIR of the mount is answered ENOSYS, before the walks (openDir).
		if got["OPENDIR"] != 0 || got["RELEASEDIR"] != 0 {
			t.Errorf("%s: %d OPENDIR, %d RELEASEDIR, want none: the kernel opens directories itself", what, got["OPENDIR"], got["RELEASEDIR"])
		}
		if i == 0 && (got["READDIRPLUS"] == 0 || got["GETATTR"] != 0) {
			t.Errorf("%s: %d READDIRPLUS, %d GETATTR, want some and none", what, got["READDIRPLUS"], got["GETATTR"])
		}
		// Listing a directory invalidates its access time in the kernel (the mount is
		// read-write for use and rmdir), so the lstat of a directory listed before asks for
		// its attributes again: one GETATTR per directory, no more.
		if i == 1 && (got["READDIRPLUS"] != 0 || got["GETATTR"] > dirs) {
			t.Errorf("%s: %d READDIRPLUS, %d GETATTR of %d directories, want none and at most one per directory: the kernel keeps the listings", what, got["READDIRPLUS"], got["GETATTR"], dirs)
		}
	}

	// The kernel may reclaim a cached listing under memory pressure (a loaded test machine):
	// the walk by paths gets three tries, and a daemon that lets the kernel cache nothing
	// fails all three.
	var problems []string
	for try := range 3 {
		start := time.Now()
		if got := walkPaths(t, diff); got != x.Len() {
			t.Fatalf("walk by paths: %d entries, the index has %d", got, x.Len())
		}
		took := time.Since(start)
		got := ops.take()
		t.Logf("walk by paths, try %d (%v): %v", try+1, took, got)
		problems = problems[:0]
		if got["GETATTR"] > dirs || got["READDIRPLUS"] != 0 || got["READDIR"] != 0 {
			problems = append(problems, fmt.Sprintf("%d GETATTR of %d directories, %d READDIRPLUS, %d READDIR, want at most one per directory, none, none",
				got["GETATTR"], dirs, got["READDIRPLUS"], got["READDIR"]))
		}
		// Each path resolves the layer directory again (its entry is never cached, so that
		// every access to it meets the daemon's check of the caller): one LOOKUP per lstat
		// and per open of a directory, for it alone.
		if paths := x.Len() + dirs + 1; got["LOOKUP"] > paths { // WalkDir lstats diff once more
			problems = append(problems, fmt.Sprintf("%d LOOKUP of %d paths, want at most one per path", got["LOOKUP"], paths))
		}
		if len(problems) == 0 {
			return
		}
	}
	t.Errorf("walk by paths: %s", strings.Join(problems, "; "))
}

// dirents reads the directory open as fd with getdents64 in buffers of size bytes until it
// has want entries or the end, and returns their names and offsets (d_off: where the next
// entry starts).
func dirents(t *testing.T, fd, size, want int) (names []string, offs []int64) {
	t.Helper()
	buf := make([]byte, size)
	for want < 0 || len(names) < want {
		n, err := unix.Getdents(fd, buf)
		if err != nil {
			t.Fatalf("getdents: %v", err)
		}
		if n == 0 {
			break
		}
		for b := buf[:n]; len(b) > 0; {
			off := int64(binary.NativeEndian.Uint64(b[8:16]))
			reclen := int(binary.NativeEndian.Uint16(b[16:18]))
			name := b[19:reclen]
			names = append(names, string(name[:bytes.IndexByte(name, 0)]))
			offs = append(offs, off)
			b = b[reclen:]
		}
	}
	return names, offs
}

// TestReaddirOffsets checks that a listing resumed at an offset the listing gave (seekdir,
// or a second open seeking where the first stopped, before the kernel holds the whole
// listing) goes on with the entry after it, and that the whole listing is the index's.
func TestReaddirOffsets(t *testing.T) {
	store, ref, key, x := syntheticLayer(t, 5000)
	mnt, _ := mountTest(t, store, defaultConfig())
	dir := layerPath(mnt, ref, key, "diff", "usr", "lib")
	id, ok := x.LookupPath("usr/lib")
	if !ok {
		t.Fatal("no usr/lib in the index")
	}
	var want []string
	for _, c := range x.ChildrenFrom(id, 0, x.Len()) {
		want = append(want, x.BaseName(c))
	}

	fd := openDir(t, dir)
	defer unix.Close(fd)
	first, offs := dirents(t, fd, 512, 10) // a few entries: the listing is not complete
	if len(first) < 10 || len(want) < 20 {
		t.Fatalf("listed %d of %d entries", len(first), len(want))
	}
	fd2 := openDir(t, dir)
	defer unix.Close(fd2)
	if _, err := unix.Seek(fd2, offs[4], io.SeekStart); err != nil {
		t.Fatal(err)
	}
	rest, _ := dirents(t, fd2, 4096, -1)
	if got := append(slices.Clone(first[:5]), rest...); !slices.Equal(got, want) {
		t.Errorf("listing resumed after entry 5 by another open:\n got %q\nwant %q", got, want)
	}
	if _, err := unix.Seek(fd, 0, io.SeekStart); err != nil {
		t.Fatal(err)
	}
	if all, _ := dirents(t, fd, 4096, -1); !slices.Equal(all, want) {
		t.Errorf("listing after a rewind:\n got %q\nwant %q", all, want)
	}
}
