package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/layerstore/layerstore/benchmarks/internal/benchd"
	"github.com/layerstore/layerstore/benchmarks/internal/peer"
)

// fioJob is one fio workload of the matrix.
type fioJob struct {
	Name     string
	RW       string // read or randread
	BS       string
	Direct   bool
	Jobs     int
	Warm     bool // read the whole file first and keep the page cache (buffered only)
	TimeBase bool // run for the configured time rather than one pass over the file
	IOs      int  // stop after this many reads per job (0: no limit)
}

// fioJobs is the matrix run on each target. Cold jobs start with dropped caches.
var fioJobs = []fioJob{
	{Name: "seq 1M, O_DIRECT", RW: "read", BS: "1M", Direct: true, Jobs: 1},
	{Name: "seq 1M, buffered cold", RW: "read", BS: "1M", Jobs: 1},
	{Name: "seq 1M, buffered warm", RW: "read", BS: "1M", Jobs: 1, Warm: true},
	{Name: "rand 4K QD1, O_DIRECT", RW: "randread", BS: "4k", Direct: true, Jobs: 1, TimeBase: true},
	{Name: "rand 4K 4 jobs, O_DIRECT", RW: "randread", BS: "4k", Direct: true, Jobs: 4, TimeBase: true},
	{Name: "rand 4K QD1, buffered warm", RW: "randread", BS: "4k", Jobs: 1, Warm: true, TimeBase: true},
	{Name: "rand 4K 4 jobs, buffered warm", RW: "randread", BS: "4k", Jobs: 4, Warm: true, TimeBase: true},
}

// fioResult is what one job measured.
type fioResult struct {
	BW        float64 // bytes/s
	IOPS      float64
	ClatP50   float64 // µs
	ClatP99   float64 // µs
	DaemonCPU float64 // daemon CPU seconds during the job (through the mount)
	// Resident is how much of the cache's file was in the page cache after the job: after a
	// cold O_DIRECT job, whether the reads really bypassed it.
	Resident int64
	Seconds  float64
	Bytes    float64 // bytes fio read
	Fetched  int64   // compressed bytes the registry sent during the job (cold on-demand jobs)
	Err      string
}

// fioTarget is one way to reach the file.
type fioTarget struct {
	Name    string
	Path    string
	backing string                  // the cache's file, whose page cache residency is reported
	cpu     func() (float64, error) // the serving process's CPU time; nil for the native file
}

// runFio runs the matrix on target.
func runFio(ctx context.Context, t fioTarget, runtime time.Duration, only *regexp.Regexp) []fioResult {
	out := make([]fioResult, len(fioJobs))
	for i, j := range fioJobs {
		if only != nil && !only.MatchString(j.Name) {
			out[i].Err = "skipped (-fio-only)"
			continue
		}
		if ctx.Err() != nil {
			out[i].Err = ctx.Err().Error()
			continue
		}
		if j.Warm {
			if err := readAll(t.Path); err != nil {
				out[i].Err = err.Error()
				continue
			}
		} else {
			dropCaches()
		}
		var cpu0 float64
		if t.cpu != nil {
			cpu0, _ = t.cpu()
		}
		start := time.Now()
		r, err := fio(ctx, t.Path, j, runtime)
		r.Seconds = time.Since(start).Seconds()
		if err != nil {
			r.Err = err.Error()
		}
		if t.cpu != nil {
			cpu1, _ := t.cpu()
			r.DaemonCPU = cpu1 - cpu0
		}
		r.Resident = resident(t.backing)
		out[i] = r
		fmt.Fprintf(os.Stderr, "  fio %-14s %-30s %9.1f MiB/s %9.0f IOPS p50 %7.1fµs p99 %8.1fµs daemon CPU %.2fs, %s cached %s\n",
			t.Name, j.Name, r.BW/(1<<20), r.IOPS, r.ClatP50, r.ClatP99, r.DaemonCPU, mib(r.Resident), r.Err)
	}
	return out
}

func readAll(p string) error {
	f, err := os.Open(p)
	if err != nil {
		return err
	}
	defer f.Close()
	_, err = io.CopyBuffer(io.Discard, f, make([]byte, 1<<20))
	return err
}

func fio(ctx context.Context, path string, j fioJob, runtime time.Duration) (fioResult, error) {
	args := []string{
		// fio splits --filename at ':' (the layer key has one); "\\:" escapes it.
		"--name=lazybench", "--filename=" + strings.ReplaceAll(path, ":", "\\:"), "--readonly", "--rw=" + j.RW, "--bs=" + j.BS,
		"--ioengine=psync", "--iodepth=1", "--numjobs=" + strconv.Itoa(j.Jobs), "--group_reporting",
		"--direct=" + b01(j.Direct), "--output-format=json", "--randrepeat=0",
		// fio drops the file's pages before a job by default; warm jobs keep them.
		"--invalidate=" + b01(!j.Warm),
	}
	if j.IOs > 0 {
		args = append(args, "--number_ios="+strconv.Itoa(j.IOs))
	}
	if j.TimeBase {
		args = append(args, "--time_based", fmt.Sprintf("--runtime=%ds", int(runtime.Seconds())), "--ramp_time=1s")
	} else {
		// One pass over the file, bounded in time all the same.
		args = append(args, fmt.Sprintf("--runtime=%ds", 3*int(runtime.Seconds())))
	}
	cmd := exec.CommandContext(ctx, "fio", args...)
	var stderr, stdout = &limitedBuffer{}, &limitedBuffer{max: 16 << 20}
	cmd.Stdout, cmd.Stderr = stdout, stderr
	if err := cmd.Run(); err != nil {
		return fioResult{}, fmt.Errorf("fio: %w: %s", err, stderr.String())
	}
	var rep struct {
		Jobs []struct {
			Error int `json:"error"`
			Read  struct {
				BW    float64 `json:"bw_bytes"`
				IOPS  float64 `json:"iops"`
				Bytes float64 `json:"io_bytes"`
				Clat  struct {
					Percentile map[string]float64 `json:"percentile"`
				} `json:"clat_ns"`
			} `json:"read"`
		} `json:"jobs"`
	}
	// fio may print warnings before the JSON.
	b := stdout.Bytes()
	if i := indexByte(b, '{'); i > 0 {
		b = b[i:]
	}
	if err := json.Unmarshal(b, &rep); err != nil {
		return fioResult{}, fmt.Errorf("fio output: %w", err)
	}
	if len(rep.Jobs) == 0 {
		return fioResult{}, fmt.Errorf("fio: no job in the output")
	}
	jr := rep.Jobs[0]
	r := fioResult{BW: jr.Read.BW, IOPS: jr.Read.IOPS, Bytes: jr.Read.Bytes,
		ClatP50: jr.Read.Clat.Percentile["50.000000"] / 1e3, ClatP99: jr.Read.Clat.Percentile["99.000000"] / 1e3}
	if jr.Error != 0 {
		return r, fmt.Errorf("fio job error %d", jr.Error)
	}
	return r, nil
}

func b01(b bool) string {
	if b {
		return "1"
	}
	return "0"
}

func indexByte(b []byte, c byte) int {
	for i, x := range b {
		if x == c {
			return i
		}
	}
	return -1
}

type limitedBuffer struct {
	buf []byte
	max int
}

func (l *limitedBuffer) Write(p []byte) (int, error) {
	max := l.max
	if max == 0 {
		max = 64 << 10
	}
	if room := max - len(l.buf); room > 0 {
		l.buf = append(l.buf, p[:min(len(p), room)]...)
	}
	return len(p), nil
}
func (l *limitedBuffer) Bytes() []byte  { return l.buf }
func (l *limitedBuffer) String() string { return string(l.buf) }

// fioScenario fetches the fio layer completely, then runs the matrix through the mount with
// passthrough, through the mount without it (another daemon on the same cache, which finds
// the file complete) and natively on the cache's own file; that for each of rounds rounds,
// so that the targets alternate and drifts of the disk hit them alike. It returns every
// round's results per target.
func (b *bench) fioScenario(ctx context.Context, repo string, l *builtLayer, fileInLayer string) (map[string][][]fioResult, map[string]string, error) {
	results := map[string][][]fioResult{}
	notes := map[string]string{}
	dir, err := b.newDir("fio")
	if err != nil {
		return nil, nil, err
	}
	defer os.RemoveAll(dir)
	cacheDir := filepath.Join(dir, "cache")
	native := ""
	for round := range b.opts.fioRounds {
		for _, pt := range []bool{true, false} {
			name := "passthrough"
			if !pt {
				name = "no-passthrough"
			}
			ddir := filepath.Join(dir, fmt.Sprintf("%s-%d", name, round))
			if err := os.MkdirAll(ddir, 0o755); err != nil {
				return nil, nil, err
			}
			d, err := benchd.Start(ctx, benchd.Config{Bin: b.bin, Dir: ddir, CacheDir: cacheDir, RegistriesConf: b.regsConf, Prefetch: true, Passthrough: pt})
			if err != nil {
				return nil, nil, err
			}
			diff := b.diffDir(d.Cfg.Mountpoint, repo, l)
			start := time.Now()
			if _, err := os.Stat(diff); err != nil {
				d.Stop()
				return nil, nil, fmt.Errorf("lookup: %w", err)
			}
			if _, err := d.WaitComplete(ctx, l.Digest, 50*time.Millisecond, b.opts.fetchTimeout); err != nil {
				d.Stop()
				return nil, nil, err
			}
			if native == "" {
				if native, err = findCached(cacheDir, b.opts.fioSize); err != nil {
					d.Stop()
					return nil, nil, err
				}
				notes["native"] = "the cache's own file, files/" + filepath.Base(filepath.Dir(native)) + "/" + filepath.Base(native)
			}
			if round == 0 {
				notes[name] = fmt.Sprintf("daemon reported passthrough=%s; layer complete %.1fs after lookup", d.Passthrough(), time.Since(start).Seconds())
				fmt.Fprintf(os.Stderr, "fio target %s: %s\n", name, notes[name])
			}
			results[name] = append(results[name], runFio(ctx, fioTarget{Name: name, Path: filepath.Join(diff, fileInLayer), backing: native, cpu: d.CPU}, b.opts.fioRuntime, b.opts.fioOnly))
			d.Stop()
		}
		results["native"] = append(results["native"], runFio(ctx, fioTarget{Name: "native", Path: native, backing: native}, b.opts.fioRuntime, b.opts.fioOnly))
		if b.opts.peer != "" {
			r, note, err := b.peerComplete(ctx, filepath.Join(dir, fmt.Sprintf("peer-%d", round)), repo, l, fileInLayer)
			if err != nil {
				return nil, nil, err
			}
			notes["peer"] = note
			results["peer"] = append(results["peer"], r)
		}
	}
	return results, notes, nil
}

// peerComplete runs the matrix through the peer store once the file is local in it: the peer
// (background fetch and passthrough asked for) has no status to wait on, so the file is read
// whole through its mount first, which fetches what it lacks.
func (b *bench) peerComplete(ctx context.Context, dir, repo string, l *builtLayer, fileInLayer string) ([]fioResult, string, error) {
	p, err := peer.Start(ctx, peer.Config{Bin: b.opts.peer, Dir: dir, Prefetch: true, Background: true, Passthrough: true})
	if err != nil {
		return nil, "", err
	}
	defer p.Stop()
	layerDir, err := peer.LayerDir(p.Cfg.Mountpoint, b.ref(repo), l.tocDigest(), l.Digest)
	if err != nil {
		return nil, "", fmt.Errorf("peer lookup: %w: %s", err, p.Tail())
	}
	path := filepath.Join(layerDir, "diff", fileInLayer)
	start := time.Now()
	if err := readAll(path); err != nil {
		return nil, "", fmt.Errorf("peer: reading the file whole: %w: %s", err, p.Tail())
	}
	note := fmt.Sprintf("%s, key %s; the file read whole through it in %.1fs before the jobs", b.opts.peer, filepath.Base(layerDir), time.Since(start).Seconds())
	return runFio(ctx, fioTarget{Name: "peer", Path: path, cpu: p.CPU}, b.opts.fioRuntime, b.opts.fioOnly), note, nil
}

// coldJobs are the fio jobs run on demand: each on a fresh daemon with an empty cache and
// prefetch off, so that every byte read comes from the registry as the reads ask for it.
var coldJobs = []fioJob{
	{Name: "seq 1M, O_DIRECT", RW: "read", BS: "1M", Direct: true, Jobs: 1},
	{Name: "rand 4K QD1, O_DIRECT", RW: "randread", BS: "4k", Direct: true, Jobs: 1, TimeBase: true},
	{Name: "rand 4K 4 jobs, O_DIRECT", RW: "randread", BS: "4k", Direct: true, Jobs: 4, TimeBase: true},
	// What a starting container does: a few scattered reads. Its amplification is the cost of
	// the chunk size.
	{Name: "1000 rand 4K reads, O_DIRECT", RW: "randread", BS: "4k", Direct: true, Jobs: 1, IOs: 1000},
}

// fioColdScenario runs coldJobs through the mount on demand: per job and round a fresh
// daemon (prefetch off, an empty cache of its own) resolves the layer, fio runs, and the
// registry's byte count gives the read amplification (compressed bytes fetched per byte
// read). With -peer, the peer store does the same (prefetch and background fetch off, an
// empty root). Returns every round's results per store ("layerstore", "peer") and job.
func (b *bench) fioColdScenario(ctx context.Context, repo string, l *builtLayer, fileInLayer string) (map[string][][]fioResult, error) {
	out := map[string][][]fioResult{}
	dir, err := b.newDir("fio-cold")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	stores := []string{"layerstore"}
	if b.opts.peer != "" {
		stores = append(stores, "peer")
	}
	for round := range b.opts.fioRounds {
		for _, store := range stores {
			if out[store] == nil {
				out[store] = make([][]fioResult, len(coldJobs))
			}
			for i, j := range coldJobs {
				if b.opts.fioOnly != nil && !b.opts.fioOnly.MatchString("cold "+j.Name) {
					continue
				}
				ddir := filepath.Join(dir, fmt.Sprintf("%s-%d-%d", store, round, i))
				if err := os.MkdirAll(ddir, 0o755); err != nil {
					return nil, err
				}
				r, err := b.coldJob(ctx, store, ddir, repo, l, fileInLayer, j)
				if err != nil {
					return nil, err
				}
				os.RemoveAll(ddir)
				out[store][i] = append(out[store][i], r)
				fmt.Fprintf(os.Stderr, "  fio cold %-10s %-30s %9.1f MiB/s %9.0f IOPS p50 %7.1fµs p99 %8.1fµs read %s fetched %s CPU %.2fs %s\n",
					store, j.Name, r.BW/(1<<20), r.IOPS, r.ClatP50, r.ClatP99, mib(int64(r.Bytes)), mib(r.Fetched), r.DaemonCPU, r.Err)
			}
		}
	}
	return out, nil
}

// coldJob starts store on an empty cache in dir, resolves the layer and runs j on demand.
func (b *bench) coldJob(ctx context.Context, store, dir, repo string, l *builtLayer, fileInLayer string, j fioJob) (fioResult, error) {
	var path string
	var cpu func() (float64, error)
	if store == "peer" {
		p, err := peer.Start(ctx, peer.Config{Bin: b.opts.peer, Dir: dir})
		if err != nil {
			return fioResult{}, err
		}
		defer p.Stop()
		layerDir, err := peer.LayerDir(p.Cfg.Mountpoint, b.ref(repo), l.tocDigest(), l.Digest)
		if err != nil {
			return fioResult{}, fmt.Errorf("peer lookup: %w: %s", err, p.Tail())
		}
		path, cpu = filepath.Join(layerDir, "diff", fileInLayer), p.CPU
	} else {
		d, err := benchd.Start(ctx, benchd.Config{Bin: b.bin, Dir: dir, RegistriesConf: b.regsConf, Passthrough: true})
		if err != nil {
			return fioResult{}, err
		}
		defer d.Stop()
		diff := b.diffDir(d.Cfg.Mountpoint, repo, l)
		if _, err := os.Stat(diff); err != nil {
			return fioResult{}, fmt.Errorf("lookup: %w: %s", err, d.Tail())
		}
		path, cpu = filepath.Join(diff, fileInLayer), d.CPU
	}
	dropCaches()
	before := b.reg.Stats(l.Digest)
	cpu0, _ := cpu()
	start := time.Now()
	r, err := fio(ctx, path, j, b.opts.fioRuntime)
	r.Seconds = time.Since(start).Seconds()
	if err != nil {
		r.Err = err.Error()
	}
	cpu1, _ := cpu()
	r.DaemonCPU = cpu1 - cpu0
	r.Fetched = b.reg.Stats(l.Digest).Bytes - before.Bytes
	return r, nil
}

// findCached returns the file of size bytes in the cache: the fio file (the cache also holds
// eStargz's one-byte landmark file).
func findCached(cacheDir string, size int64) (string, error) {
	all, err := filepath.Glob(filepath.Join(cacheDir, "files", "*", "*"))
	var found []string
	for _, p := range all {
		if info, err := os.Stat(p); err == nil && info.Size() == size {
			found = append(found, p)
		}
	}
	if err != nil || len(found) != 1 {
		return "", fmt.Errorf("finding the cached file: %v (%d candidates)", err, len(found))
	}
	return found[0], nil
}

// resident returns how many bytes of the file at path are in the page cache (mincore).
func resident(path string) int64 {
	f, err := os.Open(path)
	if err != nil {
		return -1
	}
	defer f.Close()
	info, err := f.Stat()
	if err != nil || info.Size() == 0 {
		return -1
	}
	m, err := unix.Mmap(int(f.Fd()), 0, int(info.Size()), unix.PROT_READ, unix.MAP_SHARED)
	if err != nil {
		return -1
	}
	defer unix.Munmap(m)
	page := os.Getpagesize()
	vec := make([]byte, (len(m)+page-1)/page)
	if _, _, errno := unix.Syscall(unix.SYS_MINCORE, uintptr(unsafe.Pointer(&m[0])), uintptr(len(m)), uintptr(unsafe.Pointer(&vec[0]))); errno != 0 {
		return -1
	}
	var n int64
	for _, v := range vec {
		if v&1 != 0 {
			n += int64(page)
		}
	}
	return n
}
