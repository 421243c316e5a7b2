package main

import (
	"cmp"
	"context"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/layerstore/layerstore/benchmarks/internal/benchenv"
	"github.com/layerstore/layerstore/benchmarks/internal/shaper"
	"github.com/layerstore/layerstore/internal/testutil/podman5"
	"github.com/layerstore/layerstore/layer"
)

// report is the Markdown results file and its plots.
type report struct {
	opts           options
	b              *bench
	cells          []cell
	results        map[string][]sample
	started        time.Time
	measureSeconds float64
	machine        []string
	noPlots        string // why the report has no plots, when it has none
}

func onOff(b bool) string {
	if b {
		return "on"
	}
	return "off"
}

// stats are the percentiles of one measure over a cell's samples.
type stats struct{ p50, p95 float64 }

// percentiles: p50 is the median (the mean of the two middle values for an even count);
// p95 is nearest-rank, which for 5 samples is the largest.
func percentiles(xs []float64) stats {
	if len(xs) == 0 {
		return stats{math.NaN(), math.NaN()}
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	p50 := s[len(s)/2]
	if len(s)%2 == 0 {
		p50 = (s[len(s)/2-1] + s[len(s)/2]) / 2
	}
	rank := int(math.Ceil(0.95*float64(len(s)))) - 1
	return stats{p50, s[max(rank, 0)]}
}

func measureOf(ss []sample, f func(sample) float64) stats {
	xs := make([]float64, len(ss))
	for i, s := range ss {
		xs[i] = f(s)
	}
	return percentiles(xs)
}

func (r *report) baseline(c cell) (stats, bool) {
	base := c
	base.format, base.store, base.pin = fmtGzip, "", false
	ss, ok := r.results[base.String()]
	if !ok || len(ss) == 0 {
		return stats{}, false
	}
	return measureOf(ss, sample.total), true
}

// floorOf returns the floor of a cold lazy cell (see floor), when layerstore's runs of the
// same image, format, runtime and link told what the workload read.
func (r *report) floorOf(c cell) (floor, bool) {
	if !c.lazy() || c.warm {
		return floor{}, false
	}
	src := c
	src.store = "layerstore"
	var known []sample
	for _, s := range r.results[src.String()] {
		if s.ReadKnown {
			known = append(known, s)
		}
	}
	img := r.b.imageOf(c)
	if len(known) == 0 || img == nil {
		return floor{}, false
	}
	f := floor{
		ReadBytes:        int64(measureOf(known, func(s sample) float64 { return float64(s.ReadBytes) }).p50),
		ReadChunks:       int64(measureOf(known, func(s sample) float64 { return float64(s.ReadChunks) }).p50),
		PassthroughFiles: int64(measureOf(known, func(s sample) float64 { return float64(s.PassthroughFiles) }).p50),
	}
	for _, l := range img.Layers {
		if l.TOC == "" {
			f.FullBytes += l.Size
			continue
		}
		n, err := tocBytes(r.b.reg.BlobPath(l.Digest), l.MediaType, l.Size)
		if err != nil {
			fmt.Fprintf(os.Stderr, "readybench: floor of %s: %v\n", c, err)
			return floor{}, false
		}
		f.LazyLayers++
		f.TOCBytes += n
	}
	return f, true
}

// warmOf returns the p50 total of the warm cell of the same store, image, format, runtime and
// link as the cold cell c (for a learned-profile cell, its store's plain warm cell), when the
// run measured it: the runtime's own time with every byte local.
func (r *report) warmOf(c cell) (float64, bool) {
	if c.warm {
		return 0, false
	}
	w := c
	w.warm, w.profile = true, ""
	ss := r.results[w.String()]
	if len(ss) == 0 {
		return 0, false
	}
	return measureOf(ss, sample.total).p50, true
}

// floorColumns formats the floor columns of a cell whose total p50 is total: the network
// floor net (when netOK), the floor with the runtime's own time (warm + net, when the warm
// p50 is known too) and the total over the latter. Unknown values are "-".
func floorColumns(total, net float64, netOK bool, warm float64, warmOK bool) (netCol, floorCol, ratioCol string) {
	netCol, floorCol, ratioCol = "-", "-", "-"
	if !netOK {
		return
	}
	netCol = fmt.Sprintf("%.2f", net)
	if !warmOK {
		return
	}
	f := warm + net
	floorCol = fmt.Sprintf("%.2f", f)
	if f > 0 {
		ratioCol = fmt.Sprintf("%.2f", total/f)
	}
	return
}

// mdText is a report being written.
type mdText struct{ strings.Builder }

func (m *mdText) w(format string, args ...any) { fmt.Fprintf(m, format, args...) }

func (r *report) markdown(plots map[string]string) string {
	var m mdText
	r.writeHeader(&m)
	r.writeMethod(&m)
	r.writeImages(&m)
	for _, l := range r.opts.links {
		r.writeLink(&m, l, plots)
	}
	r.writeRunTime(&m)
	return m.String()
}

// writeHeader: the machine, the daemon's settings, the samples and the wall time.
func (r *report) writeHeader(m *mdText) {
	o := r.opts
	m.WriteString(benchenv.Header("readybench: time to ready with podman, lazy vs full pull", "readybench", r.machine))
	m.w("- layerstore: `layerstore serve` with background fetch %s and FUSE passthrough on\n", onOff(!o.noPrefetch))
	if o.quiet > 0 {
		m.w("- layerstore's `[prefetch] quiet`: %s (-prefetch-quiet; the default is %s)\n", o.quiet, layer.DefaultPrefetchQuiet)
	}
	m.w("- samples per cell: %d, run order shuffled with seed %d\n", o.samples, o.seed)
	m.w("- wall time: %.0f s in all, of which %.0f s measuring (warm-cache preparation included)\n", time.Since(r.started).Seconds(), r.measureSeconds)
	if r.noPlots != "" {
		m.w("- %s\n", r.noPlots)
	}
	m.w("\n")

}

// writeMethod: what is measured, and how.
func (r *report) writeMethod(m *mdText) {
	o := r.opts
	m.w("## Method\n\n")
	m.w("Runtimes: %s. **podman4** is Debian 12's podman 4.3.1 (lookups by blob digest); **podman5** is podman %s,\n", strings.Join(o.runtimes, ", "), podman5.Version)
	m.w("built from its Go module (lookups by TOC digest). podman 5 pulls and runs in one `podman run` (its pull column\n")
	m.w("is `-`, its run column is the total): it does not record a layer taken from an additional layer store in\n")
	m.w("`layers.json` (c/storage up to at least 1.65), so that the command after a `podman pull` finds the image\n")
	m.w("corrupted and pulls it again, and one command is what the README tells users; it also fails concurrent\n")
	m.w("first pulls of images sharing layers through a store (docs/operations.md), and readybench runs one cell at\n")
	m.w("a time.")
	if len(o.peers) > 0 {
		m.w(" The peer store runs with the runtimes it has a binary for (`-peer`): podman 4.3.1 looks layers up by blob\n")
		m.w("digest, which stargz-store answers up to 0.15.1 only; podman 5 by TOC digest (stargz-store 0.16 and later).")
	}
	m.w("\n\n")
	m.w("**Headline: total = `podman pull` + `podman run` until the workload's ready line** (stargz-snapshotter's\n")
	m.w("pull + create + run), from empty podman storage, after `sync; echo 3 > /proc/sys/vm/drop_caches`\n")
	m.w("(always: a page cache left full by earlier runs makes podman's pull about 1.6x slower on this VM).\n")
	m.w("*Cold*: a fresh store with an empty cache. *Warm*: the store restarted on a cache filled by an earlier\n")
	m.w("complete run (every layer fetched); for a full pull, the image's blobs read\n")
	m.w("into the page cache on the registry's side just before. Every byte\n")
	m.w("between podman or the store and the registry goes through the shaping proxy (one link shared by\n")
	m.w("all connections; bandwidth per direction, RTT/2 one-way delay each way, 1.5 RTT before a new\n")
	m.w("connection's first request arrives). p50 is the median; p95 is nearest-rank (with 5 samples, the\n")
	m.w("largest). \"lazy/full\" is the lazy p50 total over the gzip full pull's p50 total in the same image,\n")
	m.w("link and cache state. \"via link\" is the median of the bytes the registry sent through the link\n")
	m.w("from the start of the pull to the ready line (a store's background fetch included). \"from store\" is\n")
	m.w("the number of layers podman took from the store (its `additionallayer` marks); \"blob GETs\" the median of\n")
	m.w("the blob requests (whole or ranged) the registry answered from the start of the pull to the ready line;\n")
	m.w("\"waited\" the medians of the container's reads that waited for the registry (layerstore's `status`, summed\n")
	m.w("over the lazy layers), of those of them that sent a request of their own (the round trips the workload\n")
	m.w("paid for; the others waited for chunks already on their way), and of their waits summed (reads waiting\n")
	m.w("at once count each): reads / requests (seconds). \"CPU\": from the start of the pull to the ready line, the\n")
	m.w("store's own CPU time (user + system, p50; `-` for a full pull) / the share of the machine's processors that\n")
	m.w("were busy (p50, all processes): near 100%% the start waits for the processors (decompressing, verifying,\n")
	m.w("podman's own work), which the floor below does not count. \"store peak RSS\": the largest, over the\n")
	m.w("samples, of the store's VmHWM read as it is stopped (its start, the lookups, the container's start and\n")
	m.w("as much of the background fetch as ran until the container was removed); `-` for a full pull.\n")
	m.w("**pin** cells (`-modes pin`, layerstore, cold, the first runtime only): on a fresh cache with the page\n")
	m.w("cache dropped, `layerstore pin` of the image over the link (every layer the store serves fetched and\n")
	m.w("verified to fully local, after its check that the cache's filesystem has room); \"pull\" and \"total\" are\n")
	m.w("its time, \"lazy/full\" its time over the full pull's; \"store peak RSS\" its VmHWM at the end (the largest\n")
	m.w("VmRSS sampled every 20 ms during the pin is not above it); \"cache disk / content\" the blocks the cache\n")
	m.w("takes on disk after it beside the content of the pinned layers' files (p50).\n\n")
	m.w("**Floor** (cold lazy cells): the least a cold lazy start of the image can take over the link, whatever the\n")
	m.w("store: round trips one after the other at the link's RTT (the manifest; the config; one TOC request per\n")
	m.w("layer served lazily, a layer after its parent as the runtime looks them up; one for the chunks the workload\n")
	m.w("reads, all in one request at best) plus the bytes that must cross the link at its rate (the compressed TOC\n")
	m.w("of each lazy layer, from its footer; the compressed bytes of the chunks the workload read; layers pulled in\n")
	m.w("full, none here). Connection set-up, the registry's ping, the manifest's and config's bytes (a few KB) and\n")
	m.w("the runtime's own work are left out: the floor is a lower bound, not a target reachable as is. \"read\" is\n")
	m.w("what the workload read, from layerstore's `status` once the container exited (p50 over the samples of\n")
	m.w("its lazy cell; every chunk the kernel asked for through FUSE, whatever served it, and every chunk of a\n")
	m.w("file opened with FUSE passthrough, whose reads the daemon does not see): compressed bytes of those\n")
	m.w("chunks (their count). A peer's cell has the floor of layerstore's cell of the same image, format, runtime\n")
	m.w("and link (the same workload). This is **floor (net)**, the network floor only. **floor** adds the runtime's own\n")
	m.w("time: floor = the total p50 of the warm cell of the same store, image, format, runtime and link (every layer\n")
	m.w("in the store's cache, nothing to fetch: podman's pull, storage set-up, container creation and the workload\n")
	m.w("itself) + floor (net); `-` when the run has no such warm cell. \"/floor\" is the total p50 over floor (with the\n")
	m.w("runtime's time).\n\n")
	m.w("**Learned startup profiles** (layerstore, cold only). *lazy-learned*: before the measured run, one unmeasured\n")
	m.w("run of the same image through layerstore on a fresh cache over an unshaped link (the daemon records which files\n")
	m.w("the container reads); the daemon stopped (it writes the profiles into its cache), started again on that cache\n")
	m.w("to export them with `layerstore profiles export FILE`, and stopped; the measured run is then the `lazy` cold\n")
	m.w("cell's with one step more: `layerstore profiles import FILE` into the fresh store, before podman's storage is\n")
	m.w("made and the page cache dropped. So the cache holds the profiles and nothing else: the content is gone, the\n")
	m.w("profiles are kept, as after an eviction, or on a node that imported a fleet's profiles. *lazy-newversion*: the\n")
	m.w("same, learned on the image and measured on its new version, pushed to the same repository as\n")
	m.w("`<format>-v2`: the top layer rebuilt with new content at the same paths (every ELF file with bytes appended,\n")
	m.w("every text file but Python sources with a newline appended; the lower layers are the same blobs), so that the\n")
	m.w("top layer's profile is matched by path and the base layer's is its own. \"Profiles replayed\" below the\n")
	m.w("tables is from layerstore's status after the measured run.\n\n")

}

// writeImages: the images, their layers and formats, and how they were built.
func (r *report) writeImages(m *mdText) {
	m.w("## Images\n\n")
	m.w("Built offline from Debian %s (`debootstrap --variant=minbase`, then `apt-get install --no-install-recommends`\n", suite)
	m.w("in an overlay mount: each layer is exactly what its step added), cached in `-images`. Only the images\n")
	m.w("and formats the measured cells pull are built and pushed (with the gzip image a zstd:chunked one is\n")
	m.w("converted from); the others are `-` below.\n\n")
	m.w("| image | layers | workload | ready line | uncompressed |")
	for _, f := range allFormats {
		m.w(" %s |", f)
	}
	m.w("\n|---|---|---|---|---:|")
	for range allFormats {
		m.w("---:|")
	}
	m.w("\n")
	need := r.b.images.need
	for _, img := range need.images() {
		cmd := strings.Join(img.cmd, " ")
		if len(cmd) > 60 {
			cmd = cmd[:57] + "..."
		}
		m.w("| %s | %s | `%s` | `%s` | %s |", img.name, strings.Join(img.layers, " + "), strings.ReplaceAll(cmd, "\n", " "), img.ready, mb(r.b.images.uncompressed(img)))
		for _, f := range allFormats {
			if p := r.b.images.cat.Images[img.name][f]; p != nil && need[imageFormat{img.name, f}] {
				m.w(" %s |", mb(p.compressed()))
			} else {
				m.w(" - |")
			}
		}
		m.w("\n")
	}
	m.w("\nLayers: ")
	var ls []string
	for _, name := range need.layers() {
		l, _ := recipeByName(name)
		what := "debootstrap"
		if l.parent != "" {
			what = strings.Join(l.packages, " ")
		}
		t := r.b.images.cat.Layers[l.name]
		ls = append(ls, fmt.Sprintf("`%s` (%s; %s, %d entries)", l.name, what, mb(t.Size), t.Entries))
	}
	m.w("%s. Compressed sizes are the sums of the layer blobs: gzip at the default level, eStargz by\n", strings.Join(ls, ", "))
	m.w("`estargz.Build` defaults (gzip level 9, 4 MiB chunks), eStargz-prio the same with\n")
	m.w("`estargz.WithPrioritizedFiles` (the workload's profile: `strace -f -e trace=%%file,execve` of the\n")
	m.w("workload chrooted in the image, the regular files opened or executed, in order of first use),\n")
	m.w("zstd:chunked by `e2e/harness convert` (c/storage's compressor, with tar-split) from the gzip image.\n\n")
	m.w("Build steps (cached ones show when they ran):\n\n| step | seconds | built |\n|---|---:|---|\n")
	for _, s := range r.b.images.steps {
		when := "this run"
		if s.Cached {
			when = "cached, " + s.Built.Format("2006-01-02 15:04")
		}
		m.w("| %s | %.1f | %s |\n", s.What, s.Seconds, when)
	}
	m.w("\n")

}

// writeLink: the table of link l's cells, their floors and the profiles replayed.
func (r *report) writeLink(m *mdText, l shaper.Link, plots map[string]string) {
	if !slices.ContainsFunc(r.cells, func(c cell) bool { return c.link.String() == l.String() && len(r.results[c.String()]) > 0 }) {
		return
	}
	m.w("## Link %s\n\n", l)
	if p := plots[l.String()]; p != "" {
		m.w("![time to ready over %s](%s)\n\n", l, p)
	}
	m.w("| image | format | mode | runtime | cache | n | pull p50 | pull p95 | run p50 | run p95 | **total p50** | total p95 | lazy/full | floor (net) | floor | /floor | read | from store | via link | blob GETs | waited | CPU | store peak RSS | cache disk / content |\n")
	m.w("|---|---|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, c := range r.cells {
		if c.link.String() != l.String() {
			continue
		}
		ss := r.results[c.String()]
		if len(ss) == 0 {
			continue
		}
		m.w("%s", r.row(c, ss, l))
	}
	m.w("\n")
	var floors []string
	for _, c := range r.cells {
		if c.link.String() != l.String() || c.store != "layerstore" {
			continue
		}
		if f, ok := r.floorOf(c); ok {
			floors = append(floors, fmt.Sprintf("%s %s %s %s: %.2f s = %s", c.image.name, c.format, c.mode(), c.runtime, f.seconds(l), f))
		}
	}
	if len(floors) > 0 {
		m.w("Floors (net): %s.\n\n", strings.Join(floors, "; "))
	}
	var replays []string
	for _, c := range r.cells {
		if c.link.String() != l.String() || c.profile == "" || len(r.results[c.String()]) == 0 {
			continue
		}
		replays = append(replays, fmt.Sprintf("%s %s %s %s: %s", c.image.name, c.format, c.mode(), c.runtime, profileSummary(r.results[c.String()], len(r.b.imageOf(c).Layers))))
	}
	if len(replays) > 0 {
		m.w("Profiles replayed (per sample: layers with a replay of the image's layers, of them from their own recording; files\n")
		m.w("named; compressed bytes fetched of those to fetch; what the import said): %s.\n\n", strings.Join(replays, "; "))
	}
}

// row is the table's line of cell c on link l, from its samples ss.
func (r *report) row(c cell, ss []sample, l shaper.Link) string {
	pull, run, total := measureOf(ss, func(s sample) float64 { return s.Pull }), measureOf(ss, func(s sample) float64 { return s.Run }), measureOf(ss, sample.total)
	ratio := "-"
	if base, ok := r.baseline(c); ok && !(c.format == fmtGzip && !c.lazy()) {
		ratio = fmt.Sprintf("%.2f", total.p50/base.p50)
	}
	bytes := measureOf(ss, func(s sample) float64 { return float64(s.Bytes) })
	from := measureOf(ss, func(s sample) float64 { return float64(s.FromStore) })
	fromStr := fmt.Sprintf("%.0f/%d", from.p50, len(c.image.layers))
	if full := measureOf(ss, func(s sample) float64 { return float64(s.FullGets) }); full.p95 > 0 {
		fromStr += fmt.Sprintf(" (%.0f full GETs)", full.p95)
	}
	gets := measureOf(ss, func(s sample) float64 { return float64(s.Requests) })
	f, netOK := r.floorOf(c)
	warm, warmOK := r.warmOf(c)
	netStr, floorStr, overFloor := floorColumns(total.p50, f.seconds(l), netOK, warm, warmOK)
	read := "-"
	if c.lazy() && ss[0].ReadKnown {
		rb := measureOf(ss, func(s sample) float64 { return float64(s.ReadBytes) })
		rc := measureOf(ss, func(s sample) float64 { return float64(s.ReadChunks) })
		read = fmt.Sprintf("%s (%.0f)", mb(int64(rb.p50)), rc.p50)
	}
	waited := "-"
	if c.lazy() && ss[0].ReadKnown {
		n := measureOf(ss, func(s sample) float64 { return float64(s.ReadWaits) })
		o := measureOf(ss, func(s sample) float64 { return float64(s.ReadRequests) })
		d := measureOf(ss, func(s sample) float64 { return s.ReadWaitSeconds })
		waited = fmt.Sprintf("%.0f / %.0f (%.2f s)", n.p50, o.p50, d.p50)
	}
	cpu := cpuColumn(ss)
	pull50, pull95 := fmt.Sprintf("%.2f", pull.p50), fmt.Sprintf("%.2f", pull.p95)
	if c.runtime == rtPodman5 {
		pull50, pull95 = "-", "-" // pulled by podman run (see Method)
	}
	rss := "-"
	if hwm := slices.MaxFunc(ss, func(a, b sample) int { return cmp.Compare(a.StoreHWM, b.StoreHWM) }).StoreHWM; hwm > 0 {
		rss = fmt.Sprintf("%d MiB", hwm>>20)
	}
	disk := "-"
	if c.pin {
		fromStr = "-"
		disk = fmt.Sprintf("%s / %s", mb(int64(measureOf(ss, func(s sample) float64 { return float64(s.CacheDisk) }).p50)),
			mb(int64(measureOf(ss, func(s sample) float64 { return float64(s.Content) }).p50)))
	}
	return fmt.Sprintf("| %s | %s | %s | %s | %s | %d | %s | %s | %.2f | %.2f | **%.2f** | %.2f | %s | %s | %s | %s | %s | %s | %s | %.0f | %s | %s | %s | %s |\n",
		c.image.name, c.format, c.mode(), c.runtime, c.cache(), len(ss), pull50, pull95, run.p50, run.p95, total.p50, total.p95, ratio,
		netStr, floorStr, overFloor, read, fromStr, mb(int64(bytes.p50)), gets.p50, waited, cpu, rss, disk)
}

// writeRunTime: how long the runs took, by image and mode, and the warm caches' preparation.
func (r *report) writeRunTime(m *mdText) {
	m.w("## Run time\n\n")
	var runs int
	var setup float64
	type agg struct {
		n int
		s float64
	}
	per := map[string]*agg{}
	for _, c := range r.cells {
		for _, s := range r.results[c.String()] {
			runs++
			setup += s.Seconds
			k := c.image.name + " " + c.mode() + " " + c.runtime
			if per[k] == nil {
				per[k] = &agg{}
			}
			per[k].n++
			per[k].s += s.Seconds
		}
	}
	m.w("%d runs took %.0f s with their set-up and clean-up (store start and stop, podman storage, drop_caches):\n\n", runs, setup)
	m.w("| image, mode | runs | mean seconds per run |\n|---|---:|---:|\n")
	keys := make([]string, 0, len(per))
	for k := range per {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		m.w("| %s | %d | %.1f |\n", k, per[k].n, per[k].s/float64(per[k].n))
	}
	if len(r.b.prep) > 0 {
		var t float64
		for _, p := range r.b.prep {
			t += p.Seconds
		}
		m.w("\nWarm caches prepared once per store, image and format (unshaped link, then the background fetch to\nthe end): %d in %.0f s.\n", len(r.b.prep), t)
	}
	m.w("\n")
}

// profileSummary describes the replays of a learned-profile cell's samples, the same
// description once with its count.
func profileSummary(ss []sample, layers int) string {
	var descs []string
	count := map[string]int{}
	for _, s := range ss {
		d := "status unknown"
		if s.ReadKnown {
			d = fmt.Sprintf("%d/%d layers (%d own), %d files, %s of %s (%s)", s.ProfileLayers, layers, s.ProfileSameLayer,
				s.ProfileFiles, mb(s.ProfileFetched), mb(s.ProfileBytes), s.Imported)
		}
		if count[d] == 0 {
			descs = append(descs, d)
		}
		count[d]++
	}
	for i, d := range descs {
		descs[i] = fmt.Sprintf("%s [%d of %d samples]", d, count[d], len(ss))
	}
	return strings.Join(descs, " | ")
}

// write prints the report and writes it (and its plots) to -out.
func (r *report) write(ctx context.Context, modDir string) error {
	out := benchenv.ReportPath(modDir, "readybench", r.opts.out)
	plots := map[string]string{}
	if out != "" {
		if err := os.MkdirAll(filepath.Dir(out), 0o755); err != nil {
			return err
		}
		var err error
		if plots, err = r.plots(ctx, strings.TrimSuffix(out, ".md")); err != nil {
			return err
		}
	}
	return benchenv.WriteReport(out, r.markdown(plots))
}

// cpuColumn formats what the samples' starts cost the processors: the store's CPU seconds
// (p50; "-" without a store) and the share of the machine's processors busy (p50).
func cpuColumn(ss []sample) string {
	store := "-"
	if ss[0].StoreCPU >= 0 {
		store = fmt.Sprintf("%.2f s", measureOf(ss, func(s sample) float64 { return s.StoreCPU }).p50)
	}
	return fmt.Sprintf("%s / %.0f%%", store, 100*measureOf(ss, func(s sample) float64 { return s.Busy }).p50)
}
