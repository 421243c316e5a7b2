//go:build unix

package chunked

import (
	"sync/atomic"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/layerstore/layerstore/internal/prefault"
)

// mapBlock maps size bytes of zeroed private memory, its pages faulted in at once when whole
// (it is to be written whole), or returns nil when it cannot: the caller then allocates on the
// heap.
func mapBlock(size uintptr, whole bool) unsafe.Pointer {
	flags := unix.MAP_PRIVATE | unix.MAP_ANON
	if whole {
		flags |= prefault.MapFlag
	}
	p, err := unix.MmapPtr(-1, 0, nil, size, unix.PROT_READ|unix.PROT_WRITE, flags)
	if err != nil {
		return nil
	}
	n := mappedBytes.Add(int64(size))
	for peak := mappedPeak.Load(); n > peak && !mappedPeak.CompareAndSwap(peak, n); peak = mappedPeak.Load() {
	}
	return p
}

// mappedBytes counts the bytes mapped by mapBlock and not unmapped, and mappedPeak the most
// it counted: the tests check that a parse unmaps what it mapped, whatever its end, and
// what a TOC can make it map.
var mappedBytes, mappedPeak atomic.Int64

// unmapBlock unmaps what mapBlock mapped.
func unmapBlock(p unsafe.Pointer, size uintptr) {
	if err := unix.MunmapPtr(p, size); err != nil {
		panic("chunked: unmapping a block: " + err.Error()) // only an invalid address fails
	}
	mappedBytes.Add(-int64(size))
}
