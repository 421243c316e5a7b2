// Package layer owns resolved layers: it ties a registry, the verified index of a layer, the
// local cache and background fetching together behind the store the FUSE namespace serves
// (package storefs, whose interfaces the daemon fits the manager and its layers to: this
// package does not import it).
//
// A [Manager] answers the runtime's lookups of (image reference, layer key). The key is the
// layer's TOC digest (modern runtimes) or its compressed blob digest (older ones). Resolution
// fetches the image's manifest once per reference (the registry client remembers it), finds the
// layer in the host platform's manifest or, failing that, in the other manifests of an image
// index, classifies its format, and opens it with package verify: the TOC is checked against
// the manifest before it is used. The comparison of a zstd:chunked TOC with its tar-split runs
// in the background (after the quiet period, at the latest 5 s after the lookup, below the
// runtimes' priority), and reads the tar-split first (the lookup did not wait for it; a read
// that fails, bounded by the read timeout, refuses the layer: a registry withholding it would
// otherwise keep the TOC unproven), except for lookups by blob digest (whose info needs the
// tar's size) and under Config.RequireDiffID, which read the tar-split with the TOC and run the
// comparison at once, at their priority (the background comparison of the same layer steps
// aside); a layer whose TOC the tar-split contradicts is refused from then on (lookups, reads,
// status, and through Served.Refused the mount's answers about its tree; its identity is
// remembered for the manager's life, so that a later resolution of it is refused at once).
// Resolutions are shared by concurrent lookups, bounded in time (Config.ResolveTimeout), kept
// while the runtime uses the layer and for a while after (Config.KeepTTL); failures are remembered
// only briefly (Config.NegativeTTL). Layers that are not lazily pullable, and keys that name no
// layer of the image, are reported as io/fs.ErrNotExist so that the runtime pulls them
// normally. A lookup that goes to the registry also resolves, in the background and while it
// resolves its own, the other lazily pullable layers of its manifest for the same reference (at
// most 32, two at a time): a runtime looks an image's layers up one after the other, and each
// would otherwise wait for its own round trips. A layer resolved ahead starts its background
// fetch only at its first lookup: the runtime may have it already.
//
// A [Served] layer reads its files from the cache when the verified bytes are there, and
// otherwise fetches the chunks a read needs (coalesced into as few range requests as the
// fetcher can make), with those that follow them in the blob within a small read-ahead window
// (32 KiB), verifies them, serves them and writes them to the cache. A file read in
// sequence (the chunk before the one read is in the cache) has its next chunk fetched
// meanwhile, so that the reader does not wait for a round trip and a verification per chunk.
// A cold read also fetches, without the reader waiting, the rest of the file's region around
// it (an aligned window of 1 MiB of the file, doubling with each cold read of the same file up
// to 4 MiB; from the first cold read of a file executed or loaded as a library, from the
// second of a file only read): formats differ in chunk size, and a program mapped from the
// layer faults its pages in here and there, so that zstd:chunked's small chunks would
// otherwise cost a round trip per fault where eStargz's 4 MiB chunks cost one.
// Concurrent reads of one chunk share one fetch. In the background every resolved layer is fetched
// completely, prioritized files first, in large coalesced requests verified on every core;
// background work yields to reads a runtime is waiting for, starts its requests (prioritized
// files aside) only once the runtime has been quiet for a while (Config.PrefetchQuiet) and
// nothing is being fetched ahead of the reads (a startup profile's replay, a prediction's fetch: a
// container whose reads they fetched ahead of it fetches nothing on demand, yet is starting),
// can be bounded in concurrency and bandwidth,
// and stops for layers whose users all went away.
//
// A read whose fetch failed (a registry error, a timeout, a chunk that did not verify) leaves
// its failure in place for the negative TTL: the kernel retries a failed readahead with a small
// read at once, and that read, like any other of the same chunks meanwhile, gets the same error
// without a request. A failure of the network's or the registry's (retries used up, the read's
// time) stays only 250 ms, for that retry: the next reader, often another container of an image
// sharing the layer, asks the registry again. The blob file (export: podman save and push) is
// served from a copy of the whole blob, fetched in batch-sized requests and hashed before any
// byte of it is served; a blob whose sha256 is not its digest fails every read with
// verify.ErrDigestMismatch. The copy lives in an anonymous file on the cache's filesystem and
// goes once unread for the keep TTL.
//
// # Speculative fetching
//
// Besides the chunks a read needs, the package fetches chunks nobody asked for yet. The words
// the code uses for each, what starts it, what it fetches, and its fetchKind (fetch.go; the
// kind decides how a fetch shares the link and the processors):
//
//   - read-ahead (readAhead): a cold read's chunks are fetched with those that follow them
//     in the blob, within the window, in the same batch of requests. Started by a runtime's
//     read; kind onDemand, as the read's own. The reader does not wait for them: each chunk
//     is verified as its bytes arrive (verify.StreamSource), and the read returns once its own
//     are.
//   - fetch-ahead (fetchAhead): a file read in sequence has its next chunk fetched while the
//     reader is served. Started by a read whose previous chunk is in the cache; kind ahead.
//   - region (fetchRegion): the rest of an aligned window of the file around a cold read (1
//     MiB, doubling to 4 MiB). Started by a cold read (from the first of a file executed or
//     predicted, from the second of others); kind ahead.
//   - prediction (predict, predict.go): the files a program's loader will open (its
//     interpreter, its libraries). Started by an execution (Served.Executing), a read of a
//     shared object's header, or the lookup of an image's program (start.go, which also
//     fetches the image's /etc/passwd and /etc/group, as a prediction does); kind ahead.
//   - background fetch (prefetch, prefetch.go; "background work"): the whole layer, in large
//     coalesced requests. Started by a layer's first lookup, its requests after the quiet
//     period; kind background.
//   - prioritized files: the files an eStargz producer listed as read at start; the
//     background fetch fetches them first (at once, or after the quiet period when a profile
//     is replayed); kind background.
//   - replay: the background fetch's first part when a startup profile names the layer's
//     files (profile.go): those files first, at once. Kind replay.
//
// Only read-ahead serves a waiting reader; the others are fetched before a reader asks, and
// a reader that comes for their chunks shares their fetches.
//
// # Startup profiles
//
// A container's start reads a few files of each layer one after another, each a round trip
// when cold. The manager learns them, with nothing to configure and no producer step. From a
// layer's first read on (Served.ReadFile, or an open served by passthrough, Served.Backing), for
// the profile window (30 s), it records the files read, by path, in the order of
// their first read, and ends early at 4096 files, 256 MiB of their content or 256 KiB of
// their paths; then it writes that list, the layer's profile, into the profile of each
// repository the layer was resolved through. A live layer records once; a layer resolved
// again (after the keep TTL, a restart) records again, and its new reads come first in its
// profile, followed by the files of the earlier recordings they lack, within the bounds (a
// recording misses the files the kernel had cached: it never loses what an earlier one
// learned). A recording without reads writes nothing, and Close ends the recordings under way
// and writes them (a daemon restarted within the window keeps what it learned). Once the
// recording ended, a read pays one atomic load for it.
//
// A repository's profile is a record of the cache (profile-<sha256 of the repository>, beside
// the layer records: written atomically, checksummed, evicted with them, least recently used
// first): the profiles of the repository's last 32 layers recorded, most recent first, with
// at most 1 MiB of paths; at most 1024 repositories keep a profile (beyond, the one least
// recently written or replayed by this process goes). Profiles read back from the cache are
// untrusted: checked (version, repository, digests, counts, path lengths) and removed when
// they do not check.
//
// When a layer's background fetch starts, it looks in the profiles of the layer's repositories
// (at most 16, those of its most recent references first) for the layer's own profile (the
// layer again, after the cache evicted its content) or else the layer profile of which the most
// paths name regular files with content in this layer (a new version of the image: the same
// paths, new content; at most 65536 paths looked up). The files it names that the layer holds
// and the cache does not are fetched first, in the profile's order (paths the layer does not
// hold are ignored), in requests of what the link carries in 84 ms at the rate the layer's
// fetches measure (1 MiB at 100 Mbit/s; prioritized files' requests too), each fetched in blob
// order and coalesced as any background request; at once, as eStargz's prioritized files are,
// without waiting for the quiet period, and still yielding to reads: no request of the replay
// starts while a read a runtime waits for is fetching. The replay thus goes out at the lookup,
// while the runtime prepares the container, and the container's reads of its files share its
// requests (a read waiting for a chunk the replay is fetching fetches nothing and does not hold
// the replay back); reads that come first are not delayed, and the replay waits for a pause
// between their fetches. The rest of the layer follows as before, eStargz's prioritized files
// among it (after the quiet period: the profile is what a start read, the producer's list a
// guess made at build time, which would share the link with the replay). Without background
// fetching (Config.NoPrefetch) nothing is replayed.
//
// A profile names paths, nothing else: what is fetched is always chunks of the layer's own
// verified index, verified as every chunk is. A profile, recorded from any container's reads
// or imported, changes the order of a layer's background fetch and nothing more, and is
// looked up only through the repositories the layer was resolved through. ExportProfiles and
// ImportProfiles carry profiles between nodes as lines of JSON; an import is read one line
// (at most one profile's encoding, 2 MiB) at a time and checked as the cache's profiles are.
//
// # Predicted libraries
//
// Without a profile, a program's start is still a chain of round trips: its loader opens the
// libraries it names one after the other. When the kernel opens a file to execute it
// (Served.Executing), or a runtime reads the start of a file that is an ELF shared object (a
// library a program loads itself, dlopen: Served.ReadFile), the layer reads the file's program
// headers and dynamic section, finds its interpreter and the libraries it names where the
// loader looks for them, in this layer and the other live layers resolved through one of its
// references, and fetches each one in turn (whole, up to 64 MiB of content, in batches of
// 4 MiB, four at once; else its header and dynamic section), as a prediction (fetched as
// fetch-ahead is, never recorded as the workload's reads): the loader then finds them local
// or on their way. The mechanism, its bounds and its safety are in predict.go.
//
// # Memory
//
// What untrusted input can make the package hold, beyond the index: a background request holds at
// most 8 MiB of compressed bytes, 4 MiB of decompressed content (or one chunk, when a chunk alone
// is larger) and 1024 chunks, so background fetching holds at most concurrency x 4 MiB of content
// (16 MiB by default); a cold read holds the chunks it reads and at most 16 read-ahead windows of
// content (512 KiB by default); regions hold at most 4 x 4 MiB of content; 4 predictions run at
// once, each holding at most four batches of 4 MiB of content (fetched whole) and 64 KiB of
// dynamic section; a blob copy holds one batch-sized buffer. A layer's recording holds at most
// 4096 files (and the set of files read during its window); choosing the profile to replay holds
// the profiles of at most 16 repositories, each at most 1 MiB of paths; an import holds one line,
// at most 2 MiB, at a time.
//
// # Lifetime
//
// The manager owns one context, cancelled when Close begins: resolutions, fetches of reads
// (which run on the manager's context, not the reader's, since other readers may wait for
// them), fetch-ahead, blob copies and background fetches all derive from it, so that a
// stopping daemon stops fetching at once instead of after a read timeout.
//
// # Structure
//
// A [Manager] resolves; a [Served] layer reads. A layer knows of its manager only what every layer
// of that manager shares (env, in env.go): the cache and its open files (handles.go), the
// scheduler that shares the registry and the processors with background work
// (scheduler.go), the counters, the read settings, the manager's lifetime (life), and, for
// predictions, the live layers (liveSet, which the manager fills and its layers read: a layer
// never calls its manager). A layer holds its own blob: a layer restored from its record reaches the
// registry through the reference and descriptor it was resolved by (registryBlob), not
// through the manager. Startup profiles are package profile's (format, persistence, merge,
// export and import); this package records them and replays them. The read
// path, from Served.ReadFile, probes the cache file and hands what is missing to fetchChunks
// (fetch.go), the one way chunks come to be present, whoever asks: claim the missing
// chunks, look in the cache again, fetch them in one batch through package verify (which reads
// the blob and hands the chunks back only to be verified: the layer never holds unverified
// bytes) and verify them, store them. The read goes down: layer, cache, verify, fetcher, each
// once before the request. A fetch names its chunk
// and is shared by every reader of it; its kind (on demand, ahead, background, a startup
// profile's replay) decides how it shares the link and the processors.
//
// # Concurrency
//
// Every exported method is safe for concurrent use. The locks, none of which is held while
// another is taken (each is a leaf), nor across I/O, a fetch or a wait, but for the
// exceptions said:
//
//   - Manager.mu: the resolutions, the images' starts, closed; the one lock taken under it
//     is liveSet.mu (a layer made live or forgotten as the resolutions change).
//   - liveSet.mu: the live layers (a leaf), read by the manager and by a layer's predictions.
//   - lifetime.mu: whether the manager is closing; goTracked takes it.
//   - Served.mu: the references and repositories of a layer, its chunks in flight (and the
//     failures remembered on them), its cold reads and files predicted, its blob copy.
//   - Served.prefetch.mu: the state of its background fetch.
//   - handles.mu: the open cache files and their LRU.
//   - Served.recording.mu: the startup profile being recorded.
//   - Served.recordMu: serializes the writes of a layer's record (Served.writeRecord, so that
//     each writes the state of its time); an exception: held across the write of the record
//     (cache.PutRecord: a file written and renamed), and Served.mu and the records' own lock
//     are taken under it, briefly; taken only by background work (Served.saveRecord).
//   - package profile's Store lock: the profile records; an exception, held across the read
//     and write of a repository's profile record (so that two updates do not lose each
//     other's), taken only by background work (a recording's end, a background fetch's start)
//     and imports.
//   - scheduler.mu: the background bandwidth's token bucket (the rest are atomics and the
//     slots and cpu channels).
//
// A fetch's results are written once, before its done channel is closed, and read after. The
// counters and the latency histograms (how long lookups took, by outcome and by what answered
// them; how long reads waited for the registry: package internal/metrics) are atomics,
// observed without a lock and read by Status.
//
// Goroutines: the janitor (one per manager, every second: forgets expired resolutions and the
// layers none names, but for those made live less than the resolve timeout ago, whose
// resolution is not remembered yet; drops blob copies unread for the keep TTL); each resolution in
// singleflight's goroutine; each layer's background fetch (a feeder and one worker per
// background slot, each batch verified on up to one goroutine per processor, on the
// process's background threads: one per processor, locked, at a lower priority, started
// once and never ended, idlecpu.go); and the tracked
// work of reads that outlives them (lifetime.goTracked): storing the chunks of an on-demand
// fetch, fetch-ahead, blob copies, the writing of a recorded startup profile; and the timer
// that ends each layer's recording. Close cancels the manager's context (every fetch ends),
// stops the janitor and every background fetch, waits for them and for the tracked work, and
// then closes the cache files it holds; layers already handed out keep answering reads, from
// the cache, or with an error.
//
// The package reads no configuration files, and everything it is told is a field of a
// Manager's [Config], with a documented default. What is process-wide, shared by every Manager of the
// process: the background threads that verify at a lower priority (idlecpu.go: one per
// processor Go uses, started at the first background verification, never ended, each at a
// niceness 10 above the process's); and the memory releases (releaseMemory), whose pace each
// Manager keeps but each of which collects the whole process's heap.
package layer
