package cache

import (
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"syscall"
	"time"
)

// When the cache's filesystem is full (ENOSPC, or EDQUOT for a quota), a write evicts least
// recently used files that no handle holds open, whatever the size bound, and is tried once
// more. If it still fails, the cache remembers that its filesystem is full for
// noSpaceBackoff: writes during that time fail at once with ErrNoSpace, without touching the
// disk; the first write after it tries again (evicting again). Reading is not affected.
const (
	noSpaceBackoff = 5 * time.Second
	// reportEvery bounds how often one kind of event (Cache.report) is logged.
	reportEvery = 30 * time.Second
	// roomShare is the share of its content (1/roomShare) that the cache evicts at least when
	// its filesystem is full, so that the writes that follow do not each meet a full disk.
	roomShare = 64
)

// isNoSpace reports whether err says that the filesystem (or the quota) is full.
func isNoSpace(err error) bool {
	return errors.Is(err, syscall.ENOSPC) || errors.Is(err, syscall.EDQUOT)
}

// noSpace is the cache's memory of its filesystem being full.
type noSpace struct {
	mu    sync.Mutex // a leaf: taken under any other lock of the cache, and none under it
	until time.Time  // writes fail at once until then
}

// refuseIfFull returns an error wrapping [ErrNoSpace] while the cache remembers its
// filesystem full; every write that could allocate disk space asks it first. It takes no lock
// but the leaf noSpace.mu, so callers may hold any of the cache's locks.
func (c *Cache) refuseIfFull() error {
	now := c.now()
	c.full.mu.Lock()
	until := c.full.until
	c.full.mu.Unlock()
	if !now.Before(until) {
		return nil
	}
	c.report.Count(msgFull)
	return fmt.Errorf("%w (writes refused for %v more)", ErrNoSpace, until.Sub(now).Round(time.Millisecond))
}

// withRoom runs op, a write of about need bytes to the cache's filesystem. When op fails
// because the filesystem is full, withRoom evicts files not in use to make room (see
// makeRoom) and runs op once more; if nothing could be evicted or op fails again, the cache
// refuses writes for a while and the error wraps [ErrNoSpace]. The caller holds no lock of the
// cache's (eviction takes Cache.mu); op checks refuseIfFull itself before writing, so that a
// call whose bytes are all present already succeeds while writes are refused.
func (c *Cache) withRoom(need int64, op func() error) error {
	err := op()
	if !isNoSpace(err) {
		return err
	}
	if files, freed := c.makeRoom(need); files > 0 {
		err = op()
		if !isNoSpace(err) {
			if err == nil {
				c.report.Log(c.now(), msgEvicted, slog.LevelInfo, msgEvicted, "files", files, "bytes", freed)
			}
			return err
		}
	}
	c.full.mu.Lock()
	c.full.until = c.now().Add(c.noSpaceBackoff)
	c.full.mu.Unlock()
	c.report.Log(c.now(), msgFull, slog.LevelWarn, msgFull, "backoff", c.noSpaceBackoff, "usage", c.usage.Load(), "err", err)
	return fmt.Errorf("%w: %w", ErrNoSpace, err)
}

const (
	msgFull    = "cache: filesystem full, nothing more to evict: writes refused for a while"
	msgEvicted = "cache: filesystem full: evicted files not in use to make room"
)

// makeRoom evicts least recently used files that no handle holds open until it has removed
// at least need bytes of content, and at least 1/roomShare of the cache's content. It
// returns how many files it removed and their content bytes. Evicting removes names: a file
// still open elsewhere (a passthrough backing file) keeps its blocks until it is closed.
func (c *Cache) makeRoom(need int64) (files int, freed int64) {
	want := max(need, c.usage.Load()/roomShare)
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.evictUntilLocked(func(freed int64) bool { return freed >= want })
}
