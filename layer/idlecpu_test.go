package layer

import (
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/layerstore/layerstore/internal/control/protocol"
)

// threadNice is the niceness of the calling goroutine's thread.
func threadNice(t *testing.T) int {
	prio, err := unix.Getpriority(unix.PRIO_PROCESS, unix.Gettid())
	if err != nil {
		t.Fatal(err)
	}
	return 20 - prio
}

// TestBackgroundThreads: what runs on the background threads runs backgroundNice below the
// process, on at most one thread per processor at once, and no other goroutine inherits
// their priority.
func TestBackgroundThreads(t *testing.T) {
	p := backgroundThreads()
	runtime.LockOSThread()
	base := threadNice(t)
	runtime.UnlockOSThread()
	want := min(base+backgroundNice, 19)

	var running, most atomic.Int64
	var wg sync.WaitGroup
	var mu sync.Mutex
	nices := map[int]int{}
	for range 4 * p.threads {
		wg.Go(func() {
			p.run(func() {
				n := running.Add(1)
				defer running.Add(-1)
				for {
					m := most.Load()
					if n <= m || most.CompareAndSwap(m, n) {
						break
					}
				}
				x := 0
				for i := range 1 << 20 { // long enough for the others to pile up
					x += i
				}
				_ = x
				mu.Lock()
				nices[threadNice(t)]++
				mu.Unlock()
			})
		})
	}
	wg.Wait()
	if most.Load() > int64(p.threads) {
		t.Errorf("%d functions at once on %d threads", most.Load(), p.threads)
	}
	if len(nices) != 1 || nices[want] != 4*p.threads {
		t.Errorf("ran at niceness %v, want all at %d", nices, want)
	}

	// Goroutines started meanwhile, and threads Go created meanwhile, are at the process's.
	for range 8 {
		wg.Go(func() {
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
			if got := threadNice(t); got != base {
				t.Errorf("a goroutine's thread at niceness %d, want %d", got, base)
			}
		})
	}
	wg.Wait()
}

// TestBackgroundVerifiedAtLowPriority: the background fetch verifies its chunks on the
// background threads; a read's fetch verifies on its own goroutines.
func TestBackgroundVerifiedAtLowPriority(t *testing.T) {
	e := newEnv(t)
	f := e.fixtures[0]
	idle := backgroundThreads()

	ref := e.push("lowprio/demand:v1", fixtureLayer(f))
	m := e.manager(withPrefetch(false))
	l, err := m.Lookup(t.Context(), ref, f.Desc.Digest)
	if err != nil {
		t.Fatal(err)
	}
	before := idle.ran.Load()
	readAll(t, l, 1<<16)
	if n := idle.ran.Load() - before; n != 0 {
		t.Errorf("reads verified %d chunks on the background threads", n)
	}

	e2 := newEnv(t)
	ref = e2.push("lowprio/background:v1", fixtureLayer(f))
	before = idle.ran.Load()
	m = e2.manager()
	l, err = m.Lookup(t.Context(), ref, f.Desc.Digest)
	if err != nil {
		t.Fatal(err)
	}
	l.wait()
	if st := l.Status(); st.State != protocol.StateComplete {
		t.Fatalf("state %s (%s)", st.State, st.Error)
	}
	if n := idle.ran.Load() - before; n == 0 {
		t.Error("the background fetch verified no chunk on the background threads")
	}
}

// TestWantedVerifiedAtOnce: a chunk of the background fetch that a reader waits for is
// verified at the daemon's priority, the others on the background threads.
func TestWantedVerifiedAtOnce(t *testing.T) {
	e := newEnv(t)
	f := e.fixtures[0]
	ref := e.push("lowprio/wanted:v1", fixtureLayer(f))
	m := e.manager(withPrefetch(false))
	l, err := m.Lookup(t.Context(), ref, f.Desc.Digest)
	if err != nil {
		t.Fatal(err)
	}
	var keys []chunkKey
	for id := range regularFiles(l.Index()) {
		for i := range l.Index().NumChunks(id) {
			keys = append(keys, chunkKey{id, i})
		}
	}
	if len(keys) < 2 {
		t.Skip("fewer than two chunks")
	}
	_, mine := l.claim(nil, keys) // as a background batch does
	if len(mine) != len(keys) {
		t.Fatalf("claimed %d of %d", len(mine), len(keys))
	}

	// A reader of the first chunk finds it in flight and waits, marking it.
	read := make(chan error, 1)
	go func() {
		_, err := l.fetchMissing(t.Context(), keys[0].file, []int{keys[0].i}, nil, -1, onDemand)
		read <- err
	}()
	for !mine[0].wanted.Load() {
		select {
		case err := <-read:
			t.Fatalf("the read returned before its chunk was fetched: %v", err)
		case <-time.After(time.Millisecond):
		}
	}
	for _, f := range mine[1:] {
		if f.wanted.Load() {
			t.Fatal("a chunk nobody reads is marked wanted")
		}
	}

	idle := backgroundThreads()
	before := idle.ran.Load()
	l.fetchAndVerify(t.Context(), mine, background)
	if n := idle.ran.Load() - before; n != int64(len(mine)-1) {
		t.Errorf("%d of %d chunks verified on the background threads, want all but the one read", n, len(mine))
	}
	if err := <-read; err != nil {
		t.Fatal(err)
	}
	l.store(mine)
	l.forget(mine)
}
