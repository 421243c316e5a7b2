package layer

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/opencontainers/go-digest"

	"github.com/layerstore/layerstore/internal/control/protocol"
)

// pinErrors are what stopped the pins a start resumed, by pin name, for status. Its lock is
// a leaf.
type pinErrors struct {
	mu   sync.Mutex
	errs map[string]string
}

func (e *pinErrors) set(name, msg string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if msg == "" {
		delete(e.errs, name)
		return
	}
	if e.errs == nil {
		e.errs = map[string]string{}
	}
	e.errs[name] = msg
}

func (e *pinErrors) get(name string) string {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.errs[name]
}

// Retries of resumed pins that failed: after pinRetryMin, doubling up to pinRetryMax.
var (
	pinRetryMin = 30 * time.Second
	pinRetryMax = 10 * time.Minute
)

// errRecordGone marks a pin that cannot be resumed from records: only pinning it again can.
var errRecordGone = errors.New("its record is gone: pin the image again")

// resumePins finishes, in the background, the pins a previous run left incomplete (stopped or
// killed while it fetched them): each of their layers is re-opened from its record and what
// the cache lacks of it is fetched, one pinned layer at a time, so that a start with many pins
// neither waits for them nor takes more of the registry and the processors than one background
// fetch. Complete pins only have their records checked. A pin whose fetch fails (the registry
// is down) says so in status and is retried, less and less often, until it completes or the
// manager closes; one whose layer records are gone says so and waits for a pin again.
func (m *Manager) resumePins() {
	infos, err := m.cache.Pins()
	if err != nil || len(infos) == 0 {
		return // a listing error is reported by status
	}
	m.life.goTracked(func() {
		ctx := m.life.ctx
		for wait := pinRetryMin; ; wait = min(2*wait, pinRetryMax) {
			retry := false
			for _, p := range m.Pins() {
				err := m.resumePin(ctx, p)
				if ctx.Err() != nil {
					return // closing
				}
				name := pinName(p.Ref, p.Platform)
				if err == nil {
					m.pinErrs.set(name, "")
					continue
				}
				m.pinErrs.set(name, err.Error())
				m.opts.log.Warn("pinned image not complete after the restart", "ref", p.Ref, "platform", p.Platform, "err", err)
				retry = retry || !errors.Is(err, errRecordGone)
			}
			if !retry {
				return
			}
			select {
			case <-ctx.Done():
				return
			case <-time.After(wait):
			}
		}
	})
}

// resumePin checks that every layer of p has its record and, when p is not complete, fetches
// what is missing.
func (m *Manager) resumePin(ctx context.Context, p protocol.Pin) error {
	keys := make([]digest.Digest, 0, len(p.Layers))
	for _, d := range p.Layers {
		rec, ok := m.records.find(digest.Digest(d), repository(p.Ref))
		if !ok {
			return fmt.Errorf("layer %s: %w", d, errRecordGone)
		}
		key := tocKey(rec.meta.Descriptor.Annotations)
		if key == "" {
			key = rec.meta.Descriptor.Digest
		}
		keys = append(keys, key)
	}
	if p.Present >= p.Bytes {
		return nil
	}
	m.opts.log.Info("resuming the fetch of a pinned image", "ref", p.Ref, "platform", p.Platform,
		"present", p.Present, "bytes", p.Bytes)
	for i, key := range keys {
		l, err := m.Lookup(ctx, p.Ref, key) // from the record
		if err != nil {
			return fmt.Errorf("layer %s: %w", p.Layers[i], err)
		}
		// As Pin: a background fetch already running (a runtime looked the layer up) goes
		// on, then what is still missing is fetched here.
		if err := l.waitPrefetch(ctx); err != nil {
			return err
		}
		if err := l.runPrefetch(ctx); err != nil {
			return fmt.Errorf("fetching layer %s: %w", p.Layers[i], err)
		}
	}
	m.opts.log.Info("pinned image complete", "ref", p.Ref, "platform", p.Platform)
	return nil
}
