package verify

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"sync/atomic"

	"github.com/layerstore/layerstore/chunked"
	digest "github.com/opencontainers/go-digest"
)

// Source is random access to a layer blob. Implementations fill p completely or return an
// error; package fetcher provides one over HTTP range requests.
type Source interface {
	ReadAt(ctx context.Context, p []byte, off int64) (int, error)
}

// ReaderAtSource adapts an io.ReaderAt (a local file, a byte slice) to a [Source].
func ReaderAtSource(r io.ReaderAt) Source { return readerAtSource{r} }

type readerAtSource struct{ r io.ReaderAt }

func (s readerAtSource) ReadAt(ctx context.Context, p []byte, off int64) (int, error) {
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	n, err := s.r.ReadAt(p, off)
	if n == len(p) {
		err = nil
	}
	return n, err
}

// Option configures [Open] and [Restore].
type Option func(*options) error

type options struct {
	limits     chunked.Limits
	unresident func()
}

// newOptions applies opts to the defaults.
func newOptions(opts []Option) (options, error) {
	o := options{limits: chunked.Limits{}.WithDefaults()}
	for _, opt := range opts {
		if err := opt(&o); err != nil {
			return o, err
		}
	}
	return o, nil
}

// WithLimits sets the bounds on untrusted input. Zero fields keep their defaults
// (see [chunked.Limits]).
func WithLimits(l chunked.Limits) Option {
	return func(o *options) error {
		o.limits = l.WithDefaults()
		return nil
	}
}

// WithUnresident gives [Restore] a function that lets the pages of the index and tar-split
// it uses in place stop being resident (a mapped file's pages: madvise MADV_DONTNEED), which
// the comparison of the TOC with the tar-split calls every unresidentEvery entries, so that
// what it has read of them does not stay resident while it reads the rest. Only for memory
// that reads back unchanged once dropped: never heap memory.
func WithUnresident(f func()) Option {
	return func(o *options) error {
		o.unresident = f
		return nil
	}
}

// unresidentEvery is how many entries the comparison of the TOC with the tar-split reads
// between two calls of the WithUnresident function: about 5 MiB of a record's index and tar-split.
var unresidentEvery = 1 << 16 // a variable for tests

// Guarantee is what has been proven about a layer's content.
type Guarantee int32

// Guarantees, weakest first.
const (
	// ChunksVerified: the TOC is the one the manifest names, and every byte served is checked
	// against the TOC's digests. The TOC's metadata is not proven to equal the DiffID's tar.
	ChunksVerified Guarantee = iota + 1
	// DiffIDVerified: in addition, the tar rebuilt from the tar-split and every payload hashes
	// to the DiffID, so the tree is exactly the image config's layer.
	DiffIDVerified
)

func (g Guarantee) String() string {
	switch g {
	case ChunksVerified:
		return "chunks-verified"
	case DiffIDVerified:
		return "diffid-verified"
	}
	return "none"
}

// Verifier is a layer whose TOC has been verified; it verifies the layer's chunks and DiffID
// against that TOC. Its methods are safe for concurrent use.
type Verifier struct {
	layout    *chunked.Layout
	index     *chunked.Index
	diffID    digest.Digest
	tarSplit  []byte // compressed, its digest verified against the TOC; nil when the layer has none
	limits    chunked.Limits
	guarantee atomic.Int32
	// unresident drops the pages of the index and tar-split, mapped (WithUnresident); nil
	// for those on the heap.
	unresident func()

	// The deferred comparison of the TOC with the tar-split (CheckTarSplit).
	comparing chan struct{}              // held (cap 1) while the comparison runs
	compared  atomic.Bool                // the comparison has a verdict: success or failed
	failed    atomic.Pointer[LayerError] // the comparison's failure; nil otherwise
	tarSize   atomic.Int64               // the tar's size the tar-split describes; -1 until compared
	headers   atomic.Int64               // tar-split headers compared with the TOC (tests count them)
}

// Open verifies and indexes a layer: classification from the descriptor, the footer cross-check,
// the TOC digest before the TOC is used, and for zstd:chunked with a tar-split, the tar-split digest
// (its agreement with the TOC is [Verifier.CheckTarSplit]'s). Errors are [*LayerError]s wrapping [chunked.ErrNotLazy],
// [chunked.ErrInvalid], [chunked.ErrLimit], [ErrDigestMismatch] or the source's error.
func Open(ctx context.Context, desc chunked.Descriptor, diffID digest.Digest, src Source, opts ...Option) (*Verifier, error) {
	o, err := newOptions(opts)
	if err != nil {
		return nil, err
	}
	l, err := open(ctx, desc, diffID, src, o)
	if err != nil {
		le := &LayerError{Layer: desc.Digest, Err: err}
		if l != nil {
			le.Format = l.layout.Format
		}
		return nil, le
	}
	return l, nil
}

func open(ctx context.Context, desc chunked.Descriptor, diffID digest.Digest, src Source, o options) (*Verifier, error) {
	layout, err := chunked.Classify(desc)
	if err != nil {
		return nil, err
	}
	l := &Verifier{layout: layout, diffID: diffID, limits: o.limits, comparing: make(chan struct{}, 1)}
	l.tarSize.Store(-1)
	if err := diffID.Validate(); err != nil {
		return l, fmt.Errorf("%w: DiffID %q: %v", chunked.ErrInvalid, diffID, err)
	}
	m, err := readMetadata(ctx, src, layout, o.limits)
	if err != nil {
		return l, err
	}
	if l.index, err = parseTOC(ctx, layout, m.toc, o.limits); err != nil {
		return l, err
	}
	if err := l.openTarSplit(ctx, src, m.tarSplit); err != nil {
		return l, err
	}
	l.guarantee.Store(int32(ChunksVerified))
	return l, nil
}

// metadata is the raw footer-side parts of a blob.
type metadata struct {
	toc      []byte
	tarSplit []byte // nil when not read yet
}

// readMetadata reads the footer (completing and cross-checking the layout) and the TOC. When
// the annotations place the TOC, the TOC, the tar-split and the footer are adjacent at the end
// of the blob (every zstd:chunked producer writes them so): one read covers them all.
// Otherwise (eStargz, whose footer is the only locator) the footer is read first.
func readMetadata(ctx context.Context, src Source, layout *chunked.Layout, lim chunked.Limits) (metadata, error) {
	tailN := min(chunked.TailSize(layout.Format), layout.BlobSize)
	start := layout.TOC.Offset
	if layout.TarSplit.Length > 0 {
		start = min(start, layout.TarSplit.Offset)
	}
	// The frames' headers and the footer lie between and after the parts; allow a little slack.
	const slack = 4096
	adjacent := layout.TOC.Length > 0 && layout.TOC.Length <= lim.MaxTOCSize && layout.TarSplit.Length <= lim.MaxTOCSize &&
		layout.BlobSize-start <= layout.TOC.Length+layout.TarSplit.Length+tailN+slack && layout.BlobSize-start >= tailN
	if adjacent {
		region, err := readRange(ctx, src, start, layout.BlobSize-start)
		if err != nil {
			return metadata{}, fmt.Errorf("reading the TOC and footer: %w", err)
		}
		if err := layout.ApplyFooter(region[len(region)-int(tailN):]); err != nil {
			return metadata{}, err
		}
		m := metadata{toc: region[layout.TOC.Offset-start : layout.TOC.End()-start]}
		if ts := layout.TarSplit; ts.Length > 0 && ts.Offset >= start {
			m.tarSplit = region[ts.Offset-start : ts.End()-start]
		}
		return m, nil
	}
	tail, err := readRange(ctx, src, layout.BlobSize-tailN, tailN)
	if err != nil {
		return metadata{}, fmt.Errorf("reading the footer: %w", err)
	}
	if err := layout.ApplyFooter(tail); err != nil {
		return metadata{}, err
	}
	if layout.TOC.Length > lim.MaxTOCSize {
		return metadata{}, fmt.Errorf("%w: compressed TOC of %d bytes exceeds %d", chunked.ErrLimit, layout.TOC.Length, lim.MaxTOCSize)
	}
	toc, err := readRange(ctx, src, layout.TOC.Offset, layout.TOC.Length)
	if err != nil {
		return metadata{}, fmt.Errorf("reading the TOC: %w", err)
	}
	return metadata{toc: toc}, nil
}

// parseTOC checks the TOC digest the way the format defines it: before parsing when it covers
// the compressed bytes, as the JSON is parsed when it covers the JSON (the index is returned
// only if the JSON matches, and a TOC that does not match is reported as such, not as the
// invalid TOC it may also be).
func parseTOC(ctx context.Context, layout *chunked.Layout, raw []byte, lim chunked.Limits) (*chunked.Index, error) {
	if !layout.Format.StargzTOC() {
		if err := checkDigest("TOC", layout.TOCDigest, raw); err != nil {
			return nil, err
		}
		return chunked.ParseCompressed(ctx, layout, raw, lim) // parsed as it is decompressed
	}
	if layout.LegacyChecksum != "" {
		if err := checkDigest("compressed TOC", layout.LegacyChecksum, raw); err != nil {
			return nil, err
		}
	}
	// The digest covers the JSON: it is hashed as it is decompressed and parsed, and the
	// index is used only once the whole JSON is known to be the TOC the digest names.
	h := sha256.New()
	x, hashed, err := chunked.ParseHashed(ctx, layout, raw, lim, h)
	if !hashed {
		return nil, err
	}
	if got := digest.NewDigest(digest.SHA256, h); got != layout.TOCDigest {
		return nil, &MismatchError{What: "TOC", Want: layout.TOCDigest, Got: got}
	}
	return x, err
}

func readRange(ctx context.Context, src Source, off, n int64) ([]byte, error) {
	if off < 0 || n < 0 {
		return nil, fmt.Errorf("%w: range %d+%d", chunked.ErrInvalid, off, n)
	}
	p := make([]byte, n)
	got, err := src.ReadAt(ctx, p, off)
	if err == nil && int64(got) != n {
		err = io.ErrUnexpectedEOF
	}
	if err != nil {
		return nil, err
	}
	return p, nil
}

// Index returns the layer's verified index.
func (l *Verifier) Index() *chunked.Index { return l.index }

// Layout returns where the parts of the blob are.
func (l *Verifier) Layout() chunked.Layout { return *l.layout }

// DiffID returns the DiffID the layer was opened with.
func (l *Verifier) DiffID() digest.Digest { return l.diffID }

// Guarantee returns what has been proven so far: [ChunksVerified] from Open on (the TOC's
// metadata is not proven to equal the tar's, whether or not [Verifier.CheckTarSplit] has
// run), [DiffIDVerified] once [Verifier.CheckDiffID] has succeeded, and none (0) once
// CheckTarSplit has failed.
func (l *Verifier) Guarantee() Guarantee { return Guarantee(l.guarantee.Load()) }

// TarSize returns the size of the layer's uncompressed tar as its tar-split describes it, once
// [Verifier.CheckTarSplit] has succeeded; -1 before, and for layers without a tar-split.
func (l *Verifier) TarSize() int64 { return l.tarSize.Load() }

// CanProveDiffID reports whether [Verifier.CheckDiffID] can raise the guarantee to
// [DiffIDVerified]: the layer must be zstd:chunked with a tar-split whose comparison with the
// TOC has not failed.
func (l *Verifier) CanProveDiffID() bool { return l.tarSplit != nil && l.Err() == nil }

// Err returns the failure of [Verifier.CheckTarSplit] (a [*LayerError] wrapping
// [chunked.ErrInvalid]), or nil while it has not failed. Once it has failed, the TOC is
// known to misdescribe the layer: the Verifier verifies no chunk any more, and the layer must
// not be served.
func (l *Verifier) Err() error {
	if le := l.failed.Load(); le != nil {
		return le
	}
	return nil
}

// CheckTarSplit checks that the tar-split describes exactly the TOC's entries, in order, with
// the same metadata (type, name, link target, mode, size, owner, times, device, xattrs), and
// learns the tar's size. [Open] checks only the tar-split's digest: the comparison reads the
// whole tar-split (seconds for a million entries) and is left to this method. Layers without a
// tar-split have nothing to compare: nil.
//
// The verdict is remembered: later calls return it at once, and concurrent calls wait for the
// one comparison running (or for ctx). An error from ctx is not a verdict: the next call
// compares again. On failure the error (also returned by [Verifier.Err] from then on) is a
// [*LayerError] wrapping [chunked.ErrInvalid], the guarantee drops to none, and
// [Verifier.VerifyChunk] and [Verifier.CheckDiffID] fail with it.
func (l *Verifier) CheckTarSplit(ctx context.Context) error {
	if err := l.checkTarSplit(ctx); err != nil {
		if le := l.failed.Load(); le != nil {
			return le
		}
		return &LayerError{Layer: l.layout.BlobDigest, Format: l.layout.Format, Err: err}
	}
	return nil
}

// checkTarSplit is CheckTarSplit with errors not wrapped in a LayerError.
func (l *Verifier) checkTarSplit(ctx context.Context) error {
	if l.tarSplit == nil {
		return nil
	}
	if !l.compared.Load() {
		select {
		case l.comparing <- struct{}{}:
		case <-ctx.Done():
			return ctx.Err()
		}
		defer func() { <-l.comparing }()
	}
	if l.compared.Load() {
		if le := l.failed.Load(); le != nil {
			return le.Err
		}
		return nil
	}
	size, err := l.compareTarSplit(ctx, l.tarSplit)
	if err != nil {
		if ctx.Err() != nil && (errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded)) {
			return err
		}
		l.failed.Store(&LayerError{Layer: l.layout.BlobDigest, Format: l.layout.Format, Err: err})
		l.guarantee.Store(0)
		l.compared.Store(true)
		return err
	}
	l.tarSize.Store(size)
	l.compared.Store(true)
	return nil
}

// ReadChunk fetches chunk i of a file from src and verifies it.
func (l *Verifier) ReadChunk(ctx context.Context, src Source, file chunked.EntryID, i int) (Chunk, error) {
	cs := l.index.Chunks(file)
	if i < 0 || i >= len(cs) {
		return Chunk{}, fmt.Errorf("chunk %d of %q: %w", i, l.index.Entry(file).Name, errors.ErrUnsupported)
	}
	raw, err := readRange(ctx, src, cs[i].Offset, cs[i].Length)
	if err != nil {
		return Chunk{}, &LayerError{Layer: l.layout.BlobDigest, Format: l.layout.Format, Err: err}
	}
	return l.VerifyChunk(file, i, raw)
}

// openTarSplit checks the tar-split of a modern zstd:chunked layer (raw, or read from src when
// nil) against its digest, and keeps it for CheckTarSplit and CheckDiffID.
func (l *Verifier) openTarSplit(ctx context.Context, src Source, raw []byte) error {
	want := digest.Digest(l.index.TarSplitDigest().String())
	if ann := l.layout.TarSplitChecksum; ann != "" {
		if want != "" && want != ann {
			return fmt.Errorf("%w: the TOC and the annotation name different tar-splits", chunked.ErrInvalid)
		}
		want = ann
	}
	switch {
	case want == "":
		return nil
	case l.layout.TarSplit.Length == 0:
		return fmt.Errorf("%w: a tar-split digest is given but the layer has no tar-split", chunked.ErrInvalid)
	case l.layout.TarSplit.Length > l.limits.MaxTOCSize:
		return fmt.Errorf("%w: compressed tar-split of %d bytes exceeds %d", chunked.ErrLimit, l.layout.TarSplit.Length, l.limits.MaxTOCSize)
	}
	if raw == nil {
		var err error
		if raw, err = readRange(ctx, src, l.layout.TarSplit.Offset, l.layout.TarSplit.Length); err != nil {
			return fmt.Errorf("reading the tar-split: %w", err)
		}
	}
	if err := checkDigest("tar-split", want, raw); err != nil {
		return err
	}
	l.tarSplit = bytes.Clone(raw) // without the TOC bytes beside it
	return nil
}
