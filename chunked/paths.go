package chunked

import "hash/maphash"

// pathTable maps the tree's paths to the entries holding them, as a map[string]EntryID
// would, but holds only the entries' numbers: a path is read back from its entry (keyOf)
// when probed. That is 8-16 bytes an entry (8 MiB for a TOC of a million entries, where the
// map took about 50), held through the parse's peak (the compact form is written while it is
// alive). Its hash is seeded per table (hash/maphash), so that a TOC cannot be made of paths
// that collide; probing is linear, the table at most half full. Not safe for concurrent use:
// the builder alone uses it.
type pathTable struct {
	seed  maphash.Seed
	slots []uint32 // an entry's number + 1; 0 is an empty slot
	free  func()   // lets go of slots (mappedSlice)
	n     int
	keyOf func(EntryID) string
}

// newPathTable returns a table sized for n paths, whose paths are keyOf's.
func newPathTable(n int, keyOf func(EntryID) string) *pathTable {
	size := 16
	for size < 2*n {
		size *= 2
	}
	slots, free := mappedSlice[uint32](size)
	return &pathTable{seed: maphash.MakeSeed(), slots: slots, free: free, keyOf: keyOf}
}

// Free lets go of the table: it is unusable after.
func (t *pathTable) Free() {
	t.free()
	t.slots = nil
}

// Len returns how many paths the table holds.
func (t *pathTable) Len() int { return t.n }

// find returns the slot of path p, or the empty slot where it would go.
func (t *pathTable) find(p string) int {
	mask := len(t.slots) - 1
	for i := int(maphash.String(t.seed, p)) & mask; ; i = (i + 1) & mask {
		s := t.slots[i]
		if s == 0 || t.keyOf(EntryID(s-1)) == p {
			return i
		}
	}
}

// Get returns the entry at path p.
func (t *pathTable) Get(p string) (EntryID, bool) {
	s := t.slots[t.find(p)]
	return EntryID(s - 1), s != 0
}

// Set maps path p, which must be keyOf(id), to id, replacing the entry it mapped to.
func (t *pathTable) Set(p string, id EntryID) {
	i := t.find(p)
	if t.slots[i] == 0 {
		if 2*(t.n+1) > len(t.slots) {
			t.grow()
			i = t.find(p)
		}
		t.n++
	}
	t.slots[i] = uint32(id) + 1
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
		i := int(maphash.String(t.seed, t.keyOf(EntryID(s-1)))) & mask
		for t.slots[i] != 0 {
			i = (i + 1) & mask
		}
		t.slots[i] = s
	}
}
