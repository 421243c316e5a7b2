package fetcher

import (
	"bytes"
	"context"
	"sync"
	"testing"
	"time"
)

func TestHostLimiter(t *testing.T) {
	l := newHostLimiter(2)
	ctx := t.Context()
	r1, err := l.Acquire(ctx, "a")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := l.Acquire(ctx, "a"); err != nil {
		t.Fatal(err)
	}
	canceled, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := l.Acquire(canceled, "a"); err == nil {
		t.Fatal("third Acquire on a full host succeeded, want the context's error")
	}
	if rb, err := l.Acquire(ctx, "b"); err != nil {
		t.Fatalf("Acquire on another host: %v", err)
	} else {
		rb()
	}
	r1()
	r1() // a second release must not free another slot
	if _, err := l.Acquire(ctx, "a"); err != nil {
		t.Fatalf("Acquire after release: %v", err)
	}
	if held := len(l.sems["a"]); held != 2 {
		t.Fatalf("%d slots held after a double release and a new Acquire, want 2", held)
	}

	// A waiting Acquire gets the slot once one is released.
	got := make(chan func(), 1)
	go func() {
		r, err := l.Acquire(ctx, "a")
		if err != nil {
			t.Error(err)
			r = func() {}
		}
		got <- r
	}()
	select {
	case <-got:
		t.Fatal("Acquire on a full host returned before a release")
	default:
	}
	l.mu.Lock()
	sem := l.sems["a"]
	l.mu.Unlock()
	<-sem // release a slot by hand
	select {
	case r := <-got:
		r()
	case <-time.After(10 * time.Second):
		t.Fatal("Acquire did not return after a release")
	}
}

// TestHostLimiterBoundsRequests: concurrent reads of one host never have more requests in
// flight than the limit, and the limit is reached.
func TestHostLimiterBoundsRequests(t *testing.T) {
	data := testBlob(1 << 20)
	reg := newTestRegistry(t, data)
	reg.gate = make(chan struct{})
	limiter := newHostLimiter(2)
	// Two Blobs of the same host share the limiter.
	b1, _ := newTestBlob(t, reg, Config{limiter: limiter})
	b2, _ := newTestBlob(t, reg, Config{limiter: limiter})

	var wg sync.WaitGroup
	errs := make(chan error, 6)
	for i := range 6 {
		b := b1
		if i%2 == 1 {
			b = b2
		}
		off := int64(i) * 100_000
		wg.Add(1)
		go func() {
			defer wg.Done()
			p := make([]byte, 100)
			if _, err := b.ReadAt(t.Context(), p, off); err != nil {
				errs <- err
				return
			}
			if !bytes.Equal(p, data[off:off+100]) {
				t.Errorf("ReadAt(%d): bytes differ", off)
			}
		}()
	}
	waitFor(t, "two requests in flight", func() bool {
		reg.mu.Lock()
		defer reg.mu.Unlock()
		return reg.inflight == 2
	})
	close(reg.gate)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if got := reg.count(); got != 6 {
		t.Errorf("registry saw %d requests, want 6", got)
	}
	reg.mu.Lock()
	peak := reg.peak
	reg.mu.Unlock()
	if peak != 2 {
		t.Errorf("peak concurrent requests = %d, want 2", peak)
	}
}
