package main

import (
	"debug/buildinfo"
	"fmt"
	"strings"
	"time"

	"github.com/layerstore/layerstore/benchmarks/internal/benchenv"
	"github.com/layerstore/layerstore/chunked"
	"github.com/layerstore/layerstore/layer"
)

// caseResult is what a case gave: its samples, or the error that stopped it.
type caseResult struct {
	name, what string
	large      *builtLayer
	samples    []sample
	err        string
}

type report struct {
	opts     options
	machine  []string
	daemon   string
	layers   []*builtLayer
	cases    []*caseResult
	duration time.Duration
}

// addLayer records a layer for the table of layers; the small ones are summarised.
func (r *report) addLayer(l *builtLayer) { r.layers = append(r.layers, l) }

func (s sample) line() string {
	t := fmt.Sprintf("time %.3fs, CPU %.2fs, VmRSS %s (RssAnon %s), VmHWM %s, %d layers", s.Wall, s.CPU, mib(s.RSS), mib(s.Anon), mib(s.HWM), s.Layers)
	if s.Listed > 0 {
		t += fmt.Sprintf(" (stat %.3fs, readdir %.3fs of %d entries, %d+%d requests, %s)", s.Stat, s.Readdir, s.Listed,
			s.Requests.Ranged, s.Requests.Full, mib(s.Requests.Bytes))
	}
	if s.Quiet > 0 {
		t += fmt.Sprintf("; quiet after %.1fs: VmRSS %s (RssAnon %s)", s.Quiet, mib(s.QuietRSS), mib(s.QuietAnon))
	}
	if s.Walked > 0 {
		t += fmt.Sprintf("; walk %.3fs of %d entries (%.1f µs each), CPU %.2fs, VmRSS after %s; again %.3fs, CPU %.2fs; by path %.3fs (%.1f µs each)", s.Walk, s.Walked,
			s.Walk/float64(s.Walked)*1e6, s.WalkCPU, mib(s.WalkRSS), s.Rewalk, s.RewalkCPU, s.PathWalk, s.PathWalk/float64(s.Walked)*1e6)
	}
	return t
}

// daemonInfo describes the binary under test from its build information.
func daemonInfo(bin string, given bool) string {
	how := "built by the harness from the working tree (`go build ./cmd/layerstore`)"
	if given {
		how = "`" + bin + "` (-daemon)"
	}
	bi, err := buildinfo.ReadFile(bin)
	if err != nil {
		return how
	}
	var vcs []string
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			vcs = append(vcs, "revision "+s.Value[:min(12, len(s.Value))])
		case "vcs.modified":
			if s.Value == "true" {
				vcs = append(vcs, "modified")
			}
		}
	}
	if len(vcs) > 0 {
		how += ", " + strings.Join(vcs, ", ")
	}
	return how + ", " + bi.GoVersion
}

// med is the median of one field over the samples.
func med(ss []sample, f func(sample) float64) float64 {
	xs := make([]float64, len(ss))
	for i, s := range ss {
		xs[i] = f(s)
	}
	return benchenv.Median(xs)
}

func list(ss []sample, f func(sample) float64, format string) string {
	xs := make([]string, len(ss))
	for i, s := range ss {
		xs[i] = fmt.Sprintf(format, f(s))
	}
	return strings.Join(xs, ", ")
}

func maxOf(ss []sample, f func(sample) float64) float64 {
	m := 0.0
	for _, s := range ss {
		m = max(m, f(s))
	}
	return m
}

func mib(n int64) string { return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20)) }

func mibf(n float64) string { return fmt.Sprintf("%.1f", n/(1<<20)) }

func (r *report) markdown() string {
	var b strings.Builder
	b.WriteString(benchenv.Header("scalebench results", "scalebench", r.machine))
	fmt.Fprintf(&b, "- daemon: %s\n", r.daemon)
	fmt.Fprintf(&b, "- whole run: %.0f s until this report (building or loading the layers included, compiling and the final clean-up not)\n", r.duration.Seconds())
	r.layerSection(&b)
	r.resultSection(&b)
	return b.String()
}

func (r *report) layerSection(b *strings.Builder) {
	if len(r.layers) == 0 {
		return
	}
	fmt.Fprintf(b, "\n## Layers\n\n")
	fmt.Fprintf(b, "Generated trees: directories of %d entries (the root holds the top ones), regular files of 4 B-4 KiB "+
		"(log-uniform, words and lines of text), 3%% empty files, 6%% symlinks. eStargz: `estargz.Build` with its defaults "+
		"(gzip level 9, 4 MiB chunks, one gzip member per file). zstd:chunked: c/storage's compressor "+
		"(`go.podman.io/storage/pkg/chunked/compressor.ZstdCompressor`, its default level, with tar-split), run by the "+
		"e2e harness (`harness compress`). Build time is the tar generation plus the conversion; "+
		"\"cached\" layers were loaded from `-blobs` (the time is that of the run that built them). The daemon's limit on "+
		"the TOC is %s (compressed and uncompressed) and %d entries.\n\n", perDir, mib(chunked.DefaultMaxTOCSize), chunked.DefaultMaxEntries)
	fmt.Fprintf(b, "| layer | format | entries | tar | blob | TOC (compressed) | TOC JSON | tar-split | build (s) |\n|---|---|---:|---:|---:|---:|---:|---:|---:|\n")
	type group struct {
		n                          int
		tar, blob, toc, js, ts, bt float64
		cached                     bool
	}
	small := map[string]*group{}
	var order []string
	for _, l := range r.layers {
		if l.Entries >= 10000 {
			fmt.Fprintf(b, "| %s | %s | %d | %s | %s | %s | %s | %s | %.1f%s |\n", l.Name, l.Format, l.Entries, mib(l.TarSize), mib(l.Size),
				mib(l.TOCSize), mib(l.TOCJSONSize), mibOrDash(l.TarSplitSize), l.BuildTime, cachedMark(l.Cached))
			continue
		}
		k := fmt.Sprintf("%s of %d entries", strings.TrimRight(l.Name, "0123456789"), l.Entries)
		g := small[k]
		if g == nil {
			g = &group{}
			small[k] = g
			order = append(order, k)
		}
		g.n++
		g.tar += float64(l.TarSize)
		g.blob += float64(l.Size)
		g.toc += float64(l.TOCSize)
		g.js += float64(l.TOCJSONSize)
		g.bt += l.BuildTime
		g.cached = g.cached || l.Cached
	}
	for _, k := range order {
		g := small[k]
		fmt.Fprintf(b, "| %d × %s (sizes: the mean) | estargz | %s | %.1f KiB | %.1f KiB | %.1f KiB | %.1f KiB | - | %.1f in all%s |\n", g.n, k,
			strings.Fields(k)[2], g.tar/float64(g.n)/1024, g.blob/float64(g.n)/1024, g.toc/float64(g.n)/1024, g.js/float64(g.n)/1024, g.bt, cachedMark(g.cached))
	}
}

func mibOrDash(n int64) string {
	if n == 0 {
		return "-"
	}
	return mib(n)
}

func cachedMark(c bool) string {
	if c {
		return " (cached)"
	}
	return ""
}

func (r *report) resultSection(b *strings.Builder) {
	o := r.opts
	fmt.Fprintf(b, "\n## Results\n\n")
	pf := "off"
	if o.prefetch {
		pf = "on (-prefetch)"
	}
	fmt.Fprintf(b, "Every case ran %d times, each on a fresh `layerstore serve` (passthrough on, background fetch %s except in "+
		"fetch-*, an empty cache) against the registry on 127.0.0.1; medians, the time of each run in the last column. "+
		"CPU is the daemon's utime+stime over the case's time (from `/proc/<pid>/stat`). VmRSS, RssAnon and VmHWM (peak) come from "+
		"`/proc/<pid>/status`, read %v after the case (a Go daemon returns freed memory to the kernel lazily: VmRSS "+
		"includes heap the collector freed but the runtime kept). RssAnon is the part of VmRSS that is no file's: the heap, "+
		"stacks and the runtime's own; the rest is pages of mapped files (the binary, layer records) the kernel can drop and read again. Layers are looked up by TOC digest, as podman 5.1+ and "+
		"CRI-O 1.31+ do.\n\n", o.runs, pf, o.settle)
	fmt.Fprintf(b, "| case | time (s) | daemon CPU (s) | VmRSS (MiB) | RssAnon (MiB) | VmHWM (MiB) | layers resolved | runs: time (s) |\n|---|---:|---:|---:|---:|---:|---:|---|\n")
	for _, c := range r.cases {
		if len(c.samples) == 0 {
			fmt.Fprintf(b, "| %s | **failed** (below) | | | | | | |\n", c.name)
			continue
		}
		ss := c.samples
		fmt.Fprintf(b, "| %s | %.3f | %.2f | %s | %s | %s | %d | %s |\n", c.name, med(ss, func(s sample) float64 { return s.Wall }),
			med(ss, func(s sample) float64 { return s.CPU }), mibf(med(ss, func(s sample) float64 { return float64(s.RSS) })),
			mibf(med(ss, func(s sample) float64 { return float64(s.Anon) })),
			mibf(med(ss, func(s sample) float64 { return float64(s.HWM) })), ss[len(ss)-1].Layers, list(ss, func(s sample) float64 { return s.Wall }, "%.3f"))
	}
	r.largeSection(b)
	r.lookupSection(b)
	fmt.Fprintf(b, "\n### The cases\n\n")
	for _, c := range r.cases {
		fmt.Fprintf(b, "- **%s**: %s.\n", c.name, c.what)
	}
	var failed []*caseResult
	for _, c := range r.cases {
		if c.err != "" {
			failed = append(failed, c)
		}
	}
	if len(failed) > 0 {
		fmt.Fprintf(b, "\n### Failures\n\n")
		for _, c := range failed {
			fmt.Fprintf(b, "**%s** (%d runs completed):\n\n```\n%s\n```\n\n", c.name, len(c.samples), strings.TrimSpace(c.err))
		}
	}
}

// largeSection details the large-layer and fetch cases.
func (r *report) largeSection(b *strings.Builder) {
	var rows, walks, fetch []string
	for _, c := range r.cases {
		ss := c.samples
		if c.large == nil || len(ss) == 0 {
			continue
		}
		l := c.large
		if ss[0].Fetched > 0 {
			cpu, wall := med(ss, func(s sample) float64 { return s.CPU }), med(ss, func(s sample) float64 { return s.Wall })
			sent := med(ss, func(s sample) float64 { return float64(s.Requests.Bytes) })
			fetch = append(fetch, fmt.Sprintf("| %s | %s | %s | %.2f | %.2f | %.0f | %.0f | %.0f |", c.name, mib(int64(sent)), mib(l.TarSize),
				wall, cpu, cpu/(sent/(1<<30)), cpu/(float64(l.TarSize)/(1<<30)), float64(l.Entries)/wall))
			continue
		}
		stat := med(ss, func(s sample) float64 { return s.Stat })
		rows = append(rows, fmt.Sprintf("| %s | %d | %.3f | %.0f%% | %.3f | %d | %.1f | %d + %d | %s | %.0f | %.1f | %.0f | %.3f | %d | %.0f |", c.name, l.Entries, stat,
			100*maxOf(ss, func(s sample) float64 { return s.Stat })/layer.DefaultResolveTimeout.Seconds(),
			med(ss, func(s sample) float64 { return s.Readdir }), ss[0].Listed, stat/float64(l.Entries)*1e6,
			ss[0].Requests.Ranged, ss[0].Requests.Full, mib(ss[0].Requests.Bytes),
			(med(ss, func(s sample) float64 { return float64(s.RSS) }))/float64(l.Entries),
			med(ss, func(s sample) float64 { return s.Quiet }),
			(med(ss, func(s sample) float64 { return float64(s.QuietRSS) }))/float64(l.Entries),
			med(ss, func(s sample) float64 { return s.Reopen }), ss[0].ReopenRequests,
			(med(ss, func(s sample) float64 { return float64(s.ReopenRSS) }))/float64(l.Entries)))
		if ss[0].Walked > 0 {
			w, pw, n := med(ss, func(s sample) float64 { return s.Walk }), med(ss, func(s sample) float64 { return s.PathWalk }), float64(ss[0].Walked)
			walks = append(walks, fmt.Sprintf("| %s | %d | %.2f | %.1f | %.2f | %s | %.2f | %.2f | %.2f | %.1f |", c.name, ss[0].Walked, w,
				w/n*1e6, med(ss, func(s sample) float64 { return s.WalkCPU }),
				mib(int64(med(ss, func(s sample) float64 { return float64(s.WalkRSS) }))),
				med(ss, func(s sample) float64 { return s.Rewalk }), med(ss, func(s sample) float64 { return s.RewalkCPU }), pw, pw/n*1e6))
		}
	}
	if len(rows) > 0 {
		fmt.Fprintf(b, "\n### Large layers\n\n")
		fmt.Fprintf(b, "Stat is the first `stat` of diff (the lookup that resolves the layer); readdir the open and full listing of "+
			"its root. Requests and bytes are what the registry saw for the blob during the case (range + full GETs): the TOC "+
			"and footer, no file content. RSS per entry is the whole daemon's VmRSS divided by the entries (idle RSS included). "+
			"The daemon bounds a resolution by its resolve timeout, %v by default (`[layers] resolve-timeout`): a slower "+
			"lookup fails with EIO and the runtime pulls the layer itself; the column gives the slowest run's share of it. "+
			"Quiet is when the daemon's background work after the resolution (a zstd:chunked TOC's comparison with its "+
			"tar-split, the record's storing) had ended, from the first stat: its CPU under 20 ms in half a second; the "+
			"VmRSS per entry beside it is read one settle later. "+
			"Re-open is the same first stat after the daemon was stopped and started again on the same cache (after the walks): "+
			"with the blob requests it made (0: answered from the layer's record), and "+
			"the restarted daemon's VmRSS per entry after it.\n\n", layer.DefaultResolveTimeout)
		fmt.Fprintf(b, "| case | entries | stat (s) | slowest stat, of the resolve timeout | readdir (s) | root entries | stat µs per entry | blob requests | bytes sent | VmRSS bytes per entry | quiet after (s) | VmRSS bytes per entry, quiet | re-open (s) | re-open blob requests | VmRSS bytes per entry after re-open |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
		fmt.Fprintln(b, strings.Join(rows, "\n"))
	}
	if len(walks) > 0 {
		fmt.Fprintf(b, "\n### Walking a large layer\n\n")
		fmt.Fprintf(b, "After the resolution and the memory reading above, one walk of the whole diff tree as `find` does it, "+
			"or a security scanner in a container through overlayfs: every directory listed once and every entry "+
			"`lstat`ed once, relative to the directory that lists it (`openat`, `fstatat`), on a cold kernel cache. CPU is "+
			"the daemon's over the walk; VmRSS is read right after it (the kernel and the daemon then hold a node for "+
			"every entry). The same walk again, on the caches the first filled (the kernel keeps a layer's immutable "+
			"tree for as long as it is served), with the daemon's CPU over it. Then a walk by paths from the mount's root (`filepath.WalkDir`, `os.Lstat` of each path: "+
			"what a scanner of the runtime's storage does through its `diff` symlinks), on the caches the first one "+
			"filled: every path resolves `<ref>/<key>` again, a lookup the daemon answers itself.\n\n")
		fmt.Fprintf(b, "| case | entries walked | walk (s) | µs per entry | daemon CPU (s) | VmRSS after | again, warm (s) | daemon CPU (s) | by path, warm (s) | µs per entry |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
		fmt.Fprintln(b, strings.Join(walks, "\n"))
	}
	if len(fetch) > 0 {
		fmt.Fprintf(b, "\n### Background fetch: CPU per GB\n\n")
		fmt.Fprintf(b, "From the first stat of diff until the control socket reports the layer complete (every file verified and in "+
			"the cache). CPU per GiB is the daemon's CPU over the compressed bytes the registry sent, and over the layer's "+
			"uncompressed tar. Small files make this a worst case: per file, the daemon verifies a chunk and creates a cache file.\n\n")
		fmt.Fprintf(b, "| case | bytes sent | tar | time (s) | CPU (s) | CPU s per GiB sent | CPU s per GiB of tar | entries per s |\n|---|---:|---:|---:|---:|---:|---:|---:|\n")
		fmt.Fprintln(b, strings.Join(fetch, "\n"))
	}
}

// lookupSection details the many-layer and many-image cases.
func (r *report) lookupSection(b *strings.Builder) {
	var rows []string
	for _, c := range r.cases {
		ss := c.samples
		if c.large != nil || len(ss) == 0 || ss[0].Layers == 0 {
			continue
		}
		n := float64(ss[0].Layers)
		rss := med(ss, func(s sample) float64 { return float64(s.RSS) })
		rows = append(rows, fmt.Sprintf("| %s | %d | %.1f | %.1f | %.0f |", c.name, ss[0].Layers,
			med(ss, func(s sample) float64 { return s.Wall })/n*1e3, med(ss, func(s sample) float64 { return s.CPU })/n*1e3, rss/n/1024))
	}
	if len(rows) == 0 {
		return
	}
	fmt.Fprintf(b, "\n### Many layers, many images\n\n")
	fmt.Fprintf(b, "Per layer: the case's time and CPU divided by the layers looked up (wall time per layer for the "+
		"concurrent case is the total over the count, not a latency); VmRSS per layer is the whole daemon's VmRSS over the "+
		"layers (idle RSS included).\n\n")
	fmt.Fprintf(b, "| case | layers | ms per layer | CPU ms per layer | VmRSS KiB per layer |\n|---|---:|---:|---:|---:|\n")
	fmt.Fprintln(b, strings.Join(rows, "\n"))
}
