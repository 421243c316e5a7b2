package layer

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	iofs "io/fs"
	"sync"
	"testing"
	"time"

	"github.com/opencontainers/go-digest"

	"github.com/layerstore/layerstore/chunked"
	"github.com/layerstore/layerstore/internal/control/protocol"
	"github.com/layerstore/layerstore/internal/testutil/testlayer"
	"github.com/layerstore/layerstore/internal/testutil/testregistry"
	"github.com/layerstore/layerstore/verify"
)

// readAll reads every regular file of l through ReadFile in reads of size n and returns
// path -> sha256.
func readAll(t *testing.T, l *Served, n int) map[string]string {
	t.Helper()
	idx := l.Index()
	out := map[string]string{}
	for id := range chunked.EntryID(idx.Len()) {
		e := idx.Entry(id)
		owner := idx.Entry(e.Inode)
		if !e.Visible() || owner.Type != chunked.TypeReg || e.Flags&chunked.FlagWhiteout != 0 {
			continue
		}
		h := sha256.New()
		buf := make([]byte, n)
		for off := int64(0); off < owner.Size; {
			k, err := l.ReadFile(t.Context(), e.Inode, buf, off)
			if err != nil {
				t.Fatalf("%s at %d: %v", e.Name, off, err)
			}
			if k == 0 {
				t.Fatalf("%s: short read at %d of %d", e.Name, off, owner.Size)
			}
			h.Write(buf[:k])
			off += int64(k)
		}
		out[idx.Path(id)] = hex.EncodeToString(h.Sum(nil))
	}
	return out
}

func referenceContent(t *testing.T) map[string]string {
	t.Helper()
	tree, err := testlayer.ReferenceTree(testlayer.Tar())
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for p, n := range tree {
		if n.Type == "reg" {
			out[p] = n.Content
		}
	}
	return out
}

func compareContent(t *testing.T, got, want map[string]string) {
	t.Helper()
	for p, w := range want {
		if got[p] != w {
			t.Errorf("%s: content %.12s, want %.12s", p, got[p], w)
		}
	}
	for p := range got {
		if _, ok := want[p]; !ok {
			t.Errorf("unexpected file %q", p)
		}
	}
}

// sized tells whether the tar size of a fixture is known without reading it (a tar-split or
// the eStargz annotation), which lookups by blob digest need.
func sized(f testlayer.Fixture) bool {
	return f.Desc.Annotations[chunked.AnnotationTarSplitPosition] != "" || f.Desc.Annotations[chunked.AnnotationUncompressedSize] != ""
}

// servedKey is a key the fixture is served by (the blob digest when sized, else the TOC
// digest), or "" when no runtime can have it lazily.
func servedKey(f testlayer.Fixture) digest.Digest {
	if sized(f) {
		return f.Desc.Digest
	}
	return tocKey(f.Desc.Annotations)
}

// TestReadEveryFormat resolves every fixture by both keys, reads every file lazily (no full
// GET of the blob), and checks the content and the info of each lookup generation.
func TestReadEveryFormat(t *testing.T) {
	e := newEnv(t)
	want := referenceContent(t)
	for _, f := range e.fixtures {
		t.Run(f.Name, func(t *testing.T) {
			ref := e.push("fixtures/"+f.Name+":v1", fixtureLayer(f))
			m := e.manager(withPrefetch(false))
			toc := tocKey(f.Desc.Annotations)
			blobKey := f.Desc.Digest
			keys := []digest.Digest{blobKey}
			if toc != "" {
				keys = append(keys, toc)
			}
			var l *Served
			for _, k := range keys {
				got, err := m.Lookup(t.Context(), ref, k)
				if k == blobKey && !sized(f) {
					// Runtimes looking up by blob digest need the tar size: pulled normally.
					if !errors.Is(err, iofs.ErrNotExist) {
						t.Fatalf("lookup by blob digest of a layer of unknown size: %v, want ErrNotExist", err)
					}
					continue
				}
				if err != nil {
					t.Fatalf("lookup %s: %v", k, err)
				}
				if l != nil && got != l {
					t.Fatal("the two keys gave different layers")
				}
				l = got
				var in map[string]any
				if err := json.Unmarshal(l.Info(k), &in); err != nil {
					t.Fatal(err)
				}
				if k == blobKey {
					tarStream, err := f.Decompress()
					if err != nil {
						t.Fatal(err)
					}
					if in["diff-digest"] != f.DiffID.String() || in["compressed-diff-digest"] != blobKey.String() || in["toc-digest"] != nil ||
						in["diff-size"] != float64(len(tarStream)) {
						t.Errorf("legacy info %v (tar of %d bytes)", in, len(tarStream))
					}
				} else if in["toc-digest"] != k.String() || in["diff-digest"] != nil ||
					in["flags"].(map[string]any)["expected-layer-diffid"] != f.DiffID.String() {
					t.Errorf("modern info %v", in)
				}
				wantComp := 2.0
				if f.Format.Zstd() {
					wantComp = 4
				}
				if in["compression"] != wantComp || in["compressed-size"] != float64(len(f.Blob)) {
					t.Errorf("info %v", in)
				}
			}
			if l == nil {
				return // served to no runtime (legacy zstd:chunked)
			}
			compareContent(t, readAll(t, l, 4096), want)
			st := e.reg.Stats(f.Desc.Digest)
			if st.Full != 0 || st.Ranged == 0 {
				t.Errorf("blob requests %+v, want range requests only", st)
			}
			// Everything read is cached: reading again asks the registry nothing.
			before := e.reg.Stats(f.Desc.Digest)
			compareContent(t, readAll(t, l, 1<<20), want)
			if after := e.reg.Stats(f.Desc.Digest); after != before {
				t.Errorf("re-read made requests: %+v -> %+v", before, after)
			}
		})
	}
}

// TestPrefetchCompletes checks that background fetching makes every file complete in the
// cache, proves the DiffID where the format can, and is then served without the registry.
func TestPrefetchCompletes(t *testing.T) {
	e := newEnv(t)
	want := referenceContent(t)
	for _, f := range e.fixtures {
		t.Run(f.Name, func(t *testing.T) {
			if servedKey(f) == "" {
				t.Skip("served to no runtime")
			}
			ref := e.push("prefetch/"+f.Name+":v1", fixtureLayer(f))
			m := e.manager()
			l, err := m.Lookup(t.Context(), ref, servedKey(f))
			if err != nil {
				t.Fatal(err)
			}
			l.wait()
			st := l.Status()
			if st.State != protocol.StateComplete {
				t.Fatalf("state %s (%s)", st.State, st.Error)
			}
			wantG := verify.ChunksVerified
			if l.v.CanProveDiffID() {
				wantG = verify.DiffIDVerified
			}
			if l.v.Guarantee() != wantG {
				t.Errorf("guarantee %s, want %s", l.v.Guarantee(), wantG)
			}
			before := e.reg.Stats(f.Desc.Digest)
			compareContent(t, readAll(t, l, 1<<16), want)
			if after := e.reg.Stats(f.Desc.Digest); after != before {
				t.Errorf("reads after prefetch made requests: %+v -> %+v", before, after)
			}
			if before.Full != 0 {
				t.Errorf("prefetch made %d full GETs", before.Full)
			}
		})
	}
}

func TestNotLazyAndUnknown(t *testing.T) {
	e := newEnv(t)
	gz := gzipLayer(t)
	ref := e.push("plain:v1", gz, fixtureLayer(e.fixtures[0]))
	m := e.manager(withPrefetch(false))
	for _, k := range []digest.Digest{digest.FromBytes(gz.Blob), digest.FromString("nothing"), "sha256:zz"} {
		if _, err := m.Lookup(t.Context(), ref, k); !errors.Is(err, iofs.ErrNotExist) {
			t.Errorf("%s: %v, want ErrNotExist", k, err)
		}
	}
	if _, err := m.Lookup(t.Context(), e.reg.Host+"/missing:v1", e.fixtures[0].Desc.Digest); !errors.Is(err, iofs.ErrNotExist) {
		t.Errorf("missing image: %v, want ErrNotExist", err)
	}
	if st := e.reg.Stats(digest.FromBytes(gz.Blob)); st != (testregistry.BlobStats{}) {
		t.Errorf("plain layer was read: %+v", st)
	}
}

// TestTamperedChunk: a flipped byte served by the registry never reaches a reader; the
// failure is counted and remembered for the negative TTL (a read meanwhile, as the kernel's
// retry of a failed readahead, fails at once without a request); the same bytes served
// correctly later are read fine.
func TestTamperedChunk(t *testing.T) {
	e := newEnv(t)
	f := e.fixtures[0]
	ref := e.push("tamper:v1", fixtureLayer(f))
	clock := newTestClock()
	m := e.manager(withPrefetch(false), withClock(clock.now), withNegativeTTL(time.Second))
	l, err := m.Lookup(t.Context(), ref, f.Desc.Digest)
	if err != nil {
		t.Fatal(err)
	}
	id, ok := l.Index().LookupPath("usr/bin/tool")
	if !ok {
		t.Fatal("no usr/bin/tool")
	}
	id = l.Index().Entry(id).Inode
	c := l.Index().Chunks(id)[0]
	e.reg.Tamper(f.Desc.Digest, c.Offset+c.Length/2)
	buf := make([]byte, 4096)
	if _, err := l.ReadFile(t.Context(), id, buf, 0); !errors.Is(err, verify.ErrDigestMismatch) && !errors.Is(err, verify.ErrCorrupt) {
		t.Fatalf("read of tampered chunk: %v", err)
	}
	if n := m.Status().Counters.VerifyFailures; n != 1 {
		t.Errorf("verify failures %d, want 1", n)
	}
	e.reg.Untamper(f.Desc.Digest)
	before := e.reg.Stats(f.Desc.Digest)
	if _, err := l.ReadFile(t.Context(), id, buf, 0); !errors.Is(err, verify.ErrDigestMismatch) && !errors.Is(err, verify.ErrCorrupt) {
		t.Fatalf("read within the negative TTL: %v, want the remembered failure", err)
	}
	if after := e.reg.Stats(f.Desc.Digest); after != before {
		t.Errorf("read within the negative TTL sent requests: %+v, then %+v", before, after)
	}
	clock.advance(2 * time.Second)
	if _, err := l.ReadFile(t.Context(), id, buf, 0); err != nil {
		t.Fatalf("read after the registry recovered: %v", err)
	}
}

// TestOtherPlatform: a key found only in another platform's manifest of an index resolves.
func TestOtherPlatform(t *testing.T) {
	e := newEnv(t)
	host, other := e.fixtures[0], e.fixtures[3]
	if _, err := e.reg.PushIndex(t.Context(), "multi:v1", []testregistry.Platform{
		{OS: "linux", Architecture: hostArch(), Layers: []testregistry.LayerBlob{fixtureLayer(host)}},
		{OS: "linux", Architecture: "s390x", Layers: []testregistry.LayerBlob{fixtureLayer(other)}},
	}); err != nil {
		t.Fatal(err)
	}
	m := e.manager(withPrefetch(false))
	for _, f := range []testlayer.Fixture{host, other} {
		if _, err := m.Lookup(t.Context(), e.reg.Host+"/multi:v1", f.Desc.Digest); err != nil {
			t.Errorf("%s: %v", f.Name, err)
		}
	}
}

// TestSharedResolution: concurrent lookups of every key of an image resolve it once; users
// are counted through use and release.
func TestSharedResolution(t *testing.T) {
	e := newEnv(t)
	f := e.fixtures[0]
	ref := e.push("shared:v1", fixtureLayer(f))
	m := e.manager(withPrefetch(false))
	var wg sync.WaitGroup
	for range 16 {
		wg.Go(func() {
			if _, err := m.Lookup(t.Context(), ref, f.Desc.Digest); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	if n := m.Status().Counters.Resolutions; n != 1 {
		t.Errorf("%d resolutions, want 1", n)
	}
	m.Use(ref, f.Desc.Digest)
	m.Use(ref, f.Desc.Digest)
	m.Release(ref, f.Desc.Digest)
	if u := m.Status().Layers[0].Users; u != 1 {
		t.Errorf("users %d, want 1", u)
	}
	m.Release(ref, f.Desc.Digest)
	m.Release(ref, f.Desc.Digest) // one too many: ignored
	m.Release("other", f.Desc.Digest)
	if u := m.Status().Layers[0].Users; u != 0 {
		t.Errorf("users %d, want 0", u)
	}
}

// TestNegativeTTL: a failed resolution is remembered only for the negative TTL.
func TestNegativeTTL(t *testing.T) {
	e := newEnv(t)
	f := e.fixtures[0]
	clock := newTestClock()
	m := e.manager(withPrefetch(false), withClock(clock.now), withNegativeTTL(time.Second))
	ref := e.reg.Host + "/later:v1"
	if _, err := m.Lookup(t.Context(), ref, f.Desc.Digest); err == nil {
		t.Fatal("lookup before the push succeeded")
	}
	e.push("later:v1", fixtureLayer(f))
	if _, err := m.Lookup(t.Context(), ref, f.Desc.Digest); err == nil {
		t.Fatal("failure was not remembered")
	}
	clock.advance(2 * time.Second)
	if _, err := m.Lookup(t.Context(), ref, f.Desc.Digest); err != nil {
		t.Fatalf("after the negative TTL: %v", err)
	}
}
