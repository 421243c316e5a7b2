package layer

import (
	"runtime"
	"sync"
	"sync/atomic"

	"golang.org/x/sys/unix"
)

// Background verification (decompressing and checking the chunks of the background fetch,
// prioritized files included) runs on threads of its own, at a lower scheduling priority
// than the rest of the process and than the runtimes: a niceness backgroundNice above the
// process's. The scheduler sees the reads that fetch on demand and steps aside for them, but
// not the runtime creating the container nor the container's own start, which want the same
// processors: on two cores, with an eStargz image whose prioritized files hold a large
// library, the runtime took more than twice as long between the last lookup and the exec while
// background batches decompressed at normal priority (benchmarks/results, 2026-11-27
// readybench nice, and the back-to-back figures it points to). Ten above, the kernel
// gives those threads what the others leave idle, and about a tenth of a processor against
// each busy one.
//
// The threads are the process's, started on first use, one per processor Go uses
// (GOMAXPROCS); each stays locked to its goroutine for good, so that no other goroutine runs
// at their priority, and threads Go starts later are cloned from a thread of normal priority
// (the runtime does so for a locked thread). What runs on them is short (one chunk's
// verification, after stepping aside for the demand fetches running: scheduler.verifying)
// and takes no lock a reader holds. A chunk a reader waits for (fetch.wanted) is verified at
// the daemon's priority instead, so that a container waiting for a prioritized file does not
// wait behind the busy runtimes; a reader that comes while it is being verified here waits
// for that chunk only. While one runs it holds one of Go's Ps: on a machine whose
// processors are all busy at a higher priority, a goroutine serving a FUSE request may wait
// for Go to preempt it (10 ms of running), as it would wait for the processor anyway.
// Raising GOMAXPROCS by their number instead was slower on two cores (measured with the same
// run, benchmarks/results, 2026-11-27 readybench nice; the garbage collector's workers,
// probably, taking the extra Ps).
const backgroundNice = 10

// lowPriority runs functions on the background threads.
type lowPriority struct {
	jobs    chan func()
	threads int
	ran     atomic.Int64 // functions run, for tests
}

var backgroundThreads = sync.OnceValue(func() *lowPriority {
	n := runtime.GOMAXPROCS(0)
	p := &lowPriority{jobs: make(chan func()), threads: n}
	for range n {
		go p.serve()
	}
	return p
})

func (p *lowPriority) serve() {
	runtime.LockOSThread() // never unlocked: the thread ends with the process
	// Relative to the process's own niceness (a service manager may have set one). On failure
	// (a seccomp filter refusing it) the thread keeps its priority and verification goes on
	// as before.
	tid := unix.Gettid()
	if prio, err := unix.Getpriority(unix.PRIO_PROCESS, tid); err == nil {
		nice := 20 - prio // the system call answers 20 - nice
		_ = unix.Setpriority(unix.PRIO_PROCESS, tid, min(nice+backgroundNice, 19))
	}
	for fn := range p.jobs {
		fn()
	}
}

// run calls fn on a background thread and returns once it has returned.
func (p *lowPriority) run(fn func()) {
	p.ran.Add(1)
	done := make(chan struct{})
	p.jobs <- func() {
		defer close(done)
		fn()
	}
	<-done
}
