// Command readybench measures time to ready with podman, the way stargz-snapshotter's
// benchmark does: from `podman pull` to the container's first useful output, for real Debian
// images pulled lazily through an additional layer store (layerstore, and optionally a peer
// store) or in full by podman alone.
//
// It owns the whole experiment: images built offline with debootstrap and apt-get (python,
// gcc, and a 1.3 GB image whose workload reads three small files; with -image ml, a generated
// 6 GB image of an ML framework and its model: mlimage.go), cached in -images and
// pushed as gzip, eStargz, eStargz with the workload's files prioritized (an strace profile)
// and zstd:chunked to Debian's docker-registry on 127.0.0.1; a shaping proxy
// (benchmarks/internal/shaper) that puts the registry behind a link of given bandwidth and
// RTT for podman and the stores alike; podman 4.3.1 and podman 5 (built from its Go module)
// with private configuration and empty storage for every run; the floor of every cold lazy
// cell (floor.go); the report (Markdown and gnuplot PNGs). It needs root (FUSE,
// overlay mounts, drop_caches). See benchmarks/README.md.
//
//	cd benchmarks && go run ./cmd/readybench [flags]
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strings"
	"time"

	"github.com/layerstore/layerstore/benchmarks/internal/benchd"
	"github.com/layerstore/layerstore/benchmarks/internal/benchenv"
	"github.com/layerstore/layerstore/benchmarks/internal/podmanrun"
	"github.com/layerstore/layerstore/benchmarks/internal/shaper"
	"github.com/layerstore/layerstore/internal/testutil/dockerregistry"
	"github.com/layerstore/layerstore/internal/testutil/podman5"
	"github.com/layerstore/layerstore/internal/testutil/testregistry"
)

type options struct {
	samples     int
	links       []shaper.Link
	only        *regexp.Regexp
	modes       []string // of allModes; nil: all
	fullFormats []string
	imageNames  []string // of imageSpecs
	images      string
	workdir     string
	out         string
	timeout     time.Duration
	keep        bool
	runtimes    []string
	podman5     string
	peers       map[string]string // runtime -> peer binary
	daemonBin   string
	seed        uint64
	verbose     bool
	noPrefetch  bool
	quiet       time.Duration
}

func main() {
	var o options
	var links, only, full, runtimes, peers, modes, images string
	flag.IntVar(&o.samples, "samples", 5, "runs of every cell (p50 and p95 are reported)")
	flag.StringVar(&links, "links", "100mbit/10ms,1gbit/1ms,10gbit/0.2ms", "links between the runtime and the registry, RATE/RTT, comma-separated (\"unlimited\": loopback)")
	flag.StringVar(&only, "only", "", "run only the cells whose name (image:format:mode:link:cache, e.g. python:estargz:lazy:1gbit/1ms:cold) matches this regular expression; only the images and formats they pull are built")
	flag.StringVar(&modes, "modes", strings.Join(defaultModes, ","), "modes measured, comma-separated: "+strings.Join(allModes, ", ")+" (a peer's cells are lazy ones; pin: layerstore pins the image on a fresh cache, cold cells of the first runtime)")
	flag.StringVar(&images, "image", strings.Join(defaultImages, ","), "images measured, comma-separated: python, gcc, large, ml (ml: 6 GB, about 40 GB of disk for its formats and a run; its full pull takes 8 minutes at 100 Mbit/s)")
	flag.StringVar(&full, "full", fmtGzip, "formats also pulled in full by podman alone, comma-separated ("+strings.Join(allFormats, ", ")+")")
	flag.StringVar(&o.images, "images", "", "cache of the built images (root filesystems, blobs, registry storage); default benchmarks/work/images in the module")
	flag.StringVar(&o.workdir, "workdir", "", "where the run's temporary directory goes (stores' caches, podman storage); default benchmarks/work in the module")
	benchenv.OutFlag(&o.out, "readybench", ", and the plots next to it")
	flag.DurationVar(&o.timeout, "timeout", 60*time.Minute, "bound on the whole run, image building included")
	flag.BoolVar(&o.keep, "keep", false, "keep the run's temporary directory: daemon and podman logs, every run's podman storage and cache (much disk), warm caches")
	flag.StringVar(&runtimes, "runtimes", rtPodman4+","+rtPodman5, "runtimes, comma-separated: "+rtPodman4+" (podman in $PATH, Debian 12's 4.3.1), "+rtPodman5+" (podman "+podman5.Version+", see -podman5)")
	flag.StringVar(&o.podman5, "podman5", "", "podman 5 binary (default: podman "+podman5.Version+" built from its Go module on first use and kept in the user's cache directory, as the e2e suite does)")
	flag.StringVar(&peers, "peer", "", "another additional layer store (stargz-store's command line) measured as a second lazy column: RUNTIME=PATH per runtime, comma-separated (e.g. podman4=/opt/stargz-store-0.15.1/stargz-store,podman5=/opt/stargz-store-0.18.2/stargz-store), or PATH alone for podman4")
	benchd.Flag(&o.daemonBin)
	flag.Uint64Var(&o.seed, "seed", 0, "seed of the shuffled run order (default: from the clock; printed in the report)")
	flag.BoolVar(&o.verbose, "v", false, "print how long each step of every run took")
	flag.BoolVar(&o.noPrefetch, "no-prefetch", false, "run layerstore without its background fetch (a diagnostic: what the fetch costs the workload on a slow link)")
	flag.DurationVar(&o.quiet, "prefetch-quiet", 0, "run layerstore with this [prefetch] quiet (a diagnostic; default: the daemon's)")
	replotReport := flag.String("replot", "", "measure nothing: draw the plots of this report (readybench.md) again from its tables, next to it")
	flag.Parse()
	if *replotReport != "" {
		if err := replot(context.Background(), *replotReport); err != nil {
			fmt.Fprintln(os.Stderr, "readybench:", err)
			os.Exit(1)
		}
		return
	}
	err := o.parse(links, only, full, images)
	if err == nil {
		err = o.parseModes(modes)
	}
	if err == nil {
		err = o.parseRuntimes(runtimes, peers)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "readybench:", err)
		os.Exit(2)
	}

	benchenv.Run("readybench", o.timeout, func(ctx context.Context) error { return run(ctx, o) })
}

// makeDirs makes -images and -workdir (defaults under the module's work directory) and the
// run's temporary directory in -workdir, which it returns.
func (o *options) makeDirs(modDir string) (string, error) {
	if o.images == "" {
		o.images = filepath.Join(benchenv.WorkDir(modDir), "images")
	}
	if o.workdir == "" {
		o.workdir = benchenv.WorkDir(modDir)
	}
	for _, d := range []string{o.images, o.workdir} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return "", err
		}
	}
	return os.MkdirTemp(o.workdir, "readybench-")
}

// addRuntimes gives every runtime of -runtimes its binary (podman 5 built on first use),
// naming podman 5's version in the machine lines.
func (b *bench) addRuntimes(ctx context.Context, machine *[]string) error {
	for _, rt := range b.opts.runtimes {
		switch rt {
		case rtPodman4:
			b.runtimes[rt] = "podman"
		case rtPodman5:
			p5 := b.opts.podman5
			if p5 == "" {
				if _, ok := podman5.Built(ctx); !ok {
					fmt.Fprintf(os.Stderr, "building podman %s from its Go module (a few minutes; kept in the user's cache directory)\n", podman5.Version)
				}
				var err error
				if p5, err = podman5.Build(ctx, b.work); err != nil {
					return fmt.Errorf("podman 5: %w", err)
				}
			}
			v, ok := podmanrun.Version5(p5)
			if !ok {
				return fmt.Errorf("-podman5 %s: %q is not podman 5", p5, v)
			}
			b.runtimes[rt] = p5
			*machine = append(*machine, "podman 5: "+v+" (built from github.com/containers/podman/v5, tags: "+podman5.Tags+")")
		}
	}
	return nil
}

// addPeer adds the -peer store, naming each runtime's binary in the machine lines.
func (b *bench) addPeer(machine *[]string) error {
	if len(b.opts.peers) > 0 {
		p := &peerStore{bins: b.opts.peers}
		b.stores[p.name()] = p
		for _, rt := range b.opts.runtimes {
			if path, ok := b.opts.peers[rt]; ok {
				v := benchenv.ToolVersion(path, "--version")
				if _, err := os.Stat(path); err != nil {
					return fmt.Errorf("-peer %s: %w", rt, err)
				} else if v == "not installed" {
					v = "no --version flag"
				}
				*machine = append(*machine, fmt.Sprintf("peer with %s: %s: %s", rt, filepath.Base(path), v))
			}
		}
	}
	return nil
}

func (o *options) parse(links, only, full, images string) error {
	if o.samples < 1 {
		return errors.New("-samples must be at least 1")
	}
	for _, name := range strings.Split(images, ",") {
		if name = strings.TrimSpace(name); name == "" {
			continue
		}
		if !slices.ContainsFunc(imageSpecs, func(img imageSpec) bool { return img.name == name }) {
			return fmt.Errorf("-image: no image %q", name)
		}
		o.imageNames = append(o.imageNames, name)
	}
	for _, s := range strings.Split(links, ",") {
		l, err := shaper.ParseLink(strings.TrimSpace(s))
		if err != nil {
			return err
		}
		o.links = append(o.links, l)
	}
	if only != "" {
		re, err := regexp.Compile(only)
		if err != nil {
			return fmt.Errorf("-only: %w", err)
		}
		o.only = re
	}
	for _, f := range strings.Split(full, ",") {
		if f = strings.TrimSpace(f); f == "" {
			continue
		}
		if !slices.Contains(allFormats, f) {
			return fmt.Errorf("-full: no format %q", f)
		}
		o.fullFormats = append(o.fullFormats, f)
	}
	if o.seed == 0 {
		o.seed = uint64(time.Now().UnixNano())
	}
	return nil
}

// parseModes parses -modes: modes of allModes, comma-separated.
func (o *options) parseModes(modes string) error {
	o.modes = []string{}
	for _, m := range strings.Split(modes, ",") {
		if m = strings.TrimSpace(m); m == "" {
			continue
		}
		if !slices.Contains(allModes, m) {
			return fmt.Errorf("-modes: no mode %q (%s)", m, strings.Join(allModes, ", "))
		}
		if !slices.Contains(o.modes, m) {
			o.modes = append(o.modes, m)
		}
	}
	if len(o.modes) == 0 {
		return errors.New("-modes: none")
	}
	return nil
}

// The runtimes.
const (
	rtPodman4 = "podman4" // podman in $PATH: Debian 12's 4.3.1, lookups by blob digest
	rtPodman5 = "podman5" // podman 5 built from its module: lookups by TOC digest
)

// parseRuntimes parses -runtimes and -peer: RUNTIME=PATH pairs, or one PATH for podman4.
func (o *options) parseRuntimes(runtimes, peers string) error {
	o.runtimes = nil
	for _, rt := range strings.Split(runtimes, ",") {
		if rt = strings.TrimSpace(rt); rt == "" {
			continue
		}
		if rt != rtPodman4 && rt != rtPodman5 {
			return fmt.Errorf("-runtimes: no runtime %q (%s, %s)", rt, rtPodman4, rtPodman5)
		}
		if !slices.Contains(o.runtimes, rt) {
			o.runtimes = append(o.runtimes, rt)
		}
	}
	if len(o.runtimes) == 0 {
		return errors.New("-runtimes: none")
	}
	o.peers = map[string]string{}
	if peers = strings.TrimSpace(peers); peers == "" {
		return nil
	}
	if !strings.Contains(peers, "=") {
		o.peers[rtPodman4] = peers
	} else {
		for _, kv := range strings.Split(peers, ",") {
			rt, path, ok := strings.Cut(strings.TrimSpace(kv), "=")
			if !ok || path == "" {
				return fmt.Errorf("-peer: %q is not RUNTIME=PATH", kv)
			}
			if rt != rtPodman4 && rt != rtPodman5 {
				return fmt.Errorf("-peer: no runtime %q", rt)
			}
			if _, dup := o.peers[rt]; dup {
				return fmt.Errorf("-peer: %s given twice", rt)
			}
			o.peers[rt] = path
		}
	}
	for rt, path := range o.peers {
		if filepath.Base(path) == "layerstore" {
			return errors.New("-peer: the peer's binary must not be called layerstore")
		}
		if !slices.Contains(o.runtimes, rt) {
			delete(o.peers, rt) // not measured: -runtimes leaves the runtime out
		}
	}
	return nil
}

func run(ctx context.Context, o options) error {
	started := time.Now()
	if err := podmanrun.Preflight("FUSE and overlay mounts, drop_caches, podman", podmanrun.Tool{Name: "strace", Package: "strace"},
		podmanrun.Tool{Name: "unshare", Package: "util-linux"}); err != nil {
		return err
	}
	modDir, err := benchenv.ModuleDir()
	if err != nil {
		return err
	}
	work, err := o.makeDirs(modDir)
	if err != nil {
		return err
	}
	machine := append(benchenv.Machine(modDir, work, o.daemonBin), podmanrun.ToolVersions()...)
	defer func() {
		podmanrun.UnmountUnder(work)
		if o.keep {
			fmt.Fprintln(os.Stderr, "work directory kept:", work)
		} else {
			os.RemoveAll(work)
		}
	}()
	// estargz.Build and the harness write temporary files as large as a layer: not in /tmp.
	os.Setenv("TMPDIR", work)
	// The proxy's delay lines park goroutines on timerfds, but podman and the daemon still run
	// beside it on two cores: give the runtime room for goroutines woken together.
	runtime.GOMAXPROCS(max(runtime.GOMAXPROCS(0), 8))

	bin := filepath.Join(work, "bin")
	if err := os.MkdirAll(bin, 0o755); err != nil {
		return err
	}
	daemon, err := benchd.Binary(ctx, modDir, o.daemonBin, bin)
	if err != nil {
		return err
	}

	// The stores read the registry's address (the shaping proxy's, started once the images
	// are pushed) from this file when they start, which is after it is written.
	regConf := filepath.Join(work, "registries.conf")
	reg, err := dockerregistry.Start(ctx, dockerregistry.Config{DataDir: filepath.Join(o.images, "registry"), ConfDir: work})
	if err != nil {
		return err
	}
	defer reg.Stop()
	images := &imageCache{dir: o.images, modDir: modDir, binDir: bin}
	b := &bench{opts: o, work: work, reg: reg, images: images, warm: map[string]string{}, runtimes: map[string]string{},
		stores: map[string]store{"layerstore": &layerstoreStore{bin: daemon, registriesConf: regConf, prefetch: !o.noPrefetch, quiet: o.quiet}}}
	if err := b.addRuntimes(ctx, &machine); err != nil {
		return err
	}
	if err := b.addPeer(&machine); err != nil {
		return err
	}
	// The cells first: only the images and formats they pull are built and pushed.
	cells := b.plan()
	if len(cells) == 0 {
		return errors.New("no cell matches -only")
	}
	if err := images.ensure(ctx, reg, needed(cells)); err != nil {
		return fmt.Errorf("building the images: %w", err)
	}
	if v2 := neededV2(cells); len(v2) > 0 {
		if err := images.ensureV2(ctx, reg, v2); err != nil {
			return fmt.Errorf("building the new versions of the images: %w", err)
		}
	}
	fmt.Fprintf(os.Stderr, "images ready (%.0fs)\n", time.Since(started).Seconds())

	proxy, err := shaper.Listen("127.0.0.1:0", reg.Host, o.links[0])
	if err != nil {
		return err
	}
	defer proxy.Close()
	if err := os.WriteFile(regConf, []byte(testregistry.RegistriesConf(proxy.Addr())), 0o644); err != nil {
		return err
	}
	b.proxy = proxy
	b.runBase = fmt.Sprintf("/run/readybench-%d", os.Getpid())
	defer func() { podmanrun.UnmountUnder(b.runBase); os.RemoveAll(b.runBase) }()
	fmt.Fprintf(os.Stderr, "%d cells x %d samples = %d runs, shuffled (seed %d)\n", len(cells), o.samples, len(cells)*o.samples, o.seed)
	measureStart := time.Now()
	results, err := b.measure(ctx, cells)
	if err != nil {
		return err
	}
	rep := &report{opts: o, b: b, cells: cells, results: results, started: started,
		measureSeconds: time.Since(measureStart).Seconds(), machine: machine}
	return rep.write(ctx, modDir)
}
