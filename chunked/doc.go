// Package chunked reads the lazy-pullable layer formats: eStargz (gzip), stargz-flavoured zstd,
// legacy zstd:chunked (c/storage <= 1.43) and zstd:chunked (c/storage >= 1.44, with or without
// tar-split).
//
// It owns everything that turns untrusted bytes into structure:
//
//   - [Classify] decides from a layer descriptor whether the layer is lazily pullable and where
//     its table of contents (TOC) is ([Layout]); [ParseFooter] reads the blob footer, used as a
//     fallback and a cross-check of the annotations.
//   - [ExtractTOC] decompresses the TOC with a size cap; [Parse] turns TOC JSON into an [Index]:
//     one model for all formats, with full metadata, hardlinks resolved, whiteouts and opaque
//     markers translated for overlayfs, format artefacts hidden, and for every regular file its
//     chunks with their compressed ranges in the blob. [ParseCompressed] does both in one pass,
//     parsing as it decompresses (on another goroutine), and lets go of the compressed bytes
//     once decompressed, before it builds the index (a caller that drops them too keeps them
//     out of the heap live while it is built); [ParseHashed] hashes the JSON as well, for the
//     formats whose TOC digest covers it, and [ParseStream] does that reading the compressed
//     TOC from a reader, as it arrives.
//   - [TarSplitReader] reads the records of a tar-split stream; [IterateTarSplit] walks the tar
//     they describe, header by header, decoding the records ahead on another goroutine (at
//     most three batches of 1 MiB or one record ahead) while the caller's callbacks run on its
//     own.
//
// An [Index] is its compact binary form: one byte array holding a variable-length record per
// entry (its base name only, its full path derived from its directory's; its link target;
// its metadata as varints; a file's digest, and its one chunk inline, that chunk's digest
// being the file's), a table of fixed-size records for the chunks of files of more than one
// chunk, the sorted children and the TOC's access and change times. It holds no Go pointers
// and costs its size: about 85 bytes per entry for a tree of small files (a name of 15
// bytes, a 32-byte digest), where the wide form it is built from costs about 120 (an entry of
// 104 bytes holding a file's one chunk, and its base name in an arena of names, where its
// directory's path is held once for each run of entries in it: only the chunks of files of
// more than one chunk, or of an unusual one, are in a table of their own, 80 bytes each, and
// links' targets, devices' numbers and xattrs beside). [Parse] builds the wide form and
// compacts it at its end: the steps of the tree each hold their arrays for the moment they
// need them (the table of paths is let go of once the parents are linked, the children once
// copied into the compact form), and a parse of a TOC of 256Ki entries or more first hands
// back to the kernel what reading the TOC left free (the decompressor's windows, the pieces
// read; [runtime/debug.FreeOSMemory]). The wide form's entries and chunks, and the large
// arrays that building the tree uses for a moment, are mapped outside the Go heap and
// unmapped as soon as they are done with: the compaction writes the records in entry order
// and unmaps the entries and chunks behind it, so that the compact form takes the wide
// form's place instead of adding to it (a parse's peak is the wide form's, not the two's: see
// BenchmarkParsePeak). What a parse writes whole (the mapped blocks, the compact form, the
// names' blocks) is faulted in whole when it is allocated, on Linux, rather than a page fault
// at a time as it is written.
// [Index.Binary] hands the form out for writing; [LoadIndex] uses one in place (a read-only
// mapping of a file, say), once it has checked every record, offset, count and reference, so
// that no method panics, loops or reads out of bounds whatever the bytes; [Index.Moved] uses
// a copy of an index's own form in place, once compared with it. Methods decode what they
// are asked for and return copies, never memory of the form, and keep the *Index alive while
// they read it: a caller may unmap the form in a cleanup of the *Index (runtime.AddCleanup).
// [Index.Entry] builds the entry's path; [Index.Meta], [Index.Chunk] and [Index.NumChunks]
// are the cheap accessors of the read paths.
//
// Nothing here checks a digest: the chain of trust is package verify's, which uses an index
// only once its TOC bytes are verified ([ParseHashed] hashes them for it as it parses).
// Nothing here does I/O either: callers hand over bytes.
//
// Every parser is strict and bounded (see [Limits]): sizes and counts are capped, names are
// cleaned and escapes rejected, JSON with duplicate keys, invalid UTF-8 or trailing data is
// refused. Errors wrap [ErrInvalid], [ErrLimit] or [ErrNotLazy], and name the entry at fault
// through [EntryError]. A TOC's entries of the shape its writers give them (the defined
// members, once each, strings without escapes, integers without fraction or exponent) are
// read by a scanner of that shape alone; every other entry, and every other value of the
// TOC, is cut out whole by matching its brackets and read by the JSON decoder, so that a TOC
// reads here as a JSON decoder reads it (the fuzzers hold both to json.Unmarshal). Its work
// is linear in the JSON, however the JSON arrives.
//
// The package keeps no mutable state (but an atomic count of the bytes its parses have
// mapped, which the tests read): its functions may run on any number of goroutines at
// once, and those that start goroutines of their own (the parsers, [IterateTarSplit]) have
// ended them, and unmapped what they mapped, when they return. An [Index] is immutable and safe for concurrent use; the
// bytes one uses in place ([LoadIndex], [Index.Moved]) must not change while it is in use.
// [Layout] and [Limits] are plain values: [Layout.ApplyFooter] changes its Layout, which is
// therefore completed before it is shared. A [TarSplitReader] serves one goroutine at a
// time, and the record its Next returns is valid until the following call;
// [IterateTarSplit] calls its callbacks on the caller's goroutine.
package chunked
