package main

import (
	"context"
	"fmt"

	"github.com/layerstore/layerstore/internal/testutil/testregistry"
)

// benchCase is one measurement, run -runs times.
type benchCase struct {
	name  string
	what  string                 // for the report
	prep  func() error           // builds and pushes what the case needs
	run   func() (sample, error) // one run on a fresh daemon
	large *builtLayer            // the layer of a large-layer case, once prepared
}

// Shapes of the small layers.
const (
	manyLayerEntries = 300 // entries of each layer of the many-layer image
	imageEntries     = 200 // entries of the layer of each of the many images
)

// planner builds and pushes layers and images once, for every case that needs them.
type planner struct {
	ctx    context.Context
	b      *bench
	bl     *builder
	rep    *report
	layers map[string]*builtLayer
	pushed map[string]bool
}

// layer builds (or loads) the layer of s in format, once.
func (p *planner) layer(s treeSpec, format string) (*builtLayer, error) {
	k := s.key(format)
	if l := p.layers[k]; l != nil {
		return l, nil
	}
	l, err := p.bl.build(p.ctx, s, format)
	if err != nil {
		return nil, err
	}
	p.rep.addLayer(l)
	p.layers[k] = l
	return l, nil
}

// push pushes an image of layers as repoTag, once.
func (p *planner) push(repoTag string, layers []*builtLayer) error {
	if p.pushed[repoTag] {
		return nil
	}
	var rl []testregistry.LayerBlob
	for _, l := range layers {
		rl = append(rl, l.registryLayer())
	}
	if _, err := p.b.reg.Push(p.ctx, repoTag, rl); err != nil {
		return fmt.Errorf("pushing %s: %w", repoTag, err)
	}
	p.pushed[repoTag] = true
	return nil
}

// large is the large layer of n entries in format, pushed alone as an image.
func (p *planner) large(n int, format string) (string, *builtLayer, error) {
	logf("layer of %d entries (%s): building or loading", n, format)
	l, err := p.layer(treeSpec{Name: "tree" + count(n), Entries: n, Seed: uint64(n)}, format)
	if err != nil {
		return "", nil, err
	}
	repoTag := fmt.Sprintf("scale/%s-%s:latest", formatName(format), count(n))
	return repoTag, l, p.push(repoTag, []*builtLayer{l})
}

// manyLayers is the image of o.layers layers.
func (p *planner) manyLayers() ([]image, error) {
	img := image{repoTag: fmt.Sprintf("scale/layers%d:latest", p.b.opts.layers)}
	logf("image of %d layers of %d entries: building or loading", p.b.opts.layers, manyLayerEntries)
	for i := range p.b.opts.layers {
		l, err := p.layer(treeSpec{Name: fmt.Sprintf("layer%02d", i), Entries: manyLayerEntries, Seed: 1000 + uint64(i)}, formatEStargz)
		if err != nil {
			return nil, err
		}
		img.layers = append(img.layers, l)
	}
	return []image{img}, p.push(img.repoTag, img.layers)
}

// manyImages are o.images images of one layer each, each under its own repository.
func (p *planner) manyImages() ([]image, error) {
	var imgs []image
	logf("%d images of one layer of %d entries: building or loading", p.b.opts.images, imageEntries)
	for i := range p.b.opts.images {
		l, err := p.layer(treeSpec{Name: fmt.Sprintf("image%03d", i), Entries: imageEntries, Seed: 2000 + uint64(i)}, formatEStargz)
		if err != nil {
			return nil, err
		}
		img := image{repoTag: fmt.Sprintf("scale/app%03d:v1", i), layers: []*builtLayer{l}}
		if err := p.push(img.repoTag, img.layers); err != nil {
			return nil, err
		}
		imgs = append(imgs, img)
	}
	return imgs, nil
}

// The anchor image: about 690 MB of incompressible content in two layers, many medium files
// and one large file.
const (
	anchorRepo       = "scale/anchor:latest"
	anchorFiles      = 2000
	anchorFilesBytes = 2000 * 206 << 10
	anchorBigBytes   = 256 << 20
)

// anchor is the anchor image, pushed.
func (p *planner) anchor() ([]*builtLayer, error) {
	logf("anchor image: building or loading")
	var ls []*builtLayer
	for i, s := range []treeSpec{
		{Name: "anchorfiles", Entries: anchorFiles, Seed: 3000, Random: anchorFilesBytes},
		{Name: "anchorbig", Entries: 1, Seed: 3001, Random: anchorBigBytes},
	} {
		l, err := p.layer(s, formatEStargz)
		if err != nil {
			return nil, fmt.Errorf("anchor layer %d: %w", i, err)
		}
		ls = append(ls, l)
	}
	return ls, p.push(anchorRepo, ls)
}

// combined describes several layers as one, for the report: their entries and sizes summed.
func combined(name string, ls []*builtLayer) *builtLayer {
	c := &builtLayer{Name: name, Format: ls[0].Format}
	for _, l := range ls {
		c.Entries += l.Entries
		c.TarSize += l.TarSize
		c.Size += l.Size
	}
	return c
}

func formatName(format string) string {
	if format == formatZstdChunked {
		return "zstdchunked"
	}
	return format
}

// cases lists every case in the order they run.
func (b *bench) cases(ctx context.Context, bl *builder, rep *report) []*benchCase {
	o := b.opts
	p := &planner{ctx: ctx, b: b, bl: bl, rep: rep, layers: map[string]*builtLayer{}, pushed: map[string]bool{}}
	cs := []*benchCase{{name: "idle", what: "the daemon started and mounted, nothing resolved; time: start until the mount answers; CPU: all it used until the reading",
		run: func() (sample, error) { return b.caseIdle(ctx) }}}
	for _, n := range o.entries {
		for _, format := range []string{formatEStargz, formatZstdChunked} {
			c := &benchCase{name: formatName(format) + "-" + count(n),
				what: fmt.Sprintf("one %s layer of %d entries; time: first stat of diff (resolution) + open and readdir of its root", format, n)}
			var repoTag string
			c.prep = func() (err error) {
				repoTag, c.large, err = p.large(n, format)
				return err
			}
			c.run = func() (sample, error) { return b.caseLarge(ctx, repoTag, c.large, false) }
			cs = append(cs, c)
		}
	}
	var many []image
	prepMany := func() (err error) {
		if many == nil {
			many, err = p.manyLayers()
		}
		return err
	}
	cs = append(cs,
		&benchCase{name: fmt.Sprintf("layers%d-seq", o.layers), prep: prepMany,
			what: fmt.Sprintf("one image of %d eStargz layers of %d entries, each looked up as a runtime does (stat diff, info, blob; read info), one after the other; time: all of them", o.layers, manyLayerEntries),
			run:  func() (sample, error) { return b.caseLookups(ctx, many, false) }},
		&benchCase{name: fmt.Sprintf("layers%d-conc", o.layers), prep: prepMany,
			what: fmt.Sprintf("the same %d layers looked up all at once (%d goroutines)", o.layers, o.layers),
			run:  func() (sample, error) { return b.caseLookups(ctx, many, true) }})
	var imgs []image
	cs = append(cs, &benchCase{name: fmt.Sprintf("images%d", o.images),
		what: fmt.Sprintf("%d images (distinct references) of one eStargz layer of %d entries each, looked up one after the other; time: all of them", o.images, imageEntries),
		prep: func() (err error) { imgs, err = p.manyImages(); return err },
		run:  func() (sample, error) { return b.caseLookups(ctx, imgs, false) }})
	fc := &benchCase{name: "fetch-" + count(o.entries[0]),
		what: fmt.Sprintf("the %d-entry eStargz layer made fully local by the background fetch (prefetch on); time: first stat of diff until the control socket reports it complete", o.entries[0])}
	var fetchRepo string
	fc.prep = func() (err error) {
		fetchRepo, fc.large, err = p.large(o.entries[0], formatEStargz)
		return err
	}
	fc.run = func() (sample, error) { return b.caseLarge(ctx, fetchRepo, fc.large, true) }
	ac := &benchCase{name: "fetch-anchor",
		what: fmt.Sprintf("the anchor image (stargz-store's memory figure): two eStargz layers, %d files of random bytes (%s in all) and one file of %s, made fully local by the background fetch (prefetch on); time: the first stat of both diffs until the control socket reports both complete; memory %v after",
			anchorFiles, mib(anchorFilesBytes), mib(anchorBigBytes), o.settle)}
	var anchor []*builtLayer
	ac.prep = func() (err error) {
		anchor, err = p.anchor()
		if err == nil {
			ac.large = combined("anchor", anchor)
		}
		return err
	}
	ac.run = func() (sample, error) { return b.caseFetchImage(ctx, anchorRepo, anchor) }
	return append(cs, fc, ac)
}
