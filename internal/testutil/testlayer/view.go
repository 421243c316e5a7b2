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
	r := referenceReader{
		t:      Tree{"": {Type: "dir", Mode: 0o755}},
		xattrs: map[string]map[string]string{},
		opaque: map[string]bool{},
		links:  map[string]string{},
	}
	tr := tar.NewReader(bytes.NewReader(tarStream))
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, err
		}
		if err := r.add(h, tr); err != nil {
			return nil, err
		}
	}
	r.setXattrs()
	if err := r.countLinks(); err != nil {
		return nil, err
	}
	r.shareHardlinks()
	return r.t, nil
}

// referenceReader is ReferenceTree's state between the tar's entries.
type referenceReader struct {
	t      Tree
	xattrs map[string]map[string]string // by path: the entry's xattrs
	opaque map[string]bool              // the directories a ".wh..wh..opq" marks opaque
	links  map[string]string            // hardlink path -> target path
}

// add records the tar entry h, whose content tr reads.
func (r *referenceReader) add(h *tar.Header, tr io.Reader) error {
	name := strings.Trim(path.Clean("/"+h.Name), "/")
	dir, base := path.Split(name)
	dir = strings.TrimSuffix(dir, "/")
	if dir == "" && (base == "stargz.index.json" || base == ".prefetch.landmark" || base == ".no.prefetch.landmark") {
		return nil
	}
	if base == ".wh..wh..opq" {
		r.opaque[dir] = true
		return nil
	}
	n := Node{Mode: uint32(h.Mode & 0o7777), UID: uint32(h.Uid), GID: uint32(h.Gid), MTime: h.ModTime.Unix()}
	if h.Typeflag == tar.TypeLink {
		r.addHardlink(name, h.Linkname, n)
		return nil
	}
	n, err := typedNode(n, h, tr, name)
	if err != nil {
		return err
	}
	if w, ok := strings.CutPrefix(base, ".wh."); ok {
		name = path.Join(dir, w)
		n.Type, n.Size, n.Content = "char", 0, ""
	}
	r.t[name] = n
	r.xattrs[name] = paxXattrs(h)
	for d := dir; d != ""; d = path.Dir(d) {
		if _, ok := r.t[d]; !ok {
			r.t[d] = Node{Type: "dir", Mode: 0o755}
		}
		if !strings.Contains(d, "/") {
			break
		}
	}
	return nil
}

// addHardlink records the hardlink name to linkname, whose header (owner, and mode and mtime
// unless the target is a symlink) n holds: it applies to the shared inode, the last one wins.
func (r *referenceReader) addHardlink(name, linkname string, n Node) {
	target := strings.Trim(path.Clean("/"+linkname), "/")
	r.links[name] = target
	if o, ok := r.t[target]; ok {
		o.UID, o.GID = n.UID, n.GID
		if o.Type != "symlink" {
			o.Mode, o.MTime = n.Mode, n.MTime
		}
		r.t[target] = o
	}
}

// typedNode returns n with the type of the tar entry h (not a hardlink) and what goes with
// it: the size and digest of the content tr reads, the link target, the device numbers.
func typedNode(n Node, h *tar.Header, tr io.Reader, name string) (Node, error) {
	switch h.Typeflag {
	case tar.TypeReg:
		data, err := io.ReadAll(tr)
		if err != nil {
			return n, err
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
	default:
		return n, fmt.Errorf("unexpected tar type %q for %s", h.Typeflag, name)
	}
	return n, nil
}

// paxXattrs returns the xattrs h's PAX records carry.
func paxXattrs(h *tar.Header) map[string]string {
	xs := map[string]string{}
	for k, v := range h.PAXRecords {
		if n, ok := strings.CutPrefix(k, "SCHILY.xattr."); ok {
			xs[n] = v
		}
	}
	return xs
}

// setXattrs sets every node's Xattrs, the opaque directories' overlay xattrs included.
func (r *referenceReader) setXattrs() {
	for d := range r.opaque {
		if r.xattrs[d] == nil {
			r.xattrs[d] = map[string]string{}
		}
		r.xattrs[d]["trusted.overlay.opaque"], r.xattrs[d]["user.overlay.opaque"] = "y", "y"
	}
	for p, xs := range r.xattrs {
		if n, ok := r.t[p]; ok {
			n.Xattrs = XattrString(xs)
			r.t[p] = n
		}
	}
}

// countLinks sets the link counts: directories 2 + subdirectories, files 1 + hardlinks.
func (r *referenceReader) countLinks() error {
	for p, n := range r.t {
		if n.Type == "dir" {
			n.Nlink = 2
		} else {
			n.Nlink = 1
		}
		r.t[p] = n
	}
	for p, n := range r.t {
		if p != "" && n.Type == "dir" {
			parent := r.t[parentOf(p)]
			parent.Nlink++
			r.t[parentOf(p)] = parent
		}
	}
	for name, target := range r.links {
		owner, ok := r.t[target]
		if !ok {
			return fmt.Errorf("hardlink %s to missing %s", name, target)
		}
		owner.Nlink++
		r.t[target] = owner
	}
	return nil
}

// shareHardlinks makes every hardlink and its target the same node, owned by the target.
func (r *referenceReader) shareHardlinks() {
	for name, target := range r.links {
		n := r.t[target]
		n.HardTo = target
		r.t[name], r.t[target] = n, n
	}
}

func parentOf(p string) string {
	if i := strings.LastIndexByte(p, '/'); i >= 0 {
		return p[:i]
	}
	return ""
}
