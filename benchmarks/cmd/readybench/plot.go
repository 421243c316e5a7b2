package main

import (
	"bufio"
	"context"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
)

// point is one cell of a report as the plots need it: what was measured and its total time
// to ready. The plots are drawn from points, whether a run has just measured them or -replot
// reads them back from a report.
type point struct {
	image, format, mode, runtime string
	warm                         bool
	total                        stats
}

// plotSeries are the bars of each image, in this order: what a reader compares with a full
// pull of the same image. A series the report does not have is left out.
var plotSeries = []struct{ title, format, mode, colour string }{
	{"stargz-store", fmtEStargz, "lazy-stargz-store", "#8c8c8c"},
	{"stargz-store, prioritized", fmtEStargzPri, "lazy-stargz-store", "#cccccc"},
	{"layerstore", fmtEStargz, modeLazy, "#1f5fa8"},
	{"layerstore, prioritized", fmtEStargzPri, modeLazy, "#7fb2e5"},
	{"layerstore, learned profile", fmtEStargz, modeLearned, "#2e9e4f"},
	{"layerstore, zstd:chunked", fmtZstd, modeLazy, "#e08a1e"},
}

// plots draws one PNG per link from the report's cells (see plotLink), <stem>-<link>.png, and
// returns the file names per link, relative to the report; none, and a note in the report,
// without gnuplot.
func (r *report) plots(ctx context.Context, stem string) (map[string]string, error) {
	if _, err := exec.LookPath("gnuplot"); err != nil {
		r.noPlots = "no plots: gnuplot not found (`apt-get install -y gnuplot-nox`)"
		fmt.Fprintln(os.Stderr, "readybench:", r.noPlots)
		return map[string]string{}, nil
	}
	byLink := map[string][]point{}
	var links []string
	for _, l := range r.opts.links {
		links = append(links, l.String())
	}
	for _, c := range r.cells {
		if res := r.results[c.String()]; len(res) > 0 {
			byLink[c.link.String()] = append(byLink[c.link.String()],
				point{c.image.name, c.format, c.mode(), c.runtime, c.warm, measureOf(res, sample.total)})
		}
	}
	out, err := drawPlots(ctx, r.b.work, stem, links, byLink)
	if err == nil && len(out) < len(byLink) {
		r.noPlots = "no plot of a link without a full pull: the plots show time relative to it"
	}
	return out, err
}

// drawPlots writes <stem>-<link>.png for every link with points, in a temporary directory
// under work for gnuplot's inputs, and returns the file names per link.
func drawPlots(ctx context.Context, work, stem string, links []string, byLink map[string][]point) (map[string]string, error) {
	tmp, err := os.MkdirTemp(work, "plot-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(tmp)
	out := map[string]string{}
	for _, l := range links {
		png := stem + "-" + strings.NewReplacer("/", "-", " ", "-").Replace(l) + ".png"
		drawn, err := plotLink(ctx, tmp, png, l, byLink[l])
		if err != nil {
			return nil, err
		}
		if drawn {
			out[l] = filepath.Base(png)
		}
	}
	return out, nil
}

// plotLink draws the cold starts of one link: a panel per runtime, the images along x, and
// per image the plotSeries' p50 time to ready over the p50 of the image's full pull on that
// runtime (whiskers to p95), under a line at 1.0, the full pull; the legend in a row of its
// own below the panels, so that it covers no bar. It draws nothing (false) when no image has
// both a full pull and a series.
func plotLink(ctx context.Context, tmp, png, link string, points []point) (bool, error) {
	c := coldOf(points)
	if len(c.full) == 0 || len(c.series) == 0 {
		return false, nil
	}
	var script strings.Builder
	fmt.Fprintf(&script, `set terminal pngcairo size %d,520 font "sans,11"
set output %q
set multiplot title "Time to ready from a cold cache over %s, relative to a full pull of the same image (= 1.0; lower is faster)\np50, whiskers to p95"
set style fill solid 1.0 border -1
set datafile missing "NaN"
set grid ytics
set yrange [0:1.1]
set ytics 0.1
set ylabel "time / full pull"
`, max(960, 200+440*len(c.runtimes)), png, link)
	w := 1 / float64(len(c.runtimes))
	for n, rt := range c.runtimes {
		data := filepath.Join(tmp, rt+".dat")
		if err := os.WriteFile(data, []byte(c.table(rt)), 0o644); err != nil {
			return false, err
		}
		fmt.Fprintf(&script, "set origin %.4f,0.12\nset size %.4f,0.8\nset title %q\nset style data histogram\n", float64(n)*w, w, rt)
		script.WriteString("set style histogram errorbars gap 1.5 lw 1\nunset key\n")
		script.WriteString(`plot 1.0 with lines lc rgb "#c0392b" lw 2 dt 2`)
		for j, i := range c.series {
			xtic := ""
			if j == 0 {
				xtic = ":xtic(1)"
			}
			col := 2 + 3*j
			fmt.Fprintf(&script, ", %q using %d:%d:%d%s lc rgb %q", data, col, col+1, col+2, xtic, plotSeries[i].colour)
		}
		script.WriteString("\n")
	}
	script.WriteString("set origin 0,0\nset size 1,0.12\nunset title\nunset ylabel\nunset border\nunset tics\nunset grid\n")
	script.WriteString("set xrange [0:1]\nset yrange [0:1]\nset key center center horizontal Left reverse samplen 2 width 1\n")
	script.WriteString(`plot NaN with lines lc rgb "#c0392b" lw 2 dt 2 title "full pull"`)
	for _, i := range c.series {
		fmt.Fprintf(&script, ", NaN with boxes lc rgb %q title %q", plotSeries[i].colour, plotSeries[i].title)
	}
	script.WriteString("\nunset multiplot\n")
	sp := filepath.Join(tmp, "plot.gp")
	if err := os.WriteFile(sp, []byte(script.String()), 0o644); err != nil {
		return false, err
	}
	if b, err := exec.CommandContext(ctx, "gnuplot", sp).CombinedOutput(); err != nil {
		return false, fmt.Errorf("gnuplot: %v\n%s", err, b)
	}
	return true, nil
}

// coldStarts are a link's cold cells, as plotLink draws them.
type coldStarts struct {
	runtimes, images []string              // in the report's order
	full             map[[2]string]float64 // runtime, image: the full pull's p50
	cells            map[string]stats      // runtime:image:format:mode
	series           []int                 // indexes into plotSeries of those measured
}

func coldOf(points []point) coldStarts {
	c := coldStarts{full: map[[2]string]float64{}, cells: map[string]stats{}}
	for _, p := range points {
		if p.warm {
			continue
		}
		if !slices.Contains(c.runtimes, p.runtime) {
			c.runtimes = append(c.runtimes, p.runtime)
		}
		if !slices.Contains(c.images, p.image) {
			c.images = append(c.images, p.image)
		}
		if p.format == fmtGzip && p.mode == modeFull && p.total.p50 > 0 {
			c.full[[2]string{p.runtime, p.image}] = p.total.p50
		}
		c.cells[strings.Join([]string{p.runtime, p.image, p.format, p.mode}, ":")] = p.total
	}
	for i, s := range plotSeries {
		for k := range c.cells {
			if strings.HasSuffix(k, ":"+s.format+":"+s.mode) {
				c.series = append(c.series, i)
				break
			}
		}
	}
	return c
}

// table is gnuplot's data for the panel of runtime rt: a line per image with a full pull, the
// image's name, then per series p50, p50 and p95 over the full pull's p50 (NaN: not measured).
func (c coldStarts) table(rt string) string {
	var d strings.Builder
	for _, img := range c.images {
		f, ok := c.full[[2]string{rt, img}]
		if !ok {
			continue
		}
		d.WriteString(img)
		for _, i := range c.series {
			st, ok := c.cells[strings.Join([]string{rt, img, plotSeries[i].format, plotSeries[i].mode}, ":")]
			if !ok {
				st = stats{math.NaN(), math.NaN()}
			}
			fmt.Fprintf(&d, " %s %s %s", num(st.p50/f), num(st.p50/f), num(st.p95/f))
		}
		d.WriteString("\n")
	}
	return d.String()
}

// replot draws a report's plots again from its tables, next to it (-replot): the figures of a
// run already made, in the plots' current form.
func replot(ctx context.Context, report string) error {
	links, byLink, err := readPoints(report)
	if err != nil {
		return err
	}
	out, err := drawPlots(ctx, filepath.Dir(report), strings.TrimSuffix(report, ".md"), links, byLink)
	if err != nil {
		return err
	}
	for _, l := range links {
		if p := out[l]; p != "" {
			fmt.Println(filepath.Join(filepath.Dir(report), p))
		}
	}
	return nil
}

// readPoints reads the cells of a report back from its tables: each "## Link" section's table
// with the columns image, format, mode, cache and total p50/p95 (runtime too since there were
// two; podman4 before).
func readPoints(report string) ([]string, map[string][]point, error) {
	f, err := os.Open(report)
	if err != nil {
		return nil, nil, err
	}
	defer f.Close()
	var links []string
	byLink := map[string][]point{}
	var link string
	var col map[string]int
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if l, ok := strings.CutPrefix(line, "## Link "); ok {
			link, col = strings.TrimSpace(l), nil
			links = append(links, link)
			continue
		}
		if link == "" || !strings.HasPrefix(line, "|") || strings.HasPrefix(line, "|---") {
			continue
		}
		cells := strings.Split(strings.Trim(line, "|"), "|")
		for i := range cells {
			cells[i] = strings.Trim(strings.TrimSpace(cells[i]), "*")
		}
		if col == nil {
			col = map[string]int{}
			for i, h := range cells {
				col[h] = i
			}
			continue
		}
		p, ok := pointOf(cells, col)
		if ok {
			byLink[link] = append(byLink[link], p)
		}
	}
	if err := sc.Err(); err != nil {
		return nil, nil, err
	}
	if len(byLink) == 0 {
		return nil, nil, fmt.Errorf("%s: no table of time to ready under a \"## Link\" heading", report)
	}
	return links, byLink, nil
}

// pointOf is one row of a report's table; false for a row that is not a cell.
func pointOf(cells []string, col map[string]int) (point, bool) {
	get := func(name string) string {
		if i, ok := col[name]; ok && i < len(cells) {
			return cells[i]
		}
		return ""
	}
	p50, err1 := strconv.ParseFloat(get("total p50"), 64)
	p95, err2 := strconv.ParseFloat(get("total p95"), 64)
	if err1 != nil || err2 != nil || get("image") == "" {
		return point{}, false
	}
	rt := get("runtime")
	if rt == "" {
		rt = rtPodman4
	}
	return point{get("image"), get("format"), get("mode"), rt, get("cache") == "warm", stats{p50, p95}}, true
}

func num(x float64) string {
	if math.IsNaN(x) {
		return "NaN"
	}
	return fmt.Sprintf("%.3f", x)
}
