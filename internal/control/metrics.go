package control

import (
	"fmt"
	"io"
	"net/http"
	"strconv"

	"github.com/layerstore/layerstore/internal/control/protocol"
	"github.com/layerstore/layerstore/internal/metrics"
)

// MetricsSource is what the metrics are read from: the layer manager.
type MetricsSource interface {
	Status() protocol.Status
}

// metricsContentType is the Prometheus text exposition format.
const metricsContentType = "text/plain; version=0.0.4; charset=utf-8"

// MetricsHandler serves GET /metrics alone, the same text as the control socket's /metrics,
// for the metrics address (TCP): nothing else of the control API (status, pins, credentials)
// is reachable through it. Other paths answer 404, other methods on /metrics 405.
func MetricsHandler(src MetricsSource) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /metrics", metricsEndpoint(src))
	return mux
}

func metricsEndpoint(src MetricsSource) http.HandlerFunc {
	return func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", metricsContentType)
		writeMetrics(w, src.Status())
	}
}

// writeMetrics writes the status in the Prometheus text format. Labels never carry digests,
// references or paths: a node has as many of those as images; every label has a few fixed
// values, and every series is written, zero or not.
func writeMetrics(w io.Writer, st protocol.Status) {
	header := func(name, typ, help string) {
		fmt.Fprintf(w, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, typ)
	}
	metric := func(name, typ, help string, samples ...sample) {
		header(name, typ, help)
		for _, s := range samples {
			fmt.Fprintf(w, "%s%s %d\n", name, s.labels, s.v)
		}
	}
	c := st.Counters
	metric("layerstore_lookups_total", "counter", "Layer lookups by the runtime (and by pins).", sample{v: c.Lookups})
	metric("layerstore_resolutions_total", "counter", "Layer resolutions started (lookups not answered from memory).", sample{v: c.Resolutions})
	metric("layerstore_not_lazy_total", "counter", "Lookups of layers not served lazily (the runtime pulls them).", sample{v: c.NotLazy})
	metric("layerstore_resolve_failures_total", "counter", "Resolutions that failed (registry, verification).", sample{v: c.Failures})
	metric("layerstore_verify_failures_total", "counter", "TOCs, tar-splits, chunks and blobs refused because they did not match their digest.", sample{v: c.VerifyFailures})
	metric("layerstore_fetched_bytes_total", "counter", "Compressed bytes fetched from registries: on_demand for reads (with their read-ahead and blob exports), profile for the files of startup profiles the background fetch fetched first, prefetch for the rest of the background fetch (pins included).",
		sample{`{kind="on_demand"}`, c.OnDemandBytes}, sample{`{kind="profile"}`, c.ProfileBytes}, sample{`{kind="prefetch"}`, c.PrefetchBytes})

	lat := st.Latency
	header("layerstore_lookup_duration_seconds", "histogram", "Duration of layer lookups, by outcome (served, not_lazy, failed) and by what answered (memory, record, registry).")
	for _, h := range lat.Lookups {
		writeHistogram(w, "layerstore_lookup_duration_seconds", `outcome="`+h.Outcome+`",source="`+h.Source+`"`, h.Snapshot)
	}
	header("layerstore_read_wait_seconds", "histogram", "Time reads of files waited for the registry (chunks missing from the cache).")
	writeHistogram(w, "layerstore_read_wait_seconds", "", lat.ReadWait)

	states := map[protocol.State]int64{}
	var users int64
	for _, l := range st.Layers {
		states[l.State]++
		users += l.Users
	}
	var byState []sample
	for _, s := range []protocol.State{protocol.StateIdle, protocol.StateFetching, protocol.StateComplete, protocol.StateStopped, protocol.StateFailed} {
		byState = append(byState, sample{fmt.Sprintf(`{state=%q}`, s), states[s]})
	}
	metric("layerstore_layers", "gauge", "Resolved layers by background fetch state.", byState...)
	metric("layerstore_layer_users", "gauge", "Runtime references to resolved layers.", sample{v: users})
	cs := st.Cache
	metric("layerstore_cache_bytes", "gauge", "Bytes in the cache: file content and layer records.", sample{v: cs.Bytes})
	metric("layerstore_cache_max_bytes", "gauge", "The cache's size bound.", sample{v: cs.MaxBytes})
	metric("layerstore_cache_files", "gauge", "Files in the cache, complete or being filled.",
		sample{`{complete="true"}`, int64(cs.Complete)}, sample{`{complete="false"}`, int64(cs.Files - cs.Complete)})
	metric("layerstore_cache_hits_total", "counter", "Cache reads that found all their bytes.", sample{v: cs.Hits})
	metric("layerstore_cache_misses_total", "counter", "Cache reads that found bytes missing.", sample{v: cs.Misses})
	metric("layerstore_cache_evictions_total", "counter", "Files and layer records evicted to keep the cache within its bound or make room on its filesystem.", sample{v: cs.Evictions})
	if rt := st.Runtimes; rt != nil {
		metric("layerstore_runtime_layers_recorded_total", "counter", "Layer entries the daemon added to runtimes' layers.json (their containers/storage did not record the layers taken from the store).", sample{v: rt.Recorded})
		metric("layerstore_runtime_record_failures_total", "counter", "Passes over a runtime's storage that failed to record its layers.", sample{v: rt.Failures})
	}
}

// writeHistogram writes the series of one histogram: its cumulative buckets (le), +Inf
// included, its sum and its count. labels are the series' other labels, without braces.
func writeHistogram(w io.Writer, name, labels string, s metrics.Snapshot) {
	sep := ""
	if labels != "" {
		sep = ","
	}
	for i, b := range s.Bounds {
		fmt.Fprintf(w, "%s_bucket{%s%sle=%q} %d\n", name, labels, sep, formatFloat(b), s.Cumulative[i])
	}
	fmt.Fprintf(w, "%s_bucket{%s%sle=\"+Inf\"} %d\n", name, labels, sep, s.Count)
	braces := ""
	if labels != "" {
		braces = "{" + labels + "}"
	}
	fmt.Fprintf(w, "%s_sum%s %s\n", name, braces, formatFloat(s.Sum))
	fmt.Fprintf(w, "%s_count%s %d\n", name, braces, s.Count)
}

func formatFloat(v float64) string { return strconv.FormatFloat(v, 'g', -1, 64) }

type sample struct {
	labels string
	v      int64
}
