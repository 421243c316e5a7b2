// Package verify owns the chain of trust from an image manifest to every byte served.
//
// [Open] takes a layer descriptor (whose annotations the manifest authenticates), the layer's
// DiffID from the image config and random access to the blob, and returns a [Verifier] only if:
//
//   - the TOC digest matches the annotation, computed the way the format defines it, before
//     the TOC is used: over the compressed bytes for zstd:chunked, checked before the TOC is
//     parsed when it is read whole (at most one piece, below, read with the footer in one
//     request), else hashed as they arrive; over the uncompressed JSON for eStargz, hashed as
//     the JSON is decompressed and parsed (and, for stargz-flavoured zstd that also carries
//     the legacy checksum annotation, over the compressed bytes too, before). A TOC hashed
//     as it is parsed is read to its end even when the parse fails, and the index is dropped
//     unless the whole TOC matches: a TOC that is not the one named is reported as a
//     mismatch, not as the invalid TOC it may also be. Such a TOC, with nothing to check
//     before its parse, is read from the source as it is parsed, in pieces of 2 MiB, the next
//     one on a goroutine of Open's own (ended when Open returns) while one is parsed: a TOC of
//     tens of MB is never held whole, and its parse starts with its first piece instead of
//     after its last;
//   - the footer agrees with the annotations.
//
// That the TOC and the tar-split describe the same entries with the same metadata is
// [Verifier.CheckTarSplit]'s to prove, off the lookup path: it reads the tar-split (unless
// Open did, [Config.TarSplit]), checks it against the digest the TOC names, and compares every
// entry (seconds for a million entries). Until it has succeeded the Verifier claims no more than
// [ChunksVerified] and does not know the tar's size ([Verifier.TarSize] is -1); its verdict is
// remembered, and once it has failed the Verifier verifies no chunk and proves no DiffID any
// more ([Verifier.Err]), so that its user stops serving the layer. [Verifier.CheckDiffID]
// runs it first.
//
// Chunk data leaves the package only as [ChunkData] values, built by [Verifier.VerifyChunk] after the
// chunk was decompressed with a hard size cap and its sha256 matched the TOC's digest. There
// is no option to skip any of this. [Verifier.ReadChunks] reads chunks from a [Source] (a
// registry's blob) in one request set and hands them back as [Fetched], whose bytes leave it
// only through [Fetched.Verify]: its user never holds a chunk's unverified bytes, and
// verifies them on the goroutines and at the priority it chooses. From a [StreamSource] it
// returns once the requests are sent, and Verify decompresses and hashes each chunk while its
// bytes arrive: a chunk is served once its own bytes are in and verified, not once the whole
// request has come. A chunk whose bytes stop coming fails with the read's error, which is no
// verdict on the chunk.
//
// The strongest guarantee, that the layer's tree is exactly the DiffID's tar, needs every
// payload: [Verifier.CheckDiffID] rebuilds the tar stream from the tar-split and the payloads and
// compares its digest with the DiffID (modern zstd:chunked only; see [Verifier.Guarantee]).
//
// The package keeps no mutable state: [Open] and [Restore] may run on any number of
// goroutines at once. A Verifier's methods are safe for concurrent use: the index is
// immutable once Open returns, and the tar-split once read; the tar-split, the guarantee, the
// tar size and the comparison's verdict are atomics, and concurrent CheckTarSplit calls share
// one comparison. A [ChunkData] is immutable and may be shared; its bytes must not be modified. A
// [Fetched]'s Verify may run on several goroutines at once, each for its own chunks. A
// [Source] shared by calls on several goroutines must be safe for concurrent use, as
// fetcher's is.
package verify
