package chunked

import (
	"encoding/binary"
	"hash/maphash"
	"strings"
)

// pathTable maps the tree's paths to the entries holding them, as a map[string]EntryID
// would, but holds only the entries' numbers: a path is read back from its entry (keyOf)
// when probed. That is 8-16 bytes an entry (8 MiB for a TOC of a million entries, where the
// map took about 50), held through the parse's peak (the compact form is written while it is
// alive). A path is hashed and read back in two parts, as the builder holds names
// (splitPath). A slot's bits above those of the numbers the table may hold (24 bits for the default
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
	keyOf  func(EntryID) (dir, base string)
}

// splitPath returns a path's parts as a pathTable holds them.
func splitPath(p string) (dir, base string) {
	if i := strings.LastIndexByte(p, '/'); i >= 0 {
		return p[:i], p[i+1:]
	}
	return "", p
}

// newPathTable returns a table sized for n paths, whose paths are keyOf's, for entry numbers
// up to maxEntries (an index holds at most the entry limit and its root).
func newPathTable(n, maxEntries int, keyOf func(EntryID) (dir, base string)) *pathTable {
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

// hash returns the hash of the path of parts dir and base: where its probe starts, and its
// tag. The parts' hashes are hashed together, not combined by an operation a TOC's paths could
// give a structure (the same base names in many directories).
func (t *pathTable) hash(dir, base string) (int, uint32) {
	var parts [16]byte
	binary.LittleEndian.PutUint64(parts[:8], maphash.String(t.seed, dir))
	binary.LittleEndian.PutUint64(parts[8:], maphash.String(t.seed, base))
	h := maphash.Bytes(t.seed, parts[:])
	return int(h), uint32(h>>32) &^ t.idMask
}

// find returns the slot of the path of parts dir and base, or the empty slot where it would
// go, and its tag.
func (t *pathTable) find(dir, base string) (int, uint32) {
	mask := len(t.slots) - 1
	h, tag := t.hash(dir, base)
	for i := h & mask; ; i = (i + 1) & mask {
		s := t.slots[i]
		if s == 0 {
			return i, tag
		}
		if s&^t.idMask == tag {
			if d, b := t.keyOf(EntryID(s&t.idMask - 1)); b == base && d == dir {
				return i, tag
			}
		}
	}
}

// Get returns the entry at path p.
func (t *pathTable) Get(p string) (EntryID, bool) {
	i, _ := t.find(splitPath(p))
	s := t.slots[i]
	return EntryID(s&t.idMask - 1), s != 0
}

// Set maps path p, whose parts must be keyOf(id), to id, replacing the entry it mapped to.
func (t *pathTable) Set(p string, id EntryID) {
	dir, base := splitPath(p)
	t.Put(dir, base, id)
}

// Put is Set of the path of parts dir and base, and returns the entry it mapped to before,
// if any.
func (t *pathTable) Put(dir, base string, id EntryID) (EntryID, bool) {
	i, tag := t.find(dir, base)
	old := t.slots[i]
	if old == 0 {
		if 2*(t.n+1) > len(t.slots) {
			t.grow()
			i, _ = t.find(dir, base)
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
