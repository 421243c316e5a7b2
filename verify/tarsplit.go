package verify

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/sha256"
	"fmt"
	"io"
	"maps"
	"path"
	"runtime"
	"strings"
	"time"

	"github.com/klauspost/compress/zstd"
	"github.com/layerstore/layerstore/chunked"
	digest "github.com/opencontainers/go-digest"
)

// tarTypes maps tar type flags to TOC entry types.
var tarTypes = map[byte]chunked.Type{
	tar.TypeReg: chunked.TypeReg, tar.TypeDir: chunked.TypeDir, tar.TypeSymlink: chunked.TypeSymlink,
	tar.TypeLink: chunked.TypeHardlink, tar.TypeChar: chunked.TypeChar, tar.TypeBlock: chunked.TypeBlock,
	tar.TypeFifo: chunked.TypeFifo,
}

// tarSplitEntries returns a reader of the entries of a compressed tar-split, and a function that
// releases it. Called with check set, once the entries are read, it first checks that the
// stream decompresses to the size the layout states; without, it decompresses nothing more.
func (v *Verifier) tarSplitEntries(compressed []byte) (*chunked.TarSplitReader, func(check bool) error, error) {
	d, err := zstd.NewReader(bytes.NewReader(compressed), zstd.WithDecoderConcurrency(1),
		zstd.WithDecoderMaxWindow(1<<27))
	if err != nil {
		return nil, nil, fmt.Errorf("%w: tar-split: %v", chunked.ErrInvalid, err)
	}
	cr := &countingReader{r: d}
	done := func(check bool) error {
		defer d.Close()
		if !check {
			return nil
		}
		if _, err := io.Copy(io.Discard, cr); err != nil {
			return fmt.Errorf("%w: tar-split: %v", chunked.ErrInvalid, err)
		}
		if want := v.layout.TarSplitUncompressed; want != 0 && cr.n != want {
			return fmt.Errorf("%w: tar-split decompressed to %d bytes, the layout says %d", chunked.ErrInvalid, cr.n, want)
		}
		return nil
	}
	return chunked.NewTarSplitReader(cr, v.limits), done, nil
}

type countingReader struct {
	r io.Reader
	n int64
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += int64(n)
	return n, err
}

// compareTarSplit checks that the tar-split describes exactly the TOC's entries, in order, with
// the same metadata (type, name, link target, mode, size, owner, times, device, xattrs). It
// returns the size of the tar stream the tar-split describes.
func (v *Verifier) compareTarSplit(ctx context.Context, raw []byte) (int64, error) {
	x := v.index
	// A restored tar-split is readable as long as the index is (Restore): until the end.
	defer runtime.KeepAlive(x)
	ts, done, err := v.tarSplitEntries(raw)
	if err != nil {
		return 0, err
	}
	n := x.TOCLen()
	headers := 0
	err = chunked.IterateTarSplit(ctx, ts,
		func(k int, h *tar.Header) error {
			headers++
			v.headers.Add(1)
			if headers%unresidentEvery == 0 && v.unresident != nil {
				v.unresident() // what was read of the index and tar-split need not stay resident
			}
			if k >= n {
				return fmt.Errorf("%w: tar-split has entry %q beyond the TOC's %d", chunked.ErrInvalid, h.Name, n)
			}
			if err := headerMatches(x, chunked.EntryID(k), h); err != nil {
				return &chunked.EntryError{Index: -1, Name: h.Name,
					Err: fmt.Errorf("%w: TOC and tar-split disagree: %v", chunked.ErrInvalid, err)}
			}
			return nil
		},
		func(k int, r *chunked.TarSplitEntry) error {
			return fileEntryMatches(x, k, r)
		})
	if err == nil && headers != n {
		err = fmt.Errorf("%w: tar-split has %d entries, the TOC %d", chunked.ErrInvalid, headers, n)
	}
	if err != nil {
		done(false) //nolint:errcheck // releases only
		return 0, err
	}
	return ts.TarSize(), done(true)
}

func fileEntryMatches(x *chunked.Index, k int, r *chunked.TarSplitEntry) error {
	if k >= x.TOCLen() {
		return fmt.Errorf("%w: tar-split file entry %d beyond the TOC's %d entries", chunked.ErrInvalid, k, x.TOCLen())
	}
	e := x.Entry(chunked.EntryID(k))
	if clean(r.FileName()) != e.Name || (e.Type == chunked.TypeReg && r.Size != e.Size) {
		return &chunked.EntryError{Index: -1, Name: e.Name, Err: fmt.Errorf(
			"%w: tar-split file entry %d is %q (%d bytes)", chunked.ErrInvalid, k, r.FileName(), r.Size)}
	}
	return nil
}

func clean(name string) string { return path.Clean("/" + name)[1:] }

// headerMatches checks that tar header h describes entry id of x as the TOC does: at once
// when it does (headerEqual, no allocation but the entry's name), and with every difference
// named when it does not.
func headerMatches(x *chunked.Index, id chunked.EntryID, h *tar.Header) error {
	e := x.Entry(id)
	if headerEqual(x, id, &e, h) {
		return nil
	}
	return headerDiff(x, id, &e, h)
}

// headerEqual reports whether h describes e as headerDiff finds no difference. It answers
// false when in doubt (xattrs on either side): headerDiff then decides.
func headerEqual(x *chunked.Index, id chunked.EntryID, e *chunked.Entry, h *tar.Header) bool {
	// The index's names are clean (it builds them from their components): a name equal to
	// one is equal once cleaned.
	typ, ok := tarTypes[h.Typeflag]
	if !ok || typ != e.Type || h.Name != e.Name && clean(h.Name) != e.Name {
		return false
	}
	link := h.Linkname
	if typ == chunked.TypeHardlink {
		link = clean(link)
	}
	if link != e.LinkName || uint32(h.Mode&0o7777) != e.Mode || h.Size != e.Size ||
		int64(h.Uid) != int64(e.UID) || int64(h.Gid) != int64(e.GID) ||
		h.Devmajor != int64(e.DevMajor) || h.Devminor != int64(e.DevMinor) {
		return false
	}
	var mt int64
	if e.ModTimeSec != 0 || e.ModTimeNsec != 0 {
		mt = timeNanos(e.ModTime())
	}
	at, ct := x.TOCTimes(id)
	if mt != timeNanos(h.ModTime) || at != timeNanos(h.AccessTime) || ct != timeNanos(h.ChangeTime) {
		return false
	}
	for k := range h.PAXRecords {
		if strings.HasPrefix(k, "SCHILY.xattr.") {
			return false
		}
	}
	return len(x.TOCXattrs(id)) == 0 // allocates only when there are some
}

// headerDiff returns the differences between h and entry id of x (e), nil if none.
func headerDiff(x *chunked.Index, id chunked.EntryID, e *chunked.Entry, h *tar.Header) error {
	typ, ok := tarTypes[h.Typeflag]
	var diffs []string
	check := func(what string, equal bool, toc, tarv any) {
		if !equal {
			diffs = append(diffs, fmt.Sprintf("%s %v != %v", what, toc, tarv))
		}
	}
	check("type", ok && typ == e.Type, e.Type, string(rune(h.Typeflag)))
	check("name", clean(h.Name) == e.Name, e.Name, h.Name)
	link := h.Linkname
	if typ == chunked.TypeHardlink {
		link = clean(link)
	}
	check("link", link == e.LinkName, e.LinkName, h.Linkname)
	check("mode", uint32(h.Mode&0o7777) == e.Mode, e.Mode, h.Mode)
	check("size", h.Size == e.Size, e.Size, h.Size)
	check("uid", int64(h.Uid) == int64(e.UID), e.UID, h.Uid)
	check("gid", int64(h.Gid) == int64(e.GID), e.GID, h.Gid)
	check("devmajor", h.Devmajor == int64(e.DevMajor), e.DevMajor, h.Devmajor)
	check("devminor", h.Devminor == int64(e.DevMinor), e.DevMinor, h.Devminor)
	mt := e.ModTime()
	if e.ModTimeSec == 0 && e.ModTimeNsec == 0 {
		mt = time.Time{}
	}
	check("mtime", timeNanos(mt) == timeNanos(h.ModTime), mt, h.ModTime)
	at, ct := x.TOCTimes(id)
	check("atime", at == timeNanos(h.AccessTime), at, h.AccessTime)
	check("ctime", ct == timeNanos(h.ChangeTime), ct, h.ChangeTime)
	toc := map[string]string{}
	for _, xa := range x.TOCXattrs(id) {
		toc[xa.Name] = xa.Value
	}
	tarX := map[string]string{}
	for k, v := range h.PAXRecords {
		if name, ok := strings.CutPrefix(k, "SCHILY.xattr."); ok {
			tarX[name] = v
		}
	}
	check("xattrs", maps.Equal(toc, tarX), toc, tarX)
	if len(diffs) > 0 {
		return fmt.Errorf("%s", strings.Join(diffs, ", "))
	}
	return nil
}

// timeNanos maps zero and Unix-epoch times to 0, as c/storage does when it compares them.
func timeNanos(t time.Time) int64 {
	if t.IsZero() || t.Unix() == 0 && t.Nanosecond() == 0 {
		return 0
	}
	return t.UnixNano()
}

// PayloadFunc returns the content of a regular file of the layer (size bytes). CheckDiffID
// calls it once per non-empty file, in TOC order.
type PayloadFunc func(ctx context.Context, file chunked.EntryID) (io.ReadCloser, error)

// CheckDiffID rebuilds the layer's tar stream from its tar-split and the payloads, and checks
// that it hashes to the DiffID. It first runs [Verifier.CheckTarSplit] (at once when already
// done) and fails with its error. On success the layer's guarantee becomes [DiffIDVerified].
// The tar-split is read from src when the Verifier does not hold it, and not kept after.
// Layers without a tar-split return [ErrNoDiffIDProof].
func (v *Verifier) CheckDiffID(ctx context.Context, src Source, payload PayloadFunc) error {
	defer v.ReleaseTarSplit() // a tar-split read again for this proof: not kept after it
	if err := v.checkDiffID(ctx, src, payload); err != nil {
		return &LayerError{Layer: v.layout.BlobDigest, Format: v.layout.Format, Err: err}
	}
	v.guarantee.Store(int32(DiffIDVerified))
	v.tarSplit.Store(nil) // never needed again, restored or read (Save drops it from records from now on)
	return nil
}

func (v *Verifier) checkDiffID(ctx context.Context, src Source, payload PayloadFunc) error {
	if v.tarSplitDigest == "" {
		return ErrNoDiffIDProof
	}
	if err := v.checkTarSplit(ctx, src); err != nil {
		return err
	}
	raw, err := v.loadTarSplit(ctx, src) // read by the comparison, or restored
	if err != nil {
		return err
	}
	ts, done, err := v.tarSplitEntries(raw)
	if err != nil {
		return err
	}
	defer runtime.KeepAlive(v.index) // and with it a restored tar-split (Restore)
	defer done(false)                //nolint:errcheck // checked by checkTarSplit
	h := sha256.New()
	for files, n := 0, 0; ; n++ {
		if n%4096 == 0 {
			if err := ctx.Err(); err != nil {
				return err
			}
		}
		r, err := ts.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return err
		}
		if r.Type == chunked.TarSplitSegment {
			h.Write(r.Payload)
			continue
		}
		if err := fileEntryMatches(v.index, files, r); err != nil {
			return err
		}
		id := chunked.EntryID(files)
		files++
		if r.Size == 0 {
			continue
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		if err := copyPayload(ctx, h, payload, id, r.Size); err != nil {
			return fmt.Errorf("payload of %q: %w", v.index.Entry(id).Name, err)
		}
	}
	got := digest.NewDigest(digest.SHA256, h)
	if got != v.diffID {
		return &MismatchError{What: "DiffID", Want: v.diffID, Got: got}
	}
	return nil
}

func copyPayload(ctx context.Context, w io.Writer, payload PayloadFunc, id chunked.EntryID, size int64) error {
	rc, err := payload(ctx, id)
	if err != nil {
		return err
	}
	defer rc.Close()
	n, err := io.Copy(w, io.LimitReader(rc, size))
	if err != nil {
		return err
	}
	if n != size {
		return fmt.Errorf("%w: got %d of %d bytes", io.ErrUnexpectedEOF, n, size)
	}
	return nil
}
