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
//     chunks with their compressed ranges in the blob.
//   - [TarSplitReader] iterates the tar headers recorded in a tar-split stream.
//
// Nothing here checks a digest: the chain of trust is package verify's, which calls [Parse] only
// on TOC bytes it has verified. Nothing here does I/O either: callers hand over bytes.
//
// Every parser is strict and bounded (see [Limits]): sizes and counts are capped, names are
// cleaned and escapes rejected, JSON with duplicate keys, invalid UTF-8 or trailing data is
// refused. Errors wrap [ErrInvalid], [ErrLimit] or [ErrNotLazy], and name the entry at fault
// through [EntryError].
package chunked
