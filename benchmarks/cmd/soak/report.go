package main

import (
	"bufio"
	"context"
	"fmt"
	"maps"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/layerstore/layerstore/benchmarks/internal/benchenv"
	"github.com/layerstore/layerstore/internal/control/protocol"
)

type countersAt = protocol.Counters

// sampleCounters records the serving daemon's counters under its PID: the last sample of each
// process adds up to the soak's.
func (s *soak) sampleCounters(ctx context.Context) {
	if c, pid, err := s.d.status(ctx); err == nil {
		s.counters[pid] = c
	}
}

// logLine is a line of the daemon's log at warn or error level, or one of keep's.
type logLine struct {
	At    time.Time
	Level string
	Msg   string
	Raw   string
}

var slogLine = regexp.MustCompile(`^time=(\S+) level=(\S+) msg=("(?:[^"\\]|\\.)*"|\S+)`)

// daemonLog reads the warn and error lines of the daemon's logs, keep's own lines, and panics.
func daemonLog(paths []string, bin string) []logLine {
	var out []logLine
	for _, p := range paths {
		f, err := os.Open(p)
		if err != nil {
			continue
		}
		sc := bufio.NewScanner(f)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			l := sc.Text()
			if m := slogLine.FindStringSubmatch(l); m != nil {
				if m[2] != "WARN" && m[2] != "ERROR" {
					continue
				}
				msg := m[3]
				if u, err := strconv.Unquote(msg); err == nil {
					msg = u
				}
				at, _ := time.Parse(time.RFC3339Nano, m[1])
				out = append(out, logLine{At: at, Level: m[2], Msg: msg, Raw: l})
				continue
			}
			switch {
			case strings.HasPrefix(l, "layerstore keep: "):
				out = append(out, logLine{Level: "keep", Msg: keepMessage(strings.ReplaceAll(l, bin, "layerstore")), Raw: l})
			case strings.HasPrefix(l, "panic:"), strings.HasPrefix(l, "fatal error:"):
				out = append(out, logLine{Level: "PANIC", Msg: l, Raw: l})
			}
		}
		f.Close()
	}
	return out
}

var numbers = regexp.MustCompile(`\d+`)

// keepMessage is keep's line with its numbers replaced, so that lines count by kind.
func keepMessage(l string) string {
	return numbers.ReplaceAllString(strings.TrimPrefix(l, "layerstore keep: "), "N")
}

func ms(d time.Duration) string { return fmt.Sprintf("%.1f s", d.Seconds()) }

func pct(n, of int) string {
	if of == 0 {
		return "-"
	}
	return fmt.Sprintf("%.1f%%", 100*float64(n)/float64(of))
}

// report renders the Markdown report; the temporary directories are named $WORK and $RUNROOTS.
func (s *soak) report() string {
	return strings.NewReplacer(s.work, "$WORK", s.runroots, "$RUNROOTS").Replace(s.render())
}

func (s *soak) render() string {
	var b strings.Builder
	machine := append(append([]string{}, s.machine...), s.tools...)
	b.WriteString(benchenv.Header("soak: chaos soak with real podman", "soak", machine))
	pc := countRecords(s.proxy.Records())
	logs := daemonLog(s.d.logs, s.d.bin)
	s.writeSummary(&b, pc)
	s.writeParameters(&b)
	s.writeByRuntime(&b)
	writeFaults(&b, pc)
	s.writeKills(&b)
	s.writeFallbacks(&b, logs)
	s.writeFailures(&b, logs)
	writeLogCounts(&b, logs)
	s.writeCounters(&b)
	s.writeNotes(&b)
	return b.String()
}

// writeSummary: the runs by outcome, the wrong lines, the faults and kills, the wall times.
func (s *soak) writeSummary(b *strings.Builder, pc proxyCounts) {
	elapsed := time.Since(s.started)
	if len(s.runs) > 0 {
		elapsed = s.runs[len(s.runs)-1].End.Sub(s.started)
	}

	byOutcome := map[string]int{}
	kills, killsDuring, cold := 0, 0, 0
	var walls []float64
	for _, r := range s.runs {
		byOutcome[r.Outcome]++
		if r.KilledAt > 0 {
			kills++
			if r.KilledAt < r.wall() {
				killsDuring++
			}
		}
		if r.Cold {
			cold++
		}
		if r.Outcome == "ok" || r.Outcome == "failed" || r.Outcome == "wrong" {
			walls = append(walls, r.wall().Seconds())
		}
	}
	faults := pc.Total - pc.ByFault[faultPass]

	fmt.Fprintf(b, "\n## Summary\n\n")
	fmt.Fprintf(b, "- **%d runs** in %v (seed %d): %d ok, **%d wrong outputs**, **%d failed**, %d interrupted by the end of the soak\n",
		len(s.runs), elapsed.Round(time.Second), s.o.seed, byOutcome["ok"], byOutcome["wrong"], byOutcome["failed"], byOutcome["interrupted"])
	wrongLines := 0
	for _, r := range s.runs {
		wrongLines += len(r.Wrong)
	}
	fmt.Fprintf(b, "- wrong bytes: %d output lines differ from the normal pull's (a wrong sha256, garbage, or a successful exit with lines missing)\n", wrongLines)
	single, none := 0, 0
	for _, r := range s.runs {
		if r.Outcome != "failed" {
			continue
		}
		switch len(r.Faults) {
		case 0:
			none++
		case 1:
			single++
		}
	}
	fmt.Fprintf(b, "- failed containers: %d, of which %d had exactly one fault on their image's requests and %d none (see [Failures](#failures))\n", byOutcome["failed"], single, none)
	fmt.Fprintf(b, "- %d requests through the proxy, %d faults injected (%s); %d kill -9 of the daemon (%d while the container ran); %d runs on an emptied cache, %d on the cache as the previous run left it\n",
		pc.Total, faults, pct(faults, pc.Total), kills, killsDuring, cold, len(s.runs)-cold)
	if len(walls) > 0 {
		fmt.Fprintf(b, "- container wall time (podman run, pull included): p50 %.1f s, max %.1f s\n", benchenv.Median(walls), slices.Max(walls))
	}
}

// writeParameters: what the soak did, its images.
func (s *soak) writeParameters(b *strings.Builder) {
	o := s.o
	fmt.Fprintf(b, "\n## Parameters\n\n")
	fmt.Fprintf(b, "- duration %v, a kill -9 of `layerstore serve` (under `layerstore keep`) at a random moment of every %d. run, podman commands bounded by %v\n", o.duration, o.killEvery, o.podmanTimeout)
	fmt.Fprintf(b, "- faults on every kind of request between the daemon and the registry: reset mid-body %.3g, 503 %.3g (half with Retry-After 1-3 s), truncated body %.3g, stall %.3g for %v-%v then closed; podman reaches the registry directly\n",
		o.rates.Reset, o.rates.Unavailable, o.rates.Truncate, o.rates.Stall, (o.stall / 3).Round(time.Second), o.stall)
	fmt.Fprintf(b, "- each run: the images removed from the runtime's private storage, the daemon's cache emptied (daemon restarted) or kept at random, then `podman run --rm --net=none IMAGE` printing the sha256 of every file under /data (sorted) with the image's busybox, compared with the output of a normal pull (podman 4.3.1 without the store) byte for byte\n")
	fmt.Fprintf(b, "- daemon: defaults (background fetch on, request timeout 30 s, 4 attempts, resolve timeout 30 s, read timeout 60 s, negative TTL 3 s)\n")
	for _, e := range s.events {
		fmt.Fprintf(b, "- %s\n", e)
	}
	for _, k := range slices.Sorted(maps.Keys(s.wipes)) {
		fmt.Fprintf(b, "- storage wiped before %d runs: %s\n", s.wipes[k], k)
	}
	fmt.Fprintf(b, "\n| image | format | layers | compressed | files | data |\n|---|---|---:|---:|---:|---:|\n")
	for _, img := range s.images {
		fmt.Fprintf(b, "| %s | %s | %d | %.1f MB | %d | %.1f MB |\n", img.Content.Name, img.Format, len(img.Layers), float64(img.compressed())/1e6, img.Content.Files, float64(img.Content.Bytes)/1e6)
	}
}

// writeByRuntime: the containers by runtime and format.
func (s *soak) writeByRuntime(b *strings.Builder) {
	fmt.Fprintf(b, "\n## Containers by runtime and format\n\n")
	fmt.Fprintf(b, "| runtime | format | runs | ok | wrong | failed | killed | runs with every layer from the store | p50 | max |\n|---|---|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, p := range s.runtimes {
		for _, f := range []string{fmtEStargz, fmtZstd} {
			var n, ok, wrong, failed, killed, lazy int
			var ws []float64
			for _, r := range s.runs {
				if r.Runtime != p.name || r.Image.Format != f || r.Outcome == "interrupted" {
					continue
				}
				n++
				switch r.Outcome {
				case "ok":
					ok++
				case "wrong":
					wrong++
				case "failed":
					failed++
				}
				if r.KilledAt > 0 {
					killed++
				}
				if r.FromStore >= len(r.Image.Layers) {
					lazy++
				}
				if !r.Start.IsZero() {
					ws = append(ws, r.wall().Seconds())
				}
			}
			p50, mx := "-", "-"
			if len(ws) > 0 {
				p50, mx = fmt.Sprintf("%.1f s", benchenv.Median(ws)), fmt.Sprintf("%.1f s", slices.Max(ws))
			}
			fmt.Fprintf(b, "| %s | %s | %d | %d | %d | %d | %d | %d | %s | %s |\n", p.name, f, n, ok, wrong, failed, killed, lazy, p50, mx)
		}
	}
}

// writeFaults: the requests from the daemon by kind and what the proxy did.
func writeFaults(b *strings.Builder, pc proxyCounts) {
	fmt.Fprintf(b, "\n## Faults injected\n\nRequests from the daemon, by kind (ranges: TOC, footer, chunks, background fetch) and what the proxy did:\n\n")
	fmt.Fprintf(b, "| kind | requests |")
	for _, f := range faultKinds {
		fmt.Fprintf(b, " %s |", f)
	}
	b.WriteString("\n|---|---:|" + strings.Repeat("---:|", len(faultKinds)) + "\n")
	for _, k := range requestKinds {
		m := pc.ByKind[k]
		if len(m) == 0 {
			continue
		}
		n := 0
		for _, v := range m {
			n += v
		}
		fmt.Fprintf(b, "| %s | %d |", k, n)
		for _, f := range faultKinds {
			fmt.Fprintf(b, " %d |", m[f])
		}
		b.WriteString("\n")
	}
	fmt.Fprintf(b, "| **all** | %d |", pc.Total)
	for _, f := range faultKinds {
		fmt.Fprintf(b, " %d |", pc.ByFault[f])
	}
	b.WriteString("\n")
}

// writeKills: every kill of the daemon, and the kills planned that did not happen.
func (s *soak) writeKills(b *strings.Builder) {
	kills := 0
	for _, r := range s.runs {
		if r.KilledAt > 0 {
			kills++
		}
	}
	fmt.Fprintf(b, "\n## Kills\n\n")
	if kills == 0 {
		b.WriteString("None.\n")
	} else {
		fmt.Fprintf(b, "| run | runtime | image | killed at | container ran | serve back after | outcome |\n|---:|---|---|---:|---:|---:|---|\n")
		for _, r := range s.runs {
			if r.KilledAt == 0 {
				continue
			}
			back := "-"
			if r.RestartTook > 0 {
				back = fmt.Sprintf("%d ms", r.RestartTook.Milliseconds())
			}
			fmt.Fprintf(b, "| %d | %s | %s | %s | %s | %s | %s |\n", r.N, r.Runtime, r.Image.Name(), ms(r.KilledAt), ms(r.wall()), back, r.Outcome)
		}
	}
	planned := 0
	for _, r := range s.runs {
		if r.Kill && r.KilledAt == 0 {
			planned++
		}
	}
	if planned > 0 {
		fmt.Fprintf(b, "\n%d planned kills did not happen: the container ended before the moment drawn.\n", planned)
	}
}

// writeFallbacks: the runs that ended well with a layer podman pulled itself.
func (s *soak) writeFallbacks(b *strings.Builder, logs []logLine) {
	fmt.Fprintf(b, "\n## Layers podman pulled itself\n\n")
	fmt.Fprintf(b, "Runs that ended well, but with a layer the store did not serve (its lookup failed: podman then pulls the layer from the registry itself, without faults): the faults on the image's requests other than ranges, and the daemon's messages during the run.\n\n")
	fallbacks := 0
	for _, r := range s.runs {
		if r.Outcome != "ok" || r.FromStore >= len(r.Image.Layers) {
			continue
		}
		if fallbacks == 0 {
			fmt.Fprintf(b, "| run | runtime | image | from the store | faults (not ranges) | daemon's warnings |\n|---:|---|---|---:|---|---|\n")
		}
		fallbacks++
		var fs, ws []string
		for _, f := range r.Faults {
			if f.Kind != kindRange {
				fs = append(fs, fmt.Sprintf("%s %s", f.Fault, f.Kind))
			}
		}
		seen := map[string]bool{}
		for _, l := range duringRun(logs, r) {
			m := l.Msg
			if i := strings.Index(l.Raw, " err="); i >= 0 {
				m += ": " + l.Raw[i+5:]
			}
			if !seen[m] {
				seen[m] = true
				ws = append(ws, strings.ReplaceAll(m, "|", "\\|"))
			}
		}
		fmt.Fprintf(b, "| %d | %s | %s | %d of %d | %s | %s |\n", r.N, r.Runtime, r.Image.Name(), r.FromStore, len(r.Image.Layers),
			strings.Join(fs, ", "), strings.Join(ws, "; "))
	}
	if fallbacks == 0 {
		b.WriteString("None.\n")
	}
}

// writeFailures: every failed run and wrong output, with its faults and the daemon's lines.
func (s *soak) writeFailures(b *strings.Builder, logs []logLine) {
	fmt.Fprintf(b, "\n## Failures\n\n")
	bad := 0
	for _, r := range s.runs {
		if r.Outcome != "failed" && r.Outcome != "wrong" {
			continue
		}
		bad++
		killed := "not killed"
		if r.KilledAt > 0 {
			killed = "daemon killed at " + ms(r.KilledAt)
		}
		fmt.Fprintf(b, "### Run %d: %s, %s, %s, %s cache, %s, %s after %s\n\n", r.N, r.Outcome, r.Runtime, r.Image.Name(),
			map[bool]string{true: "empty", false: "kept"}[r.Cold], killed, r.Outcome, ms(r.wall()))
		if r.Err != "" {
			fmt.Fprintf(b, "```\n%s\n```\n\n", strings.TrimSpace(r.Err))
		}
		if len(r.Wrong) > 0 {
			fmt.Fprintf(b, "Wrong output lines (%d; the first 5):\n\n```\n%s\n```\n\n", len(r.Wrong), strings.Join(r.Wrong[:min(5, len(r.Wrong))], "\n"))
		}
		fmt.Fprintf(b, "%d output lines of %d; %d layers from the store; %d requests of %s through the proxy during the run, **%d faults**",
			r.Lines, r.Image.Content.Files, r.FromStore, r.Requests, r.Image.Repo, len(r.Faults))
		if len(r.Faults) > 0 {
			byType := map[fault]int{}
			for _, f := range r.Faults {
				byType[f.Fault]++
			}
			var parts []string
			for _, f := range faultKinds {
				if byType[f] > 0 {
					parts = append(parts, fmt.Sprintf("%d %s", byType[f], f))
				}
			}
			fmt.Fprintf(b, " (%s):\n\n", strings.Join(parts, ", "))
			for i, f := range r.Faults {
				if i == 20 {
					fmt.Fprintf(b, "- ... %d more\n", len(r.Faults)-20)
					break
				}
				fmt.Fprintf(b, "- +%s %s\n", ms(f.At.Sub(r.Start)), f)
			}
		} else {
			b.WriteString(".\n")
		}
		var during []string
		for _, l := range duringRun(logs, r) {
			during = append(during, l.Raw)
		}
		if len(during) > 0 {
			fmt.Fprintf(b, "\nThe daemon's warn/error lines during the run (%d; the first 10):\n\n```\n%s\n```\n", len(during), strings.Join(during[:min(10, len(during))], "\n"))
		}
		for _, n := range r.Notes {
			fmt.Fprintf(b, "\n- note: %s\n", n)
		}
		b.WriteString("\n")
	}
	if bad == 0 {
		b.WriteString("None.\n")
	}
}

// writeLogCounts: the daemon's warn and error lines counted by message.
func writeLogCounts(b *strings.Builder, logs []logLine) {
	fmt.Fprintf(b, "\n## Daemon log: warn and error lines by message\n\n")
	type key struct{ level, msg string }
	counts := map[key]int{}
	for _, l := range logs {
		counts[key{l.Level, l.Msg}]++
	}
	keys := make([]key, 0, len(counts))
	for k := range counts {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, func(a, b key) int {
		if c := counts[b] - counts[a]; c != 0 {
			return c
		}
		return strings.Compare(a.level+a.msg, b.level+b.msg)
	})
	if len(keys) == 0 {
		b.WriteString("None.\n")
	} else {
		fmt.Fprintf(b, "| level | message | lines |\n|---|---|---:|\n")
		for _, k := range keys {
			fmt.Fprintf(b, "| %s | %s | %d |\n", k.level, strings.ReplaceAll(k.msg, "|", "\\|"), counts[k])
		}
	}
}

// writeCounters: the daemon's counters summed over its processes.
func (s *soak) writeCounters(b *strings.Builder) {
	var sum protocol.Counters
	for _, c := range s.counters {
		sum.Lookups += c.Lookups
		sum.Resolutions += c.Resolutions
		sum.FromRecords += c.FromRecords
		sum.NotLazy += c.NotLazy
		sum.Failures += c.Failures
		sum.VerifyFailures += c.VerifyFailures
		sum.OnDemandBytes += c.OnDemandBytes
		sum.PrefetchBytes += c.PrefetchBytes
	}
	fmt.Fprintf(b, "\n## Daemon counters\n\nSummed over its %d processes (each one's last sample, taken around the runs and just before a kill):\n\n", len(s.counters))
	fmt.Fprintf(b, "| lookups | resolutions | from records | not lazy | failures | verification failures | on demand | background |\n|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	fmt.Fprintf(b, "| %d | %d | %d | %d | %d | %d | %.1f MB | %.1f MB |\n", sum.Lookups, sum.Resolutions, sum.FromRecords, sum.NotLazy,
		sum.Failures, sum.VerifyFailures, float64(sum.OnDemandBytes)/1e6, float64(sum.PrefetchBytes)/1e6)
}

// writeNotes: the notes on runs that ended well.
func (s *soak) writeNotes(b *strings.Builder) {
	var notes []string
	for _, r := range s.runs {
		if r.Outcome == "ok" {
			for _, n := range r.Notes {
				notes = append(notes, fmt.Sprintf("run %d (%s, %s): %s", r.N, r.Runtime, r.Image.Name(), n))
			}
		}
	}
	if len(notes) > 0 {
		fmt.Fprintf(b, "\n## Notes on successful runs\n\n")
		for _, n := range notes {
			fmt.Fprintf(b, "- %s\n", strings.ReplaceAll(n, "\n", " "))
		}
	}
}

// duringRun are the log lines written while run r ran.
func duringRun(logs []logLine, r *runRecord) []logLine {
	var out []logLine
	for _, l := range logs {
		if !l.At.IsZero() && !l.At.Before(r.Start) && !l.At.After(r.End) {
			out = append(out, l)
		}
	}
	return out
}
