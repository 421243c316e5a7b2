//go:build !linux

package prefault

// MapFlag is Linux's alone: elsewhere a mapping's pages are faulted in as they are written.
const MapFlag = 0

// Write is Linux's alone (see its doc there).
func Write([]byte) {}
