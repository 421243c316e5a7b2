package main

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime/debug"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/containerd/stargz-snapshotter/estargz"
	"github.com/opencontainers/go-digest"

	"github.com/layerstore/layerstore/chunked"
	"github.com/layerstore/layerstore/internal/testutil/testlayer"
	"github.com/layerstore/layerstore/internal/testutil/testregistry"
)

// bombDaemonEnv names a daemon binary TestMemoryBombs measures instead of the one built from
// this tree: an older build, to see what the bombs did before their bounds.
const bombDaemonEnv = "LAYERSTORE_TEST_DAEMON"

// lookupPeakRSS bounds the daemon's peak RSS (VmHWM) through a lookup: its own memory and what
// one manifest, config or TOC may make it hold, with room to spare.
const lookupPeakRSS = 256 << 20

// prefetchPeakRSS bounds it while a layer is fetched in the background: the batches hold at
// most [prefetch] concurrency x 4 MiB of decompressed content (the zeros layer's chunks are
// 4 MiB) and 4 x 8 MiB compressed (docs/security.md, "Worst-case memory"), which the garbage
// collector lets grow to twice that before it collects (GOGC=100), and the daemon's own
// 64 MiB: 160 MiB (measured: 87 MiB).
const prefetchPeakRSS = 2*(4*4+4*8)<<20 + 64<<20

// TestMemoryBombs looks up hostile images through the mount of a real daemon, as the runtime
// does, each with a daemon of its own, and bounds the daemon's peak RSS under each:
//
//   - a config answered with Content-Encoding: gzip that inflates to 1 GiB, its manifest
//     claiming that size: refused (the fetcher asks for identity and refuses encoded answers);
//   - an eStargz layer of 1 GiB of zeros (about 1 MB compressed; 512 MiB under the race detector,
//     which makes building it slow), fetched in the background until complete: the batches
//     are bounded by decompressed bytes and stored chunk by chunk;
//   - a TOC of 4000 entries at depth 2000 (16 MB of JSON naming 8 M implicit directories):
//     refused (names are capped at 256 components, implicit directories are counted);
//   - the reference fixture layer, for comparison.
//
// With $LAYERSTORE_TEST_DAEMON set, that binary is measured instead of this tree's.
func TestMemoryBombs(t *testing.T) {
	e := newServeEnv(t)
	if bin := os.Getenv(bombDaemonEnv); bin != "" {
		e.bin = bin
		t.Logf("measuring %s", bin)
	}
	ctx := t.Context()
	f := e.fixture
	zerosSize := int64(1 << 30)
	if raceEnabled() {
		zerosSize = 512 << 20
	}

	var bombs []memoryBomb

	// The honest baseline: newServeEnv pushed the reference fixture.
	bombs = append(bombs, memoryBomb{name: "reference layer", ref: e.ref, key: tocDigest(t, f.Desc.Annotations),
		bound: lookupPeakRSS, describe: fmt.Sprintf("%s, %d bytes", f.Name, len(f.Blob))})

	// The config bomb: 1 GiB of zeros as gzip members of 1 MiB each. The manifest claims the
	// inflated size, so that a client reading the config up to its descriptor's size inflates
	// all of it before it can check the digest.
	const configSize = 1 << 30
	gz := gzipZeros(t, configSize>>20)
	configDigest := digest.FromString("a config that is a gzip bomb")
	e.reg.Encode(configDigest, "gzip", gz)
	manifest, err := json.Marshal(map[string]any{
		"schemaVersion": 2,
		"mediaType":     "application/vnd.oci.image.manifest.v1+json",
		"config":        map[string]any{"mediaType": "application/vnd.oci.image.config.v1+json", "digest": configDigest, "size": configSize},
		"layers": []map[string]any{{"mediaType": f.Desc.MediaType, "digest": f.Desc.Digest, "size": f.Desc.Size,
			"annotations": f.Desc.Annotations}},
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := e.reg.PutManifest(ctx, "bombs/config:v1", "application/vnd.oci.image.manifest.v1+json", manifest); err != nil {
		t.Fatal(err)
	}
	bombs = append(bombs, memoryBomb{name: "config gzip bomb", ref: e.reg.Host + "/bombs/config:v1", key: tocDigest(t, f.Desc.Annotations),
		refused: true, bound: lookupPeakRSS, describe: fmt.Sprintf("%d-byte body inflating to %d MiB", len(gz), configSize>>20)})

	// The zeros layer: one file, in chunks of 4 MiB.
	start := time.Now()
	var hdr bytes.Buffer
	if err := tar.NewWriter(&hdr).WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: "zeros", Mode: 0o644,
		Size: zerosSize, ModTime: testlayer.Epoch, Format: tar.FormatUSTAR}); err != nil {
		t.Fatal(err)
	}
	zerosTar := make([]byte, int64(hdr.Len())+zerosSize+2*512) // the content and the end-of-archive blocks are zeros
	copy(zerosTar, hdr.Bytes())
	zeros, err := testlayer.BuildEStargz("zeros", zerosTar, estargz.WithChunkSize(4<<20), estargz.WithCompressionLevel(gzip.BestSpeed))
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("built the zeros layer (%d MiB, %d bytes compressed) in %v", zerosSize>>20, len(zeros.Blob), time.Since(start).Round(time.Millisecond))
	bombs = append(bombs, pushBomb(t, e, "zeros layer", "bombs/zeros:v1", zeros, false, prefetchPeakRSS,
		fmt.Sprintf("%d MiB of zeros, %d bytes compressed", zerosSize>>20, len(zeros.Blob))))

	// The deep TOC: 4000 fifos, each at a path of 2000 components of its own.
	start = time.Now()
	deep := strings.Repeat("a/", 2000-2)
	es := make([]testlayer.Entry, 4000)
	for i := range es {
		es[i].Header = tar.Header{Typeflag: tar.TypeFifo, Name: fmt.Sprintf("d%d/%sf", i, deep), Mode: 0o644,
			ModTime: testlayer.Epoch, Format: tar.FormatPAX}
	}
	deepLayer, err := testlayer.BuildEStargz("deep", testlayer.Build(es))
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("built the deep layer (%d bytes compressed) in %v", len(deepLayer.Blob), time.Since(start).Round(time.Millisecond))
	bombs = append(bombs, pushBomb(t, e, "deep TOC", "bombs/deep:v1", deepLayer, true, lookupPeakRSS,
		fmt.Sprintf("4000 entries at depth 2000, %d bytes compressed", len(deepLayer.Blob))))

	for _, b := range bombs {
		t.Run(b.name, func(t *testing.T) {
			d := e.start()
			defer stopDaemon(t, d)
			pid := d.cmd.Process.Pid
			ready := procStatusBytes(t, pid, "VmHWM")
			diff := filepath.Join(e.mnt, base64.StdEncoding.EncodeToString([]byte(b.ref)), b.key.String(), "diff")
			start := time.Now()
			_, err := os.Stat(diff)
			took := time.Since(start)
			result := "ok"
			if pe := (*os.PathError)(nil); errors.As(err, &pe) {
				result = pe.Err.Error()
			}
			if b.refused {
				if !errors.Is(err, syscall.ENOENT) && !errors.Is(err, syscall.EIO) {
					t.Errorf("lookup: %v, want ENOENT or EIO", err)
				}
			} else {
				if err != nil {
					t.Fatalf("lookup: %v", err)
				}
				e.waitComplete()
			}
			peak := procStatusBytes(t, pid, "VmHWM")
			t.Logf("%s (%s): lookup %s in %v; peak RSS %.1f MiB (%.1f MiB when ready), bound %d MiB",
				b.name, b.describe, result, took.Round(time.Millisecond), float64(peak)/(1<<20), float64(ready)/(1<<20), b.bound>>20)
			if peak > b.bound {
				t.Errorf("peak RSS %d MiB, want at most %d MiB", peak>>20, b.bound>>20)
			}
		})
	}
}

// memoryBomb is an image TestMemoryBombs looks up: ref, and in it the layer of TOC digest key.
type memoryBomb struct {
	name, describe string
	ref            string
	key            digest.Digest
	refused        bool  // the lookup must fail; else it must succeed and the layer become complete
	bound          int64 // on the peak RSS
}

// pushBomb pushes an image of layer l as repoTag and returns its lookup.
func pushBomb(t *testing.T, e *serveEnv, name, repoTag string, l testlayer.Fixture, refused bool, bound int64, describe string) memoryBomb {
	t.Helper()
	if _, err := e.reg.Push(t.Context(), repoTag, []testregistry.LayerBlob{{
		Blob: l.Blob, MediaType: l.Desc.MediaType, Annotations: l.Desc.Annotations, DiffID: l.DiffID}}); err != nil {
		t.Fatal(err)
	}
	return memoryBomb{name: name, describe: describe, ref: e.reg.Host + "/" + repoTag, key: tocDigest(t, l.Desc.Annotations), refused: refused, bound: bound}
}

// tocDigest returns the TOC digest a layer descriptor's annotations name.
func tocDigest(t *testing.T, a map[string]string) digest.Digest {
	t.Helper()
	for _, k := range []string{chunked.AnnotationChecksum, chunked.AnnotationLegacyChecksum, chunked.AnnotationStargzTOCDigest} {
		if v, ok := a[k]; ok {
			return digest.Digest(v)
		}
	}
	t.Fatalf("no TOC digest in %v", a)
	return ""
}

// gzipZeros returns gzip members inflating to mib MiB of zeros.
func gzipZeros(t *testing.T, mib int) []byte {
	t.Helper()
	var one bytes.Buffer
	zw, err := gzip.NewWriterLevel(&one, gzip.BestCompression)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := zw.Write(make([]byte, 1<<20)); err != nil {
		t.Fatal(err)
	}
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	return bytes.Repeat(one.Bytes(), mib)
}

// procStatusBytes returns a field of /proc/PID/status given in kB (VmHWM: the peak RSS).
func procStatusBytes(t *testing.T, pid int, field string) int64 {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, field+":"); ok {
			kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			if err != nil {
				t.Fatalf("%s: %q: %v", field, line, err)
			}
			return kb << 10
		}
	}
	t.Fatalf("no %s in /proc/%d/status", field, pid)
	return 0
}

// stopDaemon stops d with SIGTERM, or SIGKILL if it does not exit in time.
func stopDaemon(t *testing.T, d *daemon) {
	t.Helper()
	d.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-d.exited:
	case <-time.After(20 * time.Second):
		t.Errorf("the daemon did not stop on SIGTERM")
		d.kill()
	}
}

// raceEnabled tells whether the test runs under the race detector.
func raceEnabled() bool {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return false
	}
	for _, s := range bi.Settings {
		if s.Key == "-race" {
			return s.Value == "true"
		}
	}
	return false
}
