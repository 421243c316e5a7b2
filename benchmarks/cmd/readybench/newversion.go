package main

import (
	"archive/tar"
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/layerstore/layerstore/internal/testutil/dockerregistry"
)

// A new version of an image (the lazy-newversion cells): the same layers, but the top one
// rebuilt with new content at the same paths, pushed to the same repository under the tag
// <format>-v2 (bench/<image>:<format>-v2). The top layer's tar is rewritten entry by entry
// (newVersionTar): every ELF file (programs, shared libraries, objects) gets newVersionELF
// appended, which the loader and the linker ignore, and every text file a newline, but
// Python sources, whose compiled files record the source's size (a changed size would make
// Python compile them again, another workload). Other files (archives, compiled Python,
// data) keep their content. The lower layers are the same blobs as in the first version, as
// when an image is rebuilt on an unchanged base.

// v2Suffix is the tag suffix of the new version of an image in a format.
const v2Suffix = "-v2"

// v2Format is the catalogue key (and tag) of the new version of an image in format f.
func v2Format(f string) string { return f + v2Suffix }

// newVersionELF is appended to every ELF file of the rebuilt layer.
const newVersionELF = "\x00readybench: version 2 of this file\n"

// v2Layer is the name of the rebuilt version of layer l (layers/<l>-v2.tar).
func v2Layer(l string) string { return l + v2Suffix }

// neededV2 is the set of images and formats whose new version the cells pull (with the
// formats those are made from).
func neededV2(cells []cell) needSet {
	need := needSet{}
	for _, c := range cells {
		if c.profile != profileNewVersion {
			continue
		}
		for f := c.format; f != ""; f = madeFrom[f] {
			need[imageFormat{c.image.name, f}] = true
		}
	}
	return need
}

// changeContent returns the new version of a regular file's content at path name, and
// whether it changed (see the comment at the top).
func changeContent(name string, b []byte) ([]byte, bool) {
	if bytes.HasPrefix(b, []byte("\x7fELF")) {
		return append(b, newVersionELF...), true
	}
	if len(b) == 0 || strings.HasSuffix(name, ".py") || bytes.IndexByte(b, 0) >= 0 || !utf8.Valid(b) {
		return b, false
	}
	return append(b, '\n'), true
}

// newVersionTar writes the new version of the layer tar in src to dst (see changeContent)
// and returns what writeLayerTar returns, and how many files changed.
func newVersionTar(dst io.Writer, src io.Reader) (size int64, diffID string, entries, changed int, err error) {
	h := sha256.New()
	cw := &countWriter{w: io.MultiWriter(dst, h)}
	bw := bufio.NewWriterSize(cw, 1<<20)
	tw := tar.NewWriter(bw)
	tr := tar.NewReader(src)
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return 0, "", 0, 0, err
		}
		entries++
		if hdr.Typeflag != tar.TypeReg {
			if err := tw.WriteHeader(hdr); err != nil {
				return 0, "", 0, 0, err
			}
			continue
		}
		b, err := io.ReadAll(tr)
		if err != nil {
			return 0, "", 0, 0, err
		}
		b, ok := changeContent(hdr.Name, b)
		if ok {
			changed++
		}
		hdr.Size = int64(len(b))
		if err := tw.WriteHeader(hdr); err != nil {
			return 0, "", 0, 0, err
		}
		if _, err := tw.Write(b); err != nil {
			return 0, "", 0, 0, err
		}
	}
	if err := tw.Close(); err != nil {
		return 0, "", 0, 0, err
	}
	if err := bw.Flush(); err != nil {
		return 0, "", 0, 0, err
	}
	return cw.n, fmt.Sprintf("sha256:%x", h.Sum(nil)), entries, changed, nil
}

// v2Tar writes layers/<layer>-v2.tar from layers/<layer>.tar, unless done for this tar.
func (c *imageCache) v2Tar(layer string) (layerTar, stamp, int, error) {
	src := c.cat.Layers[layer]
	p := filepath.Join(c.dir, "layers", v2Layer(layer)+".tar")
	key := src.DiffID + " v2 " + fmt.Sprintf("%x", sha256.Sum256([]byte(newVersionELF)))[:16]
	if s, ok := readStamp(p+".json", key); ok {
		if fi, err := os.Stat(p); err == nil && fi.Size() == s.Size {
			return layerTar{Size: s.Size, DiffID: s.Digest, Entries: s.Files}, s, -1, nil
		}
	}
	fmt.Fprintf(os.Stderr, "writing the new version of layer %s\n", layer)
	start := time.Now()
	in, err := os.Open(filepath.Join(c.dir, "layers", layer+".tar"))
	if err != nil {
		return layerTar{}, stamp{}, 0, err
	}
	defer in.Close()
	out, err := os.Create(p)
	if err != nil {
		return layerTar{}, stamp{}, 0, err
	}
	size, diffID, n, changed, err := newVersionTar(out, bufio.NewReaderSize(in, 1<<20))
	if err == nil {
		err = out.Close()
	} else {
		out.Close()
	}
	if err != nil {
		return layerTar{}, stamp{}, 0, err
	}
	s := stamp{Key: key, Seconds: time.Since(start).Seconds(), Built: time.Now(), Size: size, Digest: diffID, Files: n}
	return layerTar{Size: size, DiffID: diffID, Entries: n}, s, changed, writeStamp(p+".json", s)
}

// ensureV2 builds and pushes the new versions in need, after ensure built the first ones
// (whose images, profiles and lower layer blobs it reuses).
func (c *imageCache) ensureV2(ctx context.Context, reg *dockerregistry.Registry, need needSet) error {
	start := time.Now()
	for _, img := range need.images() {
		top := img.layers[len(img.layers)-1]
		t, s, changed, err := c.v2Tar(top)
		if err != nil {
			return fmt.Errorf("new version of layer %s: %w", top, err)
		}
		c.cat.Layers[v2Layer(top)] = t
		what := fmt.Sprintf("layer %s: new version (%s, %d entries", v2Layer(top), mb(t.Size), t.Entries)
		if changed >= 0 {
			what += fmt.Sprintf(", %d files changed", changed)
		}
		c.step(what+")", s, start)
		formats := need.formats(img.name)
		var files []string // the profile, for estargz-prio only: the same as the first version's
		if slices.Contains(formats, fmtEStargzPri) {
			if files, _, err = c.recordProfile(ctx, img); err != nil {
				return err
			}
		}
		for _, f := range formats {
			if f == fmtZstd {
				if err := c.convertZstd(ctx, reg, img, v2Format(fmtGzip), v2Format(fmtZstd), start); err != nil {
					return err
				}
				continue
			}
			var blobs []layerBlob
			for _, l := range img.layers {
				if l == top {
					l = v2Layer(top)
				}
				b, s, err := c.layerBlob(ctx, l, f, img.name, files)
				if err != nil {
					return fmt.Errorf("%s %s %s: %w", img.name, l, f, err)
				}
				c.step(fmt.Sprintf("image %s v2: layer %s as %s (%s)", img.name, l, f, mb(b.Size)), s, start)
				blobs = append(blobs, b)
			}
			p, err := c.push(ctx, reg, img, v2Format(f), blobs)
			if err != nil {
				return fmt.Errorf("pushing %s v2 as %s: %w", img.name, f, err)
			}
			c.cat.Images[img.name][v2Format(f)] = p
		}
		if err := c.writeCatalogue(); err != nil {
			return err
		}
	}
	return nil
}
