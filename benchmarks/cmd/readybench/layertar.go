package main

import (
	"archive/tar"
	"bufio"
	"crypto/sha256"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// writeLayerTar writes the tree at root as an OCI layer tar: entries in lexical order (a
// directory before its content), numeric owners only, modification times in whole seconds,
// extended attributes (but overlay's own trusted.* ones), hard links as links, overlay
// whiteouts (0:0 character devices) as .wh.<name> and opaque directories as
// .wh..wh..opq. The content of the top-level directories in skip is left out (the
// directories themselves are kept). It returns the tar's size, sha256 (the DiffID) and the
// number of entries.
func writeLayerTar(w io.Writer, root string, skip map[string]bool) (size int64, diffID string, entries int, err error) {
	h := sha256.New()
	cw := &countWriter{w: io.MultiWriter(w, h)}
	bw := bufio.NewWriterSize(cw, 1<<20)
	tw := tar.NewWriter(bw)
	type inode struct{ dev, ino uint64 }
	links := map[inode]string{}
	err = filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(root, p)
		if err != nil || rel == "." {
			return err
		}
		rel = filepath.ToSlash(rel)
		if top, _, nested := strings.Cut(rel, "/"); nested && skip[top] {
			if d.IsDir() {
				return fs.SkipDir
			}
			return nil
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		st, ok := fi.Sys().(*syscall.Stat_t)
		if !ok {
			return fmt.Errorf("%s: no stat", p)
		}
		mode := fi.Mode()
		if mode&fs.ModeSocket != 0 {
			return nil
		}
		if mode&fs.ModeCharDevice != 0 && st.Rdev == 0 {
			dir, name := filepath.Split(rel)
			entries++
			return tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: dir + ".wh." + name, Mode: 0o600,
				ModTime: fi.ModTime().Truncate(time.Second)})
		}
		hdr, err := tarHeader(p, rel, fi, st)
		if err != nil {
			return err
		}
		if mode.IsRegular() && st.Nlink > 1 {
			in := inode{uint64(st.Dev), st.Ino}
			if first, ok := links[in]; ok {
				hdr.Typeflag, hdr.Linkname, hdr.Size = tar.TypeLink, first, 0
			} else {
				links[in] = rel
			}
		}
		entries++
		if err := tw.WriteHeader(hdr); err != nil {
			return fmt.Errorf("%s: %w", rel, err)
		}
		if d.IsDir() {
			if v, err := lgetxattr(p, "trusted.overlay.opaque"); err == nil && v == "y" {
				entries++
				return tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: rel + "/.wh..wh..opq", Mode: 0o600, ModTime: hdr.ModTime})
			}
		}
		if hdr.Typeflag == tar.TypeReg && hdr.Size > 0 {
			return copyContent(tw, p, hdr)
		}
		return nil
	})
	if err == nil {
		err = tw.Close()
	}
	if err == nil {
		err = bw.Flush()
	}
	return cw.n, fmt.Sprintf("sha256:%x", h.Sum(nil)), entries, err
}

// tarHeader is the header of the file at p, named rel in the layer, from its stat: numeric
// owners, times in whole seconds, its extended attributes as PAX records.
func tarHeader(p, rel string, fi fs.FileInfo, st *syscall.Stat_t) (*tar.Header, error) {
	link := ""
	if fi.Mode()&fs.ModeSymlink != 0 {
		var err error
		if link, err = os.Readlink(p); err != nil {
			return nil, err
		}
	}
	hdr, err := tar.FileInfoHeader(fi, link)
	if err != nil {
		return nil, err
	}
	hdr.Name = rel
	if fi.IsDir() {
		hdr.Name += "/"
	}
	hdr.Uid, hdr.Gid = int(st.Uid), int(st.Gid)
	hdr.Uname, hdr.Gname = "", ""
	hdr.ModTime = fi.ModTime().Truncate(time.Second)
	hdr.AccessTime, hdr.ChangeTime = time.Time{}, time.Time{}
	hdr.Format = tar.FormatUnknown
	x, err := xattrs(p)
	if err != nil {
		return nil, err
	}
	if len(x) > 0 {
		hdr.PAXRecords = map[string]string{}
		for k, v := range x {
			hdr.PAXRecords["SCHILY.xattr."+k] = v
		}
	}
	return hdr, nil
}

// copyContent writes the content of the regular file at p, hdr.Size bytes, into tw.
func copyContent(tw *tar.Writer, p string, hdr *tar.Header) error {
	f, err := os.Open(p)
	if err != nil {
		return err
	}
	defer f.Close()
	if n, err := io.Copy(tw, f); err != nil || n != hdr.Size {
		return fmt.Errorf("%s: copied %d of %d bytes: %v", hdr.Name, n, hdr.Size, err)
	}
	return nil
}

// xattrs returns the extended attributes of p worth keeping in a layer: everything but
// overlay's trusted.* bookkeeping and SELinux labels of the build host.
func xattrs(p string) (map[string]string, error) {
	sz, err := unix.Llistxattr(p, nil)
	if err != nil || sz == 0 {
		return nil, nil // no xattr support or none: nothing to keep
	}
	buf := make([]byte, sz)
	if sz, err = unix.Llistxattr(p, buf); err != nil {
		return nil, err
	}
	out := map[string]string{}
	for _, k := range strings.Split(strings.TrimRight(string(buf[:sz]), "\x00"), "\x00") {
		if k == "" || strings.HasPrefix(k, "trusted.") || k == "security.selinux" {
			continue
		}
		v, err := lgetxattr(p, k)
		if err != nil {
			return nil, fmt.Errorf("%s: %s: %w", p, k, err)
		}
		out[k] = v
	}
	return out, nil
}

func lgetxattr(p, k string) (string, error) {
	sz, err := unix.Lgetxattr(p, k, nil)
	if err != nil {
		return "", err
	}
	buf := make([]byte, sz)
	sz, err = unix.Lgetxattr(p, k, buf)
	if err != nil {
		return "", err
	}
	return string(buf[:sz]), nil
}

type countWriter struct {
	w io.Writer
	n int64
}

func (c *countWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n += int64(n)
	return n, err
}
