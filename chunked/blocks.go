package chunked

import (
	"math"
	"sync"
	"unsafe"

	"github.com/layerstore/layerstore/internal/prefault"
)

// blockShift sets the elements of a block of a blockSlice: 1<<blockShift.
const (
	blockShift = 12
	blockLen   = 1 << blockShift
)

// blockSlice is an append-only sequence held in blocks of blockLen elements, as the builder
// keeps its entries and chunks: appending never moves what it holds (a grown slice copies
// it, and holds both copies for a moment), and it holds at most one block more than its
// length (a slice made from a guess of a TOC's entries holds the whole guess, zeroed). The
// zero value is empty.
//
// A mapped one (mapped set before the first append; for types that hold no pointers) maps
// its blocks outside the Go heap, so that what it lets go of (drop, free) is the system's
// again at once, not once a collection has found it and the runtime returned it: a
// million-entry parse lets go of its wide form as it writes the compact form in its place.
// Its owner must free it, and use no element it dropped or freed: a pointer at returns
// points into the block, and reads or writes unmapped memory after.
type blockSlice[T any] struct {
	blocks  [][]T
	n       int
	dropped int              // the blocks before it were let go of (drop)
	mapped  bool             // blocks are mapped (mapBlock) when they can be
	maps    []unsafe.Pointer // the mapping of each mapped block, nil for a block on the heap
}

// len returns the number of elements.
func (s *blockSlice[T]) len() int { return s.n }

// at returns element i, which must be below len.
func (s *blockSlice[T]) at(i int) *T { return &s.blocks[i>>blockShift][i&(blockLen-1)] }

// append adds v at the end.
func (s *blockSlice[T]) append(v T) {
	if s.n&(blockLen-1) == 0 {
		var m unsafe.Pointer
		if s.mapped {
			// A TOC's first block may hold a few entries: it is faulted in as it is
			// written; those after it are written whole, but for a TOC's last.
			m = mapBlock(blockBytes[T](), len(s.blocks) > 0)
		}
		if m != nil {
			s.blocks = append(s.blocks, unsafe.Slice((*T)(m), blockLen))
		} else {
			s.blocks = append(s.blocks, make([]T, blockLen))
		}
		s.maps = append(s.maps, m)
	}
	s.blocks[s.n>>blockShift][s.n&(blockLen-1)] = v
	s.n++
}

// blockBytes is the size of a block of T.
func blockBytes[T any]() uintptr { return blockLen * unsafe.Sizeof(*new(T)) }

// drop lets go of the blocks before the one holding element i, which are not used again.
func (s *blockSlice[T]) drop(i int) {
	for ; s.dropped < min(i>>blockShift, len(s.blocks)); s.dropped++ {
		s.release(s.dropped)
	}
}

// free lets go of every block: s is empty, and no element may be used after.
func (s *blockSlice[T]) free() {
	for k := s.dropped; k < len(s.blocks); k++ {
		s.release(k)
	}
	*s = blockSlice[T]{mapped: s.mapped}
}

// release lets go of block k.
func (s *blockSlice[T]) release(k int) {
	s.blocks[k] = nil
	if m := s.maps[k]; m != nil {
		s.maps[k] = nil
		unmapBlock(m, blockBytes[T]())
	}
}

// nameBlockShift sets the bytes of a block of a nameArena: 1<<nameBlockShift, more than a
// name's limit (maxNameLen), so that a name never spans two blocks.
const nameBlockShift = 20

// nameArena holds the builder's entry names (and links' targets, xattrs' names and values),
// one after the other in blocks of bytes that hold no pointers and are written once: a name
// is a nameRef (6 bytes in its entry) where a string would be 16 and an allocation of its
// own, which the collector would scan and the allocator round up. Its zero value is empty.
type nameArena struct {
	blocks [][]byte
}

// nameRef is where a nameArena holds a name: its first byte's block<<nameBlockShift + offset,
// and its length.
type nameRef struct {
	off uint32
	n   uint16
}

// add copies s, of at most maxNameLen bytes, into the arena.
func (a *nameArena) add(s string) (nameRef, error) {
	if len(s) == 0 {
		return nameRef{}, nil
	}
	off, err := a.put(s)
	return nameRef{off: off, n: uint16(len(s))}, err
}

// bytesRef is where a nameArena holds a run of bytes longer than a name may be (an xattr's
// value): its first byte's offset, as in a nameRef, and its length.
type bytesRef struct {
	off, n uint32
}

// addBytes copies b, of at most a block (1<<nameBlockShift bytes), into the arena.
func (a *nameArena) addBytes(b []byte) (bytesRef, error) {
	if len(b) == 0 {
		return bytesRef{}, nil
	}
	if len(b) > 1<<nameBlockShift {
		return bytesRef{}, limitf("%d bytes in one piece", len(b))
	}
	off, err := a.put(unsafe.String(&b[0], len(b)))
	return bytesRef{off: off, n: uint32(len(b))}, err
}

// getBytes returns the bytes at r as a string, as get does.
func (a *nameArena) getBytes(r bytesRef) string { return a.str(r.off, int(r.n)) }

// put copies s, not empty and of at most a block, into the arena and returns its offset.
func (a *nameArena) put(s string) (uint32, error) {
	last := len(a.blocks) - 1
	if last < 0 || len(a.blocks[last])+len(s) > cap(a.blocks[last]) {
		if uint64(len(a.blocks)+1)<<nameBlockShift > math.MaxUint32+1 {
			return 0, limitf("names of more than 4 GiB")
		}
		block := make([]byte, 0, 1<<nameBlockShift)
		if last >= 0 { // a TOC's first block may hold a few names (see blockSlice.append)
			prefault.Write(block[:cap(block)])
		}
		a.blocks = append(a.blocks, block)
		last++
	}
	at := len(a.blocks[last])
	a.blocks[last] = append(a.blocks[last], s...)
	return uint32(last<<nameBlockShift + at), nil
}

// get returns the name at r. Its bytes are never written again: the string is valid, and
// keeps its block alive, whatever the arena does after.
func (a *nameArena) get(r nameRef) string { return a.str(r.off, int(r.n)) }

// str returns the n bytes at off as a string, as get does.
func (a *nameArena) str(off uint32, n int) string {
	if n == 0 {
		return ""
	}
	b := a.blocks[off>>nameBlockShift]
	return unsafe.String(&b[off&(1<<nameBlockShift-1)], n)
}

// mapMin is the size from which mappedSlice maps a slice.
const mapMin = 1 << 20

// mappedSlice returns a zeroed slice of n T (a type holding no pointers), mapped outside the
// heap when it takes mapMin bytes or more (see blockSlice), and the function that lets go of
// it, once: no element may be used after. A transient array of the builder is then the
// system's again as soon as it is done with, instead of adding to the parse's peak until a
// collection.
func mappedSlice[T any](n int) ([]T, func()) {
	size := uintptr(n) * unsafe.Sizeof(*new(T))
	if size < mapMin {
		return make([]T, n), func() {}
	}
	m := mapBlock(size, true)
	if m == nil {
		return make([]T, n), func() {}
	}
	return unsafe.Slice((*T)(m), n), sync.OnceFunc(func() { unmapBlock(m, size) })
}

// faultAhead prefaults b a window at a time ahead of a writer that writes it in order, from
// next: the pages come in fewer faults, but no sooner than they are about to be written (the
// compaction's pages take the place of the wide form's as it unmaps them).
type faultAhead struct {
	b    []byte
	next int // b is faulted in up to next
}

// faultWindow is how far ahead of its writer a faultAhead faults pages in.
const faultWindow = 256 << 10

// to is called with the writer at offset at.
func (f *faultAhead) to(at int) {
	if at+faultWindow/2 < f.next || f.next >= len(f.b) {
		return
	}
	end := min(max(f.next, at)+faultWindow, len(f.b))
	prefault.Write(f.b[f.next:end])
	f.next = end
}
