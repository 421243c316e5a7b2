package control

import (
	"fmt"
	"io"

	"github.com/layerstore/layerstore/layer"
)

// writeMetrics writes the status in the Prometheus text format. Labels never carry digests or
// references: a node has as many of those as images.
func writeMetrics(w io.Writer, st layer.Status) {
	metric := func(name, typ, help string, samples ...sample) {
		fmt.Fprintf(w, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, typ)
		for _, s := range samples {
			fmt.Fprintf(w, "%s%s %d\n", name, s.labels, s.v)
		}
	}
	c := st.Counters
	metric("layerstore_lookups_total", "counter", "Layer lookups by the runtime.", sample{v: c.Lookups})
	metric("layerstore_resolutions_total", "counter", "Layer resolutions started.", sample{v: c.Resolutions})
	metric("layerstore_not_lazy_total", "counter", "Lookups of layers not served lazily (the runtime pulls them).", sample{v: c.NotLazy})
	metric("layerstore_resolve_failures_total", "counter", "Resolutions that failed (registry, verification).", sample{v: c.Failures})
	metric("layerstore_verify_failures_total", "counter", "TOCs and chunks refused because they did not match their digest.", sample{v: c.VerifyFailures})
	metric("layerstore_fetched_bytes_total", "counter", "Compressed bytes fetched from registries.",
		sample{`{kind="on_demand"}`, c.OnDemandBytes}, sample{`{kind="prefetch"}`, c.PrefetchBytes})
	states := map[layer.State]int64{}
	var users int64
	for _, l := range st.Layers {
		states[l.State]++
		users += l.Users
	}
	var byState []sample
	for _, s := range []layer.State{layer.StateIdle, layer.StateFetching, layer.StateComplete, layer.StateStopped, layer.StateFailed} {
		byState = append(byState, sample{fmt.Sprintf(`{state=%q}`, s), states[s]})
	}
	metric("layerstore_layers", "gauge", "Resolved layers by background fetch state.", byState...)
	metric("layerstore_layer_users", "gauge", "Runtime references to resolved layers.", sample{v: users})
	cs := st.Cache
	metric("layerstore_cache_bytes", "gauge", "Content bytes in the cache.", sample{v: cs.Bytes})
	metric("layerstore_cache_max_bytes", "gauge", "The cache's size bound.", sample{v: cs.MaxBytes})
	metric("layerstore_cache_files", "gauge", "Files in the cache, complete or being filled.",
		sample{`{complete="true"}`, int64(cs.Complete)}, sample{`{complete="false"}`, int64(cs.Files - cs.Complete)})
	metric("layerstore_cache_hits_total", "counter", "Cache reads that found all their bytes.", sample{v: cs.Hits})
	metric("layerstore_cache_misses_total", "counter", "Cache reads that found bytes missing.", sample{v: cs.Misses})
	metric("layerstore_cache_evictions_total", "counter", "Files evicted to keep the cache within its bound.", sample{v: cs.Evictions})
}

type sample struct {
	labels string
	v      int64
}
