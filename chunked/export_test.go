package chunked

import (
	"bytes"
	"context"
	"fmt"
	"reflect"
)

// Children returns the visible entries of a directory, sorted by name.
func (x *Index) Children(dir EntryID) []EntryID { return x.ChildrenFrom(dir, 0, x.Len()) }

// CompareWide parses a TOC as Parse does and returns the first difference between the wide
// form the builder fills and what the compact index it becomes answers, or nil.
func CompareWide(layout *Layout, tocJSON []byte, limits Limits) error {
	b := &builder{ctx: context.Background(), lim: limits.WithDefaults(), cur: -1,
		x: newWideIndex(layout)}
	b.x.keep = true
	defer b.free()
	if err := b.decode(bytes.NewBuffer(tocJSON)); err != nil {
		return nil // Parse refuses it too
	}
	x, err := b.finish()
	if err != nil {
		return nil
	}
	w := b.x
	if x.Len() != w.entries.len() || x.Root() != w.root || x.TOCLen() != w.tocCount || x.Format() != w.format ||
		x.PrefetchEnd() != w.prefetchEnd || x.PayloadEnd() != w.payloadEnd || x.TarSplitDigest() != w.tarSplitDigest {
		return fmt.Errorf("header differs")
	}
	for i := range w.entries.len() {
		id := EntryID(i)
		wide := w.entries.at(i)
		ex := w.extraOf(wide)
		sec, nsec := w.modTime(id, wide)
		we := Entry{Name: w.nameOf(wide), LinkName: w.linkName(ex), Size: wide.Size, ModTimeSec: sec,
			ModTimeNsec: nsec, Mode: wide.Mode, UID: wide.UID, GID: wide.GID, DevMajor: ex.DevMajor,
			DevMinor: ex.DevMinor, Parent: wide.Parent, Inode: w.inode(id, wide), Nlink: w.nlink(wide), Digest: wide.Digest,
			Type: wide.Type, Flags: wide.Flags}
		owner := w.entries.at(int(we.Inode))
		attr := w.attrOf(we.Inode, owner)
		var cs []Chunk
		for k := range int(owner.nchunks) {
			cs = append(cs, w.chunk(owner, k))
		}
		var xs []Xattr
		for k := range int(ex.nxattrs) {
			xs = append(xs, w.xattrAt(ex, k))
		}
		var at, ct int64
		if i < len(w.times) {
			at, ct = w.times[i].atime, w.times[i].ctime
		}
		gat, gct := x.TOCTimes(id)
		for _, d := range []struct {
			what      string
			got, want any
		}{
			{"entry", x.Entry(id), we}, {"attr", x.AttrEntry(id), attr}, {"base", x.BaseName(id), w.baseName(id)},
			{"chunks", x.Chunks(id), cs}, {"xattrs", x.TOCXattrs(id), xs}, {"times", [2]int64{gat, gct}, [2]int64{at, ct}},
		} {
			if (reflect.ValueOf(d.want).Kind() != reflect.Slice || reflect.ValueOf(d.want).Len() > 0 ||
				reflect.ValueOf(d.got).Len() > 0) && !reflect.DeepEqual(d.got, d.want) {
				return fmt.Errorf("entry %d %q: %s %+v, want %+v", i, we.Name, d.what, d.got, d.want)
			}
		}
	}
	var children []EntryID
	for i := range w.entries.len() {
		children = append(children, x.Children(EntryID(i))...)
	}
	if len(children) != len(w.children) || len(w.children) > 0 && !reflect.DeepEqual(children, w.children) {
		return fmt.Errorf("children %v, want %v", children, w.children)
	}
	return nil
}

// MappedPeak returns the most bytes the parses since the last call held mapped outside the
// heap at once (see blockSlice), and starts counting again from what is mapped now.
func MappedPeak() int64 { return mappedPeak.Swap(mappedBytes.Load()) }
