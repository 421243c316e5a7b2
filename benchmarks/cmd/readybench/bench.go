package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/opencontainers/go-digest"

	"github.com/layerstore/layerstore/benchmarks/internal/shaper"
	"github.com/layerstore/layerstore/internal/control/protocol"
	"github.com/layerstore/layerstore/internal/testutil/dockerregistry"
)

// cell is one measured configuration: an image in a format, pulled by a runtime alone (full)
// or through a store (lazy), over a link, with cold or warm caches.
type cell struct {
	image   imageSpec
	format  string
	store   string // "" for a full pull
	runtime string // rtPodman4 or rtPodman5
	link    shaper.Link
	warm    bool
	// profile is set for layerstore's cold cells that start with the startup profiles a
	// first run learned (see learnProfile): profileLearned (the same image again) or
	// profileNewVersion (the image's new version, see newversion.go).
	profile string
	// pin is set for layerstore's cells that pin the image on a fresh cache instead of
	// running it (pinOnce): the image fetched and verified to fully local, beside its full
	// pull.
	pin bool
}

// The learned-profile cells.
const (
	profileLearned    = "learned"
	profileNewVersion = "newversion"
)

func (c cell) lazy() bool { return c.store != "" }

// mode is "full", "lazy" (layerstore), "lazy-learned" and "lazy-newversion" (layerstore
// with a learned profile), "pin" (layerstore, pinCell) or "lazy-<peer>".
func (c cell) mode() string {
	if c.pin {
		return modePin
	}
	switch c.store {
	case "":
		return "full"
	case "layerstore":
		if c.profile != "" {
			return "lazy-" + c.profile
		}
		return "lazy"
	}
	return "lazy-" + c.store
}

// modeOf is the mode that -modes names for a cell: a peer's cells are "lazy" too.
func (c cell) modeOf() string {
	if c.store != "" && c.store != "layerstore" {
		return modeLazy
	}
	return c.mode()
}

// The modes of -modes.
const (
	modeFull       = "full"
	modeLazy       = "lazy"
	modeLearned    = "lazy-" + profileLearned
	modeNewVersion = "lazy-" + profileNewVersion
	modePin        = "pin"
)

var allModes = []string{modeFull, modeLazy, modeLearned, modeNewVersion, modePin}

// defaultModes are the modes measured unless -modes says otherwise: pin is asked for.
var defaultModes = allModes[:4]

func (c cell) cache() string {
	if c.warm {
		return "warm"
	}
	return "cold"
}

// String names the cell for -only and the progress lines: image:format:mode:runtime:link:cache.
func (c cell) String() string {
	return strings.Join([]string{c.image.name, c.format, c.mode(), c.runtime, c.link.String(), c.cache()}, ":")
}

// sample is one measured run of a cell.
type sample struct {
	Pull      float64 // seconds of `podman pull`
	Run       float64 // seconds from `podman run` to the ready line
	Exit      float64 // seconds from `podman run` to its exit
	Bytes     int64   // delivered from the registry through the link until the ready line
	FromStore int     // layers c/storage took from the store
	FullGets  int     // full GETs of lazily pullable layers (must be 0 for layerstore)
	Requests  int     // blob GETs the registry answered from the start of the pull to the ready line
	Seconds   float64 // wall time of the whole run, set-up and clean-up included
	Phases    string  // how long each step of the run took
	// What the workload read of the image's lazy layers, summed over them, as layerstore's
	// status tells once the container has exited (ReadKnown): chunks, their compressed bytes,
	// files opened with passthrough (their every chunk counted).
	ReadKnown        bool
	ReadChunks       int64
	ReadBytes        int64
	PassthroughFiles int64
	// The container's reads that waited for the registry, those that sent a request of their
	// own, and their waits summed.
	ReadWaits, ReadRequests int64
	ReadWaitSeconds         float64
	// The startup profiles replayed (learned-profile cells), summed over the image's lazy
	// layers, from the same status: layers with a replay, those whose profile was recorded
	// from the layer itself, files named, compressed bytes to fetch and fetched.
	ProfileLayers, ProfileSameLayer int
	ProfileFiles                    int
	ProfileBytes, ProfileFetched    int64
	// Imported is what `layerstore profiles import` said.
	Imported string
	// From the start of the pull to the ready line: the store's CPU seconds (-1 without a
	// store) and the share of the machine's processors that were busy (cpu.go).
	StoreCPU, Busy float64
	// StoreHWM is the store's peak RSS (VmHWM, bytes) from its start until it is stopped,
	// after the container's removal: the lookups, the start, and as much of the background
	// fetch as had run by then; 0 without a store.
	StoreHWM int64
	// For a pin cell: the largest of the store's VmRSS sampled during the pin, the content
	// the pin reports (the pinned layers' files) and the cache's disk use after it.
	StoreRSSSampled, Content, CacheDisk int64
}

func (s sample) total() float64 { return s.Pull + s.Run }

// bench holds what every run shares.
type bench struct {
	opts   options
	work   string
	reg    *dockerregistry.Registry
	proxy  *shaper.Proxy
	images *imageCache
	stores map[string]store
	// runtimes maps each runtime of -runtimes to its binary.
	runtimes map[string]string
	warm     map[string]string // warm cache directory per warmKey, once prepared
	prep     []prepResult
	runs     int    // runs done, to name directories and containers
	runBase  string // short directory on /run for podman's run roots, removed at the end
}

// prepResult is the making of one warm cache, for the report.
type prepResult struct {
	What    string
	Seconds float64
	Note    string
}

// plan lists the selected cells, in a fixed order (the report's).
func (b *bench) plan() []cell {
	var cells []cell
	storeNames := []string{"layerstore"}
	for n := range b.stores {
		if n != "layerstore" {
			storeNames = append(storeNames, n)
		}
	}
	for _, l := range b.opts.links {
		for _, img := range imageSpecs {
			if !slices.Contains(b.opts.imageNames, img.name) {
				continue
			}
			for _, warm := range []bool{false, true} {
				for _, rt := range b.opts.runtimes {
					for _, f := range b.opts.fullFormats {
						cells = append(cells, cell{image: img, format: f, runtime: rt, link: l, warm: warm})
					}
					for _, s := range storeNames {
						if !b.stores[s].serves(rt) {
							continue
						}
						for _, f := range lazyFormats {
							cells = append(cells, cell{image: img, format: f, store: s, runtime: rt, link: l, warm: warm})
							if s == "layerstore" && !warm {
								for _, p := range []string{profileLearned, profileNewVersion} {
									cells = append(cells, cell{image: img, format: f, store: s, runtime: rt, link: l, profile: p})
								}
								if rt == b.opts.runtimes[0] { // no runtime takes part
									cells = append(cells, cell{image: img, format: f, store: s, runtime: rt, link: l, pin: true})
								}
							}
						}
					}
				}
			}
		}
	}
	modes := b.opts.modes
	if modes == nil {
		modes = defaultModes
	}
	cells = slices.DeleteFunc(cells, func(c cell) bool {
		if c.image.generated() && (c.format == fmtEStargzPri || c.profile == profileNewVersion) {
			return true // no tree to trace the workload in, nor to rebuild (layerRecipe.generate)
		}
		return !slices.Contains(modes, c.modeOf()) || (b.opts.only != nil && !b.opts.only.MatchString(c.String()))
	})
	return cells
}

// imageOf is the image a cell measures: the new version for lazy-newversion cells.
func (b *bench) imageOf(c cell) *pushedImage {
	f := c.format
	if c.profile == profileNewVersion {
		f = v2Format(f)
	}
	return b.images.cat.Images[c.image.name][f]
}

// learnProfile is the unmeasured start of a learned-profile cell: the first version of the
// image pulled and run once through layerstore on a fresh cache, over an unshaped link; the
// daemon stopped (which writes the startup profiles it recorded into its cache), started
// again on that cache to export them with `layerstore profiles export`, and stopped. It
// returns the export, which the measured run imports into a fresh cache.
func (b *bench) learnProfile(ctx context.Context, c cell) ([]byte, error) {
	ls, ok := b.stores["layerstore"].(*layerstoreStore)
	if !ok {
		return nil, errors.New("no layerstore store")
	}
	dir, err := b.newRunDir()
	if err != nil {
		return nil, err
	}
	if !b.opts.keep {
		defer os.RemoveAll(dir)
	}
	unshaped, _ := shaper.ParseLink("unlimited")
	b.proxy.SetLink(unshaped)
	img := b.images.cat.Images[c.image.name][c.format]
	cacheDir := filepath.Join(dir, "cache")
	ms, err := ls.start(ctx, c.runtime, filepath.Join(dir, "store"), cacheDir)
	if err != nil {
		return nil, err
	}
	defer ms.stop()
	pm, err := b.newPodman(c.runtime, filepath.Join(dir, "podman"), ms.mountpoint())
	if err != nil {
		return nil, err
	}
	name := fmt.Sprintf("learn-%d", b.runs)
	defer pm.remove(name)
	if _, _, _, err := pm.pullAndRun(ctx, b.proxy.Addr()+"/"+img.Repo, name, c.image.ready, nil); err != nil {
		return nil, fmt.Errorf("learning run: %w", err)
	}
	pm.remove(name)
	ms.stop()
	if ms, err = ls.start(ctx, c.runtime, filepath.Join(dir, "store-export"), cacheDir); err != nil {
		return nil, err
	}
	defer ms.stop()
	file := filepath.Join(dir, "profiles.jsonl")
	if _, err := ms.(*runningLayerstore).profiles(ctx, ls.bin, "export", file); err != nil {
		return nil, err
	}
	ms.stop()
	return os.ReadFile(file)
}

// schedule returns every run of the cells (each cell -samples times) in a shuffled order.
func (b *bench) schedule(cells []cell) []cell {
	var runs []cell
	for range b.opts.samples {
		runs = append(runs, cells...)
	}
	rng := rand.New(rand.NewPCG(b.opts.seed, b.opts.seed^0x5eed))
	rng.Shuffle(len(runs), func(i, j int) { runs[i], runs[j] = runs[j], runs[i] })
	return runs
}

// warmKey names a warm cache. layerstore's serves every runtime; a peer's is made by the
// peer's binary for the runtime (see -peer), whose caches need not be compatible.
func warmKey(c cell) string {
	if c.store == "layerstore" {
		return c.store + "/" + c.image.name + "/" + c.format
	}
	return c.store + "/" + c.runtime + "/" + c.image.name + "/" + c.format
}

// prepareWarm fills a store's cache with every layer of the image, for the warm cells: one
// complete run over an unshaped link, then the store's background fetch to the end.
func (b *bench) prepareWarm(ctx context.Context, c cell) error {
	key := warmKey(c)
	if _, ok := b.warm[key]; ok {
		return nil
	}
	start := time.Now()
	cacheDir := filepath.Join(b.work, "warm", strings.ReplaceAll(key, "/", "-"))
	dir, err := b.newRunDir()
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	unshaped, _ := shaper.ParseLink("unlimited")
	b.proxy.SetLink(unshaped)
	img := b.images.cat.Images[c.image.name][c.format]
	ms, err := b.stores[c.store].start(ctx, c.runtime, filepath.Join(dir, "store"), cacheDir)
	if err != nil {
		return err
	}
	defer ms.stop()
	pm, err := b.newPodman(c.runtime, filepath.Join(dir, "podman"), ms.mountpoint())
	if err != nil {
		return err
	}
	name := fmt.Sprintf("warm-%d", b.runs)
	defer pm.remove(name)
	ref := b.proxy.Addr() + "/" + img.Repo
	if _, _, _, err := pm.pullAndRun(ctx, ref, name, c.image.ready, nil); err != nil {
		return err
	}
	var lazy []digest.Digest
	for _, l := range img.Layers {
		if l.TOC != "" {
			lazy = append(lazy, l.Digest)
		}
	}
	note := ""
	err = ms.waitComplete(ctx, lazy, 10*time.Minute)
	if errors.Is(err, errCannotTell) {
		// A store without a status: wait until the registry has seen no request for 5 s.
		note = "store has no status; waited for 5 s without registry requests"
		for last := b.reg.Mark(); ; {
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(5 * time.Second):
			}
			if m := b.reg.Mark(); m != last {
				last = m
				continue
			}
			break
		}
	} else if err != nil {
		return fmt.Errorf("warming %s: %w", key, err)
	}
	b.warm[key] = cacheDir
	b.prep = append(b.prep, prepResult{What: key, Seconds: time.Since(start).Seconds(), Note: note})
	fmt.Fprintf(os.Stderr, "warm cache of %s ready (%.1fs)\n", key, time.Since(start).Seconds())
	return nil
}

// newPodman is runtime rt (rtPodman4 or rtPodman5) with private configuration in dir, store
// its additional layer store unless empty (see newPodman).
func (b *bench) newPodman(rt, dir, store string) (*podman, error) {
	bin, ok := b.runtimes[rt]
	if !ok {
		return nil, fmt.Errorf("no binary for runtime %s", rt)
	}
	return newPodman(bin, rt == rtPodman5, dir, b.runroot(), store, b.proxy.Addr())
}

// runroot is a short directory for podman's run root of the current run (see newPodman).
func (b *bench) runroot() string { return filepath.Join(b.runBase, strconv.Itoa(b.runs)) }

func (b *bench) newRunDir() (string, error) {
	b.runs++
	dir := filepath.Join(b.work, fmt.Sprintf("run-%04d", b.runs))
	return dir, os.MkdirAll(dir, 0o755)
}

// errLazyDownloaded is a lazy run in which podman downloaded a layer layerstore should have
// served: the benchmark fails.
var errLazyDownloaded = errors.New("a lazily pullable layer was downloaded in full")

// startRun makes the directory of a measured run of c, which done removes unless -keep, waits
// until the previous run's connections are closed, and sets c's link.
func (b *bench) startRun(c cell, ph *phases) (dir string, done func(), err error) {
	if dir, err = b.newRunDir(); err != nil {
		return "", nil, err
	}
	done = func() {
		if !b.opts.keep {
			os.RemoveAll(dir)
			ph.mark("rm -r")
		}
	}
	if !b.proxy.WaitIdle(30 * time.Second) {
		done()
		return "", nil, fmt.Errorf("%d connections of the previous run still open after 30s", b.proxy.Conns())
	}
	b.proxy.SetLink(c.link)
	return dir, done, nil
}

// runOnce measures one run of c. Its phases (set-up, the measured pull and run, clean-up)
// are timed in s.Phases.
func (b *bench) runOnce(ctx context.Context, c cell) (s sample, err error) {
	ph := &phases{last: time.Now()}
	defer func() { s.Phases = ph.String() }()
	if c.pin {
		return b.pinOnce(ctx, c, ph)
	}
	var learned []byte
	if c.profile != "" {
		if learned, err = b.learnProfile(ctx, c); err != nil {
			return s, fmt.Errorf("%s: %w", c, err)
		}
		ph.mark("learn")
	}
	dir, done, err := b.startRun(c, ph)
	if err != nil {
		return s, err
	}
	defer done()
	img := b.imageOf(c)
	mnt := ""
	var ms mountedStore
	if c.lazy() {
		if ms, err = b.startStore(ctx, c, dir); err != nil {
			return s, err
		}
		defer ms.stop() // after the container is removed (defers run last in, first out)
		mnt = ms.mountpoint()
		ph.mark("store start")
		if learned != nil {
			if s.Imported, err = b.importProfiles(ctx, c, ms, dir, learned); err != nil {
				return s, err
			}
			ph.mark("profiles import")
		}
	}
	pm, err := b.newPodman(c.runtime, filepath.Join(dir, "podman"), mnt)
	if err != nil {
		return s, err
	}
	name := fmt.Sprintf("ready-%d", b.runs)
	defer pm.remove(name)
	if err := pm.do(ctx, "images", "--quiet"); err != nil { // creates the storage, outside the timing
		return s, err
	}
	ph.mark("podman init")
	// Every run starts with an empty page cache: left full by earlier runs, it makes podman's
	// pull about 1.6 times slower here (memory reclaim during the pull), which is no part of
	// what a warm cache means.
	if err := dropCaches(); err != nil {
		return s, fmt.Errorf("drop_caches: %w", err)
	}
	ph.mark("drop_caches")
	if c.warm && !c.lazy() {
		// Warm full pull: the registry's blobs of the image in the page cache.
		for _, l := range img.Layers {
			if err := readFile(b.reg.BlobPath(l.Digest)); err != nil {
				return s, err
			}
		}
		ph.mark("read blobs")
	}
	mark, err := b.timeReady(ctx, c, img, pm, ms, name, &s)
	if err != nil {
		return s, err
	}
	ph.mark("pull+run")
	pm.remove(name)
	ph.mark("podman rm")
	if ms != nil {
		s.StoreHWM = peakRSS(ms.pid())
		ms.stop()
		ph.mark("store stop")
	}
	return s, b.countFullGets(c, img, mark, &s)
}

// timeReady pulls and runs c's image with pm (named name) until its ready line, through ms
// when lazy, and records in s the times, the bytes through the link, the store's CPU and
// reads, and the blob requests. It returns the registry's mark from before the pull.
func (b *bench) timeReady(ctx context.Context, c cell, img *pushedImage, pm *podman, ms mountedStore, name string, s *sample) (int, error) {
	mark := b.reg.Mark()
	_, down0 := b.proxy.Bytes()
	ref := b.proxy.Addr() + "/" + img.Repo
	pid := 0
	if ms != nil {
		pid = ms.pid()
	}
	cpu0 := snapCPU(pid)
	var cpu1 cpuSnap
	pull, toReady, toExit, err := pm.pullAndRun(ctx, ref, name, c.image.ready, func() { cpu1 = snapCPU(pid) })
	if err != nil {
		return mark, err
	}
	s.StoreCPU, s.Busy = cpuSpent(cpu0, cpu1)
	_, down1 := b.proxy.Bytes()
	s.Pull, s.Run, s.Exit, s.Bytes, s.FromStore = pull.Seconds(), toReady.Seconds(), toExit.Seconds(), down1-down0, pm.FromStore()
	if ms != nil {
		if st, err := ms.layers(ctx); err == nil {
			s.addReads(st, img.Layers)
		} else if !errors.Is(err, errCannotTell) {
			return mark, fmt.Errorf("%s: the store's status: %w", c, err)
		}
	}
	for _, g := range b.reg.BlobGets(mark) {
		s.Requests += g.Full + g.Ranged
	}
	return mark, nil
}

// startStore starts c's store on a cache of its own under dir, or on the warm cache of c.
func (b *bench) startStore(ctx context.Context, c cell, dir string) (mountedStore, error) {
	cacheDir := filepath.Join(dir, "cache")
	if c.warm {
		cacheDir = b.warm[warmKey(c)]
	}
	return b.stores[c.store].start(ctx, c.runtime, filepath.Join(dir, "store"), cacheDir)
}

// importProfiles gives the fresh cache of ms the learned profiles, as a node of a fleet would,
// and returns what the import said.
func (b *bench) importProfiles(ctx context.Context, c cell, ms mountedStore, dir string, learned []byte) (string, error) {
	file := filepath.Join(dir, "profiles.jsonl")
	if err := os.WriteFile(file, learned, 0o644); err != nil {
		return "", err
	}
	out, err := ms.(*runningLayerstore).profiles(ctx, b.stores[c.store].(*layerstoreStore).bin, "import", file)
	if err != nil {
		return out, fmt.Errorf("%s: %w", c, err)
	}
	return out, nil
}

// addReads adds what the store's status says of the image's layers: the reads, their waits
// and the profiles replayed.
func (s *sample) addReads(st map[digest.Digest]protocol.LayerStatus, layers []pushedLayer) {
	s.ReadKnown = true
	for _, l := range layers {
		ls, ok := st[l.Digest]
		if !ok {
			continue
		}
		s.ReadChunks += ls.ReadChunks
		s.ReadBytes += ls.ReadCompressed
		s.PassthroughFiles += ls.PassthroughFiles
		s.ReadWaits += ls.ReadWaits
		s.ReadRequests += ls.ReadRequests
		s.ReadWaitSeconds += ls.ReadWaitSeconds
		if p := ls.Profile; p != nil {
			s.ProfileLayers++
			if p.SameLayer {
				s.ProfileSameLayer++
			}
			s.ProfileFiles += p.Files
			s.ProfileBytes += p.Bytes
			s.ProfileFetched += p.Fetched
		}
	}
}

// countFullGets counts in s the whole-blob GETs of c's lazily pullable layers since mark: a
// layerstore cell with any fails (errLazyDownloaded).
func (b *bench) countFullGets(c cell, img *pushedImage, mark int, s *sample) error {
	g := b.reg.BlobGets(mark)
	var full []string
	for _, l := range img.Layers {
		if c.lazy() && l.TOC != "" && g[l.Digest].Full > 0 {
			s.FullGets += g[l.Digest].Full
			full = append(full, fmt.Sprintf("%s (%s, %d full GETs)", l.Digest, mb(l.Size), g[l.Digest].Full))
		}
	}
	if len(full) > 0 && c.store == "layerstore" {
		return fmt.Errorf("%s: %w: %s; layers taken from the store: %d", c, errLazyDownloaded, strings.Join(full, ", "), s.FromStore)
	}
	return nil
}

// phases times the steps of a run, for -v and the budget.
type phases struct {
	last  time.Time
	parts []string
}

func (p *phases) mark(name string) {
	now := time.Now()
	p.parts = append(p.parts, fmt.Sprintf("%s %.2fs", name, now.Sub(p.last).Seconds()))
	p.last = now
}

func (p *phases) String() string { return strings.Join(p.parts, ", ") }

func readFile(p string) error {
	f, err := os.Open(p)
	if err != nil {
		return err
	}
	defer f.Close()
	_, err = io.Copy(io.Discard, f)
	return err
}

// measure prepares the warm caches the cells need, then runs every sample in a shuffled
// order and returns the samples per cell.
func (b *bench) measure(ctx context.Context, cells []cell) (map[string][]sample, error) {
	for _, c := range cells {
		if c.lazy() && c.warm {
			if err := b.prepareWarm(ctx, c); err != nil {
				return nil, fmt.Errorf("warm cache for %s: %w", c, err)
			}
		}
	}
	runs := b.schedule(cells)
	out := map[string][]sample{}
	start := time.Now()
	for i, c := range runs {
		t0 := time.Now()
		s, err := b.runOnce(ctx, c)
		s.Seconds = time.Since(t0).Seconds()
		if err != nil {
			if ctx.Err() != nil {
				return out, fmt.Errorf("%s: %w (%v)", c, ctx.Err(), err)
			}
			return out, fmt.Errorf("%s: %w", c, err)
		}
		out[c.String()] = append(out[c.String()], s)
		elapsed := time.Since(start)
		eta := time.Duration(float64(elapsed) / float64(i+1) * float64(len(runs)-i-1))
		fmt.Fprintf(os.Stderr, "[%d/%d] %-50s pull %6.2fs run %6.2fs total %6.2fs exit %6.2fs %s  (%.0fs with set-up; ETA %s)\n",
			i+1, len(runs), c, s.Pull, s.Run, s.total(), s.Exit, mb(s.Bytes), s.Seconds, eta.Round(time.Second))
		if b.opts.verbose {
			fmt.Fprintf(os.Stderr, "    %s\n", s.Phases)
		}
	}
	return out, nil
}
