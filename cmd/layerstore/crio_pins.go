package main

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/layerstore/layerstore/internal/control/protocol"
)

// CRI-O pins images with pinned_images ([crio.image] in its configuration): the kubelet never
// collects them. The pin-and-preload enhancement writes that list after pulling the images
// through CRI-O, so that a node starts them with no registry; with lazy pulling that pull
// fetched almost nothing, so the daemon pins them too (layerstore pin: fetched completely,
// verified, kept out of eviction, with its disk check), as the configuration says now: it is
// read again every crioPinInterval, since CRI-O is reloaded after the file is written.

// crioPinInterval is how often CRI-O's configuration is read again for its pinned images.
const crioPinInterval = 10 * time.Second

// crioPinRetry is how long a pin that failed waits before it is tried again.
const crioPinRetry = time.Minute

// pinner is what the CRI-O pins need of the layer manager.
type pinner interface {
	Pin(ctx context.Context, ref, platform string) (protocol.Pin, error)
	Status() protocol.Status
}

// crioPins pins the images CRI-O's configuration pins.
type crioPins struct {
	m     pinner
	paths crioPaths
	log   *slog.Logger

	mu       sync.Mutex
	inFlight map[string]bool
	failed   map[string]time.Time // when a pin last failed
}

func newCrioPins(m pinner, paths crioPaths, log *slog.Logger) *crioPins {
	return &crioPins{m: m, paths: paths, log: log, inFlight: map[string]bool{}, failed: map[string]time.Time{}}
}

// run pins what CRI-O's configuration pins, now and whenever it changes, until ctx is done.
func (p *crioPins) run(ctx context.Context) {
	t := time.NewTicker(crioPinInterval)
	defer t.Stop()
	for {
		p.pass(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// pass starts a pin of each image CRI-O pins that is not pinned, being pinned, or failed
// within crioPinRetry.
func (p *crioPins) pass(ctx context.Context) {
	c, ok := p.paths.read()
	if !ok || len(c.Crio.Image.PinnedImages) == 0 {
		return
	}
	pinned := map[string]bool{}
	for _, pin := range p.m.Status().Pins {
		if pin.Platform == "" {
			pinned[pin.Ref] = true
		}
	}
	root := or(c.Crio.Root, defaultGraphRoot)
	for _, ref := range crioPinnedRefs(c.Crio.Image.PinnedImages, crioImageNames(root)) {
		p.mu.Lock()
		skip := pinned[ref] || p.inFlight[ref] || time.Since(p.failed[ref]) < crioPinRetry
		if !skip {
			p.inFlight[ref] = true
		}
		p.mu.Unlock()
		if !skip {
			go p.pin(ctx, ref)
		}
	}
}

func (p *crioPins) pin(ctx context.Context, ref string) {
	p.log.Info("pinning an image CRI-O's configuration pins (pinned_images)", "ref", ref)
	pin, err := p.m.Pin(ctx, ref, "")
	p.mu.Lock()
	delete(p.inFlight, ref)
	if err != nil {
		p.failed[ref] = time.Now()
	} else {
		delete(p.failed, ref)
	}
	p.mu.Unlock()
	if err != nil {
		if ctx.Err() == nil {
			p.log.Warn("pinning an image CRI-O's configuration pins failed: tried again in a minute", "ref", ref, "err", err)
		}
		return
	}
	p.log.Info("pinned an image CRI-O's configuration pins", "ref", ref, "layers", len(pin.Layers), "bytes", pin.Bytes)
}

// crioPinnedRefs are the references to pin for CRI-O's pinned_images patterns, as CRI-O reads
// them: an exact name is pinned as it is (pulled or not: pre-loading); a glob (a trailing *)
// and a keyword (* at both ends) pin the images of CRI-O's storage whose names match.
func crioPinnedRefs(patterns, names []string) []string {
	var refs []string
	add := func(r string) {
		if !slices.Contains(refs, r) {
			refs = append(refs, r)
		}
	}
	for _, pat := range patterns {
		switch {
		case pat == "" || pat == "*" || pat == "**":
			continue // every image: not what pinning all of a node's images through the store means
		case strings.HasPrefix(pat, "*") && strings.HasSuffix(pat, "*"):
			for _, n := range names {
				if strings.Contains(n, strings.Trim(pat, "*")) {
					add(n)
				}
			}
		case strings.HasSuffix(pat, "*"):
			for _, n := range names {
				if strings.HasPrefix(n, strings.TrimSuffix(pat, "*")) {
					add(n)
				}
			}
		case !strings.Contains(pat, "*"):
			add(pat)
		}
	}
	return refs
}

// crioImageNames are the names of the images in CRI-O's storage at root.
func crioImageNames(root string) []string {
	var images []storageImage
	if err := readJSONFile(filepath.Join(root, "overlay-images", "images.json"), &images); err != nil {
		return nil
	}
	var names []string
	for _, img := range images {
		names = append(names, img.Names...)
	}
	return names
}

// startCrioPins pins the images CRI-O's configuration pins, where CRI-O's configuration is
// (as root: CRI-O runs as root), until ctx is done.
func startCrioPins(ctx context.Context, cfg *Config, m pinner, log *slog.Logger) {
	paths := crioPathsOf(cfg)
	if os.Geteuid() != 0 {
		return
	}
	go newCrioPins(m, paths, log).run(ctx)
}
