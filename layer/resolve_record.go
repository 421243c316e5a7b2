package layer

import (
	"bytes"
	"context"
	"fmt"
	"io"
	iofs "io/fs"
	"sync"
	"time"

	"github.com/opencontainers/go-digest"

	"github.com/layerstore/layerstore/fetcher"
	"github.com/layerstore/layerstore/internal/byterange"
	"github.com/layerstore/layerstore/verify"
)

// resolveFromRecord answers a lookup from the record of a layer resolved before through ref's
// repository, without the registry. It reports false when no record answers the lookup (or
// the record turned out damaged: it is then dropped and the registry asked).
func (m *Manager) resolveFromRecord(ctx context.Context, ref string, key digest.Digest, start time.Time) (*Served, error, bool) {
	rec, ok := m.records.find(key, repository(ref))
	if !ok {
		return nil, nil, false
	}
	modern := key != rec.meta.Descriptor.Digest
	desc := rec.meta.Descriptor
	log := m.opts.log.With("ref", ref, "layer", desc.Digest)
	if err := m.diffIDPolicy(rec.meta.Verified.Layout.Format); err != nil {
		m.counters.notLazy.Add(1)
		return nil, fmt.Errorf("layer %s of %s: %w (%w)", desc.Digest, ref, iofs.ErrNotExist, err), true
	}
	id, err := rec.meta.identity()
	if err != nil {
		return nil, nil, false // checked when indexed: not reached
	}
	if err := m.refusals.err(id); err != nil {
		return nil, err, true
	}
	if l := m.liveLayer(id); l != nil {
		if err := m.ready(ctx, l, modern, ref); err != nil {
			return nil, err, true
		}
		l.addRef(ref)
		return l, nil, true
	}
	meta, v, mapped, err := m.records.open(rec.name)
	if err != nil {
		log.Warn("layer record unusable: resolving through the registry", "record", rec.name, "err", err)
		return nil, nil, false
	}
	blob := &lazyBlob{src: registryBlob{reg: m.reg, ref: ref, desc: desc, life: m.life, timeout: m.opts.resolveTimeout}}
	l := newLayer(&m.env, id, ref, desc, v, blob)
	l.rec = mapped
	l.restoreRefs(meta.Refs, meta.Repositories)
	if err := m.ready(ctx, l, modern, ref); err != nil {
		return nil, err, true
	}
	if l, err = m.addLiveReady(ctx, l, modern, ref); err != nil {
		return nil, err, true
	}
	m.counters.fromRecords.Add(1)
	m.logServed(log, "record", l.tocKey, &desc, v, start)
	return l, nil, true
}

// registryBlob is how a layer opened from its record reaches its blob, when a read first
// needs it: through the registry, for the reference the layer was resolved for, within the
// resolution's bound and the manager's lifetime.
type registryBlob struct {
	reg     Registry
	ref     string
	desc    fetcher.ImageLayer
	life    *lifetime
	timeout time.Duration // Config.ResolveTimeout
}

// open resolves the image's manifest, then the blob's location.
func (r registryBlob) open(ctx context.Context) (RemoteBlob, error) {
	ctx, cancel := r.life.bound(ctx, r.timeout)
	defer cancel()
	img, err := r.reg.Resolve(ctx, r.ref)
	if err != nil {
		return nil, err
	}
	return r.reg.Blob(ctx, img, &r.desc)
}

// lazyBlob is the blob of a layer opened from its record: it asks the registry (the image's
// manifest, then the blob's location) only when a read first needs a byte that is not in the
// cache, and again after a failure, so that a layer whose files are all local never touches
// the registry, and one whose registry is down fails only the reads that need it.
type lazyBlob struct {
	src registryBlob

	mu      sync.Mutex
	attempt *blobAttempt
}

type blobAttempt struct {
	done chan struct{}
	blob RemoteBlob
	err  error
}

func (b *lazyBlob) get(ctx context.Context) (RemoteBlob, error) {
	b.mu.Lock()
	a := b.attempt
	if a != nil {
		select {
		case <-a.done:
			if a.err != nil {
				a = nil // try again
			}
		default:
		}
	}
	if a == nil {
		a = &blobAttempt{done: make(chan struct{})}
		b.attempt = a
		go func() {
			defer close(a.done)
			a.blob, a.err = b.src.open(ctx)
		}()
	}
	b.mu.Unlock()
	select {
	case <-a.done:
		return a.blob, a.err
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

func (b *lazyBlob) ReadAt(ctx context.Context, p []byte, off int64) (int, error) {
	blob, err := b.get(ctx)
	if err != nil {
		return 0, err
	}
	return blob.ReadAt(ctx, p, off)
}

func (b *lazyBlob) Fetch(ctx context.Context, ranges []byterange.Range) ([][]byte, error) {
	blob, err := b.get(ctx)
	if err != nil {
		return nil, err
	}
	return blob.Fetch(ctx, ranges)
}

// Stream streams the ranges from the blob (verify.StreamSource) when it can, as a
// fetcher.Blob does; from another, it reads them whole first.
func (b *lazyBlob) Stream(ctx context.Context, ranges []byterange.Range) ([]io.Reader, func() error, error) {
	blob, err := b.get(ctx)
	if err != nil {
		return nil, nil, err
	}
	if s, ok := blob.(verify.StreamSource); ok {
		return s.Stream(ctx, ranges)
	}
	bufs, err := blob.Fetch(ctx, ranges)
	if err != nil {
		return nil, nil, err
	}
	parts := make([]io.Reader, len(bufs))
	for i, buf := range bufs {
		parts[i] = bytes.NewReader(buf)
	}
	return parts, func() error { return nil }, nil
}
