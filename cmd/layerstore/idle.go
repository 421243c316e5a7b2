package main

import "runtime/debug"

// releaseStartMemory gives back, once the store is mounted and serving, memory that only the
// start used: the heap the start allocated and freed (configuration, registries.conf, the
// mount), which the runtime would otherwise return to the kernel only over minutes.
func releaseStartMemory() {
	debug.FreeOSMemory()
}
