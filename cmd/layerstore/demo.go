package main

import (
	"archive/tar"
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"os"
	"path/filepath"
	"text/tabwriter"
	"time"

	"github.com/containerd/stargz-snapshotter/estargz"
	"github.com/opencontainers/go-digest"

	"github.com/layerstore/layerstore/chunked"
	storefs "github.com/layerstore/layerstore/fs"
	"github.com/layerstore/layerstore/internal/control/protocol"
	"github.com/layerstore/layerstore/internal/demo"
	"github.com/layerstore/layerstore/layer"
)

// demoFiles are what the demo's "workload" reads.
var demoFiles = []string{"etc/hostname", "usr/bin/tool", "usr/share/doc/deep/er/README"}

// demoImage is one image the demo pushes and reads.
type demoImage struct {
	tag   string
	layer demo.LayerBlob
	key   digest.Digest // what a modern runtime looks the layer up by
	lazy  bool
}

// runDemo pushes sample images to a registry on 127.0.0.1, mounts a store in a temporary
// directory, reads a few files of each image through the mount and prints what was fetched.
// Nothing leaves 127.0.0.1; everything is removed afterwards.
func runDemo(ctx context.Context, out io.Writer) error {
	if err := storefs.Usable(); err != nil {
		return fmt.Errorf("FUSE is not usable here, so no store can be mounted: %w\n"+
			"the demo mounts a FUSE filesystem: run it as root on a machine with /dev/fuse", err)
	}
	reg, err := demo.StartRegistry()
	if err != nil {
		return err
	}
	defer reg.Close()
	images, err := pushDemoImages(ctx, out, reg)
	if err != nil {
		return err
	}
	dir, err := os.MkdirTemp("", "layerstore-demo-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	mnt := filepath.Join(dir, "store")
	s, err := openDemoStack(dir, mnt, reg)
	if err != nil {
		return err
	}
	defer s.Close()
	fmt.Fprintf(out, "registry on %s, store mounted at %s\n\n", reg.Host, mnt)

	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "image\tformat\tblob\tresolve\tfirst byte\t3 files\tfetched\tof blob\trequests\tall local in\tguarantee\t")
	for _, im := range images {
		if err := readDemoImage(ctx, tw, reg, s, mnt, im); err != nil {
			return err
		}
	}
	tw.Flush()
	fmt.Fprint(out, `
fetched, requests: what the registry had sent for the layer when the 3 files had been read
  (TOC, the files' chunks, and whatever the background fetch, paced to 8 MiB/s in 1 MiB requests here, got to).
all local in: time until the background fetch had verified and cached the whole layer.
The images hold the same files: the cache is content-addressed, so after the first image
only the TOCs and content not seen before are fetched.
`)
	return readTampered(ctx, out, reg, s, mnt)
}

// pushDemoImages builds the sample images and pushes them to reg.
func pushDemoImages(ctx context.Context, out io.Writer, reg *demo.Registry) ([]demoImage, error) {
	images, bulk, err := demoImages()
	if err != nil {
		return nil, err
	}
	fmt.Fprintf(out, "sample image: the reference layer (%d entries) plus %d MiB of libraries, in each format\n",
		len(demo.Entries()), bulk>>20)
	for _, im := range images {
		if _, err := reg.Push(ctx, "demo/app:"+im.tag, []demo.LayerBlob{im.layer}); err != nil {
			return nil, err
		}
	}
	return images, nil
}

// openDemoStack mounts a store at mnt reading from reg alone, its cache and registries.conf in
// dir.
func openDemoStack(dir, mnt string, reg *demo.Registry) (*stack, error) {
	conf := filepath.Join(dir, "registries.conf")
	if err := os.WriteFile(conf, fmt.Appendf(nil, "[[registry]]\nlocation = %q\ninsecure = true\n", reg.Host), 0o644); err != nil {
		return nil, err
	}
	cfg := &Config{CacheDir: filepath.Join(dir, "cache")}
	// Paced, so that the lazy reads visibly overtake the background fetch.
	cfg.Prefetch.Bandwidth, cfg.Prefetch.BatchSize = 8<<20, 1<<20
	cfg.Registries.Conf, cfg.Registries.ConfDir = conf, conf+".d"
	return openStack(cfg, mnt, nil, slog.New(slog.DiscardHandler))
}

// readDemoImage reads the demo's files of im through the store at mnt, waits for the
// background fetch, and writes the table's row.
func readDemoImage(ctx context.Context, tw io.Writer, reg *demo.Registry, s *stack, mnt string, im demoImage) error {
	ref := reg.Host + "/demo/app:" + im.tag
	layerDir := filepath.Join(mnt, base64.StdEncoding.EncodeToString([]byte(ref)), im.key.String())
	start := time.Now()
	_, err := os.Stat(filepath.Join(layerDir, "diff"))
	if !im.lazy {
		if !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("%s: a plain layer was served (%v)", im.tag, err)
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\tENOENT in %s\t\t\t\t\t\t\t(the runtime pulls it)\t\n", im.tag, "gzip", len(im.layer.Blob), since(start))
		return nil
	}
	if err != nil {
		return fmt.Errorf("%s: %w", im.tag, err)
	}
	resolved := time.Since(start)
	var firstByte time.Duration
	for i, p := range demoFiles {
		f, err := os.Open(filepath.Join(layerDir, "diff", p))
		if err != nil {
			return err
		}
		_, err = f.Read(make([]byte, 1))
		if i == 0 {
			firstByte = time.Since(start)
		}
		if err == nil {
			_, err = io.Copy(io.Discard, f)
		}
		f.Close()
		if err != nil {
			return fmt.Errorf("%s: reading %s: %w", im.tag, p, err)
		}
	}
	read := time.Since(start)
	stats := reg.Stats(im.layer.Digest())
	fetched, requests := stats.Bytes, stats.Ranged
	if stats.Full > 0 {
		return fmt.Errorf("%s: the blob was fetched in full", im.tag)
	}
	local, err := waitLocal(ctx, s.manager, im.layer)
	if err != nil {
		return err
	}
	st := layerStatus(s.manager, im.layer)
	fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s\t%s\t%d\t%.1f%%\t%d\t%s\t%s\t\n", im.tag, st.Format, st.Size,
		resolved.Round(time.Millisecond), firstByte.Round(time.Millisecond), read.Round(time.Millisecond),
		fetched, 100*float64(fetched)/float64(st.Size), requests, local.Round(time.Millisecond), st.Guarantee)
	return nil
}

// readTampered reads a file of an image whose registry serves a corrupted chunk: the read
// fails with EIO, nothing wrong is returned.
func readTampered(ctx context.Context, out io.Writer, reg *demo.Registry, s *stack, mnt string) error {
	tampered, err := tamperedImage(reg)
	if err != nil {
		return err
	}
	ref := reg.Host + "/demo/app:tampered"
	if _, err := reg.Push(ctx, "demo/app:tampered", []demo.LayerBlob{tampered.layer}); err != nil {
		return err
	}
	_, err = os.ReadFile(filepath.Join(mnt, base64.StdEncoding.EncodeToString([]byte(ref)), tampered.key.String(), "diff", "usr/bin/secret"))
	if err == nil {
		return errors.New("a tampered chunk was served")
	}
	fmt.Fprintf(out, "\nregistry serving a flipped byte in usr/bin/secret: the read failed (%v)\n", err)
	fmt.Fprintf(out, "verification failures counted: %d\n", s.manager.Status().Counters.VerifyFailures)
	return nil
}

func since(t time.Time) time.Duration { return time.Since(t).Round(time.Millisecond) }

func layerStatus(m *layer.Manager, l demo.LayerBlob) protocol.LayerStatus {
	d := l.Digest()
	for _, st := range m.Status().Layers {
		if st.Digest == d.String() {
			return st
		}
	}
	return protocol.LayerStatus{}
}

// waitLocal waits for the background fetch of a layer and returns how long it took.
func waitLocal(ctx context.Context, m *layer.Manager, l demo.LayerBlob) (time.Duration, error) {
	deadline := time.Now().Add(2 * time.Minute)
	for time.Now().Before(deadline) {
		st := layerStatus(m, l)
		switch st.State {
		case protocol.StateComplete:
			return time.Duration(st.Seconds * float64(time.Second)), nil
		case protocol.StateFailed:
			return 0, fmt.Errorf("background fetch failed: %s", st.Error)
		}
		select {
		case <-ctx.Done():
			return 0, ctx.Err()
		case <-time.After(10 * time.Millisecond):
		}
	}
	return 0, errors.New("background fetch did not finish in 2 minutes")
}

// demoImages builds the sample layer in each lazy format, plus a plain gzip one. It returns
// the size of the bulk content added to the reference layer.
func demoImages() ([]demoImage, int64, error) {
	tarBlob, bulk := demoTar()
	var images []demoImage
	for _, v := range []struct {
		tag  string
		opts []estargz.Option
	}{
		{"estargz", nil},
		{"estargz-prioritized", []estargz.Option{estargz.WithPrioritizedFiles(demoFiles)}},
	} {
		l, err := demo.EStargz(tarBlob, v.opts...)
		if err != nil {
			return nil, 0, fmt.Errorf("%s: %w", v.tag, err)
		}
		images = append(images, demoImage{tag: v.tag, layer: l, key: digest.Digest(l.Annotations[chunked.AnnotationStargzTOCDigest]), lazy: true})
	}
	// zstd:chunked as c/storage writes it (the reference layer only).
	zc, err := demo.ZstdChunked()
	if err != nil {
		return nil, 0, err
	}
	images = append(images, demoImage{tag: "zstdchunked", layer: zc, key: digest.Digest(zc.Annotations[chunked.AnnotationChecksum]), lazy: true})
	gz, err := demo.Gzip(tarBlob)
	if err != nil {
		return nil, 0, err
	}
	images = append(images, demoImage{tag: "gzip", layer: gz, key: gz.Digest()})
	return images, bulk, nil
}

// tamperedImage is a layer of one file whose bytes the registry corrupts when serving it.
func tamperedImage(reg *demo.Registry) (demoImage, error) {
	b := make([]byte, 1<<20)
	rand.NewChaCha8([32]byte{'t'}).Read(b)
	tarBlob := demo.BuildTar([]demo.Entry{{Header: tar.Header{Typeflag: tar.TypeReg, Name: "usr/bin/secret",
		Mode: 0o755, Size: int64(len(b)), ModTime: demo.Epoch}, Data: b}})
	l, err := demo.EStargz(tarBlob)
	if err != nil {
		return demoImage{}, fmt.Errorf("tampered: %w", err)
	}
	reg.Tamper(l.Digest(), int64(len(b)/2)) // inside the file's data, before the TOC
	return demoImage{tag: "tampered", layer: l, key: digest.Digest(l.Annotations[chunked.AnnotationStargzTOCDigest]), lazy: true}, nil
}

// demoTar is the reference layer with "shared libraries" appended: incompressible files
// that a workload reading three small files never touches.
func demoTar() ([]byte, int64) {
	var es []demo.Entry
	es = append(es, demo.Entries()...)
	rnd := rand.NewChaCha8([32]byte{'d', 'e', 'm', 'o'})
	var bulk int64
	for i := range 6 {
		b := make([]byte, 4<<20)
		rnd.Read(b)
		bulk += int64(len(b))
		es = append(es, demo.Entry{Header: tar.Header{Typeflag: tar.TypeReg, Name: fmt.Sprintf("usr/lib/libdemo%d.so", i),
			Mode: 0o755, Size: int64(len(b)), ModTime: demo.Epoch}, Data: b})
	}
	return demo.BuildTar(es), bulk
}
