// Command lazybench measures what issue 4 asks of layerstore, against the real daemon:
//
//  1. Background fetch: how long the daemon takes to make a realistic eStargz layer
//     (several hundred MB, thousands of small files and a few large ones) fully local, with
//     its CPU time and the registry requests it made, against the physical limit (one plain
//     GET of the blob, gunzipped and untarred as it streams in); and the latency of reads
//     through the mount while that fetch runs.
//  2. fio on a fully cached large file: through the mount with FUSE passthrough, through
//     the mount without it, and natively on the same file.
//
// It runs a registry on 127.0.0.1 in process, builds the daemon with `go build` (or takes
// -daemon), starts `layerstore serve` on temporary mountpoints and cache directories, and
// removes everything when done, failed or interrupted. It needs root (FUSE mounts,
// drop_caches) and fio. See benchmarks/README.md.
//
//	cd benchmarks && go run ./cmd/lazybench [flags]
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/layerstore/layerstore/benchmarks/internal/benchd"
	"github.com/layerstore/layerstore/benchmarks/internal/benchenv"
	"github.com/layerstore/layerstore/internal/testutil/testregistry"
)

type options struct {
	out          string
	runs         int
	small        int
	medium       int
	large        int64
	fioSize      int64
	fioRuntime   time.Duration
	fioRounds    int
	fioOnly      *regexp.Regexp
	probes       int
	probeGap     time.Duration
	skipFetch    bool
	skipFio      bool
	blobs        string
	daemonBin    string
	workdir      string
	timeout      time.Duration
	fetchTimeout time.Duration
	inproc       bool
	cpuProfile   string
	traceFile    string
	keepWork     bool
	verbose      bool
	peer         string
}

func main() {
	if len(os.Args) > 1 && os.Args[1] == "baseline" {
		if err := runBaselineChild(os.Args[2:]); err != nil {
			fmt.Fprintln(os.Stderr, "baseline:", err)
			os.Exit(1)
		}
		return
	}
	var o options
	var large, fioSize sizeFlag = 256 << 20, 1 << 30
	benchenv.OutFlag(&o.out, "lazybench", "")
	flag.IntVar(&o.runs, "runs", 3, "rounds of (baseline, baseline to disk, background fetch); medians are reported")
	flag.IntVar(&o.small, "small", 6000, "small files (1-50 KiB, text) in the rootfs layer")
	flag.IntVar(&o.medium, "medium", 100, "library-sized files (64 KiB-3 MiB, binary) in the rootfs layer")
	flag.Var(&large, "large", "total size of the three large files (text, binary, random) in the rootfs layer")
	flag.Var(&fioSize, "fio-size", "size of the fio file")
	flag.DurationVar(&o.fioRuntime, "fio-runtime", 5*time.Second, "duration of each random-read fio job")
	fioOnly := flag.String("fio-only", "", "run only the fio jobs whose name matches this regular expression")
	flag.IntVar(&o.fioRounds, "fio-rounds", 2, "rounds of the fio matrix over the three targets (alternating); medians are reported")
	flag.IntVar(&o.probes, "probes", 40, "reads through the mount during a background fetch")
	flag.DurationVar(&o.probeGap, "probe-gap", 20*time.Millisecond, "pause between those reads")
	flag.BoolVar(&o.skipFetch, "skip-fetch", false, "skip the background fetch measurements")
	flag.BoolVar(&o.skipFio, "skip-fio", false, "skip the fio measurements")
	flag.StringVar(&o.blobs, "blobs", "", "keep built layer blobs in this directory and reuse them (default: build each time)")
	benchd.Flag(&o.daemonBin)
	flag.StringVar(&o.workdir, "workdir", os.TempDir(), "where temporary mountpoints and caches go (their filesystem is the one measured as native)")
	flag.DurationVar(&o.timeout, "timeout", 10*time.Minute, "bound on the whole run")
	flag.DurationVar(&o.fetchTimeout, "fetch-timeout", 3*time.Minute, "bound on one background fetch")
	flag.BoolVar(&o.inproc, "inproc", false, "run the background fetch in this process (layer and cache packages, no FUSE) instead of the daemon; for profiling")
	flag.StringVar(&o.cpuProfile, "cpuprofile", "", "with -inproc: write a CPU profile of the fetch")
	flag.StringVar(&o.traceFile, "trace", "", "with -inproc: write an execution trace of the fetch (go tool trace -pprof=syscall for time in fsync)")
	flag.BoolVar(&o.keepWork, "keep", false, "keep the work directory (daemon logs) for inspection")
	flag.BoolVar(&o.verbose, "v", false, "print every read made during the background fetch")
	flag.StringVar(&o.peer, "peer", "", "another additional layer store binary with stargz-store's command line (e.g. stargz-store) to run the fio cases against too")
	flag.Parse()
	o.large, o.fioSize = int64(large), int64(fioSize)
	if *fioOnly != "" {
		re, err := regexp.Compile(*fioOnly)
		if err != nil {
			fmt.Fprintln(os.Stderr, "lazybench: -fio-only:", err)
			os.Exit(2)
		}
		o.fioOnly = re
	}

	benchenv.Run("lazybench", o.timeout, func(ctx context.Context) error { return run(ctx, o) })
}

func run(ctx context.Context, o options) error {
	if os.Geteuid() != 0 {
		return errors.New("needs root: FUSE mounts and drop_caches")
	}
	if !o.skipFio {
		if _, err := exec.LookPath("fio"); err != nil {
			return errors.New("fio not found (apt-get install -y fio), or use -skip-fio")
		}
	}
	modDir, err := benchenv.ModuleDir()
	if err != nil {
		return err
	}
	// Every round's files are kept until the end (see bench.newDir): about two copies of the
	// layer's content per round, two more for the reads, and the fio file.
	need := int64(2*o.runs+3)*(int64(o.small)*26<<10+int64(o.medium)*3<<19+o.large) + 2*o.fioSize
	var st unix.Statfs_t
	if err := unix.Statfs(o.workdir, &st); err == nil && int64(st.Bavail)*int64(st.Bsize) < need {
		return fmt.Errorf("%s has %s free, the run needs about %s (see -workdir)", o.workdir, mib(int64(st.Bavail)*int64(st.Bsize)), mib(need))
	}
	work, err := os.MkdirTemp(o.workdir, "lazybench-")
	if err != nil {
		return err
	}
	if o.keepWork {
		fmt.Fprintln(os.Stderr, "work directory:", work)
	} else {
		defer os.RemoveAll(work)
	}

	b := &bench{opts: o, work: work}
	b.bin = o.daemonBin
	if b.bin == "" && !(o.inproc && o.skipFio) {
		b.bin = filepath.Join(work, "layerstore")
		if err := benchd.Build(ctx, modDir, b.bin); err != nil {
			return err
		}
	}
	reg, err := testregistry.Start()
	if err != nil {
		return err
	}
	defer reg.Close()
	b.reg = reg
	b.regsConf = filepath.Join(work, "registries.conf")
	if err := os.WriteFile(b.regsConf, []byte(testregistry.RegistriesConf(reg.Host)), 0o644); err != nil {
		return err
	}

	rep := &report{opts: o, machine: machineInfo(modDir, work, o.daemonBin)}
	if !o.skipFetch {
		if err := b.fetchScenario(ctx, rep); err != nil {
			return err
		}
	}
	if !o.skipFio && !o.inproc {
		spec := fioSpec(2, o.fioSize)
		fmt.Fprintf(os.Stderr, "building the fio layer (%s)\n", mib(o.fioSize))
		l, err := spec.build(o.blobs)
		if err != nil {
			return err
		}
		if _, err := reg.Push(ctx, "bench/fio:latest", []testregistry.LayerBlob{{Blob: l.Blob, MediaType: l.MediaType, Annotations: l.Annotations, DiffID: l.DiffID}}); err != nil {
			return err
		}
		rep.fioLayer = l
		if rep.fioCold, err = b.fioColdScenario(ctx, "bench/fio", l, spec.Files[0].Path); err != nil {
			return err
		}
		rep.fio, rep.fioNotes, err = b.fioScenario(ctx, "bench/fio", l, spec.Files[0].Path)
		if err != nil {
			return err
		}
	}
	return benchenv.WriteReport(benchenv.ReportPath(modDir, "lazybench", o.out), rep.markdown())
}

// fetchScenario measures the background fetch of the rootfs layer and its baseline.
func (b *bench) fetchScenario(ctx context.Context, rep *report) error {
	o := b.opts
	spec := rootfsSpec(1, o.small, o.medium, o.large)
	fmt.Fprintf(os.Stderr, "building the rootfs layer: %d files, %s uncompressed\n", len(spec.Files), mib(spec.uncompressed()))
	l, err := spec.build(o.blobs)
	if err != nil {
		return err
	}
	rep.spec, rep.layer = spec, l
	fmt.Fprintf(os.Stderr, "  eStargz blob %s (built in %.1fs)\n", mib(l.Size), l.BuildTime)
	if _, err := b.reg.Push(ctx, "bench/rootfs:latest", []testregistry.LayerBlob{{Blob: l.Blob, MediaType: l.MediaType, Annotations: l.Annotations, DiffID: l.DiffID}}); err != nil {
		return err
	}
	url := fmt.Sprintf("http://%s/v2/bench/rootfs/blobs/%s", b.reg.Host, l.Digest)
	// Runs alternate (baseline, hashed, baseline to disk, background fetch), so that drifts of
	// the machine hit all alike; each fetch is also compared with the baseline of its round.
	for i := range o.runs {
		dropCaches()
		r, err := runBaseline(ctx, url, "", false)
		if err != nil {
			return err
		}
		fmt.Fprintf(os.Stderr, "round %d: baseline GET+gunzip+untar (discard): %.2fs, CPU %.2fs\n", i+1, r.Seconds, r.CPU)
		rep.baseline = append(rep.baseline, r)

		dropCaches()
		if r, err = runBaseline(ctx, url, "", true); err != nil {
			return err
		}
		fmt.Fprintf(os.Stderr, "round %d: baseline GET+gunzip+untar+sha256 (discard): %.2fs, CPU %.2fs\n", i+1, r.Seconds, r.CPU)
		rep.baselineHash = append(rep.baselineHash, r)

		dir, err := b.newDir("untar")
		if err != nil {
			return err
		}
		dropCaches()
		r, err = runBaseline(ctx, url, dir, false)
		if err != nil {
			return err
		}
		fmt.Fprintf(os.Stderr, "round %d: baseline GET+gunzip+untar to disk+syncfs: %.2fs, CPU %.2fs\n", i+1, r.Seconds, r.CPU)
		rep.baselineDisk = append(rep.baselineDisk, r)

		var f fetchRun
		if o.inproc {
			var probes []probe
			if i == o.runs-1 && o.probes > 0 {
				probes = pickProbes(spec, o.probes, 3) // the last run also reads, in process
			}
			f, err = b.fetchInProcess(ctx, "bench/rootfs", l, probes)
			if len(probes) > 0 {
				rep.during = f
				s := summarize(f.Probes, true)
				fmt.Fprintf(os.Stderr, "reads (in process) during the fetch: %d, p50 %.1fms, max %.1fms\n", s.N, s.P50*1e3, s.Max*1e3)
				b.printProbes(f.Probes)
			}
		} else {
			f, err = b.fetchOnce(ctx, "bench/rootfs", l, true, nil)
		}
		if err != nil {
			return fmt.Errorf("background fetch: %w", err)
		}
		fmt.Fprintf(os.Stderr, "round %d: background fetch: lookup %.3fs, fully local after %.2fs (daemon %.2fs), CPU %.2fs, %d+%d requests, %s sent; %.2fx the baseline\n",
			i+1, f.Lookup, f.Total, f.Daemon, f.CPU, f.Requests.Ranged, f.Requests.Full, mib(f.Requests.Bytes), f.Total/rep.baseline[i].Seconds)
		rep.fetch = append(rep.fetch, f)
	}
	if o.inproc || o.probes == 0 {
		return nil
	}
	probes := pickProbes(spec, o.probes, 3)
	r, err := b.fetchOnce(ctx, "bench/rootfs", l, true, probes)
	if err != nil {
		return fmt.Errorf("reads during the background fetch: %w", err)
	}
	rep.during = r
	b.printProbes(r.Probes)
	s := summarize(r.Probes, true)
	fmt.Fprintf(os.Stderr, "reads during the fetch: %d, p50 %.1fms, max %.1fms (fetch took %.2fs)\n", s.N, s.P50*1e3, s.Max*1e3, r.Total)
	r, err = b.fetchOnce(ctx, "bench/rootfs", l, false, probes)
	if err != nil {
		return fmt.Errorf("reads without background fetch: %w", err)
	}
	rep.idle = r
	s = summarize(r.Probes, false)
	fmt.Fprintf(os.Stderr, "the same reads, no background fetch: %d, p50 %.1fms, max %.1fms\n", s.N, s.P50*1e3, s.Max*1e3)
	return nil
}

func (b *bench) printProbes(ps []probeResult) {
	if !b.opts.verbose {
		return
	}
	for _, p := range ps {
		fmt.Fprintf(os.Stderr, "  during=%t %7.1fms %s@%d+%d %s\n", p.During, p.Seconds*1e3, p.Path, p.Off, p.Len, p.Err)
	}
}

// sizeFlag is a byte count with an optional KiB/MiB/GiB suffix.
type sizeFlag int64

func (s *sizeFlag) String() string { return fmt.Sprint(int64(*s)) }
func (s *sizeFlag) Set(v string) error {
	mult := int64(1)
	for _, u := range []struct {
		suf string
		m   int64
	}{{"KiB", 1 << 10}, {"MiB", 1 << 20}, {"GiB", 1 << 30}, {"K", 1 << 10}, {"M", 1 << 20}, {"G", 1 << 30}} {
		if n, ok := strings.CutSuffix(v, u.suf); ok {
			v, mult = n, u.m
			break
		}
	}
	var n int64
	if _, err := fmt.Sscan(v, &n); err != nil || n < 0 {
		return fmt.Errorf("size %q", v)
	}
	*s = sizeFlag(n * mult)
	return nil
}

func mib(n int64) string { return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20)) }
