package chunked_test

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/layerstore/layerstore/chunked"
)

// linkStream is a layer whose paths are written twice, with hardlinks to them between the
// two: tar extraction links each to the entry the path holds when the hardlink comes.
var linkStream = []tar.Header{
	{Name: "f", Typeflag: tar.TypeReg, Linkname: "first"}, // Linkname holds the content here
	{Name: "l1", Typeflag: tar.TypeLink, Linkname: "f"},
	{Name: "f", Typeflag: tar.TypeReg, Linkname: "second!"},
	{Name: "l2", Typeflag: tar.TypeLink, Linkname: "f"},
	{Name: "l3", Typeflag: tar.TypeLink, Linkname: "l1"},
	{Name: "g", Typeflag: tar.TypeFifo},
	{Name: "lg", Typeflag: tar.TypeLink, Linkname: "g"},
	{Name: "g", Typeflag: tar.TypeReg, Linkname: "g-file"},
	{Name: "lg2", Typeflag: tar.TypeLink, Linkname: "g"},
	{Name: "d/h", Typeflag: tar.TypeReg, Linkname: "h one"},
	{Name: "d/lh", Typeflag: tar.TypeLink, Linkname: "d/h"},
	{Name: "d/h", Typeflag: tar.TypeLink, Linkname: "f"},
	{Name: "lh2", Typeflag: tar.TypeLink, Linkname: "d/h"},
}

// TestHardlinksAsExtracted: the index links what `tar -x` links, with the same content and
// link counts, for a layer that replaces paths hardlinks point to.
func TestHardlinksAsExtracted(t *testing.T) {
	tarBin, err := exec.LookPath("tar")
	if err != nil {
		t.Skip("no tar")
	}
	var layer bytes.Buffer
	tw := tar.NewWriter(&layer)
	var entries []string
	for i, h := range linkStream {
		h.Mode = 0o644
		var content []byte
		if h.Typeflag == tar.TypeReg {
			content, h.Linkname, h.Size = []byte(h.Linkname), "", int64(len(h.Linkname))
		}
		if err := tw.WriteHeader(&h); err != nil {
			t.Fatal(err)
		}
		if _, err := tw.Write(content); err != nil {
			t.Fatal(err)
		}
		switch h.Typeflag {
		case tar.TypeReg:
			sum := sha256.Sum256(content)
			d := "sha256:" + hex.EncodeToString(sum[:])
			entries = append(entries, ent(h.Name, "reg", "size", h.Size, "offset", 100*i, "digest", d, "chunkDigest", d))
		case tar.TypeLink:
			entries = append(entries, ent(h.Name, "hardlink", "linkName", h.Linkname))
		case tar.TypeFifo:
			entries = append(entries, ent(h.Name, "fifo"))
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	cmd := exec.Command(tarBin, "-x", "-C", dir, "--no-same-owner")
	cmd.Stdin = &layer
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("tar -x: %v: %s", err, out)
	}
	x, err := chunked.Parse(context.Background(), testLayout(chunked.EStargz), []byte(tocOf(entries...)), chunked.Limits{})
	if err != nil {
		t.Fatal(err)
	}

	// What tar made: every non-directory by path, with its inode, link count and content.
	type file struct {
		ino     uint64
		nlink   uint64
		fifo    bool
		content string
	}
	got := map[string]file{}
	err = filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		fi, err := os.Lstat(p)
		if err != nil {
			return err
		}
		st := fi.Sys().(*syscall.Stat_t)
		f := file{ino: st.Ino, nlink: uint64(st.Nlink), fifo: fi.Mode()&fs.ModeNamedPipe != 0}
		if fi.Mode().IsRegular() {
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			sum := sha256.Sum256(b)
			f.content = hex.EncodeToString(sum[:])
		}
		rel, _ := filepath.Rel(dir, p)
		got[rel] = f
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	paths := map[string]bool{}
	for _, h := range linkStream {
		paths[h.Name] = true
	}
	if len(got) != len(paths) {
		t.Errorf("tar made %d files, the stream names %d paths", len(got), len(paths))
	}
	for p := range paths {
		id := lookup(t, x, p)
		owner := x.Entry(x.Entry(id).Inode)
		want := got[p]
		content := ""
		if owner.Type == chunked.TypeReg {
			content = hex.EncodeToString(owner.Digest[:])
		}
		if (owner.Type == chunked.TypeFifo) != want.fifo || content != want.content || uint64(owner.Nlink) != want.nlink {
			t.Errorf("%s: index shows %v %.8s with %d links; tar made fifo %v %.8s with %d links",
				p, owner.Type, content, owner.Nlink, want.fifo, want.content, want.nlink)
		}
		for q := range paths {
			same := x.Entry(lookup(t, x, q)).Inode == x.Entry(id).Inode
			if same != (got[q].ino == want.ino) {
				t.Errorf("%s and %s: same inode in the index %v, after tar -x %v", p, q, same, !same)
			}
		}
	}
}
