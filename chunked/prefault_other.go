//go:build !linux

package chunked

// mapPopulate is Linux's alone: elsewhere a mapping's pages are faulted in as they are
// written.
const mapPopulate = 0

// prefault is Linux's alone (see its doc there).
func prefault([]byte) {}
