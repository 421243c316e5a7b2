package testlayer

import (
	"archive/tar"
	"bytes"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"path"
	"sort"
	"strings"
)

// Node is what the overlay tree shows for one path.
type Node struct {
	Type     string // reg dir symlink char block fifo
	Mode     uint32
	UID, GID uint32
	MTime    int64 // Unix seconds
	Link     string
	Dev      [2]uint32
	Xattrs   string // sorted "name=value;" list
	Content  string // sha256 of the content, for regular files
	Size     int64
	HardTo   string // path of the inode owner when the entry is a hardlink
	Nlink    uint32
}

// Tree maps cleaned paths ("" is the root) to nodes.
type Tree map[string]Node

// XattrString renders xattrs in the form Node.Xattrs uses.
func XattrString(m map[string]string) string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var b strings.Builder
	for _, k := range keys {
		fmt.Fprintf(&b, "%s=%q;", k, m[k])
	}
	return b.String()
}

// ReferenceTree reads a tar stream the way an overlay-aware extractor would: format artefacts
// dropped, ".wh.NAME" turned into a 0/0 character device NAME, ".wh..wh..opq" turned into the
// opaque xattrs on its directory, later entries replacing earlier ones, missing directories
// created, hardlinks sharing their target's inode (whose owner, mode and mtime the last
// hardlink header sets, as c/storage's extraction does).
func ReferenceTree(tarStream []byte) (Tree, error) {
	t := Tree{"": {Type: "dir", Mode: 0o755}}
	xattrs := map[string]map[string]string{}
	opaque := map[string]bool{}
	links := map[string]string{}
	tr := tar.NewReader(bytes.NewReader(tarStream))
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, err
		}
		name := strings.Trim(path.Clean("/"+h.Name), "/")
		dir, base := path.Split(name)
		dir = strings.TrimSuffix(dir, "/")
		if dir == "" && (base == "stargz.index.json" || base == ".prefetch.landmark" || base == ".no.prefetch.landmark") {
			continue
		}
		if base == ".wh..wh..opq" {
			opaque[dir] = true
			continue
		}
		xs := map[string]string{}
		for k, v := range h.PAXRecords {
			if n, ok := strings.CutPrefix(k, "SCHILY.xattr."); ok {
				xs[n] = v
			}
		}
		n := Node{Mode: uint32(h.Mode & 0o7777), UID: uint32(h.Uid), GID: uint32(h.Gid), MTime: h.ModTime.Unix()}
		switch h.Typeflag {
		case tar.TypeReg:
			data, err := io.ReadAll(tr)
			if err != nil {
				return nil, err
			}
			n.Type, n.Size, n.Content = "reg", int64(len(data)), fmt.Sprintf("%x", sha256.Sum256(data))
		case tar.TypeDir:
			n.Type = "dir"
		case tar.TypeSymlink:
			n.Type, n.Link = "symlink", h.Linkname
		case tar.TypeChar:
			n.Type, n.Dev = "char", [2]uint32{uint32(h.Devmajor), uint32(h.Devminor)}
		case tar.TypeBlock:
			n.Type, n.Dev = "block", [2]uint32{uint32(h.Devmajor), uint32(h.Devminor)}
		case tar.TypeFifo:
			n.Type = "fifo"
		case tar.TypeLink:
			// The link's header applies to the shared inode: the last header wins.
			target := strings.Trim(path.Clean("/"+h.Linkname), "/")
			links[name] = target
			if o, ok := t[target]; ok {
				o.UID, o.GID = n.UID, n.GID
				if o.Type != "symlink" {
					o.Mode, o.MTime = n.Mode, n.MTime
				}
				t[target] = o
			}
			continue
		default:
			return nil, fmt.Errorf("unexpected tar type %q for %s", h.Typeflag, name)
		}
		if w, ok := strings.CutPrefix(base, ".wh."); ok {
			name = path.Join(dir, w)
			n.Type, n.Size, n.Content = "char", 0, ""
		}
		t[name] = n
		xattrs[name] = xs
		for d := dir; d != ""; d = path.Dir(d) {
			if _, ok := t[d]; !ok {
				t[d] = Node{Type: "dir", Mode: 0o755}
			}
			if !strings.Contains(d, "/") {
				break
			}
		}
	}
	for d := range opaque {
		if xattrs[d] == nil {
			xattrs[d] = map[string]string{}
		}
		xattrs[d]["trusted.overlay.opaque"], xattrs[d]["user.overlay.opaque"] = "y", "y"
	}
	for p, xs := range xattrs {
		if n, ok := t[p]; ok {
			n.Xattrs = XattrString(xs)
			t[p] = n
		}
	}
	// Link counts: directories 2 + subdirectories, files 1 + hardlinks.
	for p, n := range t {
		if n.Type == "dir" {
			n.Nlink = 2
		} else {
			n.Nlink = 1
		}
		t[p] = n
	}
	for p, n := range t {
		if p != "" && n.Type == "dir" {
			parent := t[parentOf(p)]
			parent.Nlink++
			t[parentOf(p)] = parent
		}
	}
	for name, target := range links {
		owner, ok := t[target]
		if !ok {
			return nil, fmt.Errorf("hardlink %s to missing %s", name, target)
		}
		owner.Nlink++
		t[target] = owner
	}
	for name, target := range links {
		n := t[target]
		n.HardTo = target
		t[name], t[target] = n, n
	}
	return t, nil
}

func parentOf(p string) string {
	if i := strings.LastIndexByte(p, '/'); i >= 0 {
		return p[:i]
	}
	return ""
}
