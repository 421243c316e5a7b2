package chunked

import (
	"slices"
	"strings"
)

const (
	whiteoutPrefix = ".wh."
	opaqueMarker   = ".wh..wh..opq"
	// reservedPrefix starts names overlay reserves (".wh..wh.plnk" and the like).
	reservedPrefix   = ".wh..wh."
	prefetchLandmark = ".prefetch.landmark"
	noPrefetchMark   = ".no.prefetch.landmark"
)

// artefacts are root-level entries that formats add and the tree hides.
var artefacts = map[string]bool{"stargz.index.json": true, prefetchLandmark: true, noPrefetchMark: true}

// finish links the entries into a tree: last entry wins per path, implicit directories,
// whiteouts and opaque markers, hardlinks, link counts, compressed ends, sorted children;
// then compacts the index.
func (b *builder) finish() (*Index, error) {
	if err := b.closeFile(); err != nil {
		return nil, err
	}
	x := b.x
	x.tocCount = x.entries.len()
	if x.times != nil {
		x.times = x.times[:x.entries.len()]
	}
	if err := b.fillEnds(); err != nil {
		return nil, err
	}
	if err := b.mapPaths(); err != nil {
		return nil, err
	}
	if err := b.addDirs(); err != nil {
		return nil, err
	}
	if err := b.linkParents(); err != nil {
		return nil, err
	}
	b.paths.Free() // linkParents was its last use
	b.paths = nil
	counts, freeCounts := b.countChildren()
	err := b.listChildren(counts)
	freeCounts()
	if err != nil {
		return nil, err
	}
	return x.compact()
}

// free lets go of the builder's wide form and path table: neither is usable after.
func (b *builder) free() {
	b.x.free()
	if b.paths != nil {
		b.paths.Free()
	}
}

// mapPaths maps every path of the tree to the last TOC entry at it, marking the entries it
// replaces shadowed, and resolves hardlinks as it goes.
func (b *builder) mapPaths() error {
	x := b.x
	b.paths = newPathTable(x.entries.len(), b.lim.MaxEntries, b.pathOf)
	for id := range x.entries.len() {
		if err := b.canceled(id); err != nil {
			return err
		}
		e := x.entries.at(int(id))
		dir, base, err := b.classifyName(e)
		if err != nil {
			return &EntryError{Index: -1, Name: x.nameOf(e), Err: err}
		}
		if e.Flags&FlagHidden != 0 {
			continue
		}
		// A hardlink links to what its target path holds at this point of the layer, as
		// extraction makes it: a later entry at that path replaces the path, not the link.
		if e.Type == TypeHardlink {
			ex := x.extras.at(int(e.extra) - 1)
			if ex.inode, err = b.resolveLink(b.paths, x.linkName(*ex)); err != nil {
				return &EntryError{Index: -1, Name: x.nameOf(e), Err: err}
			}
		}
		if old, ok := b.paths.Put(dir, base, EntryID(id)); ok {
			x.entries.at(int(old)).Flags |= FlagShadowed
		}
	}
	return nil
}

// addDirs adds the root and the directories the visible entries need that the TOC does not
// list, and marks the directories of opaque markers opaque.
func (b *builder) addDirs() error {
	x := b.x
	if err := b.ensureDir(""); err != nil {
		return err
	}
	lastDir := uint32(0) // ensured: entries of a directory mostly follow one another
	for id := range x.tocCount {
		if err := b.canceled(id); err != nil {
			return err
		}
		if e := x.entries.at(int(id)); e.Visible() && e.dir != lastDir {
			if err := b.ensureDir(x.dirOf(e)); err != nil {
				return err
			}
			lastDir = e.dir
		}
	}
	for _, d := range b.opaqueDir {
		if err := b.ensureDir(d); err != nil {
			return err
		}
		at, _ := b.paths.Get(d)
		dir := x.entries.at(int(at))
		if dir.Type != TypeDir {
			return &EntryError{Index: -1, Name: d + "/" + opaqueMarker, Err: invalidf("opaque marker in a non-directory")}
		}
		dir.Flags |= FlagOpaque
	}
	return nil
}

// ensureDir adds an implicit directory at p and at each of its parents that no entry holds.
// Implicit directories count against the entry limit with the TOC's entries (the root,
// which every index has, does not).
func (b *builder) ensureDir(p string) error {
	x := b.x
	for {
		if _, ok := b.paths.Get(p); ok {
			return nil
		}
		if p != "" {
			if b.raw+b.implicit >= b.lim.MaxEntries {
				return &EntryError{Index: -1, Name: p, Err: limitf(
					"the TOC's %d entries and the directories they imply exceed %d", b.raw, b.lim.MaxEntries)}
			}
			b.implicit++
		}
		id := EntryID(x.entries.len())
		dir, base, err := x.addName(p)
		if err != nil {
			return err
		}
		x.entries.append(wideEntry{dir: dir, baseOff: base.off, baseLen: base.n, Type: TypeDir, Mode: 0o755, Flags: FlagImplicit})
		b.paths.Set(p, id)
		if p == "" {
			return nil
		}
		p, _ = splitPath(p)
	}
}

// linkParents sets the root, and each visible entry's Parent and default link count; for
// each entry that is not visible, it notes the entry its name continues (hiddenDirs). It is
// the last step that needs the path table.
func (b *builder) linkParents() error {
	x := b.x
	x.root, _ = b.paths.Get("")
	if x.entries.at(int(x.root)).Type != TypeDir {
		return &EntryError{Index: -1, Name: "/", Err: invalidf("root is not a directory")}
	}
	lastDir, lastParent := uint32(0), x.root
	for id := range x.entries.len() {
		if err := b.canceled(id); err != nil {
			return err
		}
		e := x.entries.at(int(id))
		if !e.Visible() {
			d := x.dirOf(e)
			cand, ok := b.paths.Get(d)
			if !ok || cand == EntryID(id) || !x.nameIs(x.entries.at(int(cand)), d) {
				cand = noDir
			}
			x.hiddenDirs = append(x.hiddenDirs, cand)
			continue
		}
		if e.Type == TypeDir {
			e.chunk0 = 2 // its Nlink (see nlink); another's is 1
		}
		if EntryID(id) == x.root {
			e.Parent = x.root
			continue
		}
		if e.dir != lastDir {
			lastDir = e.dir
			lastParent, _ = b.paths.Get(x.dirOf(e))
		}
		e.Parent = lastParent
		if x.entries.at(int(e.Parent)).Type != TypeDir {
			return &EntryError{Index: -1, Name: x.nameOf(e), Err: invalidf("parent is not a directory")}
		}
	}
	return nil
}

// countChildren returns the count of each entry's visible children, at the index after the
// entry's (for listChildren), and the function that lets go of them.
func (b *builder) countChildren() ([]uint32, func()) {
	x := b.x
	counts, free := mappedSlice[uint32](x.entries.len() + 1)
	for id := range x.entries.len() {
		if e := x.entries.at(id); e.Visible() && EntryID(id) != x.root {
			counts[e.Parent+1]++
		}
	}
	return counts, free
}

// listChildren lists the visible entries but the root as children, sorted by (Parent,
// BaseName): grouped by parent in one pass in TOC order, then each directory's sorted by name
// (often sorted already, in TOC order). counts is countChildren's; listChildren changes them. In
// the same pass it counts a directory's subdirectories and an inode's hardlinks in their link
// counts, and gives a hardlinked inode the attributes of its last header.
func (b *builder) listChildren(counts []uint32) error {
	x := b.x
	at := counts // at[p]: where the next child of p goes, once summed
	for i := 1; i < len(at); i++ {
		at[i] += at[i-1]
	}
	children, free := mappedSlice[EntryID](int(at[len(at)-1]))
	x.children, x.freeChildren = children, free
	for id := range x.entries.len() {
		if err := b.canceled(id); err != nil {
			return err
		}
		e := x.entries.at(int(id))
		if !e.Visible() || EntryID(id) == x.root {
			continue
		}
		children[at[e.Parent]] = EntryID(id)
		at[e.Parent]++
		switch e.Type {
		case TypeDir:
			x.entries.at(int(e.Parent)).chunk0++ // its Nlink
		case TypeHardlink:
			// The owner counts its visible names: itself unless a later entry replaced it.
			owner := x.entries.at(int(x.inode(EntryID(id), e)))
			ex := x.extraFor(owner)
			ex.links++
			// Extractors apply a hardlink's header to the inode it shares (c/storage chowns,
			// chmods and sets times through the new name), so the last header wins.
			if owner.Type != TypeSymlink {
				ex.attr = EntryID(id) + 1
			}
		}
	}
	// at[p] is now where the children of p end, and those of p+1 start.
	byName := func(a, b EntryID) int { return strings.Compare(x.baseName(a), x.baseName(b)) }
	from := uint32(0)
	for p := range x.entries.len() {
		if dir := children[from:at[p]]; len(dir) > 1 && !slices.IsSortedFunc(dir, byName) {
			slices.SortFunc(dir, byName)
		}
		from = at[p]
	}
	return nil
}

// classifyName sets the whiteout and hidden flags of an entry, and returns its path in the
// tree: its directory's path and its base name (see pathTable).
func (b *builder) classifyName(e *wideEntry) (dir, base string, err error) {
	dir, base = b.x.dirOf(e), b.x.baseOf(e)
	switch {
	case base == "":
	case dir == "" && artefacts[base]:
		e.Flags |= FlagHidden
	case base == opaqueMarker:
		e.Flags |= FlagHidden
		b.opaqueDir = append(b.opaqueDir, dir)
	case strings.HasPrefix(base, reservedPrefix):
		e.Flags |= FlagHidden
	case strings.HasPrefix(base, whiteoutPrefix):
		vis := base[len(whiteoutPrefix):]
		if vis == "" || vis == "." || vis == ".." {
			return "", "", invalidf("bad whiteout name")
		}
		if e.Type == TypeDir {
			return "", "", invalidf("whiteout is a directory")
		}
		e.Flags |= FlagWhiteout
		return dir, vis, nil
	}
	return dir, base, nil
}

// pathOf returns the path entry id holds in the tree, as classifyName does: its directory's
// path and its base name, for a whiteout the name of the path it removes.
func (b *builder) pathOf(id EntryID) (dir, base string) {
	e := b.x.entries.at(int(id))
	return b.x.dirOf(e), b.x.baseName(id)
}

// resolveLink returns the entry that owns the inode at path target, given paths, the entries
// before the hardlink by path. A hardlink there is resolved already.
func (b *builder) resolveLink(paths *pathTable, target string) (EntryID, error) {
	id, ok := paths.Get(target)
	if !ok {
		return 0, invalidf("hardlink target %q does not exist before the hardlink", target)
	}
	switch t := b.x.entries.at(int(id)); {
	case t.Flags&FlagWhiteout != 0:
		return 0, invalidf("hardlink to the whiteout %q", target)
	case t.Type == TypeDir:
		return 0, invalidf("hardlink to the directory %q", target)
	default:
		return b.x.inode(id, t), nil
	}
}

// fillEnds sets the compressed end of chunks whose format does not record it: the next
// larger chunk offset in the blob, or the end of the data; then caps every chunk's span at
// [MaxSpan].
func (b *builder) fillEnds() error {
	x := b.x
	var offs []int64 // sorted distinct chunk offsets, when some chunk needs them
	for e, i := range x.chunksAll() {
		if x.chunk(e, i).Length == 0 {
			n := 0
			for range x.chunksAll() {
				n++
			}
			all, free := mappedSlice[int64](n) // at its size: mapped pages are faulted in whole
			defer free()
			offs = all[:0]
			for e, i := range x.chunksAll() {
				offs = append(offs, x.chunk(e, i).Offset)
			}
			slices.Sort(offs)
			offs = slices.Compact(offs)
			break
		}
	}
	for e, i := range x.chunksAll() {
		c := x.chunk(e, i)
		end := c.End()
		if c.Length == 0 {
			end = x.payloadEnd
			if j, _ := slices.BinarySearch(offs, c.Offset+1); j < len(offs) {
				end = offs[j]
			}
		}
		if end <= c.Offset || end > x.payloadEnd {
			return invalidf("chunk at blob offset %d ends at %d (data ends at %d)", c.Offset, end, x.payloadEnd)
		}
		x.setLength(e, i, min(end, c.Offset+MaxSpan(c.InnerOffset+c.Size))-c.Offset)
	}
	return nil
}
