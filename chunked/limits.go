package chunked

// Limits bound what the parsers accept from untrusted input. A zero field takes its default.
type Limits struct {
	// MaxTOCSize caps the compressed and the uncompressed size of a TOC, in bytes.
	// The default is 512 MiB (c/storage caps at 150 MiB; layers of a million entries need more).
	MaxTOCSize int64
	// MaxEntries caps the number of entries: the TOC's (chunk entries included) plus the
	// directories the index adds for paths whose parents the TOC does not list. The default
	// is 8 Mi.
	MaxEntries int
	// MaxChunkSize caps the uncompressed size of one chunk, in bytes: a layer with a larger
	// chunk is refused at parse time, so that no read can ask for more memory than this.
	// zstd:chunked has no maximum chunk size (a long run of one byte is one chunk).
	// The default is 256 MiB.
	MaxChunkSize int64
	// MaxTarSplitSize caps the uncompressed size of a tar-split stream, in bytes. The default
	// is 4 GiB (it is streamed, never held in memory).
	MaxTarSplitSize int64
	// MaxXattrBytes caps the total size of the extended attributes (names and values) of
	// one entry. The default is 64 KiB, the Linux limit for one xattr value.
	MaxXattrBytes int
}

// Default limits.
const (
	DefaultMaxTOCSize      = 512 << 20
	DefaultMaxEntries      = 8 << 20
	DefaultMaxChunkSize    = 256 << 20
	DefaultMaxTarSplitSize = 4 << 30
	DefaultMaxXattrBytes   = 64 << 10
	// maxNameLen bounds entry names and link targets (PATH_MAX).
	maxNameLen = 4096
	// maxDepth bounds the components of an entry name or a hardlink target. PATH_MAX fits
	// 2048 one-byte components; 256 is far deeper than real trees go, and keeps what one entry
	// can add to the index (its missing ancestors) to 256 directories.
	maxDepth = 256
)

// WithDefaults returns l with every zero field set to its default.
func (l Limits) WithDefaults() Limits {
	if l.MaxTOCSize <= 0 {
		l.MaxTOCSize = DefaultMaxTOCSize
	}
	if l.MaxEntries <= 0 {
		l.MaxEntries = DefaultMaxEntries
	}
	if l.MaxChunkSize <= 0 {
		l.MaxChunkSize = DefaultMaxChunkSize
	}
	if l.MaxTarSplitSize <= 0 {
		l.MaxTarSplitSize = DefaultMaxTarSplitSize
	}
	if l.MaxXattrBytes <= 0 {
		l.MaxXattrBytes = DefaultMaxXattrBytes
	}
	return l
}

// MaxSpan returns the most blob bytes one chunk's fetch covers, for a chunk whose decompression
// yields n bytes (its InnerOffset plus its Size). A [Chunk]'s Length never exceeds it,
// whatever the TOC says, so that no TOC makes a chunk fetch ask for more.
//
// Compressors fall back to stored blocks on incompressible data: deflate adds 5 bytes per
// 64 KiB block (zlib's deflateBound about 0.03%), zstd 3 bytes per 128 KiB block
// (ZSTD_compressBound 1/256, plus 64 bytes for small inputs); the gzip and zstd frame headers
// and trailers add a few dozen bytes. n/64 and 64 KiB leave ample room for all of them. What
// an eStargz member holds after the chunk (the next tar headers) need not be fetched: reading
// stops once the chunk's bytes are out.
func MaxSpan(n int64) int64 { return n + n/64 + 64<<10 }
