package chunked

import (
	"unsafe"

	"golang.org/x/sys/unix"
)

// mapPopulate has mapBlock fault a mapping's pages in at once (MAP_POPULATE): a block is
// written whole, and one system call costs less than a page fault for each of its pages
// (about 10 µs each on a virtual machine without transparent huge pages: a million-entry
// parse touches some 80000 pages).
const mapPopulate = unix.MAP_POPULATE

// prefault faults in the whole pages of b, which is about to be written whole, as mapPopulate
// does for a mapping: heap memory (the compact form, the names' blocks) that the runtime has
// just taken from the system is otherwise faulted in a page at a time as it is written. It
// changes none of b's bytes. Kernels before 5.14 do not know MADV_POPULATE_WRITE: the pages
// are then faulted in as they are written.
func prefault(b []byte) {
	const page = 4096
	if len(b) < 2*page {
		return
	}
	start := uintptr(unsafe.Pointer(unsafe.SliceData(b)))
	skip := (page - start%page) % page
	n := (uintptr(len(b)) - skip) &^ (page - 1)
	_ = unix.Madvise(unsafe.Slice((*byte)(unsafe.Add(unsafe.Pointer(unsafe.SliceData(b)), skip)), n), unix.MADV_POPULATE_WRITE)
}
