package verify_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"maps"
	"strings"
	"sync"
	"testing"

	"github.com/klauspost/compress/zstd"
	"github.com/layerstore/layerstore/chunked"
	"github.com/layerstore/layerstore/internal/byterange"
	"github.com/layerstore/layerstore/internal/testutil/testlayer"
	"github.com/layerstore/layerstore/verify"
	digest "github.com/opencontainers/go-digest"
)

// positions returns up to n positions spread over [0, size), always including both ends.
func positions(size, n int) []int {
	if size <= n {
		ps := make([]int, size)
		for i := range ps {
			ps[i] = i
		}
		return ps
	}
	ps := make([]int, 0, n)
	for i := range n {
		ps = append(ps, i*(size-1)/(n-1))
	}
	return ps
}

func flip(b []byte, at int) []byte {
	c := bytes.Clone(b)
	c[at] ^= 0x5a
	return c
}

// isTyped reports whether err is one of the typed failures of the chain of trust.
func isTyped(err error) bool {
	var le *verify.LayerError
	if !errors.As(err, &le) {
		return false
	}
	for _, target := range []error{verify.ErrDigestMismatch, verify.ErrCorrupt, chunked.ErrInvalid, chunked.ErrLimit, chunked.ErrNotLazy} {
		if errors.Is(err, target) {
			return true
		}
	}
	return false
}

// Any flipped byte of a chunk's compressed range is detected, or leaves the served bytes
// identical (bytes no decoder reads: gzip member headers and trailers, the next tar header).
func TestTamperChunks(t *testing.T) {
	for _, f := range fixtures(t) {
		t.Run(f.Name, func(t *testing.T) {
			l, _ := open(t, f)
			x := l.Index()
			var detected, harmless int
			for id := range chunked.EntryID(x.Len()) {
				if x.Entry(id).Inode != id {
					continue
				}
				for i, c := range x.Chunks(id) {
					orig := f.Blob[c.Offset:c.End()]
					good, err := l.VerifyChunk(id, i, orig)
					if err != nil {
						t.Fatalf("untampered chunk %d of %s: %v", i, x.Entry(id).Name, err)
					}
					for _, p := range positions(len(orig), 24) {
						got, err := l.VerifyChunk(id, i, flip(orig, p))
						switch {
						case err != nil:
							if !isTyped(err) || got.Bytes() != nil {
								t.Fatalf("chunk %d of %s, byte %d: untyped error or data with error: %v", i, x.Entry(id).Name, p, err)
							}
							detected++
						case !bytes.Equal(got.Bytes(), good.Bytes()):
							t.Fatalf("chunk %d of %s, byte %d flipped: served different bytes without an error", i, x.Entry(id).Name, p)
						default:
							harmless++
						}
					}
				}
			}
			t.Logf("%d flips detected, %d in bytes that change nothing served", detected, harmless)
			if detected == 0 || detected < harmless {
				t.Errorf("only %d of %d flips detected", detected, detected+harmless)
			}
		})
	}
}

// dump renders an index completely, to compare two of them.
func dump(x *chunked.Index) string {
	var b strings.Builder
	for id := range chunked.EntryID(x.Len()) {
		fmt.Fprintf(&b, "%+v %v %v\n", x.Entry(id), x.Chunks(id), x.TOCXattrs(id))
	}
	return b.String()
}

// Any flipped byte of the footer, the TOC or the tar-split makes Open fail with a typed error
// (the tar-split's only when Open reads it, Config.TarSplit; otherwise CheckTarSplit fails, and
// its failure is the verdict). The only exception: the gzip header fields of the eStargz TOC
// member (mtime, flags, OS), which no reader uses and which change nothing parsed.
func TestTamperMetadata(t *testing.T) {
	for _, f := range fixtures(t) {
		t.Run(f.Name, func(t *testing.T) {
			l, _ := open(t, f)
			want := dump(l.Index())
			lay := l.Layout()
			tail := chunked.TailSize(lay.Format)
			regions := map[string]byterange.Range{
				"footer": {Offset: lay.BlobSize - tail, Length: tail},
				"TOC":    lay.TOC,
			}
			if lay.TarSplit.Length > 0 {
				regions["tar-split"] = lay.TarSplit
			}
			for name, r := range regions {
				detected := 0
				for _, p := range positions(int(r.Length), 160) {
					at := int(r.Offset) + p
					src := source(flip(f.Blob, at))
					if name == "tar-split" {
						lazy, err := verify.Open(t.Context(), f.Desc, f.DiffID, src, verify.Config{})
						if err != nil {
							t.Fatalf("tar-split byte %d: Open without the tar-split = %v", p, err)
						}
						if err := lazy.CheckTarSplit(t.Context(), src); !isTyped(err) || lazy.Err() == nil {
							t.Fatalf("tar-split byte %d: CheckTarSplit = %v (Err %v), want a typed verdict", p, err, lazy.Err())
						}
					}
					lt, err := verify.Open(t.Context(), f.Desc, f.DiffID, src, verify.Config{TarSplit: true})
					if err != nil {
						if !isTyped(err) {
							t.Fatalf("%s byte %d: untyped error %v", name, p, err)
						}
						detected++
						continue
					}
					gzipHeader := lay.Format == chunked.EStargz && name == "TOC" && p >= 4 && p < 10
					if !gzipHeader || dump(lt.Index()) != want {
						t.Errorf("%s byte %d flipped: not detected", name, p)
					}
				}
				t.Logf("%s: %d of %d flips detected", name, detected, len(positions(int(r.Length), 160)))
			}
		})
	}
}

// A TOC whose digest does not match the annotation is rejected before it is parsed.
func TestTOCAnnotationMismatch(t *testing.T) {
	for _, f := range fixtures(t) {
		t.Run(f.Name, func(t *testing.T) {
			d := f.Desc
			d.Annotations = maps.Clone(d.Annotations)
			for _, k := range []string{chunked.AnnotationChecksum, chunked.AnnotationStargzTOCDigest, chunked.AnnotationLegacyChecksum} {
				if _, ok := d.Annotations[k]; ok {
					d.Annotations[k] = digest.FromString("another TOC").String()
				}
			}
			_, err := verify.Open(t.Context(), d, f.DiffID, source(f.Blob), verify.Config{})
			var me *verify.MismatchError
			if !errors.Is(err, verify.ErrDigestMismatch) || !errors.As(err, &me) || !strings.Contains(me.What, "TOC") {
				t.Fatalf("Open = %v, want a TOC digest mismatch", err)
			}
			if !strings.Contains(err.Error(), f.Desc.Digest.String()) {
				t.Errorf("error %q does not name the layer", err)
			}
		})
	}
}

// repackModern rebuilds the modern zstd:chunked fixture with an edited TOC, re-anchored in new
// annotations: what a producer lying about metadata would publish.
func repackModern(t *testing.T, edit func(string) string) (testlayer.Fixture, error) {
	t.Helper()
	var f testlayer.Fixture
	for _, g := range fixtures(t) {
		if g.Name == "zstdchunked-modern" {
			f = g
		}
	}
	lay, err := chunked.Classify(f.Desc)
	if err != nil {
		return f, err
	}
	if err := lay.ApplyFooter(f.Blob[f.Desc.Size-chunked.TailSize(lay.Format):]); err != nil {
		return f, err
	}
	js, err := chunked.ExtractTOC(lay, f.Blob[lay.TOC.Offset:lay.TOC.End()], chunked.Limits{})
	if err != nil {
		return f, err
	}
	newJS := edit(string(js))
	enc, _ := zstd.NewWriter(nil)
	toc := enc.EncodeAll([]byte(newJS), nil)
	tarSplit := f.Blob[lay.TarSplit.Offset:lay.TarSplit.End()]
	skippable := func(b []byte) []byte {
		h := []byte{0x50, 0x2a, 0x4d, 0x18, 0, 0, 0, 0}
		binary.LittleEndian.PutUint32(h[4:], uint32(len(b)))
		return append(h, b...)
	}
	blob := bytes.Clone(f.Blob[:lay.PayloadEnd()])
	tocOff := int64(len(blob)) + 8
	blob = append(blob, skippable(toc)...)
	tsOff := int64(len(blob)) + 8
	blob = append(blob, skippable(tarSplit)...)
	footer := make([]byte, 64)
	for i, v := range []int64{tocOff, int64(len(toc)), int64(len(newJS)), 1, tsOff, int64(len(tarSplit)), lay.TarSplitUncompressed} {
		binary.LittleEndian.PutUint64(footer[8*i:], uint64(v))
	}
	copy(footer[56:], "GNUlInUx")
	blob = append(blob, skippable(footer)...)
	f.Blob = blob
	f.Desc = chunked.Descriptor{MediaType: f.Desc.MediaType, Digest: digest.FromBytes(blob), Size: int64(len(blob)),
		Annotations: map[string]string{
			chunked.AnnotationChecksum:         digest.FromBytes(toc).String(),
			chunked.AnnotationPosition:         fmt.Sprintf("%d:%d:%d:1", tocOff, len(toc), len(newJS)),
			chunked.AnnotationTarSplitPosition: fmt.Sprintf("%d:%d:%d", tsOff, len(tarSplit), lay.TarSplitUncompressed),
		}}
	return f, nil
}

// A zstd:chunked TOC that is correctly anchored but disagrees with the tar-split (and so with
// the DiffID) opens, since Open compares nothing, but is caught by CheckTarSplit, or by
// CheckDiffID when that runs first; from then on the layer verifies nothing.
func TestTarSplitDisagreement(t *testing.T) {
	same, err := repackModern(t, func(s string) string { return s })
	if err != nil {
		t.Fatal(err)
	}
	if l, err := verify.Open(t.Context(), same.Desc, same.DiffID, source(same.Blob), verify.Config{}); err != nil || l.CheckTarSplit(t.Context(), source(same.Blob)) != nil {
		t.Fatalf("repacked without changes: %v", err)
	}
	for name, edit := range map[string]func(string) string{
		"setuid added": func(s string) string { return strings.Replace(s, `"mode":420`, `"mode":2468`, 1) },
		"owner":        func(s string) string { return strings.Replace(s, `"uid":1000`, `"uid":0`, 1) },
		"symlink":      func(s string) string { return strings.Replace(s, `"linkName":"tool"`, `"linkName":"/etc/shadow"`, 1) },
	} {
		for _, first := range []string{"CheckTarSplit", "CheckDiffID"} {
			t.Run(name+"/"+first, func(t *testing.T) {
				f, err := repackModern(t, edit)
				if err != nil {
					t.Fatal(err)
				}
				if bytes.Equal(f.Blob, same.Blob) {
					t.Fatal("the edit changed nothing")
				}
				src := source(f.Blob)
				l, err := verify.Open(t.Context(), f.Desc, f.DiffID, src, verify.Config{})
				if err != nil {
					t.Fatalf("Open = %v; it checks the tar-split's digest only", err)
				}
				if l.Guarantee() != verify.ChunksVerified || l.TarSize() != -1 || !l.CanProveDiffID() || l.Err() != nil {
					t.Fatalf("before the comparison: guarantee %v, TarSize %d, CanProveDiffID %v, Err %v",
						l.Guarantee(), l.TarSize(), l.CanProveDiffID(), l.Err())
				}
				if first == "CheckTarSplit" {
					err = l.CheckTarSplit(t.Context(), src)
				} else {
					err = l.CheckDiffID(t.Context(), src, payloads(l, src))
				}
				if !isTyped(err) || !errors.Is(err, chunked.ErrInvalid) || !strings.Contains(err.Error(), "tar-split disagree") {
					t.Fatalf("%s = %v, want TOC and tar-split disagreement", first, err)
				}
				if again := l.CheckTarSplit(t.Context(), src); again == nil || again.Error() != l.Err().Error() {
					t.Fatalf("CheckTarSplit again = %v, Err = %v: the verdict is not remembered", again, l.Err())
				}
				if l.Guarantee() != 0 || l.TarSize() != -1 || l.CanProveDiffID() {
					t.Errorf("after the failure: guarantee %v, TarSize %d, CanProveDiffID %v", l.Guarantee(), l.TarSize(), l.CanProveDiffID())
				}
				x := l.Index()
				for id := range chunked.EntryID(x.Len()) {
					if cs := x.Chunks(id); len(cs) > 0 && x.Entry(id).Inode == id {
						c, err := l.VerifyChunk(id, 0, f.Blob[cs[0].Offset:cs[0].End()])
						if !errors.Is(err, chunked.ErrInvalid) || c.Bytes() != nil {
							t.Fatalf("VerifyChunk after the failure = %v", err)
						}
						break
					}
				}
				if err := l.CheckDiffID(t.Context(), src, payloads(l, src)); !errors.Is(err, chunked.ErrInvalid) || l.Guarantee() != 0 {
					t.Fatalf("CheckDiffID after the failure = %v, guarantee %v", err, l.Guarantee())
				}
			})
		}
	}
}

// Open compares no tar-split header with the TOC, whatever the layer's size; CheckTarSplit
// compares each once, however many call it at once or again.
func TestTarSplitComparisonDeferred(t *testing.T) {
	const n = 20_000
	f, err := testlayer.SyntheticZstdChunked(n, nil)
	if err != nil {
		t.Fatal(err)
	}
	l, src := open(t, f)
	if got := verify.HeadersCompared(l); got != 0 {
		t.Fatalf("Open compared %d tar-split headers with the TOC, want 0", got)
	}
	if l.TarSize() != -1 || l.Guarantee() != verify.ChunksVerified {
		t.Fatalf("before the comparison: TarSize %d, guarantee %v", l.TarSize(), l.Guarantee())
	}
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			if err := l.CheckTarSplit(t.Context(), src); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	if err := l.CheckDiffID(t.Context(), src, payloads(l, src)); err != nil {
		t.Fatal(err)
	}
	if got := verify.HeadersCompared(l); got != n {
		t.Errorf("%d headers compared by concurrent CheckTarSplit calls and CheckDiffID, want %d once each", got, n)
	}
	if l.TarSize() <= 0 || l.Guarantee() != verify.DiffIDVerified {
		t.Errorf("after: TarSize %d, guarantee %v", l.TarSize(), l.Guarantee())
	}
	// A synthetic layer whose TOC lies is caught too (the layer tests use it).
	bad, err := testlayer.SyntheticZstdChunked(100, func(js []byte) []byte {
		return bytes.Replace(js, []byte(`"mode":420`), []byte(`"mode":2541`), 1)
	})
	if err != nil {
		t.Fatal(err)
	}
	lb, bsrc := open(t, bad)
	if err := lb.CheckTarSplit(t.Context(), bsrc); !errors.Is(err, chunked.ErrInvalid) {
		t.Fatalf("CheckTarSplit of a lying synthetic layer = %v", err)
	}
}

func TestCheckDiffIDMismatch(t *testing.T) {
	f, err := repackModern(t, func(s string) string { return s })
	if err != nil {
		t.Fatal(err)
	}
	src := source(f.Blob)
	wrong, err := verify.Open(t.Context(), f.Desc, digest.FromString("other"), src, verify.Config{})
	if err != nil {
		t.Fatal(err)
	}
	if err := wrong.CheckDiffID(t.Context(), src, payloads(wrong, src)); !errors.Is(err, verify.ErrDigestMismatch) {
		t.Fatalf("CheckDiffID with a wrong DiffID = %v", err)
	}
	if g := wrong.Guarantee(); g != verify.ChunksVerified {
		t.Fatalf("guarantee after a failed check = %v", g)
	}
	l, err := verify.Open(t.Context(), f.Desc, f.DiffID, src, verify.Config{})
	if err != nil {
		t.Fatal(err)
	}
	bad := func(ctx context.Context, id chunked.EntryID) (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(make([]byte, l.Index().Entry(id).Size))), nil
	}
	if err := l.CheckDiffID(t.Context(), src, bad); !errors.Is(err, verify.ErrDigestMismatch) {
		t.Fatalf("CheckDiffID with wrong payloads = %v", err)
	}
}

// c/storage 1.47-1.49 wrote a 56-byte footer and anchored the tar-split with an annotation
// instead of the TOC: such layers open, and the tar-split still binds them to the DiffID.
func TestTarSplitChecksumAnnotation(t *testing.T) {
	base, err := repackModern(t, func(s string) string {
		i := strings.Index(s, `,"tarSplitDigest"`)
		return s[:i] + "}"
	})
	if err != nil {
		t.Fatal(err)
	}
	lay, err := chunked.Classify(base.Desc)
	if err != nil {
		t.Fatal(err)
	}
	tsDigest := digest.FromBytes(base.Blob[lay.TarSplit.Offset:lay.TarSplit.End()])
	// Swap the 64-byte footer for the 56-byte one: the legacy 40 bytes, then 16 zeros.
	old := base.Blob[len(base.Blob)-64:]
	footer := append(append(bytes.Clone(old[:32]), "GnUlInUx"...), make([]byte, 16)...)
	blob := append(bytes.Clone(base.Blob[:len(base.Blob)-72]), 0x50, 0x2a, 0x4d, 0x18, 56, 0, 0, 0)
	blob = append(blob, footer...)
	for name, tc := range map[string]struct {
		checksum digest.Digest
		ok       bool
	}{
		"right annotation": {tsDigest, true},
		"wrong annotation": {digest.FromString("other"), false},
	} {
		t.Run(name, func(t *testing.T) {
			d := chunked.Descriptor{MediaType: base.Desc.MediaType, Digest: digest.FromBytes(blob), Size: int64(len(blob)),
				Annotations: maps.Clone(base.Desc.Annotations)}
			d.Annotations[chunked.AnnotationTarSplitChecksum] = tc.checksum.String()
			src := source(blob)
			if _, err := verify.Open(t.Context(), d, base.DiffID, src, verify.Config{TarSplit: true}); tc.ok != (err == nil) {
				t.Fatalf("Open with the tar-split = %v", err)
			} else if !tc.ok && !errors.Is(err, verify.ErrDigestMismatch) {
				t.Fatalf("Open with the tar-split = %v, want a tar-split digest mismatch", err)
			}
			l, err := verify.Open(t.Context(), d, base.DiffID, src, verify.Config{})
			if err != nil {
				t.Fatal(err)
			}
			if !tc.ok {
				// Read later, the tar-split that is not the one named refuses the layer.
				if err := l.CheckTarSplit(t.Context(), src); !errors.Is(err, verify.ErrDigestMismatch) || l.Err() == nil || l.Guarantee() != 0 {
					t.Fatalf("CheckTarSplit = %v (Err %v, guarantee %v), want a tar-split digest mismatch as the verdict", err, l.Err(), l.Guarantee())
				}
				return
			}
			if !l.CanProveDiffID() {
				t.Fatal("the annotated tar-split was not used")
			}
			if err := l.CheckDiffID(t.Context(), src, payloads(l, src)); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// failingSource fails every read.
type failingSource struct{}

func (failingSource) ReadAt(context.Context, []byte, int64) (int, error) {
	return 0, errors.New("registry unavailable")
}

// A tar-split that cannot be read (the registry down when the comparison runs) is no verdict:
// the layer stays served and the next comparison reads it again.
func TestTarSplitReadFailureIsNoVerdict(t *testing.T) {
	f, err := repackModern(t, func(s string) string { return s })
	if err != nil {
		t.Fatal(err)
	}
	l, src := open(t, f)
	if err := l.CheckTarSplit(t.Context(), failingSource{}); err == nil || l.Err() != nil || l.TarSize() != -1 || l.Guarantee() != verify.ChunksVerified {
		t.Fatalf("CheckTarSplit from a failing source = %v (Err %v, TarSize %d, guarantee %v), want an error and no verdict",
			err, l.Err(), l.TarSize(), l.Guarantee())
	}
	if err := l.CheckDiffID(t.Context(), failingSource{}, payloads(l, src)); err == nil || l.Err() != nil {
		t.Fatalf("CheckDiffID from a failing source = %v (Err %v), want an error and no verdict", err, l.Err())
	}
	if err := l.CheckTarSplit(t.Context(), src); err != nil || l.TarSize() <= 0 {
		t.Fatalf("CheckTarSplit once the source answers = %v, TarSize %d", err, l.TarSize())
	}
}

// ReadTarSplit: a failed read is no verdict, nor a cancelled one, unless the caller says it
// can wait no longer (final): then the layer is unproven, and refused as by a failed
// comparison.
func TestReadTarSplitFinal(t *testing.T) {
	f, err := repackModern(t, func(s string) string { return s })
	if err != nil {
		t.Fatal(err)
	}
	l, src := open(t, f)
	if err := l.ReadTarSplit(t.Context(), failingSource{}, false); err == nil || l.Err() != nil {
		t.Fatalf("ReadTarSplit, not final, from a failing source = %v (Err %v), want an error and no verdict", err, l.Err())
	}
	cancelled, cancel := context.WithCancel(t.Context())
	cancel()
	if err := l.ReadTarSplit(cancelled, src, true); err == nil || l.Err() != nil {
		t.Fatalf("ReadTarSplit, final, cancelled = %v (Err %v), want an error and no verdict", err, l.Err())
	}
	if err := l.ReadTarSplit(t.Context(), failingSource{}, true); !errors.Is(err, verify.ErrUnproven) || !errors.Is(l.Err(), verify.ErrUnproven) || l.Guarantee() != 0 {
		t.Fatalf("ReadTarSplit, final, from a failing source = %v (Err %v, guarantee %v), want the layer unproven", err, l.Err(), l.Guarantee())
	}
	if err := l.CheckTarSplit(t.Context(), src); !errors.Is(err, verify.ErrUnproven) {
		t.Fatalf("CheckTarSplit after = %v, want the verdict", err)
	}

	l, src = open(t, f)
	if err := l.ReadTarSplit(t.Context(), src, true); err != nil || l.Err() != nil {
		t.Fatalf("ReadTarSplit = %v (Err %v)", err, l.Err())
	}
	if err := l.CheckTarSplit(t.Context(), failingSource{}); err != nil || l.TarSize() <= 0 {
		t.Fatalf("CheckTarSplit after the read (needing no source) = %v, TarSize %d", err, l.TarSize())
	}
}
