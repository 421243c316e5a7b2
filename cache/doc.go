// Package cache owns the daemon's durable local store of verified, uncompressed file
// content, of layer records (named blobs the daemon writes once and maps read-only) and of
// pins (what must not be evicted). Content is addressed by the sha256 digest of the whole file ([chunked.Sum]), so a
// file that appears in many layers and images (base images, shared libraries) is stored and
// fetched once, whatever chunking each layer used. The store is bounded in size, survives
// crashes and restarts, and a complete file is a plain local file that can back FUSE
// passthrough.
//
// # Use
//
//	c, err := cache.New(root, cache.Config{MaxSize: 20 << 30})
//	f, err := c.Open(entry.Digest, entry.Size) // pins the file until f.Close
//	n, err := f.ReadAt(p, off)                 // errors.Is(err, cache.ErrMissing): fetch f.Missing(off, len(p))
//	err = f.Put(chunk)                         // chunk is a verify.ChunkData of this file
//	if f.Complete() { path, _ := f.Path() }    // read-only file for passthrough
//
//	errs := c.PutFiles(files)                  // whole files at once, one group commit
//
//	err = c.PutRecord(name, meta, data)        // atomic, durable, checksummed
//	r, stored, err := c.WriteRecord(name, meta, data) // the same, r open at once, stored later
//	meta, err := c.RecordMeta(name)            // header and meta only
//	r, err := c.OpenRecord(name)               // checked, then r.Data() is a read-only mapping
//	err = c.Pin(image, records, digests)       // kept out of eviction, across restarts
//
// Data enters only as [verify.ChunkData] values, which package verify makes only after checking
// the chunk's digest, and a file becomes complete only after its whole content hashed to
// its digest.
//
// Two ways in: [File.Put] stores chunks into a partial file (a reader filling a file as it
// needs it, large files fetched piecewise) and costs two fsyncs per call, whatever the number
// of chunks it is given (a batch's chunks of one file go in one call);
// [Cache.PutFiles] stores files whose every chunk is at hand (the small files of a background
// batch) in one group commit, two syncfs calls for the whole group, which is what keeps a
// layer of thousands of small files from costing seconds of fsyncs.
//
// Trust in partial files: a recorded range was verified against the TOC of the layer that
// supplied it, but only completion proves it belongs to the file's digest, and any image's
// TOC can name any digest. A reader whose trust comes from its own layer's TOC reads partial
// content with [File.ReadChunk] or [File.ReadChunkAt], which check the bytes against that
// TOC's chunk digest; [File.ReadAt] serves recorded bytes unchecked. A lying TOC can therefore
// delay caching of a file (completion drops it) but not make an honest reader see its bytes
// through ReadChunk. Present bytes are never rewritten, so the check is made once per range
// and digest while the file is loaded: a range stored whole from a verified chunk, or hashed
// by a read, is remembered with its digest (in memory; forgotten when the file is reset,
// unloaded or completed), and later reads of parts of it are served without hashing.
//
// # On-disk layout
//
//	<root>/lock                          flock'd by the one Cache using the root
//	<root>/files/<2 hex>/<64 hex>        complete, verified files (mode 0400)
//	<root>/files/<2 hex>/<64 hex>.tmp    a file of a PutFiles group, not yet committed
//	<root>/partial/<2 hex>/<64 hex>      sparse data file of a file being filled, full size
//	<root>/partial/<2 hex>/<64 hex>.ranges  its journal: header (magic, size, CRC) then one
//	                                     20-byte record (offset, length, CRC-32C) per range
//	                                     written; see journal.go
//	<root>/records/<name>                a record (mode 0400): 48-byte header (magic, version,
//	                                     meta and data lengths, data offset, CRC-32C of meta,
//	                                     of data and of the header), meta, zeros, then the data
//	                                     from the next multiple of 4096; see record.go
//	<root>/records/.<name>.<n>.tmp       a record being written
//	<root>/pins/<64 hex>                 a pin, named by the sha256 of its name: the name, the
//	                                     records and file digests it names, a CRC-32C; pin.go
//	<root>/pins/.<64 hex>.<n>.tmp        a pin being written
//
// The 2-hex-digit shard is the digest's first byte; the 64-hex name is the whole digest.
// Record names are 1 to 128 bytes of [0-9a-z] and '-' (so never a temporary file's name); a
// record's meta is at most 4 MiB (read whole into memory), its data at most 1 TiB (mapped).
// A record costs its data plus 48 bytes of header and its meta rounded up to 4 KiB.
//
// # Crash safety
//
// Invariant: a range recorded in a journal was durably written to the data file, and a file
// under files/ was durably written and hashed to its name. It holds because of the order of
// operations:
//
//   - a partial file is created when the first chunk of the file is stored (opening a file
//     only to read it writes nothing), as: data file truncated to the size and fsynced, then
//     the journal written to a temporary name, fsynced, renamed into place and the directory
//     fsynced. A data file without a journal is a leftover and is removed;
//   - [File.Put] writes the chunks' missing bytes with pwrite, fsyncs the data file, then
//     writes the records of all of them and fsyncs the journal. A crash before the records leaves bytes
//     that nothing records: they read as missing and are overwritten by the next Put. A torn
//     record fails its CRC and ends the journal, so it and any later bytes are ignored;
//   - completion hashes the whole data file and compares with the digest; only then is the
//     data file renamed from partial/ to files/ and the directory fsynced. The rename is the
//     commit point. The journal is removed afterwards; a journal left beside a complete file
//     is removed by the next scan. Content that does not hash to its digest is dropped and
//     reported with [ErrCorrupt];
//   - [Cache.PutFiles] hashes each file's content in memory (a single chunk whose digest is
//     the file's was hashed by verification) and writes it to files/<2 hex>/<64 hex>.tmp;
//     one syncfs of the cache's filesystem makes every temporary file durable; then each is
//     renamed to its final name, a second syncfs makes the renames durable, and only then are
//     the files complete. A temporary file is never taken for content: the next scan removes
//     it. A crash between the renames and the second syncfs leaves some files complete on
//     disk that the cache had not reported complete yet, which is sound: their content was
//     durable and verified before their name existed. A reader that opened the file meanwhile
//     sees it complete; a partial file it began is removed (journal first);
//   - removal (eviction, reset) deletes the journal before the data file;
//   - [Cache.PutRecord] writes the whole record to a temporary file in records/ (header, meta,
//     data), fsyncs it, renames it over the record's name and fsyncs the directory: the
//     rename is the commit point, so kill -9 or a crash at any moment leaves the old record or
//     the new one, never a mix; the temporary file left by a crash is removed by the next
//     scan. Open records map the file they opened: a replacement or a removal does not change
//     what they see, and since no record file is ever written or truncated in place once
//     named, a mapping never loses pages under its reader (no SIGBUS). Pins are written the
//     same way;
//   - removing a record (eviction, [Cache.RemoveRecord], damage) or a file does not fsync the
//     directory: a crash may bring a removed record or file back, which is sound (it was
//     whole and checked) and is evicted again if need be. [Cache.Unpin] fsyncs: a pin that
//     comes back would keep content for nobody.
//
// On start, [New] scans the root: complete files are kept as they are, partial files whose
// journal header is sound and whose data file has the recorded size keep their recorded
// ranges, and everything else (damaged journals, data files without journal, temporary
// files, in partial/ and files/) is deleted. Records whose header is sound (magic, version,
// CRC, lengths that match the file's size) are kept; temporary files, short files and damaged
// headers are deleted (the meta's and data's CRCs are checked when a record is read:
// [Cache.RecordMeta] checks the meta's, [Cache.OpenRecord] both, reading the data once
// through the page cache before mapping it; a record that fails is removed and reported with
// [ErrCorrupt], so that its owner rebuilds it). Pins are loaded; a damaged pin file (CRC,
// structure, or a file name that is not the hash of the name it holds) is logged as a
// warning, deleted and dropped. Dropping is deliberate: the pin's content can no longer be
// known, and the other choices are worse, refusing to start (one damaged sector stops the
// node's image store) or refusing to evict anything (a full disk instead of a full cache).
// Without the pin its content is evicted like any other and fetched again when needed, and
// the warning tells the operator to pin again. Nothing is written on [Cache.Close], so a crash
// and a clean shutdown leave the same state.
//
// # Size bound and eviction
//
// [Cache.Usage] counts content bytes: the size of complete files plus the recorded bytes of
// partial ones, plus the size of record files (not other metadata, not filesystem block
// rounding). When the usage not held by pins exceeds the bound (Config.MaxSize, default
// [DefaultMaxSize], 10 GiB) after a Put, a PutRecord, a handle's or a record's Close,
// a Pin or Unpin, or at start, the least recently used files and records that are neither
// open nor pinned are removed, complete or partial, until it is within the bound. Files and
// records share one LRU order. A file is used when a handle on it is opened or closed, a
// record when it is stored, opened or closed ([Cache.RecordMeta] is no use); the last close
// (and a record's open) stores the time in the file's mtime, which orders files and records
// after a restart. Open files and records are never evicted, so usage can exceed the bound
// while they are open.
//
// # Pins
//
// A pin ([Cache.Pin]) names records and files (by digest, complete or partial, present or
// not yet) that are never evicted, open or not, neither to keep within the bound nor to make
// room on a full filesystem, until every pin naming them is removed ([Cache.Unpin]). Pins are
// durable (see Crash safety) and hold from the start of the next Cache on. Pinned content is
// outside the bound: the bound applies to the content no pin names, so that pinning images
// does not take the room of the lazily pulled ones; usage then exceeds the bound by what the
// pins hold, which is logged once (until usage is within the bound again). What pinned
// content may take is the filesystem's: check [Cache.Available] before storing it. A pinned
// file or record is out of the LRU order; when its last pin goes it is put at the least
// recently used end, so that what a pin no longer keeps goes before the working set of the
// rest. A pin costs 32 bytes of memory per file it names.
//
// # A full filesystem
//
// The bound counts content, and the filesystem may hold less (other data on it, a bound
// larger than the disk, pinned content). A write that meets ENOSPC or EDQUOT (a chunk's bytes,
// a journal, a new partial file, a file of a PutFiles group, a record, a pin) evicts least
// recently used files and records that are neither open nor pinned, as the bound does but
// whatever the usage, until at least the write's
// size and 1/64 of the content are removed, and is tried once more. If nothing could be
// evicted or the write fails again, it fails with an error wrapping [ErrNoSpace] and the cache
// remembers its filesystem full for 5 s: every write during that time fails at once with
// [ErrNoSpace] without touching the disk (a Put of bytes already present still succeeds), and
// the first write after it tries again. A failed write records nothing (the ranges and the
// journal name only bytes written and synced, see Crash safety), so the content reads as
// missing and can be stored later. Evicting removes names: a complete file still open
// elsewhere (a passthrough backing file) keeps its blocks until it is closed. These events
// are logged at most once per 30 s each, with the count of those not logged.
//
// # Concurrency
//
// A Cache and its Files are safe for concurrent use; many goroutines may Put and ReadAt on
// the same file. Per file, a read-write mutex is held shared for data I/O (so reads and
// writes of different chunks run in parallel, including their fsyncs) and exclusively to
// open, close, complete or drop the files; an inner mutex serialises the range record and
// the journal appends. Bytes already present are never rewritten, so readers see stable
// content. Completion hashes under the shared lock and takes the exclusive lock only for the
// rename. PutFiles pins the files of its group and marks them as being stored, so that no
// two groups write the same temporary file; it takes each file's exclusive lock only to
// rename it and to mark it complete. Records are immutable files: a record's state (size,
// open count, pins) is under the Cache's lock, and its file is renamed into place and removed
// only under it, so that the record table and records/ agree. Pin and Unpin are serialised by
// a lock of their own, held across the write of the pin file, so that the pin files and the
// pins in memory agree. The lock order is File (or Record, or the pins' lock), Cache, file,
// range record; see [Cache]. Pinned bytes are counted in an atomic that a file's writes
// update without the Cache's lock: the pinned flag lives in the same atomic word as the
// file's byte count, so a write and a Pin are ordered and each byte counts as pinned exactly
// when its file is. The memory of a full filesystem and the rate-limited log have leaf locks; making
// room takes Cache.mu, so a write that meets a full disk drops the file's locks first and
// takes them again for its second try.
//
// syncfs writes back everything dirty on the cache's filesystem, not only the group's files:
// on a filesystem shared with busy writers a group commit waits for their data too. Keep the
// cache on its own filesystem where that matters.
//
// The cache directory should be on a plain filesystem (ext4, xfs, tmpfs), not overlayfs, so
// that passthrough keeps the kernel's stacking depth within its limit.
package cache
