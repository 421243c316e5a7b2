package control

import (
	"fmt"
	"io"
	"strings"

	"github.com/layerstore/layerstore/internal/control/protocol"
)

// Render writes the status for a person: one block per layer, with a progress bar for the
// layers still fetching in the background.
func Render(w io.Writer, st protocol.Status) {
	fmt.Fprintf(w, "cache: %s   layers: %d   lookups: %d   not lazy: %d   failures: %d   verification failures: %d\n",
		human(st.Cache.Bytes), len(st.Layers), st.Counters.Lookups, st.Counters.NotLazy,
		st.Counters.Failures, st.Counters.VerifyFailures)
	for _, p := range st.Pins {
		platform := ""
		if p.Platform != "" {
			platform = " (" + p.Platform + ")"
		}
		fmt.Fprintf(w, "\npinned %s%s  %d layers  %s %s / %s\n", p.Ref, platform, len(p.Layers),
			bar(p.Present, p.Bytes, 30), human(p.Present), human(p.Bytes))
		if p.Error != "" {
			fmt.Fprintf(w, "  %s\n", p.Error)
		}
	}
	for _, l := range st.Layers {
		fmt.Fprintf(w, "\n%s  %s  %s  users %d\n", short(string(l.Digest)), l.Format, l.Guarantee, l.Users)
		for _, r := range l.Refs {
			fmt.Fprintf(w, "  %s\n", r)
		}
		fetched := l.OnDemand + l.Prefetched
		switch l.State {
		case protocol.StateFetching:
			fmt.Fprintf(w, "  %s %s / %s\n", bar(l.Prefetched, l.ToFetch, 30), human(l.Prefetched), human(l.ToFetch))
		default:
			fmt.Fprintf(w, "  %s", l.State)
			if l.Seconds > 0 {
				fmt.Fprintf(w, " in %.1fs", l.Seconds)
			}
			fmt.Fprintln(w)
		}
		fmt.Fprintf(w, "  fetched %s of %s (%s on demand, %s in the background)\n",
			human(fetched), human(l.Size), human(l.OnDemand), human(l.Prefetched))
		if l.ReadChunks > 0 {
			fmt.Fprintf(w, "  read %d chunks, %s of the blob", l.ReadChunks, human(l.ReadCompressed))
			if l.ReadWaits > 0 {
				fmt.Fprintf(w, "; %d reads waited for the registry (%d sent a request), %.2fs in all", l.ReadWaits, l.ReadRequests, l.ReadWaitSeconds)
			}
			fmt.Fprintln(w)
		}
		if p := l.Profile; p != nil {
			from := "recorded from this layer"
			if !p.SameLayer {
				from = "learned from another version of the image"
			}
			fmt.Fprintf(w, "  startup profile replayed first: %d files, %s of %s fetched (%s)\n",
				p.Files, human(p.Fetched), human(p.Bytes), from)
		}
		if l.ProfileRecorded > 0 {
			fmt.Fprintf(w, "  startup profile recorded: %d files\n", l.ProfileRecorded)
		}
		if l.Error != "" {
			fmt.Fprintf(w, "  error: %s\n", l.Error)
		}
	}
}

func short(d string) string {
	if i := strings.IndexByte(d, ':'); i >= 0 && len(d) > i+13 {
		return d[:i+13]
	}
	return d
}

func bar(n, total int64, width int) string {
	if total <= 0 {
		total = 1
	}
	full := min(int(n*int64(width)/total), width)
	return "[" + strings.Repeat("#", full) + strings.Repeat(".", width-full) + "]" +
		fmt.Sprintf(" %3d%%", min(n*100/total, 100))
}

func human(n int64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	v, u := float64(n), 0
	for v >= unit && u < 4 {
		v /= unit
		u++
	}
	return fmt.Sprintf("%.1f %ciB", v, "KMGT"[u-1])
}
