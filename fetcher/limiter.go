package fetcher

import (
	"context"
	"sync"
)

// hostLimiter bounds the number of concurrent requests per host. It is safe for concurrent use
// and shared by every [Blob] of a Client.
type hostLimiter struct {
	perHost int

	mu   sync.Mutex
	sems map[string]chan struct{} // guarded by mu; a semaphore per host, never removed
}

// newHostLimiter returns a limiter allowing perHost concurrent requests to each host. A
// perHost of zero or less means the default, 8.
func newHostLimiter(perHost int) *hostLimiter {
	if perHost <= 0 {
		perHost = DefaultConcurrencyPerHost
	}
	return &hostLimiter{perHost: perHost, sems: make(map[string]chan struct{})}
}

// Acquire waits for a free slot for host, or for ctx to be done. On success it returns a
// function that frees the slot; calling it more than once is harmless.
func (l *hostLimiter) Acquire(ctx context.Context, host string) (release func(), err error) {
	l.mu.Lock()
	sem, ok := l.sems[host]
	if !ok {
		sem = make(chan struct{}, l.perHost)
		l.sems[host] = sem
	}
	l.mu.Unlock()

	if err := ctx.Err(); err != nil {
		return nil, err
	}
	select {
	case sem <- struct{}{}:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	var once sync.Once
	return func() { once.Do(func() { <-sem }) }, nil
}
