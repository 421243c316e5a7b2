// Package demo holds what `layerstore demo` serves, so that the installed daemon can run it
// from any directory, without the source tree and without test code: the reference layer (a
// tar stream with every kind of entry a lazily pullable layer must reproduce), its eStargz,
// zstd:chunked and gzip blobs, and a read-only registry on 127.0.0.1 that counts the requests
// for each blob and can corrupt one byte of a blob. The registry is this package's own, a few
// handlers over maps, not a registry library: the package is linked into the daemon's binary,
// whose pages are most of what the idle daemon holds in memory.
//
// The reference layer is also what the test fixtures are made from (internal/testutil/testlayer), so
// it must not change without regenerating them; its content is deterministic.
//
// Functions without a receiver are safe for concurrent use; so is a Registry.
package demo
