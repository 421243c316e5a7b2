package layer

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	iofs "io/fs"
	"slices"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/layerstore/layerstore/cache"
	"github.com/layerstore/layerstore/chunked"
	"github.com/layerstore/layerstore/fetcher"
	"github.com/layerstore/layerstore/internal/control/protocol"
)

// pinMeta is what a pin's record holds (its data is empty): the pin without its progress.
type pinMeta struct {
	Version int `json:"version"`
	protocol.Pin
}

// pinName is the name of the pin of ref for platform, in the cache and as a record.
func pinName(ref, platform string) string {
	s := sha256.Sum256([]byte(ref + "\x00" + platform))
	return "pin-" + hex.EncodeToString(s[:])
}

// Pin resolves every lazily served layer of ref (of the host's platform, or of platform,
// "os/arch[/variant]"), checks that the cache's filesystem has room for what is not local
// yet, keeps the layers' records and files out of eviction, and fetches and verifies them
// completely. It returns when they are all local, or with the error that stopped it; the pin
// holds either way (pin again to finish, Unpin to give it up). Pinning an image again is
// cheap once it is complete.
func (m *Manager) Pin(ctx context.Context, ref, platform string) (protocol.Pin, error) {
	p := protocol.Pin{Ref: ref, Platform: platform, Pinned: time.Now().UTC()}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	defer context.AfterFunc(m.life.ctx, cancel)() // Close stops a pin
	img, err := m.reg.Resolve(ctx, ref)
	if err != nil {
		return p, fmt.Errorf("pin %s: %w", ref, err)
	}
	mf, err := m.platformManifest(ctx, img, platform)
	if err != nil {
		return p, fmt.Errorf("pin %s: %w", ref, err)
	}
	var layers []*Served
	for i := range mf.Layers {
		d := &mf.Layers[i]
		key := tocKey(d.Annotations)
		if key == "" {
			key = d.Digest
		}
		l, err := m.Lookup(ctx, ref, key)
		if errors.Is(err, iofs.ErrNotExist) {
			p.Normal++
			continue
		}
		if err != nil {
			return p, fmt.Errorf("pin %s: layer %s: %w", ref, d.Digest, err)
		}
		if !slices.Contains(layers, l) {
			layers = append(layers, l)
			p.Layers = append(p.Layers, l.desc.Digest.String())
		}
	}
	records, files, total, need := m.pinContent(layers)
	p.Bytes = total
	avail, err := m.cache.Available()
	if err != nil {
		return p, fmt.Errorf("pin %s: %w", ref, err)
	}
	if need > avail {
		return p, fmt.Errorf("pin %s: its layers need %d MiB more on the cache's filesystem, which has %d MiB free: %w",
			ref, (need+1<<20-1)>>20, avail>>20, cache.ErrNoSpace)
	}
	name := pinName(ref, platform)
	raw, err := json.Marshal(pinMeta{Version: recordVersion, Pin: p})
	if err != nil {
		return p, err
	}
	// Pinned first, so that nothing it names is evicted from here on, written after.
	if err := m.cache.Pin(name, append(records, name), files); err != nil {
		return p, fmt.Errorf("pin %s: %w", ref, err)
	}
	if err := m.cache.PutRecord(name, raw); err != nil {
		return p, fmt.Errorf("pin %s: %w", ref, err)
	}
	m.pinErrs.set(name, "")
	for _, l := range layers {
		// A layer whose record is gone (evicted, or never written: the filesystem was full) gets
		// its record now: a pin keeps records and content.
		if _, err := m.cache.RecordMeta(recordName(l.id)); err != nil {
			if err := l.writeRecord(); err != nil {
				return p, fmt.Errorf("pin %s: layer %s: writing its record: %w", ref, l.desc.Digest, err)
			}
		}
	}
	m.opts.log.Info("image pinned", "ref", ref, "platform", platform, "layers", len(layers),
		"pulled_normally", p.Normal, "to_fetch", need)
	for _, l := range layers {
		// A background fetch already running goes on: the pin waits for it, then fetches
		// what is still missing itself.
		if err := l.waitPrefetch(ctx); err != nil {
			return m.pinProgress(p), fmt.Errorf("pin %s: %w", ref, err)
		}
		if err := l.runPrefetch(ctx); err != nil {
			return m.pinProgress(p), fmt.Errorf("pin %s: fetching layer %s: %w", ref, l.desc.Digest, err)
		}
	}
	return m.pinProgress(p), nil
}

// Unpin gives up the pin of ref for platform: its layers' records and files become evictable
// again. Unpinning an image that is not pinned is not an error.
func (m *Manager) Unpin(ref, platform string) error {
	name := pinName(ref, platform)
	if err := m.cache.Unpin(name); err != nil && !errors.Is(err, iofs.ErrNotExist) {
		return fmt.Errorf("unpin %s: %w", ref, err)
	}
	if err := m.cache.RemoveRecord(name); err != nil && !errors.Is(err, iofs.ErrNotExist) {
		return fmt.Errorf("unpin %s: %w", ref, err)
	}
	m.opts.log.Info("image unpinned", "ref", ref, "platform", platform)
	return nil
}

// Pins returns the pinned images and how much of each is local.
func (m *Manager) Pins() []protocol.Pin {
	infos, err := m.cache.Pins()
	if err != nil {
		m.opts.log.Warn("listing pins failed", "err", err)
		return nil
	}
	var out []protocol.Pin
	for _, in := range infos {
		raw, err := m.cache.RecordMeta(in.Name)
		var pm pinMeta
		if err == nil {
			err = json.Unmarshal(raw, &pm)
		}
		if err != nil {
			continue // not a pin this package made
		}
		p := pm.Pin
		p.Present = in.Bytes
		p.Error = m.pinErrs.get(in.Name)
		if gone := len(in.Records) - in.RecordsPresent; gone > 0 && p.Error == "" {
			p.Error = fmt.Sprintf("%d of its %d records gone: pin the image again", gone, len(in.Records))
		}
		out = append(out, p)
	}
	slices.SortFunc(out, func(a, b protocol.Pin) int { return strings.Compare(a.Ref+a.Platform, b.Ref+b.Platform) })
	return out
}

func (m *Manager) pinProgress(p protocol.Pin) protocol.Pin {
	for _, q := range m.Pins() {
		if q.Ref == p.Ref && q.Platform == p.Platform {
			return q
		}
	}
	return p
}

// pinContent returns what keeps the layers local: their records, the digests of their
// regular files, the bytes of those files, and the bytes the cache does not hold yet.
func (m *Manager) pinContent(layers []*Served) (records []string, files []chunked.Sum, total, need int64) {
	seen := map[chunked.Sum]bool{}
	for _, l := range layers {
		records = append(records, recordName(l.id))
		for d, size := range l.contentFiles(seen) {
			files = append(files, d)
			total += size
			if !m.cache.Has(d) {
				need += size // partial files counted whole: the check errs on the safe side
			}
		}
	}
	return records, files, total, need
}

// platformManifest returns img's manifest for platform ("" for the host's).
func (m *Manager) platformManifest(ctx context.Context, img *fetcher.Image, platform string) (*fetcher.Manifest, error) {
	if platform == "" {
		return &img.Manifest, nil
	}
	want, err := v1.ParsePlatform(platform)
	if err != nil {
		return nil, fmt.Errorf("platform %q: %w", platform, err)
	}
	all := []*fetcher.Manifest{&img.Manifest}
	others, err := m.reg.Platforms(ctx, img)
	if err != nil {
		return nil, err
	}
	for _, mf := range append(all, others...) {
		if mf.Platform != nil && mf.Platform.Satisfies(*want) {
			return mf, nil
		}
	}
	if img.Manifest.Platform == nil && len(others) == 0 {
		return &img.Manifest, nil // a single-platform image: its platform is not stated
	}
	return nil, fmt.Errorf("no manifest for platform %s", platform)
}
