package chunked

import "hash/maphash"

// pathTable maps the tree's paths to the entries holding them, as a map[string]EntryID
// would, but holds only the entries' numbers: a path is read back from its entry (keyOf)
// when probed. That is 8-16 bytes an entry (8 MiB for a TOC of a million entries, where the
// map took about 50), held through the parse's peak (the compact form is written while it is
// alive). A slot's bits above those of the numbers the table may hold (24 bits for the default
// entry limit) hold a tag of its path's hash: a probe reads back only the paths whose tag
// matches, not one of every slot it passes (each read two cache misses, the entry and its
// name). Its hash is seeded per table (hash/maphash), so that a TOC cannot be made of paths
// that collide; probing is linear, the table at most half full. Not safe for concurrent use:
// the builder alone uses it.
type pathTable struct {
	seed  maphash.Seed
	slots []uint32 // an entry's number + 1 (idMask), and its path's tag; 0 is an empty slot
	free  func()   // lets go of slots (mappedSlice)
	n     int
	// idMask is the bits of a slot that hold the entry's number + 1: the others hold the tag.
	idMask uint32
	keyOf  func(EntryID) string
}

// newPathTable returns a table sized for n paths, whose paths are keyOf's, for entry numbers
// up to maxEntries (an index holds at most the entry limit and its root).
func newPathTable(n, maxEntries int, keyOf func(EntryID) string) *pathTable {
	size := 16
	for size < 2*n {
		size *= 2
	}
	slots, free := mappedSlice[uint32](size)
	idMask := ^uint32(0) // no tag
	if maxEntries+1 < 1<<24-1 {
		idMask = 1<<24 - 1
	}
	return &pathTable{seed: maphash.MakeSeed(), slots: slots, free: free, idMask: idMask, keyOf: keyOf}
}

// Free lets go of the table: it is unusable after.
func (t *pathTable) Free() {
	t.free()
	t.slots = nil
}

// Len returns how many paths the table holds.
func (t *pathTable) Len() int { return t.n }

// hash returns the hash of path p: where its probe starts, and its tag.
func (t *pathTable) hash(p string) (int, uint32) {
	h := maphash.String(t.seed, p)
	return int(h), uint32(h>>32) &^ t.idMask
}

// find returns the slot of path p, or the empty slot where it would go, and p's tag.
func (t *pathTable) find(p string) (int, uint32) {
	mask := len(t.slots) - 1
	h, tag := t.hash(p)
	for i := h & mask; ; i = (i + 1) & mask {
		s := t.slots[i]
		if s == 0 || s&^t.idMask == tag && t.keyOf(EntryID(s&t.idMask-1)) == p {
			return i, tag
		}
	}
}

// Get returns the entry at path p.
func (t *pathTable) Get(p string) (EntryID, bool) {
	i, _ := t.find(p)
	s := t.slots[i]
	return EntryID(s&t.idMask - 1), s != 0
}

// Set maps path p, which must be keyOf(id), to id, replacing the entry it mapped to.
func (t *pathTable) Set(p string, id EntryID) { t.Put(p, id) }

// Put is Set that returns the entry p mapped to before, if any.
func (t *pathTable) Put(p string, id EntryID) (EntryID, bool) {
	i, tag := t.find(p)
	old := t.slots[i]
	if old == 0 {
		if 2*(t.n+1) > len(t.slots) {
			t.grow()
			i, _ = t.find(p)
		}
		t.n++
	}
	if uint64(id)+1 > uint64(t.idMask) {
		panic("chunked: an entry number beyond the path table's") // the entry limit bounds them
	}
	t.slots[i] = uint32(id) + 1 | tag
	return EntryID(old&t.idMask - 1), old != 0
}

// grow doubles the table.
func (t *pathTable) grow() {
	old, freeOld := t.slots, t.free
	defer freeOld()
	t.slots, t.free = mappedSlice[uint32](2 * len(old))
	mask := len(t.slots) - 1
	for _, s := range old {
		if s == 0 {
			continue
		}
		h, _ := t.hash(t.keyOf(EntryID(s&t.idMask - 1)))
		i := h & mask
		for t.slots[i] != 0 {
			i = (i + 1) & mask
		}
		t.slots[i] = s
	}
}
