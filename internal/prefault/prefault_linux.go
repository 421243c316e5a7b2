// Package prefault faults in memory that is about to be written whole in as few system
// calls as it can, rather than a page fault at a time as it is written: a page fault costs
// about 10 µs on a virtual machine without transparent huge pages, and a million-entry TOC's
// parse, or a TOC of tens of MB read from a registry, touches tens of thousands of new pages.
// It keeps no state: its functions may run on any number of goroutines at once.
package prefault

import (
	"unsafe"

	"golang.org/x/sys/unix"
)

// MapFlag has an anonymous mapping's pages faulted in at once (MAP_POPULATE), for a mapping
// that is written whole.
const MapFlag = unix.MAP_POPULATE

// minSize is the size below which Write does nothing: a system call for a few pages costs
// about what their faults do.
const minSize = 64 << 10

// Write faults in the whole pages of b, which is about to be written whole (heap memory the
// runtime may just have taken from the system). It changes none of b's bytes. Kernels before
// 5.14 do not know MADV_POPULATE_WRITE: the pages are then faulted in as they are written.
func Write(b []byte) {
	const page = 4096
	if len(b) < minSize {
		return
	}
	start := uintptr(unsafe.Pointer(unsafe.SliceData(b)))
	skip := (page - start%page) % page
	n := (uintptr(len(b)) - skip) &^ (page - 1)
	_ = unix.Madvise(unsafe.Slice((*byte)(unsafe.Add(unsafe.Pointer(unsafe.SliceData(b)), skip)), n), unix.MADV_POPULATE_WRITE)
}
