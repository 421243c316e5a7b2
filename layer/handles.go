package layer

import (
	"container/list"
	"sync"

	"github.com/layerstore/layerstore/cache"
	"github.com/layerstore/layerstore/chunked"
)

// handles keeps up to max cache files open between reads, least recently used closed first.
// A handle in use is never closed; files the cache holds open are pinned (not evicted), so the
// bound also bounds what the manager pins.
type handles struct {
	c   *cache.Cache
	max int

	mu   sync.Mutex
	open map[chunked.Sum]*handle
	lru  list.List // of *handle, most recent first
}

type handle struct {
	f    *cache.File
	refs int
	elem *list.Element
}

func newHandles(c *cache.Cache, max int) *handles {
	return &handles{c: c, max: max, open: map[chunked.Sum]*handle{}}
}

// acquire returns an open handle on the cache file sum; release it when done.
func (hs *handles) acquire(sum chunked.Sum, size int64) (*handle, error) {
	hs.mu.Lock()
	if h := hs.open[sum]; h != nil {
		h.refs++
		hs.lru.MoveToFront(h.elem)
		hs.mu.Unlock()
		return h, nil
	}
	hs.mu.Unlock()
	f, err := hs.c.Open(sum, size) // may create files: not under the lock
	if err != nil {
		return nil, err
	}
	hs.mu.Lock()
	if h := hs.open[sum]; h != nil { // opened meanwhile by another reader
		h.refs++
		hs.lru.MoveToFront(h.elem)
		hs.mu.Unlock()
		f.Close()
		return h, nil
	}
	h := &handle{f: f, refs: 1}
	h.elem = hs.lru.PushFront(h)
	hs.open[sum] = h
	excess := hs.trimLocked()
	hs.mu.Unlock()
	closeAll(excess)
	return h, nil
}

func (hs *handles) release(h *handle) {
	hs.mu.Lock()
	h.refs--
	excess := hs.trimLocked()
	hs.mu.Unlock()
	closeAll(excess)
}

// trimLocked removes unused handles beyond the bound and returns them for closing.
func (hs *handles) trimLocked() []*cache.File {
	var out []*cache.File
	for e := hs.lru.Back(); e != nil && len(hs.open) > hs.max; {
		h := e.Value.(*handle)
		prev := e.Prev()
		if h.refs == 0 {
			hs.lru.Remove(e)
			delete(hs.open, h.f.Sum())
			out = append(out, h.f)
		}
		e = prev
	}
	return out
}

func (hs *handles) closeAll() {
	hs.mu.Lock()
	var all []*cache.File
	for sum, h := range hs.open {
		delete(hs.open, sum)
		all = append(all, h.f)
	}
	hs.lru.Init()
	hs.mu.Unlock()
	closeAll(all)
}

func closeAll(files []*cache.File) {
	for _, f := range files {
		f.Close()
	}
}

// holds reports whether the cache file holds all of chunk c.
func (h *handle) holds(c chunked.Chunk) bool {
	return c.Size > 0 && len(h.f.Missing(c.FileOffset, c.Size)) == 0
}
