// Package runtimestore writes into a container runtime's own storage (containers/storage, as
// CRI-O, podman and buildah keep it) the records of the layers the runtime took from this
// store and did not record itself.
//
// # Why
//
// containers/storage 1.58 and later (CRI-O 1.33+, podman 5.5+) decode a layer taken from an
// additional layer store from the store's info file and add it to the layer list in memory,
// but never give it a storage location, so saving the list writes nothing for it:
// overlay-layers/layers.json never names the layer (docs/upstream-cstorage.md). The process
// that pulled the image works; the next one does not know the layer: CRI-O's start-up garbage
// collection deletes its overlay directory, every image on it fails with "layer not known",
// and after an unclean stop CRI-O's repair deletes the layers and the containers made from
// them.
//
// # What it writes
//
// For each directory overlay/<id> of a graphroot whose additionallayer file names a layer
// directory of this store (<store>/<reference>/<digest>), and whose id layers.json lacks, it
// appends the entry a c/storage with the fix would have written: the store's info as
// c/storage decodes it, the id, the parent (as the overlay driver finds it: the first id of
// its lower-layers file, or without one the first link of its lower file, resolved through
// overlay/l), and the creation time (the additionallayer file's). Entries
// already there are never reordered, rewritten or dropped: the new ones are appended to the
// file's bytes as they are, whatever fields a newer c/storage put in them. An entry is written
// once: a layer whose tar size the store does not know yet (zstd:chunked, until its tar-split
// is compared with its TOC, seconds after the lookup) waits for it up to Config.SizeWait, so
// that the runtime reports the image's true size; at the daemon's start, nothing waits.
//
// It follows c/storage's own write protocol, with its own lock-file code: the graphroot's
// overlay-layers/layers.lock taken for writing (TryLock, until a deadline: the wait holds
// nothing), layers.json read again under it, a new last-writer value recorded in the lock
// before the file changes (so that running runtimes reload it at their next access), the new
// file written beside the old one, synced and renamed over it, the directory synced. The lock
// is held for reading the file and the directory entries, never for the store's info (read
// before, through the store's mount as c/storage reads it). A kill at any instant leaves the
// old file or the new one, and at most a temporary file of ours, removed by the next run.
//
// A graphroot without overlay-layers (no runtime has used it), a layers.json that does not
// parse, a lower-layers or lower file that does not name one parent layer, a layer directory
// of another store: nothing is written for them, and the log says why.
//
// # Concurrency
//
// A Recorder's methods are safe for concurrent use. Its work runs in one goroutine (Run):
// Poke only signals it, so a FUSE request that notices a runtime's use of a layer never waits
// for a runtime's lock or a disk write.
package runtimestore
