// Command soak is a chaos soak of layerstore with real podman: a fault-injecting proxy between
// the daemon and the registry (connection resets mid-body, 503 with and without Retry-After,
// truncated bodies, stalls), kill -9 of the daemon during runs (restarted at once with its FUSE
// session by `layerstore keep`), and every container's output compared byte for byte with the
// output of a normal pull.
//
// It builds the daemon and synthetic images offline (a static busybox and a few hundred files
// of random bytes, as eStargz and zstd:chunked), pushes them to Debian's docker-registry on
// 127.0.0.1, then runs containers in a loop for -duration, alternating podman 4.3.1 and podman
// 5 (when the e2e suite built it), and writes a Markdown report. It needs root (FUSE, overlay
// mounts, podman). See benchmarks/README.md.
//
//	cd benchmarks && go run ./cmd/soak [flags]
package main

import (
	"context"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"time"

	"github.com/layerstore/layerstore/benchmarks/internal/benchd"
	"github.com/layerstore/layerstore/benchmarks/internal/benchenv"
	"github.com/layerstore/layerstore/benchmarks/internal/podmanrun"
	"github.com/layerstore/layerstore/internal/testutil/dockerregistry"
	"github.com/layerstore/layerstore/internal/testutil/podman5"
)

type options struct {
	duration      time.Duration
	killEvery     int
	rates         faultRates
	stall         time.Duration
	files         int
	maxFileSize   int64
	podmanTimeout time.Duration
	daemonBin     string
	podman5       string
	busybox       string
	workdir       string
	out           string
	keep          bool
	seed          uint64
}

func main() {
	var o options
	p5, _ := podman5.Path()
	flag.DurationVar(&o.duration, "duration", 30*time.Minute, "how long new runs are started; the run under way then finishes (bounded by -podman-timeout)")
	flag.IntVar(&o.killEvery, "kill-every", 5, "kill -9 the daemon at a random moment of every Nth run (0: never)")
	flag.Float64Var(&o.rates.Reset, "reset", 0.03, "fraction of requests whose connection is reset mid-body")
	flag.Float64Var(&o.rates.Unavailable, "unavailable", 0.03, "fraction of requests answered 503 (half of them with Retry-After: 1-3)")
	flag.Float64Var(&o.rates.Truncate, "truncate", 0.03, "fraction of requests whose body is cut short (Content-Length of the whole, then the connection closed)")
	flag.Float64Var(&o.rates.Stall, "stall-rate", 0.01, "fraction of requests that stall (nothing sent, or part of the body) and are then closed")
	flag.DurationVar(&o.stall, "stall", 60*time.Second, "longest stall; each lasts between a third of it and all of it (default: 20-60 s)")
	flag.IntVar(&o.files, "files", 200, "files in each image's data layer (80% of 1-64 KiB, 20% of 64 KiB to -max-file-size)")
	flag.Int64Var(&o.maxFileSize, "max-file-size", 3<<20, "largest file, in bytes")
	flag.DurationVar(&o.podmanTimeout, "podman-timeout", 5*time.Minute, "bound of every podman command")
	benchd.Flag(&o.daemonBin)
	flag.StringVar(&o.podman5, "podman5", p5, "podman 5 binary (the e2e suite and readybench build it there: internal/testutil/podman5); runs use podman 4.3.1 alone when it is missing; \"\" for none")
	flag.StringVar(&o.busybox, "busybox", "/bin/busybox", "a static busybox for the images (Debian: busybox-static)")
	flag.StringVar(&o.workdir, "workdir", "", "where the soak's temporary directory goes (default $TMPDIR)")
	benchenv.OutFlag(&o.out, "soak", "")
	flag.BoolVar(&o.keep, "keep", false, "keep the temporary directory (daemon logs, registry, storage)")
	flag.Uint64Var(&o.seed, "seed", 0, "seed of the run order, faults and kill moments (default: from the clock; printed in the report)")
	flag.Parse()
	if err := o.rates.validate(); err != nil {
		fmt.Fprintln(os.Stderr, "soak:", err)
		os.Exit(2)
	}
	if o.seed == 0 {
		o.seed = uint64(time.Now().UnixNano())
	}
	// Setup (daemon, harness, images, references) takes a few minutes; then the soak, then the
	// last run's bound and the cleanup.
	benchenv.Run("soak", 20*time.Minute+o.duration+o.podmanTimeout+5*time.Minute, func(ctx context.Context) error { return run(ctx, o) })
}

// pushImages makes the soak's two families of content and pushes their images.
func (s *soak) pushImages(ctx context.Context) error {
	contents := []*content{
		makeContent("a", s.o.files, s.o.maxFileSize, 1),
		makeContent("b", s.o.files, s.o.maxFileSize, 2),
	}
	var err error
	s.images, err = pushImages(ctx, s.reg, s.modDir, s.work, s.o.busybox, contents)
	return err
}

// configs are the digests of the images' configs, as the proxy tells their requests.
func (s *soak) configs() []string {
	var configs []string
	for _, img := range s.images {
		configs = append(configs, img.Config.String())
	}
	return configs
}

// writeDaemonRegistries writes the daemon's registries.conf at path: the registry's references
// rewritten to the proxy, so that the daemon reaches the registry through it only.
func (s *soak) writeDaemonRegistries(path string) error {
	conf := fmt.Sprintf("[[registry]]\nprefix = %q\nlocation = %q\ninsecure = true\n\n[[registry]]\nlocation = %q\ninsecure = true\n",
		s.reg.Host, s.proxy.Host, s.proxy.Host)
	return os.WriteFile(path, []byte(conf), 0o644)
}

// referenceOutputs runs every image with podman 4.3.1 without the store, straight from the
// registry: its output, which must be the sha256 of the files as written, is what every run
// of the soak is compared with.
func (s *soak) referenceOutputs(ctx context.Context, runroots string) error {
	ref, err := newPodman("podman 4.3.1 (reference)", "podman", filepath.Join(s.work, "ref"), filepath.Join(runroots, "r"), "", s.reg.Host, s.o.podmanTimeout)
	if err != nil {
		return err
	}
	for _, img := range s.images {
		r := ref.runWorkload(ctx, img.Ref)
		if r.Err != nil {
			ref.wipe(context.Background())
			return fmt.Errorf("reference run of %s: %v\n%s", img.Name(), r.Err, podmanrun.LastLines(r.Stderr, 10))
		}
		if r.Stdout != img.Content.Expected {
			ref.wipe(context.Background())
			return fmt.Errorf("reference run of %s: its output (%d bytes) is not the sha256 of the files written (%d bytes)", img.Name(), len(r.Stdout), len(img.Content.Expected))
		}
		img.Reference = r.Stdout
		fmt.Fprintf(os.Stderr, "reference output of %s: %d lines, normal pull and run %v\n", img.Name(), strings.Count(r.Stdout, "\n"), r.Took.Round(time.Millisecond))
	}
	ref.wipe(context.Background())
	return nil
}

// addRuntimes makes the runtimes of the soak, with the daemon's store: podman 4.3.1, and
// podman 5 when -podman5 is one.
func (s *soak) addRuntimes(work, runroots string) error {
	p4, err := newPodman("podman 4.3.1", "podman", filepath.Join(work, "podman4"), filepath.Join(runroots, "4"), s.d.mnt, s.reg.Host, s.o.podmanTimeout)
	if err != nil {
		return err
	}
	s.runtimes = append(s.runtimes, p4)
	if s.o.podman5 != "" {
		if v, ok := podmanrun.Version5(s.o.podman5); ok {
			p5, err := newPodman("podman "+strings.TrimPrefix(v, "podman version "), s.o.podman5, filepath.Join(work, "podman5"), filepath.Join(runroots, "5"), s.d.mnt, s.reg.Host, s.o.podmanTimeout)
			if err != nil {
				return err
			}
			s.runtimes = append(s.runtimes, p5)
			s.tools = append(s.tools, "podman 5: "+v+" ("+s.o.podman5+")")
		} else {
			s.events = append(s.events, fmt.Sprintf("podman 5 not found at %s: every run uses podman 4.3.1", s.o.podman5))
			s.tools = append(s.tools, "podman 5: not found at "+s.o.podman5)
		}
	}
	return nil
}

// runRecord is one container run of the soak.
type runRecord struct {
	N          int
	Runtime    string
	Image      *soakImage
	Cold       bool // the daemon's cache emptied before the run
	Start, End time.Time
	Outcome    string // ok, wrong, failed, interrupted
	Err        string
	Wrong      []string // output lines that are not the reference's
	Lines      int      // output lines
	FromStore  int      // layers podman took from the store
	Requests   int      // requests of the image's repository the proxy saw during the run
	Faults     []proxyRecord
	Notes      []string

	Kill        bool          // a kill was planned
	KilledAt    time.Duration // after the start; 0: not killed (the run ended first)
	KilledPID   int
	RestartTook time.Duration
}

func (r *runRecord) wall() time.Duration { return r.End.Sub(r.Start) }

// soak is the state of one soak.
type soak struct {
	o        options
	rnd      *rand.Rand
	images   []*soakImage
	runtimes []*podman
	d        *daemon
	proxy    *proxy
	reg      *dockerregistry.Registry
	runs     []*runRecord
	events   []string // daemon restarts outside kills, setup notes
	started  time.Time
	modDir   string
	machine  []string
	tools    []string
	counters map[int]countersAt // last counters seen per serve PID
	wipes    map[string]int     // storage wiped before a run, by runtime and reason
	work     string             // the temporary directories, named in the report by a variable
	runroots string
}

func run(ctx context.Context, o options) (err error) {
	if err := podmanrun.Preflight("FUSE and overlay mounts, podman", podmanrun.Tool{Name: o.busybox, Package: "busybox-static"}); err != nil {
		return err
	}
	s := &soak{o: o, rnd: rand.New(rand.NewPCG(o.seed, o.seed>>7^0x50a6)), counters: map[int]countersAt{}, wipes: map[string]int{}}
	if s.modDir, err = benchenv.ModuleDir(); err != nil {
		return err
	}
	work, err := os.MkdirTemp(o.workdir, "soak-")
	if err != nil {
		return err
	}
	// podman 4.3.1 wants short run roots (see newPodman): they get a directory of their own.
	runroots, err := os.MkdirTemp("", "soak-rr-")
	if err != nil {
		return err
	}
	s.work, s.runroots = work, runroots
	defer func() {
		podmanrun.UnmountUnder(runroots)
		os.RemoveAll(runroots)
		if o.keep {
			fmt.Fprintln(os.Stderr, "kept", work)
			return
		}
		podmanrun.UnmountUnder(work)
		os.RemoveAll(work)
	}()

	bin, err := benchd.Binary(ctx, s.modDir, o.daemonBin, work)
	if err != nil {
		return err
	}
	s.machine = benchenv.Machine(s.modDir, work, o.daemonBin)
	s.tools = podmanrun.ToolVersions()

	for _, d := range []string{"registry", "daemon", "ref", "podman4", "podman5"} {
		if err := os.MkdirAll(filepath.Join(work, d), 0o755); err != nil {
			return err
		}
	}
	s.reg, err = dockerregistry.Start(ctx, dockerregistry.Config{DataDir: filepath.Join(work, "registry"), ConfDir: work})
	if err != nil {
		return err
	}
	defer s.reg.Stop()

	if err := s.pushImages(ctx); err != nil {
		return err
	}
	s.proxy, err = startProxy(s.reg.Host, o.rates, o.stall, s.configs(), o.seed)
	if err != nil {
		return err
	}
	defer s.proxy.Close()

	if err := s.referenceOutputs(ctx, runroots); err != nil {
		return err
	}

	// The daemon reaches the registry through the proxy only: its registries.conf rewrites
	// the registry's references to the proxy.
	regConf := filepath.Join(work, "daemon", "registries.conf")
	if err := s.writeDaemonRegistries(regConf); err != nil {
		return err
	}
	s.d = newDaemon(bin, filepath.Join(work, "daemon"), regConf)
	if err := s.d.start(ctx); err != nil {
		return err
	}
	defer func() { s.d.stop() }()

	if err := s.addRuntimes(work, runroots); err != nil {
		return err
	}
	defer func() {
		for _, p := range s.runtimes {
			p.wipe(context.Background())
		}
	}()

	s.loop(ctx)

	for _, p := range s.runtimes {
		p.wipe(context.Background())
	}
	if note := s.d.stop(); note != "" {
		s.events = append(s.events, "at the end: "+note)
	}
	s.proxy.Close()
	return benchenv.WriteReport(benchenv.ReportPath(s.modDir, "soak", o.out), s.report())
}

// loop runs containers until -duration has passed or ctx ends.
func (s *soak) loop(ctx context.Context) {
	s.started = time.Now()
	var combos [][2]int // runtime, image
	for n := 1; time.Since(s.started) < s.o.duration && ctx.Err() == nil; n++ {
		if len(combos) == 0 { // every runtime with every image, in a shuffled order
			for i := range s.runtimes {
				for j := range s.images {
					combos = append(combos, [2]int{i, j})
				}
			}
			s.rnd.Shuffle(len(combos), func(i, j int) { combos[i], combos[j] = combos[j], combos[i] })
		}
		c := combos[0]
		combos = combos[1:]
		r := &runRecord{N: n, Runtime: s.runtimes[c[0]].name, Image: s.images[c[1]], Cold: s.rnd.IntN(2) == 0,
			Kill: s.o.killEvery > 0 && n%s.o.killEvery == 0}
		s.runOne(ctx, s.runtimes[c[0]], r)
		if r.Outcome == "no daemon" {
			s.events = append(s.events, fmt.Sprintf("the soak stopped before run %d: %s", n, r.Err))
			break
		}
		s.runs = append(s.runs, r)
		fmt.Fprintf(os.Stderr, "run %d (%v): %s, %s, %s cache%s: %s in %v, %d layers from the store, %d requests, %d faults%s\n",
			n, time.Since(s.started).Round(time.Second), r.Runtime, r.Image.Name(), map[bool]string{true: "empty", false: "kept"}[r.Cold],
			map[bool]string{true: ", killed at " + r.KilledAt.Round(time.Millisecond).String(), false: ""}[r.KilledAt > 0],
			r.Outcome, r.wall().Round(time.Millisecond), r.FromStore, r.Requests, len(r.Faults), errLine(r.Err))
	}
}

func errLine(e string) string {
	if e == "" {
		return ""
	}
	return ": " + strings.ReplaceAll(podmanrun.LastLines(e, 1), "\n", " ")
}

// runOne prepares and runs one container and records what happened.
func (s *soak) runOne(ctx context.Context, p *podman, r *runRecord) {
	if s.d.exited() {
		s.events = append(s.events, fmt.Sprintf("before run %d: layerstore keep had exited; started again", r.N))
		if err := s.d.start(ctx); err != nil {
			r.Outcome, r.Err = "no daemon", "starting the daemon: "+err.Error()
			return
		}
	}
	if wiped, why := p.removeImages(ctx); wiped {
		s.wipes[p.name+": "+why]++
	}
	if r.Cold {
		note, err := s.d.emptyCache(ctx)
		if note != "" {
			s.events = append(s.events, fmt.Sprintf("before run %d, stopping the daemon to empty its cache: %s", r.N, note))
		}
		if err != nil {
			r.Outcome, r.Err = "no daemon", "restarting the daemon on an empty cache: "+err.Error()
			return
		}
	}
	s.sampleCounters(ctx)

	done := make(chan struct{})
	killed := make(chan struct{})
	r.Start = time.Now()
	if r.Kill {
		delay := time.Duration(100+s.rnd.IntN(int(s.killWindow()/time.Millisecond))) * time.Millisecond
		go func() {
			defer close(killed)
			select {
			case <-done:
				return
			case <-time.After(delay):
			}
			s.sampleCounters(ctx)
			pid, err := s.d.kill()
			if err != nil {
				r.Notes = append(r.Notes, "kill: "+err.Error())
				return
			}
			r.KilledAt, r.KilledPID = time.Since(r.Start), pid
			took, err := s.d.waitServing(ctx, pid, 60*time.Second)
			if err != nil {
				r.Notes = append(r.Notes, "after the kill: "+err.Error())
				return
			}
			r.RestartTook = took
		}()
	} else {
		close(killed)
	}
	res := p.runWorkload(ctx, r.Image.Ref)
	r.End = time.Now()
	close(done)
	<-killed
	r.FromStore = p.FromStore()
	s.sampleCounters(ctx)

	for _, rec := range s.proxy.Records() {
		if rec.Repo != r.Image.Repo || rec.At.Before(r.Start) || rec.At.After(r.End) {
			continue
		}
		r.Requests++
		if rec.Fault != faultPass {
			r.Faults = append(r.Faults, rec)
		}
	}
	r.Lines = strings.Count(res.Stdout, "\n")
	r.Outcome, r.Wrong = classify(res.Stdout, r.Image.Reference, res.Err)
	switch {
	case ctx.Err() != nil && res.Err != nil:
		r.Outcome = "interrupted"
	case res.TimedOut:
		r.Err = fmt.Sprintf("timed out after %v\n", s.o.podmanTimeout)
	}
	if res.Err != nil {
		r.Err += res.Err.Error() + "\n" + podmanrun.LastLines(res.Stderr, 8)
	}
	if r.FromStore == 0 && r.Outcome == "ok" {
		r.Notes = append(r.Notes, "no layer taken from the store: podman pulled the image itself")
	}
}

// killWindow is the span a kill moment is drawn from: most of a typical run so far.
func (s *soak) killWindow() time.Duration {
	var walls []float64
	for _, r := range s.runs {
		if r.Outcome == "ok" {
			walls = append(walls, r.wall().Seconds())
		}
	}
	w := 3 * time.Second
	if len(walls) > 0 {
		w = time.Duration(0.8 * benchenv.Median(walls) * float64(time.Second))
	}
	return max(w, 500*time.Millisecond)
}

var outputLine = regexp.MustCompile(`^([0-9a-f]{64})  (\./\S+)$`)

// classify compares a container's output with the reference: "ok" when podman succeeded with
// the reference's bytes; "wrong" when a line is not one of the reference's (a hash that is not
// the file's, garbage), or podman succeeded with less or more than the reference; otherwise
// "failed". It returns the wrong lines too.
func classify(out, ref string, runErr error) (string, []string) {
	if runErr == nil && out == ref {
		return "ok", nil
	}
	want := map[string]string{}
	for _, l := range strings.Split(strings.TrimSuffix(ref, "\n"), "\n") {
		if m := outputLine.FindStringSubmatch(l); m != nil {
			want[m[2]] = m[1]
		}
	}
	var wrong []string
	if out != "" {
		for _, l := range strings.Split(strings.TrimSuffix(out, "\n"), "\n") {
			m := outputLine.FindStringSubmatch(l)
			if m == nil || want[m[2]] != m[1] {
				wrong = append(wrong, l)
			}
		}
	}
	switch {
	case len(wrong) > 0:
		return "wrong", wrong
	case runErr == nil:
		return "wrong", []string{fmt.Sprintf("(exit status 0 with %d of the reference's %d lines)", strings.Count(out, "\n"), len(want))}
	}
	return "failed", nil
}
