package main

import (
	"context"
	"encoding/base64"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime/pprof"
	"runtime/trace"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/layerstore/layerstore/benchmarks/internal/benchd"
	"github.com/layerstore/layerstore/cache"
	"github.com/layerstore/layerstore/fetcher"
	"github.com/layerstore/layerstore/internal/control/protocol"
	"github.com/layerstore/layerstore/internal/testutil/testregistry"
	"github.com/layerstore/layerstore/layer"
)

// fetchRun is one background fetch of the rootfs layer by a fresh daemon with an empty cache.
type fetchRun struct {
	Lookup   float64 // stat of the diff directory: manifest, TOC, verification, parse
	Total    float64 // from the stat to the layer reported complete
	Daemon   float64 // the daemon's own prefetch time (prefetchSeconds)
	CPU      float64 // daemon CPU seconds over Total
	HWM      int64   // the daemon's peak RSS (VmHWM) at the end: its start, the lookup and the fetch; 0 in process
	Requests testregistry.BlobStats
	Status   protocol.LayerStatus
	Cache    protocol.CacheStats
	Probes   []probeResult // reads made while the fetch ran, if asked for
}

// bench holds what every scenario shares.
type bench struct {
	opts     options
	reg      *testregistry.Registry
	regsConf string
	bin      string
	work     string
}

func (b *bench) ref(repo string) string { return b.reg.Host + "/" + repo + ":latest" }

func (b *bench) diffDir(mnt, repo string, l *builtLayer) string {
	return filepath.Join(mnt, base64.StdEncoding.EncodeToString([]byte(b.ref(repo))), l.tocDigest().String(), "diff")
}

// newDir makes a fresh directory under the work directory. Directories are removed only at
// the end, with the work directory: removing thousands of files between runs would make the
// next run's file creations slow on ext4, whose inode allocator skips (and reads, one by one)
// the inodes deleted in the last 30 s or so, which is not what a node usually does.
func (b *bench) newDir(name string) (string, error) {
	return os.MkdirTemp(b.work, name+"-")
}

// fetchOnce starts a daemon on an empty cache, looks the layer up and waits until it is
// fully local. With probes, it reads those files through the mount meanwhile.
func (b *bench) fetchOnce(ctx context.Context, repo string, l *builtLayer, prefetch bool, probes []probe) (fetchRun, error) {
	var run fetchRun
	dir, err := b.newDir("fetch")
	if err != nil {
		return run, err
	}
	dropCaches()
	d, err := benchd.Start(ctx, benchd.Config{Bin: b.bin, Dir: dir, RegistriesConf: b.regsConf, Prefetch: prefetch, Passthrough: true})
	if err != nil {
		return run, err
	}
	defer d.Stop()
	before := b.reg.Stats(l.Digest)
	cpu0, err := d.CPU()
	if err != nil {
		return run, err
	}
	diff := b.diffDir(d.Cfg.Mountpoint, repo, l)
	start := time.Now()
	if _, err := os.Stat(diff); err != nil {
		return run, fmt.Errorf("lookup: %w: %s", err, d.Tail())
	}
	run.Lookup = time.Since(start).Seconds()

	var fetching atomic.Bool
	fetching.Store(prefetch)
	var wg sync.WaitGroup
	if len(probes) > 0 {
		wg.Go(func() { run.Probes = readProbes(diff, probes, &fetching, b.opts.probeGap) })
	}
	if prefetch {
		ls, err := d.WaitComplete(ctx, l.Digest, 25*time.Millisecond, b.opts.fetchTimeout)
		run.Total = time.Since(start).Seconds()
		fetching.Store(false)
		wg.Wait()
		if err != nil {
			return run, err
		}
		run.Status = ls
		run.Daemon = ls.Seconds
	} else {
		wg.Wait()
		run.Total = time.Since(start).Seconds()
	}
	cpu1, err := d.CPU()
	if err != nil {
		return run, err
	}
	run.CPU = cpu1 - cpu0
	m, err := d.Memory()
	if err != nil {
		return run, err
	}
	run.HWM = m.HWM
	after := b.reg.Stats(l.Digest)
	run.Requests = testregistry.BlobStats{Full: after.Full - before.Full, Ranged: after.Ranged - before.Ranged, Bytes: after.Bytes - before.Bytes}
	if ls, st, ok, err := d.LayerStatus(ctx, l.Digest); err == nil && ok {
		run.Cache = st.Cache
		if !prefetch {
			run.Status = ls
		}
	}
	return run, nil
}

// probe is one read through the mount: a whole small file, or 4 KiB of a large one.
type probe struct {
	Path string
	Off  int64
	Len  int
}

type probeResult struct {
	probe
	Seconds float64
	During  bool // issued while the background fetch was running
	Err     string
}

// pickProbes chooses n reads among the files in the last 60% of the layer's blob order (the
// part the background fetch reaches last): whole small files and 4 KiB of large ones.
func pickProbes(s layerSpec, n int, seed uint64) []probe {
	rng := rand.New(rand.NewPCG(seed, 7))
	files := s.Files[len(s.Files)*2/5:]
	var small, large []genFile
	for _, f := range files {
		if f.Size <= 64<<10 {
			small = append(small, f)
		} else {
			large = append(large, f)
		}
	}
	var out []probe
	for i := range n {
		if i%4 == 3 && len(large) > 0 {
			f := large[rng.IntN(len(large))]
			off := rng.Int64N(f.Size-4096) &^ 4095
			out = append(out, probe{Path: f.Path, Off: off, Len: 4096})
			continue
		}
		f := small[rng.IntN(len(small))]
		out = append(out, probe{Path: f.Path, Len: int(f.Size)})
	}
	return out
}

// readProbes makes the reads one after the other, gap apart, while fetching holds (all of
// them when fetching is false from the start).
func readProbes(diff string, probes []probe, fetching *atomic.Bool, gap time.Duration) []probeResult {
	return readProbesWith(probes, fetching, gap, func(p probe, buf []byte) error {
		return readOne(filepath.Join(diff, p.Path), p, buf)
	})
}

func readProbesWith(probes []probe, fetching *atomic.Bool, gap time.Duration, read func(probe, []byte) error) []probeResult {
	all := !fetching.Load()
	var out []probeResult
	buf := make([]byte, 64<<10)
	for _, p := range probes {
		during := fetching.Load()
		if !all && !during {
			break
		}
		start := time.Now()
		err := read(p, buf)
		r := probeResult{probe: p, Seconds: time.Since(start).Seconds(), During: during}
		if err != nil {
			r.Err = err.Error()
		}
		out = append(out, r)
		time.Sleep(gap)
	}
	return out
}

func readOne(path string, p probe, buf []byte) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	want := p.Len
	if want > len(buf) {
		buf = make([]byte, want)
	}
	n, err := f.ReadAt(buf[:want], p.Off)
	if n == want {
		return nil
	}
	return err
}

// latencies summarises probe results.
type latencies struct {
	N             int
	P50, P90, Max float64
	Errors        int
}

func summarize(rs []probeResult, onlyDuring bool) latencies {
	var s []float64
	var l latencies
	for _, r := range rs {
		if onlyDuring && !r.During {
			continue
		}
		if r.Err != "" {
			l.Errors++
			continue
		}
		s = append(s, r.Seconds)
	}
	slices.Sort(s)
	l.N = len(s)
	if len(s) > 0 {
		l.P50 = s[len(s)/2]
		l.P90 = s[min(len(s)-1, len(s)*9/10)]
		l.Max = s[len(s)-1]
	}
	return l
}

// fetchInProcess runs the background fetch of l with the layer and cache packages in this
// process (no FUSE, no daemon), under the CPU profiler and the execution tracer when asked:
// the way to find where the daemon's time goes without changing the daemon.
func (b *bench) fetchInProcess(ctx context.Context, repo string, l *builtLayer, probes []probe) (fetchRun, error) {
	var run fetchRun
	dir, err := b.newDir("inproc")
	if err != nil {
		return run, err
	}
	dropCaches()
	c, err := cache.New(filepath.Join(dir, "cache"), cache.Config{})
	if err != nil {
		return run, err
	}
	defer c.Close()
	client, err := fetcher.NewClient(fetcher.Config{RegistriesConf: b.regsConf, RegistriesConfDir: b.regsConf + ".d"})
	if err != nil {
		return run, err
	}
	m, err := layer.New(layer.ClientRegistry(client), c, layer.Config{})
	if err != nil {
		return run, err
	}
	defer m.Close()
	if b.opts.cpuProfile != "" {
		f, err := os.Create(b.opts.cpuProfile)
		if err != nil {
			return run, err
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return run, err
		}
		defer pprof.StopCPUProfile()
	}
	if b.opts.traceFile != "" {
		f, err := os.Create(b.opts.traceFile)
		if err != nil {
			return run, err
		}
		defer f.Close()
		if err := trace.Start(f); err != nil {
			return run, err
		}
		defer trace.Stop()
	}
	before := b.reg.Stats(l.Digest)
	var ru0 syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru0)
	start := time.Now()
	fl, err := m.Lookup(ctx, b.ref(repo), l.tocDigest())
	if err != nil {
		return run, err
	}
	run.Lookup = time.Since(start).Seconds()
	var fetching atomic.Bool
	fetching.Store(true)
	var wg sync.WaitGroup
	if len(probes) > 0 {
		// The reads go to the layer as package storefs would send them: Backing at open, then
		// ReadFile.
		wg.Go(func() {
			run.Probes = readProbesWith(probes, &fetching, b.opts.probeGap, func(p probe, buf []byte) error {
				id, ok := fl.Index().LookupPath(p.Path)
				if !ok {
					return fmt.Errorf("%s: not in the index", p.Path)
				}
				if f := fl.Backing(id); f != nil {
					defer f.Close()
					_, err := f.ReadAt(buf[:p.Len], p.Off)
					return err
				}
				_, err := fl.ReadFile(ctx, id, buf[:p.Len], p.Off)
				return err
			})
		})
	}
	defer wg.Wait()
	defer fetching.Store(false)
	deadline := time.Now().Add(b.opts.fetchTimeout)
	for {
		st := m.Status()
		if len(st.Layers) == 1 && st.Layers[0].State == protocol.StateComplete {
			run.Status, run.Cache = st.Layers[0], st.Cache
			break
		}
		if len(st.Layers) == 1 && (st.Layers[0].State == protocol.StateFailed || st.Layers[0].State == protocol.StateStopped) {
			return run, fmt.Errorf("background fetch %s: %s", st.Layers[0].State, st.Layers[0].Error)
		}
		if time.Now().After(deadline) {
			return run, fmt.Errorf("not complete after %v", b.opts.fetchTimeout)
		}
		time.Sleep(10 * time.Millisecond)
	}
	run.Total = time.Since(start).Seconds()
	run.Daemon = run.Status.Seconds
	var ru1 syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru1)
	run.CPU = tv(ru1.Utime) + tv(ru1.Stime) - tv(ru0.Utime) - tv(ru0.Stime)
	after := b.reg.Stats(l.Digest)
	run.Requests = testregistry.BlobStats{Full: after.Full - before.Full, Ranged: after.Ranged - before.Ranged, Bytes: after.Bytes - before.Bytes}
	return run, nil
}

// dropCaches writes dirty pages back and empties the page cache, so that runs start alike.
func dropCaches() {
	syscall.Sync()
	_ = os.WriteFile("/proc/sys/vm/drop_caches", []byte("3\n"), 0o200)
}
