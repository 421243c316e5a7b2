//go:build !unix

package chunked

import (
	"sync/atomic"
	"unsafe"
)

// mapBlock returns nil where memory is not mapped: blocks are on the heap.
func mapBlock(uintptr, bool) unsafe.Pointer { return nil }

func unmapBlock(unsafe.Pointer, uintptr) {}

var mappedBytes, mappedPeak atomic.Int64
