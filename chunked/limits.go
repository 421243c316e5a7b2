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
