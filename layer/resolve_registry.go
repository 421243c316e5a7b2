package layer

import (
	"context"
	"errors"
	"fmt"
	iofs "io/fs"
	"log/slog"
	"time"

	"github.com/opencontainers/go-digest"

	"github.com/layerstore/layerstore/cache"
	"github.com/layerstore/layerstore/chunked"
	"github.com/layerstore/layerstore/fetcher"
	"github.com/layerstore/layerstore/verify"
)

// resolve finds key in the image ref and opens the layer: from its record when one was
// written for ref's repository, otherwise through the registry; it says which answered.
func (m *Manager) resolve(ctx context.Context, ref string, key digest.Digest, ahead bool) (*Served, lookupSource, error) {
	start := m.opts.now()
	m.counters.resolutions.Add(1)
	if err := key.Validate(); err != nil {
		return nil, sourceRegistry, fmt.Errorf("layer key %q: %w", key, iofs.ErrNotExist)
	}
	if l, err, ok := m.resolveFromRecord(ctx, ref, key, start); ok {
		return l, sourceRecord, err
	}
	l, err := m.resolveThroughRegistry(ctx, ref, key, start, ahead)
	return l, sourceRegistry, err
}

// resolveThroughRegistry finds key in the image ref through the registry and opens the layer:
// the live layer of its identity when there is one, else a new one, verified and recorded.
func (m *Manager) resolveThroughRegistry(ctx context.Context, ref string, key digest.Digest, start time.Time, ahead bool) (*Served, error) {
	img, err := m.resolveImage(ctx, ref)
	if err != nil {
		return nil, err
	}
	desc, modern, err := m.find(ctx, img, key)
	if err != nil {
		return nil, err
	}
	if !ahead {
		m.resolveAhead(ref, img, key, modern)
		m.noteStart(ref, img, key)
	}
	log := m.opts.log.With("ref", ref, "layer", desc.Digest)
	id, err := m.servedIdentity(desc, modern, ref, log)
	if err != nil {
		return nil, err
	}
	if l := m.liveLayer(id); l != nil {
		return m.shareLive(ctx, l, img, desc, modern, ref, log)
	}
	blob, v, err := m.openVerified(ctx, img, desc, modern, id.layout.Format, log)
	if err != nil {
		return nil, err
	}
	v, rec, from := m.writeRecord(ctx, desc, v, ref, log)
	l := newLayer(&m.env, id, ref, *desc, v, blob)
	l.rec = rec
	if err := m.unsized(l, modern, ref); err != nil {
		return nil, err
	}
	if l, err = m.addLiveReady(ctx, l, modern, ref); err != nil {
		return nil, err
	}
	m.logServed(log, from, l.tocKey, desc, v, start)
	return l, nil
}

// resolveImage resolves ref's manifest through the registry; an image the registry does not
// have is not served here (io/fs.ErrNotExist).
func (m *Manager) resolveImage(ctx context.Context, ref string) (*fetcher.Image, error) {
	img, err := m.reg.Resolve(ctx, ref)
	if err != nil {
		m.counters.failures.Add(1)
		m.opts.log.Warn("resolving image failed", "ref", ref, "err", err)
		if errors.Is(err, fetcher.ErrNotFound) {
			return nil, fmt.Errorf("%s: %w", err, iofs.ErrNotExist)
		}
		return nil, err
	}
	return img, nil
}

// servedIdentity returns the identity of the layer desc, when it is served lazily: of a lazily
// pullable format (zstd:chunked under the DiffID policy), with a DiffID when looked up by blob
// digest, and not refused before.
func (m *Manager) servedIdentity(desc *fetcher.ImageLayer, modern bool, ref string, log *slog.Logger) (identity, error) {
	layout, err := chunked.Classify(desc.Descriptor)
	if err == nil {
		err = m.diffIDPolicy(layout.Format)
	}
	if err != nil {
		m.counters.notLazy.Add(1)
		log.Info("layer not served lazily", "reason", err)
		return identity{}, fmt.Errorf("layer %s of %s: %w (%w)", desc.Digest, ref, iofs.ErrNotExist, err)
	}
	if !modern && desc.DiffID == "" {
		return identity{}, fmt.Errorf("layer %s of %s has no DiffID: %w", desc.Digest, ref, iofs.ErrNotExist)
	}
	id := identity{layout: *layout, diffID: desc.DiffID}
	if err := m.refusals.err(id); err != nil {
		return identity{}, err // its TOC and tar-split disagree: refused before, refused again
	}
	return id, nil
}

// diffIDPolicy refuses the formats the DiffID policy (Config.RequireDiffID) does not serve.
func (m *Manager) diffIDPolicy(f chunked.Format) error {
	if m.opts.requireDiffID && f != chunked.ZstdChunked {
		return fmt.Errorf("%w: the DiffID policy requires zstd:chunked with a tar-split", chunked.ErrNotLazy)
	}
	return nil
}

// shareLive answers a lookup with l, the live layer of the identity it found, once l is ready
// for it.
func (m *Manager) shareLive(ctx context.Context, l *Served, img *fetcher.Image, desc *fetcher.ImageLayer, modern bool, ref string, log *slog.Logger) (*Served, error) {
	if err := m.ready(ctx, l, modern, ref); err != nil {
		return nil, err
	}
	if !l.hasRepo(repository(ref)) {
		// Verified through another repository, perhaps with credentials this one does
		// not have: the blob must be readable here too, as a pull would need.
		if err := m.probe(ctx, img, desc); err != nil {
			m.counters.failures.Add(1)
			log.Warn("layer not readable through this repository", "err", err)
			return nil, err
		}
	}
	l.addRef(ref)
	return l, nil
}

// openVerified opens the blob of desc and verifies its TOC against the manifest; a lookup
// that waits for the comparison has the tar-split read with the TOC and compared at once,
// others have it read by the comparison, in the background.
func (m *Manager) openVerified(ctx context.Context, img *fetcher.Image, desc *fetcher.ImageLayer, modern bool, format chunked.Format, log *slog.Logger) (RemoteBlob, *verify.Verifier, error) {
	blob, err := m.reg.Blob(ctx, img, desc)
	if err != nil {
		m.counters.failures.Add(1)
		return nil, nil, err
	}
	now := waitsForTarSplit(modern, m.opts.requireDiffID)
	v, err := verify.Open(ctx, desc.Descriptor, desc.DiffID, blob, verify.Config{TarSplit: now})
	if err == nil && now {
		err = v.CheckTarSplit(ctx, blob) // before the record is written, which then holds the size
	}
	if err != nil {
		m.counters.failures.Add(1)
		if errors.Is(err, verify.ErrDigestMismatch) || errors.Is(err, chunked.ErrInvalid) {
			m.counters.verifyFailures.Add(1)
		}
		if fetchFailed(err) {
			log.Warn("fetching the layer's TOC failed", "format", format, "err", err)
		} else {
			log.Warn("layer refused", "format", format, "err", err)
		}
		return nil, nil, err
	}
	return blob, v, nil
}

// writeRecord writes the verified layer to its record, to be served from it: the index is
// mapped from the record instead of living on the heap, and the next start needs no registry.
// The record is made durable in the background. It returns the verifier to serve (v itself
// when the record could not be written) and the record, and says where the layer came from.
func (m *Manager) writeRecord(ctx context.Context, desc *fetcher.ImageLayer, v *verify.Verifier, ref string, log *slog.Logger) (*verify.Verifier, *cache.Record, string) {
	rv, rec, store, err := m.records.write(*desc, v, []string{repository(ref)}, []string{ref})
	if store != nil {
		m.life.goTracked(func() {
			if err := store(); err != nil {
				log.Log(m.life.ctx, noSpaceLevel(err), "storing the layer record failed: a restart needs the registry", "err", err)
			}
		})
	}
	if err != nil {
		// A full cache filesystem is the cache's to report (at a bounded rate): one warning
		// per cause.
		log.Log(ctx, noSpaceLevel(err), "writing the layer record failed: the layer is served, but from memory, and a restart needs the registry", "err", err)
		return v, rec, "registry"
	}
	m.life.goTracked(m.releaseMemory) // the TOC, its parse and the index built on the heap
	return rv, rec, "registry, recorded"
}

// logServed logs a resolution that serves the layer desc, verified by v: from where it came,
// and in how long.
func (m *Manager) logServed(log *slog.Logger, from string, toc digest.Digest, desc *fetcher.ImageLayer, v *verify.Verifier, start time.Time) {
	log.Info("layer served lazily", "from", from, "format", v.Layout().Format, "toc", toc,
		"entries", v.Index().Len(), "size", desc.Size, "guarantee", v.Guarantee(),
		"resolve", m.opts.now().Sub(start).Round(time.Millisecond))
}

// noSpaceLevel is the level of a failure to write to the cache: info for a full cache
// filesystem, which the cache reports itself, warning otherwise.
func noSpaceLevel(err error) slog.Level {
	if errors.Is(err, cache.ErrNoSpace) {
		return slog.LevelInfo
	}
	return slog.LevelWarn
}

// find returns the descriptor of the layer key names in img, looking through the other
// platforms of an index when the host's manifest does not have it, and whether key is the
// TOC digest (a modern runtime's lookup) rather than the blob digest.
func (m *Manager) find(ctx context.Context, img *fetcher.Image, key digest.Digest) (*fetcher.ImageLayer, bool, error) {
	if d, modern := findIn(&img.Manifest, key); d != nil {
		return d, modern, nil
	}
	others, err := m.reg.Platforms(ctx, img)
	if err != nil {
		return nil, false, err
	}
	for _, mf := range others {
		if d, modern := findIn(mf, key); d != nil {
			return d, modern, nil
		}
	}
	return nil, false, fmt.Errorf("no layer %s in %s: %w", key, img.Ref, iofs.ErrNotExist)
}

func findIn(mf *fetcher.Manifest, key digest.Digest) (*fetcher.ImageLayer, bool) {
	for i := range mf.Layers {
		l := &mf.Layers[i]
		if tocKey(l.Annotations) == key {
			return l, true
		}
		if l.Digest == key {
			return l, false
		}
	}
	return nil, false
}

// probe checks that the blob of desc can be read through img's sources (its last byte): what
// a layer verified through another repository needs before it is served for this one.
// Registries answer a blob only to those who may pull it from the repository asked.
func (m *Manager) probe(ctx context.Context, img *fetcher.Image, desc *fetcher.ImageLayer) error {
	blob, err := m.reg.Blob(ctx, img, desc)
	if err == nil {
		var b [1]byte
		_, err = blob.ReadAt(ctx, b[:], desc.Size-1)
	}
	if err == nil {
		return nil
	}
	if errors.Is(err, fetcher.ErrNotFound) {
		return fmt.Errorf("blob %s of %s: %w (%w)", desc.Digest, img.Ref, iofs.ErrNotExist, err)
	}
	return fmt.Errorf("blob %s of %s: %w", desc.Digest, img.Ref, err)
}

// fetchFailed reports whether err is the registry's or the network's (a request that failed,
// the lookup's time running out), not a verdict on the layer's content.
func fetchFailed(err error) bool {
	var fe *fetcher.Error
	return errors.As(err, &fe) || errors.Is(err, fetcher.ErrTransient) || errors.Is(err, fetcher.ErrNotFound) ||
		errors.Is(err, fetcher.ErrUnauthorized) || errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled)
}
