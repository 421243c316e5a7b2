package verify

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"hash"
	"io"
	"sync"
	"sync/atomic"
	"time"

	"github.com/layerstore/layerstore/chunked"
	"github.com/layerstore/layerstore/internal/byterange"
	"github.com/layerstore/layerstore/internal/readahead"
	digest "github.com/opencontainers/go-digest"
)

// Source is random access to a layer blob. Implementations fill p completely or return an
// error; package fetcher provides one over HTTP range requests.
type Source interface {
	ReadAt(ctx context.Context, p []byte, off int64) (int, error)
}

// Config configures [Open] and [Restore]. Its zero value is the defaults.
type Config struct {
	// Limits bounds untrusted input. Zero fields keep their defaults (see [chunked.Limits]).
	Limits chunked.Limits
	// Unresident, for [Restore], lets the pages of the index and tar-split it uses in place
	// stop being resident (a mapped file's pages: madvise MADV_DONTNEED). The comparison of
	// the TOC with the tar-split calls it every unresidentEvery entries, so that what it has
	// read of them does not stay resident while it reads the rest. Only for memory that reads
	// back unchanged once dropped: never heap memory. The default is none.
	Unresident func()
	// TarSplit makes [Open] read a zstd:chunked tar-split with the TOC (in one request with
	// it when the source can make one: [RangeSource]) and check its digest, for a caller that
	// compares them at once ([Verifier.CheckTarSplit]). By default the tar-split is read by the
	// first CheckTarSplit or CheckDiffID: a runtime's lookup need not wait for its bytes
	// (1.3 MB for a layer of 26,000 entries, 0.1 s at 100 Mbit/s).
	TarSplit bool
}

// unresidentEvery is how many entries the comparison of the TOC with the tar-split reads
// between two calls of [Config.Unresident]: about 5 MiB of a record's index and tar-split.
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
	layout *chunked.Layout
	index  *chunked.Index
	diffID digest.Digest
	// tarSplitDigest is the digest of the layer's tar-split, as the TOC (or, for older
	// layers, the annotation) names it; empty when the layer has none.
	tarSplitDigest digest.Digest
	// tarSplit is the compressed tar-split, its digest checked; nil until read (Open with
	// Config.TarSplit, Restore, or loadTarSplit), or again once released (ReleaseTarSplit).
	tarSplit atomic.Pointer[[]byte]
	// readTarSplit is tarSplit when the Verifier read it itself (on the heap, not mapped by
	// Restore's caller): what ReleaseTarSplit drops.
	readTarSplit atomic.Pointer[[]byte]
	limits       chunked.Limits
	guarantee    atomic.Int32
	// unresident drops the pages of the index and tar-split, mapped (Config.Unresident); nil
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
// the TOC digest before the TOC is used, and for zstd:chunked with a tar-split, its size
// within the limits (its digest is checked as it is read: by Open under [Config.TarSplit], else
// by the first [Verifier.CheckTarSplit], which also compares it with the TOC). Errors are [*LayerError]s wrapping [chunked.ErrNotLazy],
// [chunked.ErrInvalid], [chunked.ErrLimit], [ErrDigestMismatch] or the source's error.
func Open(ctx context.Context, desc chunked.Descriptor, diffID digest.Digest, src Source, cfg Config) (*Verifier, error) {
	cfg.Limits = cfg.Limits.WithDefaults()
	v, err := open(ctx, desc, diffID, src, cfg)
	if err != nil {
		le := &LayerError{Layer: desc.Digest, Err: err}
		if v != nil {
			le.Format = v.layout.Format
		}
		return nil, le
	}
	return v, nil
}

// open does Open's work, cfg.Limits completed by their defaults. Once the layer is classified
// it returns its Verifier even with an error, so that Open's error names the format.
func open(ctx context.Context, desc chunked.Descriptor, diffID digest.Digest, src Source, cfg Config) (*Verifier, error) {
	layout, err := chunked.Classify(desc)
	if err != nil {
		return nil, err
	}
	v := &Verifier{layout: layout, diffID: diffID, limits: cfg.Limits, comparing: make(chan struct{}, 1)}
	v.tarSize.Store(-1)
	if err := diffID.Validate(); err != nil {
		return v, fmt.Errorf("%w: DiffID %q: %v", chunked.ErrInvalid, diffID, err)
	}
	m, err := readMetadata(ctx, src, layout, cfg.Limits, cfg.TarSplit)
	if err != nil {
		return v, err
	}
	// The compressed TOC is the parse's alone: it lets go of it once decompressed, before it
	// builds the index (tens of MB for a million entries, which m would otherwise keep).
	toc := m.toc
	m.toc = nil
	if v.index, err = parseTOC(ctx, src, layout, toc, cfg.Limits); err != nil {
		return v, err
	}
	if v.tarSplitDigest, err = tarSplitDigest(layout, v.index, cfg.Limits); err != nil {
		return v, err
	}
	if cfg.TarSplit && v.tarSplitDigest != "" {
		own := m.tarSplit == nil
		if own { // the footer placed it: read now
			if m.tarSplit, err = readRange(ctx, src, layout.TarSplit.Offset, layout.TarSplit.Length); err != nil {
				return v, fmt.Errorf("reading the tar-split: %w", err)
			}
		}
		if _, err := v.keepTarSplit(m.tarSplit, own); err != nil {
			return v, err
		}
	}
	v.guarantee.Store(int32(ChunksVerified))
	return v, nil
}

// metadata is the raw footer-side parts of a blob.
type metadata struct {
	toc      []byte // nil when the parse is to read it (streamTOC)
	tarSplit []byte // nil when not read yet
}

// streamTOC reports whether the layout's TOC is read as it is parsed (parseTOC), rather than
// whole before: a TOC whose digest covers the JSON (the eStargz family), unless a digest of
// its compressed bytes is also to be checked before (stargz-flavoured zstd with the legacy
// checksum annotation); a zstd:chunked TOC of more than two pieces (streamPiece), whose
// digest, over the compressed bytes, is then checked as they arrive. A smaller zstd:chunked
// TOC, which the stream would hold whole anyway, is read with the footer, in one request, and
// checked before its parse.
func streamTOC(layout *chunked.Layout) bool {
	if layout.LegacyChecksum != "" {
		return false
	}
	return layout.Format.StargzTOC() || layout.TOC.Length > 2*streamPiece
}

// readMetadata reads the footer (completing and cross-checking the layout), the TOC unless
// the parse is to read it as it goes (streamTOC), and with tarSplit the tar-split when the
// annotations place it. When the annotations place the TOC (zstd:chunked), these are read at
// once, in one request when the source can make one (RangeSource; every zstd:chunked producer
// writes the TOC, the tar-split and the footer adjacent at the end of the blob). Otherwise
// (eStargz, whose footer is the only locator) the footer is read first.
func readMetadata(ctx context.Context, src Source, layout *chunked.Layout, lim chunked.Limits, tarSplit bool) (metadata, error) {
	tailN := min(chunked.TailSize(layout.Format), layout.BlobSize)
	tailAt := byterange.Range{Offset: layout.BlobSize - tailN, Length: tailN}
	if layout.TOC.Length > 0 {
		if layout.TOC.Length > lim.MaxTOCSize {
			return metadata{}, fmt.Errorf("%w: compressed TOC of %d bytes exceeds %d", chunked.ErrLimit, layout.TOC.Length, lim.MaxTOCSize)
		}
		parts := []byterange.Range{tailAt}
		withTOC := !streamTOC(layout)
		if withTOC {
			parts = append(parts, layout.TOC)
		}
		withTarSplit := tarSplit && layout.TarSplit.Length > 0 && layout.TarSplit.Length <= lim.MaxTOCSize
		if withTarSplit {
			parts = append(parts, layout.TarSplit)
		}
		bufs, err := readRanges(ctx, src, parts)
		if err != nil {
			return metadata{}, fmt.Errorf("reading the TOC and footer: %w", err)
		}
		if err := layout.ApplyFooter(bufs[0]); err != nil {
			return metadata{}, err
		}
		var m metadata
		if withTOC {
			m.toc, bufs = bufs[1], bufs[1:]
		}
		if withTarSplit {
			m.tarSplit = bufs[1]
		}
		return m, nil
	}
	tail, err := readRange(ctx, src, tailAt.Offset, tailAt.Length)
	if err != nil {
		return metadata{}, fmt.Errorf("reading the footer: %w", err)
	}
	if err := layout.ApplyFooter(tail); err != nil {
		return metadata{}, err
	}
	if layout.TOC.Length > lim.MaxTOCSize {
		return metadata{}, fmt.Errorf("%w: compressed TOC of %d bytes exceeds %d", chunked.ErrLimit, layout.TOC.Length, lim.MaxTOCSize)
	}
	if streamTOC(layout) {
		return metadata{}, nil
	}
	toc, err := readRange(ctx, src, layout.TOC.Offset, layout.TOC.Length)
	if err != nil {
		return metadata{}, fmt.Errorf("reading the TOC: %w", err)
	}
	return metadata{toc: toc}, nil
}

// parseTOC checks the TOC digest the way the format defines it: over the compressed bytes
// (zstd:chunked) before the parse when they were read whole, else as they arrive; over the
// JSON as it is decompressed and parsed (the eStargz family). The index is returned only if
// the digest matches, and a TOC that does not match is reported as such, not as the invalid
// TOC it may also be: the rest of the TOC is still read and hashed after a failed parse
// (within the TOC limit). raw is the compressed TOC, or nil for the parse to read it from
// src as it goes (streamTOC).
func parseTOC(ctx context.Context, src Source, layout *chunked.Layout, raw []byte, lim chunked.Limits) (*chunked.Index, error) {
	if !layout.Format.StargzTOC() {
		if raw == nil {
			return parseCompressedSum(ctx, src, layout, lim)
		}
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
	h := sha256.New()
	var x *chunked.Index
	var hashed bool
	var err error
	if raw != nil {
		x, hashed, err = chunked.ParseHashed(ctx, layout, raw, lim, h)
	} else {
		r := streamRange(ctx, src, layout.TOC)
		x, hashed, err = chunked.ParseStream(ctx, layout, r, layout.TOC.Length, lim, h)
		if rerr := r.Close(); rerr != nil {
			// The parse saw the source's failure as a TOC that ends too soon: it is not.
			return nil, fmt.Errorf("reading the TOC: %w", rerr)
		}
	}
	if !hashed {
		return nil, err
	}
	if got := digest.NewDigest(digest.SHA256, h); got != layout.TOCDigest {
		return nil, &MismatchError{What: "TOC", Want: layout.TOCDigest, Got: got}
	}
	return x, err
}

// parseCompressedSum parses the TOC of a format whose digest covers its compressed bytes
// (zstd:chunked), read from src as it is hashed, decompressed and parsed: the compressed TOC
// (tens of MB for a million entries) is never held whole, and its download overlaps its
// parse.
func parseCompressedSum(ctx context.Context, src Source, layout *chunked.Layout, lim chunked.Limits) (*chunked.Index, error) {
	r := &hashingReader{r: streamRange(ctx, src, layout.TOC), h: sha256.New()}
	x, _, err := chunked.ParseStream(ctx, layout, r, layout.TOC.Length, lim, nil)
	// A parse that succeeded read the TOC to its end; one that failed is followed by the rest,
	// to tell a TOC that is not the one named from an invalid one (or one over a limit).
	if err != nil && ctx.Err() == nil {
		r.drain()
	}
	if rerr := r.r.Close(); rerr != nil {
		return nil, fmt.Errorf("reading the TOC: %w", rerr)
	}
	if err != nil && ctx.Err() != nil {
		return nil, err // not read to its end: no verdict on the TOC
	}
	if got := r.sum(); got != layout.TOCDigest {
		return nil, &MismatchError{What: "TOC", Want: layout.TOCDigest, Got: got}
	}
	return x, err
}

// hashingReader hashes what is read through it. Its reads are serialized: the decompressor
// reads on a goroutine of its own, which may not have returned when the parse has.
type hashingReader struct {
	mu sync.Mutex
	r  *readahead.Reader
	h  hash.Hash
}

func (r *hashingReader) Read(p []byte) (int, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	n, err := r.r.Read(p)
	r.h.Write(p[:n])
	return n, err
}

// drain reads the rest, to its end or the source's error.
func (r *hashingReader) drain() { _, _ = io.Copy(io.Discard, r) }

func (r *hashingReader) sum() digest.Digest {
	r.mu.Lock()
	defer r.mu.Unlock()
	return digest.NewDigest(digest.SHA256, r.h)
}

// RangeSource is a [Source] that reads several ranges in as few requests as it can (a
// fetcher.Blob: one multi-range request). Open uses it to read a zstd:chunked layer's TOC and
// footer at once.
type RangeSource interface {
	Source
	// Fetch returns the bytes of each range, in order.
	Fetch(ctx context.Context, ranges []byterange.Range) ([][]byte, error)
}

// checkRanges refuses a range at a negative offset or of a negative length.
func checkRanges(ranges []byterange.Range) error {
	for _, r := range ranges {
		if r.Offset < 0 || r.Length < 0 {
			return fmt.Errorf("%w: range %d+%d", chunked.ErrInvalid, r.Offset, r.Length)
		}
	}
	return nil
}

// readRanges reads ranges from src, at once when src is a RangeSource, else one by one.
func readRanges(ctx context.Context, src Source, ranges []byterange.Range) ([][]byte, error) {
	if err := checkRanges(ranges); err != nil {
		return nil, err
	}
	rs, ok := src.(RangeSource)
	if !ok {
		out := make([][]byte, len(ranges))
		for i, r := range ranges {
			b, err := readRange(ctx, src, r.Offset, r.Length)
			if err != nil {
				return nil, err
			}
			out[i] = b
		}
		return out, nil
	}
	out, err := rs.Fetch(ctx, ranges)
	if err != nil {
		return nil, err
	}
	if len(out) != len(ranges) {
		return nil, fmt.Errorf("%d ranges read of %d: %w", len(out), len(ranges), io.ErrUnexpectedEOF)
	}
	for i, r := range ranges {
		if int64(len(out[i])) != r.Length {
			return nil, fmt.Errorf("%d bytes read at %d of %d: %w", len(out[i]), r.Offset, r.Length, io.ErrUnexpectedEOF)
		}
	}
	return out, nil
}

func readRange(ctx context.Context, src Source, off, n int64) ([]byte, error) {
	if off < 0 || n < 0 {
		return nil, fmt.Errorf("%w: range %d+%d", chunked.ErrInvalid, off, n)
	}
	p := make([]byte, n)
	if err := readFull(ctx, src, p, off); err != nil {
		return nil, err
	}
	return p, nil
}

// readFull fills p with src's bytes at off, or fails: a short read is io.ErrUnexpectedEOF.
func readFull(ctx context.Context, src Source, p []byte, off int64) error {
	got, err := src.ReadAt(ctx, p, off)
	if err == nil && got != len(p) {
		err = io.ErrUnexpectedEOF
	}
	return err
}

// Index returns the layer's verified index.
func (v *Verifier) Index() *chunked.Index { return v.index }

// Layout returns where the parts of the blob are.
func (v *Verifier) Layout() chunked.Layout { return *v.layout }

// DiffID returns the DiffID the layer was opened with.
func (v *Verifier) DiffID() digest.Digest { return v.diffID }

// Guarantee returns what has been proven so far: [ChunksVerified] from Open on (the TOC's
// metadata is not proven to equal the tar's, whether or not [Verifier.CheckTarSplit] has
// run), [DiffIDVerified] once [Verifier.CheckDiffID] has succeeded, and none (0) once
// CheckTarSplit has failed.
func (v *Verifier) Guarantee() Guarantee { return Guarantee(v.guarantee.Load()) }

// TarSize returns the size of the layer's uncompressed tar as its tar-split describes it, once
// [Verifier.CheckTarSplit] has succeeded; -1 before, and for layers without a tar-split.
func (v *Verifier) TarSize() int64 { return v.tarSize.Load() }

// CanProveDiffID reports whether [Verifier.CheckDiffID] can raise the guarantee to
// [DiffIDVerified]: the layer must be zstd:chunked with a tar-split whose comparison with the
// TOC has not failed.
func (v *Verifier) CanProveDiffID() bool { return v.tarSplitDigest != "" && v.Err() == nil }

// Err returns the failure of [Verifier.CheckTarSplit] (a [*LayerError] wrapping
// [chunked.ErrInvalid]), or nil while it has not failed. Once it has failed, the TOC is
// known to misdescribe the layer: the Verifier verifies no chunk any more, and the layer must
// not be served.
func (v *Verifier) Err() error {
	if le := v.failed.Load(); le != nil {
		return le
	}
	return nil
}

// CheckTarSplit checks that the tar-split describes exactly the TOC's entries, in order, with
// the same metadata (type, name, link target, mode, size, owner, times, device, xattrs), and
// learns the tar's size. It first reads the tar-split from src and checks its digest, unless
// [Open] did ([Config.TarSplit]) or [Restore] was given it: the comparison reads the whole
// tar-split (seconds for a million entries) and is left to this method. Layers without a
// tar-split have nothing to compare: nil.
//
// The verdict is remembered: later calls return it at once, and concurrent calls wait for the
// one comparison running (or for ctx). An error from ctx or from src is not a verdict: the
// next call reads and compares again. On failure the error (also returned by [Verifier.Err]
// from then on) is a [*LayerError] wrapping [chunked.ErrInvalid] or [ErrDigestMismatch] (a
// tar-split that is not the one the TOC names), the guarantee drops to none, and
// [Verifier.VerifyChunk] and [Verifier.CheckDiffID] fail with it.
func (v *Verifier) CheckTarSplit(ctx context.Context, src Source) error {
	if err := v.checkTarSplit(ctx, src); err != nil {
		if le := v.failed.Load(); le != nil {
			return le
		}
		return &LayerError{Layer: v.layout.BlobDigest, Format: v.layout.Format, Err: err}
	}
	return nil
}

// checkTarSplit is CheckTarSplit with errors not wrapped in a LayerError.
func (v *Verifier) checkTarSplit(ctx context.Context, src Source) error {
	if v.tarSplitDigest == "" {
		return nil
	}
	release, err := v.startComparing(ctx)
	if release == nil {
		return err // the verdict, or ctx's error
	}
	defer release()
	raw, err := v.loadTarSplit(ctx, src)
	if err != nil && !errors.Is(err, ErrDigestMismatch) {
		return err // not a verdict: read again next time
	}
	var size int64
	if err == nil {
		size, err = v.compareTarSplit(ctx, raw)
	}
	if err != nil {
		if ctx.Err() != nil && (errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded)) {
			return err
		}
		v.fail(err)
		return err
	}
	v.tarSize.Store(size)
	v.compared.Store(true)
	return nil
}

// startComparing takes the comparison's turn and returns the function that gives it back; nil
// with the verdict (nil for success) once there is one, or with ctx's error.
func (v *Verifier) startComparing(ctx context.Context) (func(), error) {
	held := false
	if !v.compared.Load() {
		select {
		case v.comparing <- struct{}{}:
			held = true
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	if v.compared.Load() {
		if held {
			<-v.comparing
		}
		if le := v.failed.Load(); le != nil {
			return nil, le.Err
		}
		return nil, nil
	}
	return func() { <-v.comparing }, nil
}

// fail records err as the comparison's verdict: the layer is not to be served.
func (v *Verifier) fail(err error) {
	v.failed.Store(&LayerError{Layer: v.layout.BlobDigest, Format: v.layout.Format, Err: err})
	v.guarantee.Store(0)
	v.compared.Store(true)
}

// ReadTarSplit reads the tar-split from src and checks its digest, unless it has been read
// (Open with [Config.TarSplit], [Restore], an earlier call) or the comparison has a verdict; the
// comparison itself is [Verifier.CheckTarSplit]'s. Bytes that do not hash to the digest are
// the comparison's verdict, as in CheckTarSplit. A failed read is not, unless final is set: the
// caller can wait no longer for the bytes that prove the TOC (a hostile registry may withhold
// them for as long as the TOC's tree is served unproven), and the failure becomes the verdict,
// wrapping [ErrUnproven]. An error of ctx is never a verdict. Layers without a tar-split: nil.
func (v *Verifier) ReadTarSplit(ctx context.Context, src Source, final bool) error {
	if v.tarSplitDigest == "" || v.tarSplit.Load() != nil {
		return nil
	}
	release, err := v.startComparing(ctx)
	if release == nil {
		if err != nil {
			return &LayerError{Layer: v.layout.BlobDigest, Format: v.layout.Format, Err: err}
		}
		return nil
	}
	defer release()
	_, err = v.loadTarSplit(ctx, src)
	switch {
	case err == nil:
		return nil
	case ctx.Err() != nil:
	case errors.Is(err, ErrDigestMismatch):
		v.fail(err)
	case final:
		err = fmt.Errorf("%w: %v", ErrUnproven, err)
		v.fail(err)
	}
	return &LayerError{Layer: v.layout.BlobDigest, Format: v.layout.Format, Err: err}
}

// ReadChunk fetches chunk i of a file from src and verifies it: [Verifier.ReadChunks] of one
// chunk.
func (v *Verifier) ReadChunk(ctx context.Context, src Source, file chunked.EntryID, i int) (ChunkData, error) {
	got, err := v.ReadChunks(ctx, src, []ChunkID{{file, i}})
	if err != nil {
		return ChunkData{}, &LayerError{Layer: v.layout.BlobDigest, Format: v.layout.Format, Err: err}
	}
	return got.Verify(0)
}

// A ChunkID names chunk I of regular file File.
type ChunkID struct {
	File chunked.EntryID
	I    int
}

// Fetched is the compressed bytes of chunks read from a source ([Verifier.ReadChunks]), not
// yet verified: they leave it only as [ChunkData], through [Fetched.Verify]. Verify may be
// called on several goroutines at once, each for its own chunks.
type Fetched struct {
	v   *Verifier
	ids []ChunkID
	n   int64
	// The chunks' bytes, one of them: read whole (raws), or on their way (parts). A chunk of
	// zeros has none; a verified one none any more.
	raws  [][]byte
	parts []io.Reader

	start time.Time
	done  chan struct{} // closed once the read has ended: took and err are set
	took  time.Duration
	err   error
}

// StreamSource is a [RangeSource] that also reads ranges as their bytes arrive (a
// fetcher.Blob): [Verifier.ReadChunks] then returns at once, and each chunk is decompressed and
// hashed while its bytes come in.
type StreamSource interface {
	RangeSource
	// Stream starts reading ranges and returns a reader of each, in order, which returns its
	// bytes as they arrive (io.EOF at its end, the read's error if they do not come), and wait,
	// which returns once the whole read has ended, with its error.
	Stream(ctx context.Context, ranges []byterange.Range) (parts []io.Reader, wait func() error, err error)
}

// ReadChunks reads the compressed bytes of chunks ids from src, in as few requests as src can
// make (one set of range requests, when src is a [RangeSource]); a chunk of zeros has none. It
// returns them to be verified one by one by the caller, on the goroutines and at the priority
// it chooses. From a [StreamSource], it returns once the requests are sent, and each chunk is
// verified as its bytes arrive; [Fetched.Wait] returns when the read ends. Its errors are
// src's, and [errors.ErrUnsupported] wrapped for a chunk the index does not have.
func (v *Verifier) ReadChunks(ctx context.Context, src Source, ids []ChunkID) (*Fetched, error) {
	var ranges []byterange.Range
	read := make([]bool, len(ids)) // the chunk has bytes to read (not zeros)
	f := &Fetched{v: v, ids: ids, start: time.Now(), done: make(chan struct{})}
	for i, id := range ids {
		c, ok := v.index.Chunk(id.File, id.I)
		if !ok {
			return nil, fmt.Errorf("chunk %d of %q: %w", id.I, v.index.Entry(id.File).Name, errors.ErrUnsupported)
		}
		if read[i] = c.Length > 0; read[i] {
			ranges = append(ranges, c.Range)
			f.n += c.Length
		}
	}
	if ss, ok := src.(StreamSource); ok && len(ranges) > 0 {
		if err := checkRanges(ranges); err != nil {
			return nil, err
		}
		parts, wait, err := ss.Stream(ctx, ranges)
		if err != nil {
			return nil, err
		}
		if len(parts) != len(ranges) {
			return nil, fmt.Errorf("%d ranges streamed of %d: %w", len(parts), len(ranges), io.ErrUnexpectedEOF)
		}
		f.parts, f.raws = make([]io.Reader, len(ids)), make([][]byte, len(ids))
		for i, j := 0, 0; i < len(ids); i++ {
			if read[i] {
				f.parts[i] = parts[j]
				j++
			}
		}
		go func() {
			f.err = wait()
			f.took = time.Since(f.start)
			close(f.done)
		}()
		return f, nil
	}
	bufs, err := readRanges(ctx, src, ranges)
	if err != nil {
		return nil, err
	}
	f.took = time.Since(f.start)
	close(f.done)
	f.raws = make([][]byte, len(ids))
	for i, j := 0, 0; i < len(ids); i++ {
		if read[i] {
			f.raws[i] = bufs[j]
			j++
		}
	}
	return f, nil
}

// Len returns the number of chunks read.
func (f *Fetched) Len() int { return len(f.ids) }

// Size returns the compressed bytes read, or being read.
func (f *Fetched) Size() int64 { return f.n }

// Wait returns once the read has ended: how long it took, or its error. The chunks whose bytes
// came before an error can be verified all the same.
func (f *Fetched) Wait() (time.Duration, error) {
	<-f.done
	return f.took, f.err
}

// Arrived returns once the i-th chunk's bytes are all in, or the read has failed: a caller
// that verifies below others' priority waits for them before it takes its turn. Verify then
// decompresses them whole, as from a source that does not stream.
func (f *Fetched) Arrived(i int) {
	if f.parts == nil || f.parts[i] == nil {
		return
	}
	w, ok := f.parts[i].(wholeReader)
	if !ok {
		<-f.done
		return
	}
	if b, err := w.Bytes(); err == nil {
		f.raws[i], f.parts[i] = b, nil
	}
}

// Verify verifies the i-th chunk read ([Verifier.VerifyChunk]) and drops its compressed
// bytes: each chunk is verified once. A chunk still on its way is verified as it arrives; if
// its bytes do not come, Verify returns the read's error, as ReadChunks would have.
func (f *Fetched) Verify(i int) (ChunkData, error) {
	if err := f.v.Err(); err != nil {
		return ChunkData{}, err
	}
	var in *arriving
	if f.parts != nil && f.parts[i] != nil {
		in = streamed(f.parts[i])
		f.parts[i] = nil
	} else {
		in = whole(f.raws[i])
		f.raws[i] = nil
	}
	c, err := f.v.verifyChunk(f.ids[i].File, f.ids[i].I, in)
	switch {
	case in.err != nil:
		return ChunkData{}, in.err // the read's failure, not the chunk's
	case err != nil:
		return ChunkData{}, &LayerError{Layer: f.v.layout.BlobDigest, Format: f.v.layout.Format, Err: err}
	}
	return c, nil
}

// tarSplitDigest returns the digest of a modern zstd:chunked layer's tar-split as its TOC (or,
// for c/storage 1.47-1.49, the annotation) names it, checked against the layout: empty for a
// layer without one.
func tarSplitDigest(layout *chunked.Layout, idx *chunked.Index, lim chunked.Limits) (digest.Digest, error) {
	want := digest.Digest(idx.TarSplitDigest().String())
	if ann := layout.TarSplitChecksum; ann != "" {
		if want != "" && want != ann {
			return "", fmt.Errorf("%w: the TOC and the annotation name different tar-splits", chunked.ErrInvalid)
		}
		want = ann
	}
	switch {
	case want == "":
		return "", nil
	case layout.TarSplit.Length == 0:
		return "", fmt.Errorf("%w: a tar-split digest is given but the layer has no tar-split", chunked.ErrInvalid)
	case layout.TarSplit.Length > lim.MaxTOCSize:
		return "", fmt.Errorf("%w: compressed tar-split of %d bytes exceeds %d", chunked.ErrLimit, layout.TarSplit.Length, lim.MaxTOCSize)
	}
	if err := want.Validate(); err != nil {
		return "", fmt.Errorf("%w: tar-split digest %q: %v", chunked.ErrInvalid, want, err)
	}
	return want, nil
}

// keepTarSplit checks raw against the tar-split's digest and keeps it, which it returns: raw
// itself when own (a buffer of its own), else a copy (a view of a larger buffer, which the copy
// lets go of).
func (v *Verifier) keepTarSplit(raw []byte, own bool) ([]byte, error) {
	if err := checkDigest("tar-split", v.tarSplitDigest, raw); err != nil {
		return nil, err
	}
	b := raw
	if !own {
		b = bytes.Clone(raw)
	}
	if v.tarSplit.CompareAndSwap(nil, &b) {
		v.readTarSplit.Store(&b)
	}
	return b, nil
}

// ReleaseTarSplit drops the tar-split the Verifier read itself (Open with [Config.TarSplit],
// [Verifier.ReadTarSplit], a comparison's or CheckDiffID's read) once the comparison has its
// verdict, so that it does not stay on the heap for the layer's life: up to the TOC limit per
// layer, whose size the image chooses. Only [Verifier.CheckDiffID] needs it after the verdict,
// and reads it again from its source. A tar-split given to [Restore] (mapped by the caller) is
// kept. Safe to call at any time, concurrently with the other methods.
func (v *Verifier) ReleaseTarSplit() {
	if !v.compared.Load() {
		return
	}
	if p := v.readTarSplit.Swap(nil); p != nil {
		v.tarSplit.CompareAndSwap(p, nil)
	}
}

// loadTarSplit returns the tar-split, reading it from src (and checking its digest) the first
// time. A digest mismatch is a *MismatchError (the blob is not the one the manifest names); a
// failed read is the source's error, and the next call reads again.
func (v *Verifier) loadTarSplit(ctx context.Context, src Source) ([]byte, error) {
	if p := v.tarSplit.Load(); p != nil {
		return *p, nil
	}
	if src == nil {
		return nil, errors.New("the tar-split is not read yet, and no source is given")
	}
	raw, err := readRange(ctx, src, v.layout.TarSplit.Offset, v.layout.TarSplit.Length)
	if err != nil {
		return nil, fmt.Errorf("reading the tar-split: %w", err)
	}
	return v.keepTarSplit(raw, true)
}
