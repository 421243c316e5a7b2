// Command scalebench measures how layerstore scales, against the real daemon:
//
//  1. idle: the daemon started and mounted, nothing resolved: its resident memory (VmRSS,
//     VmHWM) after a settle, and the CPU its start took.
//  2. estargz-100k, estargz-1m, zstdchunked-100k, zstdchunked-1m: one layer of 100 000 and
//     1 000 000 entries (a tree of directories of about 100 entries, small text files of
//     4 B-4 KiB, empty files, symlinks), as eStargz (estargz.Build) and as zstd:chunked (c/storage's
//     compressor): the time of the first stat of <mnt>/<base64 ref>/<TOC digest>/diff (manifest,
//     TOC fetch, verification, parse), plus an open and readdir of the root of diff; the
//     daemon's CPU over that time and its memory afterwards.
//  3. layers50-seq, layers50-conc: an image of 50 layers of 300 entries, every layer looked
//     up as a runtime does (stat diff, info, blob; read info), one after the other and all at once.
//  4. images100: 100 images (distinct references) of one small layer each, looked up one
//     after the other: time, and the daemon's memory with 100 images mounted.
//  5. fetch-100k: the 100 000-entry eStargz layer made fully local by the background fetch:
//     time and the daemon's CPU per GB fetched (a worst case: every file is a few KiB).
//  6. fetch-anchor: the anchor image (two eStargz layers: 2000 files of random bytes and one
//     256 MiB file, about 690 MB) made fully local by the background fetch: the daemon's
//     anonymous memory (RssAnon) after it, the figure stargz-store gives (29 MB).
//
// Every case reports the daemon's VmRSS, RssAnon and VmHWM after a settle.
//
// Every case runs -runs times, each on a fresh daemon with an empty cache (prefetch off, so
// that resolution is measured alone, except in fetch-100k), and the medians are reported.
// It runs a registry on 127.0.0.1 in process (internal/testutil/testregistry), builds the layers once
// into -blobs, builds the daemon with `go build ./cmd/layerstore` (or takes -daemon), starts
// `layerstore serve` through benchmarks/internal/benchd, and removes its work directory when
// done, failed or interrupted. It needs root (FUSE mounts). See benchmarks/README.md.
//
//	cd benchmarks && go run ./cmd/scalebench [flags]
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/layerstore/layerstore/benchmarks/internal/benchd"
	"github.com/layerstore/layerstore/benchmarks/internal/benchenv"
	"github.com/layerstore/layerstore/internal/testutil/testregistry"
)

type options struct {
	out       string
	runs      int
	only      *regexp.Regexp
	entries   []int
	layers    int
	images    int
	blobs     string
	daemonBin string
	workdir   string
	timeout   time.Duration
	prefetch  bool
	settle    time.Duration
	keepWork  bool
}

func main() {
	var o options
	benchenv.OutFlag(&o.out, "scalebench", "")
	flag.IntVar(&o.runs, "runs", 3, "runs of every case, each on a fresh daemon; medians are reported")
	only := flag.String("only", "", "run only the cases whose name matches this regular expression (idle, estargz-100k, zstdchunked-1m, layers50-seq, images100, fetch-100k, ...)")
	entries := flag.String("entries", "100000,1000000", "entry counts of the large layers, comma-separated")
	flag.IntVar(&o.layers, "layers", 50, "layers of the many-layer image")
	flag.IntVar(&o.images, "images", 100, "images of the many-image case")
	flag.StringVar(&o.blobs, "blobs", "", "keep built layer blobs in this directory and reuse them (default benchmarks/work/scalebench-blobs in the module)")
	benchd.Flag(&o.daemonBin)
	flag.StringVar(&o.workdir, "workdir", "", "where temporary mountpoints, caches and build files go (default benchmarks/work in the module)")
	flag.DurationVar(&o.timeout, "timeout", 20*time.Minute, "bound on the whole run")
	flag.BoolVar(&o.prefetch, "prefetch", false, "leave the background fetch on in every case (it starts as soon as a layer is resolved)")
	flag.DurationVar(&o.settle, "settle", time.Second, "how long the daemon is left alone after a case before its memory is read")
	flag.BoolVar(&o.keepWork, "keep", false, "keep the work directory (daemon logs) for inspection")
	flag.Parse()
	if err := o.parse(*only, *entries); err != nil {
		fmt.Fprintln(os.Stderr, "scalebench:", err)
		os.Exit(2)
	}
	benchenv.Run("scalebench", o.timeout, func(ctx context.Context) error { return run(ctx, o) })
}

func (o *options) parse(only, entries string) error {
	if only != "" {
		re, err := regexp.Compile(only)
		if err != nil {
			return fmt.Errorf("-only: %w", err)
		}
		o.only = re
	}
	for _, f := range strings.Split(entries, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < perDir {
			return fmt.Errorf("-entries: %q is not a count of at least %d", f, perDir)
		}
		o.entries = append(o.entries, n)
	}
	if o.runs < 1 || o.layers < 1 || o.images < 1 {
		return errors.New("-runs, -layers and -images must be at least 1")
	}
	return nil
}

// count names an entry count: 100k, 1m, 2500.
func count(n int) string {
	switch {
	case n%1000000 == 0:
		return fmt.Sprintf("%dm", n/1000000)
	case n%1000 == 0:
		return fmt.Sprintf("%dk", n/1000)
	}
	return strconv.Itoa(n)
}

func run(ctx context.Context, o options) error {
	if os.Geteuid() != 0 {
		return errors.New("needs root: FUSE mounts")
	}
	modDir, err := benchenv.ModuleDir()
	if err != nil {
		return err
	}
	if o.workdir == "" {
		o.workdir = benchenv.WorkDir(modDir)
	}
	if o.blobs == "" {
		o.blobs = filepath.Join(benchenv.WorkDir(modDir), "scalebench-blobs")
	}
	if err := os.MkdirAll(o.workdir, 0o755); err != nil {
		return err
	}
	work, err := os.MkdirTemp(o.workdir, "scalebench-")
	if err != nil {
		return err
	}
	if o.keepWork {
		fmt.Fprintln(os.Stderr, "work directory:", work)
	} else {
		defer os.RemoveAll(work)
	}
	// estargz.Build keeps its temporary files in TMPDIR: keep them in the work directory.
	if err := os.Setenv("TMPDIR", work); err != nil {
		return err
	}
	started := time.Now()
	rep := &report{opts: o, machine: benchenv.Machine(modDir, work, o.daemonBin)}
	b := &bench{opts: o, work: work}
	if b.bin, err = benchd.Binary(ctx, modDir, o.daemonBin, work); err != nil {
		return err
	}
	rep.daemon = daemonInfo(b.bin, o.daemonBin != "")
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
	bl := &builder{dir: o.blobs, modDir: modDir, workDir: work, logf: logf}
	for _, c := range b.cases(ctx, bl, rep) {
		if o.only != nil && !o.only.MatchString(c.name) {
			continue
		}
		if err := runCase(ctx, o, c, rep); err != nil {
			// Interrupted or out of time: show what was measured, keep the results file as it was.
			rep.duration = time.Since(started)
			fmt.Print(rep.markdown())
			return fmt.Errorf("%s: %w", c.name, err)
		}
	}
	rep.duration = time.Since(started)
	return benchenv.WriteReport(benchenv.ReportPath(modDir, "scalebench", o.out), rep.markdown())
}

// runCase prepares c and runs it o.runs times, recording the samples, or the error that
// stopped it, in the report. It returns an error only when ctx ended.
func runCase(ctx context.Context, o options, c *benchCase, rep *report) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	res := &caseResult{name: c.name, what: c.what}
	rep.cases = append(rep.cases, res)
	if c.prep != nil {
		if err := c.prep(); err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			res.err = fmt.Sprintf("preparing: %v", err)
			logf("%s: %s", c.name, res.err)
			return nil
		}
	}
	res.large = c.large
	for i := range o.runs {
		s, err := c.run()
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if err != nil {
			res.err = fmt.Sprintf("run %d: %v", i+1, err)
			logf("%s: %s", c.name, res.err)
			return nil
		}
		logf("%s run %d: %s", c.name, i+1, s.line())
		res.samples = append(res.samples, s)
	}
	return nil
}

func logf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "%s "+format+"\n", append([]any{time.Now().Format("15:04:05")}, args...)...)
}
