package main

import (
	"context"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
)

// plots draws, per link, the p50 total time to ready of every image (x) and format and mode
// (bars, whiskers to p95), cold and warm side by side, with gnuplot. It writes
// <stem>-<link>.png and returns the file names per link, relative to the report; none, and
// a note in the report, without gnuplot.
func (r *report) plots(ctx context.Context, stem string) (map[string]string, error) {
	out := map[string]string{}
	if _, err := exec.LookPath("gnuplot"); err != nil {
		r.noPlots = "no plots: gnuplot not found (`apt-get install -y gnuplot-nox`)"
		fmt.Fprintln(os.Stderr, "readybench:", r.noPlots)
		return out, nil
	}
	tmp, err := os.MkdirTemp(r.b.work, "plot-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(tmp)
	for _, l := range r.opts.links {
		// The series: format, mode and runtime measured on this link, in the report's order.
		type series struct{ format, mode, runtime string }
		var ss []series
		seen := map[series]bool{}
		for _, c := range r.cells {
			s := series{c.format, c.mode(), c.runtime}
			if c.link.String() == l.String() && !seen[s] {
				seen[s] = true
				ss = append(ss, s)
			}
		}
		var caches []bool // the cache states measured on this link
		for _, warm := range []bool{false, true} {
			for _, c := range r.cells {
				if c.link.String() == l.String() && c.warm == warm && len(r.results[c.String()]) > 0 {
					caches = append(caches, warm)
					break
				}
			}
		}
		var images []imageSpec // the images measured on this link
		for _, img := range imageSpecs {
			if slices.ContainsFunc(r.cells, func(c cell) bool {
				return c.image.name == img.name && c.link.String() == l.String() && len(r.results[c.String()]) > 0
			}) {
				images = append(images, img)
			}
		}
		if len(ss) == 0 || len(caches) == 0 {
			continue
		}
		var script strings.Builder
		png := stem + "-" + strings.NewReplacer("/", "-", " ", "-").Replace(l.String()) + ".png"
		fmt.Fprintf(&script, `set terminal pngcairo size 1400,560 font "sans,10"
set output %q
set multiplot layout 1,%d title "time to ready (podman pull + run until ready), link %s: p50, whiskers to p95"
set style data histogram
set style histogram errorbars gap 2 lw 1
set style fill solid 0.85 border -1
set datafile missing "NaN"
set ylabel "seconds"
set grid ytics
set yrange [0:*]
set key top left
`, png, len(caches), l)
		for _, warm := range caches {
			cache := map[bool]string{false: "cold", true: "warm"}[warm]
			data := filepath.Join(tmp, fmt.Sprintf("%d-%s.dat", len(out), cache))
			var d strings.Builder
			for _, img := range images {
				fmt.Fprintf(&d, "%s", img.name)
				for _, s := range ss {
					c := cell{image: img, format: s.format, runtime: s.runtime, link: l, warm: warm}
					if s.mode != "full" {
						c.store = strings.TrimPrefix(strings.TrimPrefix(s.mode, "lazy"), "-")
						if c.store == "" {
							c.store = "layerstore"
						}
					}
					st := stats{math.NaN(), math.NaN()}
					if res := r.results[c.String()]; len(res) > 0 {
						st = measureOf(res, sample.total)
					}
					fmt.Fprintf(&d, " %s %s %s", num(st.p50), num(st.p50), num(st.p95))
				}
				d.WriteString("\n")
			}
			if err := os.WriteFile(data, []byte(d.String()), 0o644); err != nil {
				return nil, err
			}
			fmt.Fprintf(&script, "set title %q\nplot ", cache)
			for i, s := range ss {
				if i > 0 {
					script.WriteString(", ")
				}
				col := 2 + 3*i
				xtic := ""
				if i == 0 {
					xtic = ":xtic(1)"
				}
				fmt.Fprintf(&script, "%q using %d:%d:%d%s title %q", data, col, col+1, col+2, xtic, s.format+" "+s.mode+" "+s.runtime)
			}
			script.WriteString("\n")
		}
		script.WriteString("unset multiplot\n")
		sp := filepath.Join(tmp, "plot.gp")
		if err := os.WriteFile(sp, []byte(script.String()), 0o644); err != nil {
			return nil, err
		}
		if b, err := exec.CommandContext(ctx, "gnuplot", sp).CombinedOutput(); err != nil {
			return nil, fmt.Errorf("gnuplot: %v\n%s", err, b)
		}
		out[l.String()] = filepath.Base(png)
	}
	return out, nil
}

func num(x float64) string {
	if math.IsNaN(x) {
		return "NaN"
	}
	return fmt.Sprintf("%.3f", x)
}
