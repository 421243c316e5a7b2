package layer

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"os"
	"sync/atomic"
	"time"

	"github.com/opencontainers/go-digest"

	"github.com/layerstore/layerstore/verify"
)

// blobCopy is a layer's compressed blob, fetched whole and hashed before any of it is served:
// the registry's bytes are trusted only once their sha256 is the blob's digest. It lives in an
// anonymous file on the cache's filesystem while export reads it (podman save, push), and goes
// once unused for the keep TTL.
type blobCopy struct {
	done     chan struct{} // closed once f or err is set
	f        *os.File
	err      error
	failedAt time.Time
	used     atomic.Int64 // unix nanoseconds of the last read
}

// ReadBlob implements storefs.Layer: the raw blob, from the verified copy, which the first read
// makes. A blob whose bytes do not hash to its digest fails every read (with
// verify.ErrDigestMismatch) and is fetched again after the negative TTL.
func (l *Served) ReadBlob(ctx context.Context, p []byte, off int64) (int, error) {
	if err := l.v.Err(); err != nil {
		return 0, err // the layer is refused (checkTarSplit)
	}
	if off < 0 {
		return 0, fmt.Errorf("negative offset %d", off)
	}
	if off >= l.desc.Size || len(p) == 0 {
		return 0, nil
	}
	if rest := l.desc.Size - off; int64(len(p)) > rest {
		p = p[:rest]
	}
	bc := l.blobCopyFor()
	select {
	case <-bc.done:
	case <-ctx.Done():
		return 0, ctx.Err()
	}
	if bc.err != nil {
		return 0, bc.err
	}
	bc.used.Store(l.env.now().UnixNano())
	n, err := bc.f.ReadAt(p, off)
	if errors.Is(err, io.EOF) && n == len(p) {
		err = nil
	}
	return n, err
}

// blobCopyFor returns the layer's blob copy, starting it when there is none or when the last
// attempt failed more than the negative TTL ago.
func (l *Served) blobCopyFor() *blobCopy {
	now := l.env.now()
	l.mu.Lock()
	if bc := l.blobCopy; bc != nil {
		select {
		case <-bc.done:
			if bc.err == nil || now.Sub(bc.failedAt) < l.env.negativeTTL {
				l.mu.Unlock()
				return bc
			}
		default:
			l.mu.Unlock()
			return bc
		}
	}
	bc := &blobCopy{done: make(chan struct{})}
	bc.used.Store(now.UnixNano())
	l.blobCopy = bc
	l.mu.Unlock()
	l.env.life.goTracked(func() { l.copyBlob(bc) }) // takes Manager.mu: not under Served.mu
	return bc
}

// copyBlob fetches the whole blob in pieces of the background fetch's batch size
// (Config.PrefetchBatch), in order, into a scratch file, hashing it on the way, and completes bc.
func (l *Served) copyBlob(bc *blobCopy) {
	f, err := l.fetchBlob()
	l.mu.Lock()
	current := l.blobCopy == bc
	l.mu.Unlock()
	if err == nil && !current { // dropped meanwhile (Close)
		f.Close()
		err = errors.New("layer closed")
	}
	if err != nil {
		if f != nil && current {
			f.Close()
		}
		f = nil
		l.env.log.Warn("blob export failed", "layer", l.desc.Digest, "err", err)
	}
	bc.f, bc.err, bc.failedAt = f, err, l.env.now()
	close(bc.done)
}

func (l *Served) fetchBlob() (*os.File, error) {
	f, err := l.env.cache.Scratch()
	if err != nil {
		return nil, err
	}
	buf := make([]byte, min(l.desc.Size, l.env.batch))
	h := sha256.New()
	for off := int64(0); off < l.desc.Size; {
		p := buf[:min(int64(len(buf)), l.desc.Size-off)]
		ctx, cancel := l.env.life.bound(context.Background(), l.env.readTimeout)
		n, err := l.blob.ReadAt(ctx, p, off)
		cancel()
		l.onDemand.Add(int64(n))
		l.env.counters.onDemandBytes.Add(int64(n))
		if err != nil && !(errors.Is(err, io.EOF) && n == len(p)) {
			f.Close()
			return nil, fmt.Errorf("fetching blob %s at %d: %w", l.desc.Digest, off, err)
		}
		h.Write(p)
		if _, err := f.WriteAt(p, off); err != nil {
			f.Close()
			return nil, fmt.Errorf("copying blob %s: %w", l.desc.Digest, err)
		}
		off += int64(n)
	}
	if got := digest.NewDigest(digest.SHA256, h); got != l.desc.Digest {
		f.Close()
		l.env.counters.verifyFailures.Add(1)
		return nil, fmt.Errorf("blob %s: %w: the registry's bytes hash to %s", l.desc.Digest, verify.ErrDigestMismatch, got)
	}
	return f, nil
}

// dropBlobCopy removes the blob copy when it has not been read since before cutoff (the zero
// time: whatever its use), and closes its file once made.
func (l *Served) dropBlobCopy(cutoff time.Time) {
	l.mu.Lock()
	bc := l.blobCopy
	if bc == nil || (!cutoff.IsZero() && bc.used.Load() >= cutoff.UnixNano()) {
		l.mu.Unlock()
		return
	}
	select {
	case <-bc.done:
	default:
		if !cutoff.IsZero() {
			l.mu.Unlock()
			return // still being made: not idle
		}
	}
	l.blobCopy = nil
	l.mu.Unlock()
	select {
	case <-bc.done:
		if bc.f != nil {
			bc.f.Close()
		}
	default: // copyBlob sees it is no longer current and closes its file
	}
}
