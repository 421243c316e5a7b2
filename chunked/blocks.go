package chunked

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
type blockSlice[T any] struct {
	blocks [][]T
	n      int
}

// len returns the number of elements.
func (s *blockSlice[T]) len() int { return s.n }

// at returns element i, which must be below len.
func (s *blockSlice[T]) at(i int) *T { return &s.blocks[i>>blockShift][i&(blockLen-1)] }

// append adds v at the end.
func (s *blockSlice[T]) append(v T) {
	if s.n&(blockLen-1) == 0 {
		s.blocks = append(s.blocks, make([]T, blockLen))
	}
	s.blocks[s.n>>blockShift][s.n&(blockLen-1)] = v
	s.n++
}
