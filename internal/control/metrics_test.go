package control

import (
	"bufio"
	"bytes"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/layerstore/layerstore/internal/control/protocol"
	"github.com/layerstore/layerstore/internal/metrics"
)

var (
	sampleLine = regexp.MustCompile(`^(layerstore_[a-z_]+)(\{([a-z_]+="[^"]*"(,[a-z_]+="[^"]*")*)\})? (\S+)$`)
	typeLine   = regexp.MustCompile(`^# TYPE (layerstore_[a-z_]+) (counter|gauge|histogram)$`)
	helpLine   = regexp.MustCompile(`^# HELP (layerstore_[a-z_]+) \S.*$`)
)

// checkExposition checks text against the Prometheus text format and naming conventions: a
// HELP and a TYPE before each family's samples, each family once; counters end in _total;
// histograms are in seconds, with cumulative buckets ending at +Inf equal to the count. It
// returns the samples by series (name and labels).
func checkExposition(t *testing.T, text string) map[string]float64 {
	t.Helper()
	samples := map[string]float64{}
	types := map[string]string{}
	helped := map[string]bool{}
	var family string
	last := map[string]float64{} // a histogram series' previous bucket
	sc := bufio.NewScanner(strings.NewReader(text))
	for sc.Scan() {
		line := sc.Text()
		if m := helpLine.FindStringSubmatch(line); m != nil {
			if helped[m[1]] {
				t.Errorf("HELP of %s twice", m[1])
			}
			helped[m[1]] = true
			continue
		}
		if m := typeLine.FindStringSubmatch(line); m != nil {
			if _, ok := types[m[1]]; ok || !helped[m[1]] {
				t.Errorf("TYPE of %s twice or without HELP", m[1])
			}
			types[m[1]], family = m[2], m[1]
			switch {
			case m[2] == "counter" && !strings.HasSuffix(m[1], "_total"),
				m[2] == "histogram" && !strings.HasSuffix(m[1], "_seconds"),
				m[2] != "counter" && strings.HasSuffix(m[1], "_total"):
				t.Errorf("%s %s breaks the naming conventions", m[2], m[1])
			}
			continue
		}
		m := sampleLine.FindStringSubmatch(line)
		if m == nil {
			t.Errorf("not a sample: %q", line)
			continue
		}
		name, labels := m[1], m[3]
		v, err := strconv.ParseFloat(m[5], 64)
		if err != nil || v < 0 {
			t.Errorf("value of %q", line)
		}
		if types[family] == "histogram" {
			base, le, _ := strings.Cut(labels, `le="`)
			base = strings.TrimSuffix(base, ",")
			switch name {
			case family + "_bucket":
				if le == "" {
					t.Errorf("bucket without le: %q", line)
				}
				if v < last[base] {
					t.Errorf("buckets not cumulative: %q", line)
				}
				last[base] = v
				if le == `+Inf"` {
					last[base+"+Inf"] = v
				}
			case family + "_count":
				if inf, ok := last[labels+"+Inf"]; !ok || inf != v {
					t.Errorf("%q: the +Inf bucket is %v", line, inf)
				}
				delete(last, labels)
			case family + "_sum":
			default:
				t.Errorf("sample %q in histogram %s", line, family)
			}
		} else if name != family {
			t.Errorf("sample %q after the TYPE of %s", line, family)
		}
		key := name
		if m[2] != "" {
			key += m[2]
		}
		if _, dup := samples[key]; dup {
			t.Errorf("series %s twice", key)
		}
		samples[key] = v
	}
	return samples
}

func TestMetricsFormat(t *testing.T) {
	wait := metrics.NewHistogram(metrics.DefaultBuckets)
	wait.Observe(3 * time.Millisecond)
	wait.Observe(2 * time.Second)
	wait.Observe(2 * time.Minute)
	served := metrics.NewHistogram(metrics.DefaultBuckets)
	served.Observe(40 * time.Millisecond)
	st := protocol.Status{
		Layers: []protocol.LayerStatus{{Refs: []string{"r/app:v1"}, Digest: "sha256:abcd", State: protocol.StateComplete, Users: 3}},
		Latency: protocol.Latency{
			Lookups: []protocol.LookupLatency{
				{Outcome: "served", Source: "registry", Snapshot: served.Snapshot()},
				{Outcome: "failed", Source: "memory", Snapshot: metrics.NewHistogram(metrics.DefaultBuckets).Snapshot()},
			},
			ReadWait: wait.Snapshot(),
		},
	}
	st.Counters.VerifyFailures, st.Counters.OnDemandBytes, st.Counters.PrefetchBytes = 2, 100, 4096
	st.Counters.ProfileBytes = 7
	st.Cache.Evictions = 5
	var buf bytes.Buffer
	writeMetrics(&buf, st)
	text := buf.String()
	got := checkExposition(t, text)
	for series, want := range map[string]float64{
		`layerstore_verify_failures_total`:                                                         2,
		`layerstore_fetched_bytes_total{kind="on_demand"}`:                                         100,
		`layerstore_fetched_bytes_total{kind="prefetch"}`:                                          4096,
		`layerstore_fetched_bytes_total{kind="profile"}`:                                           7,
		`layerstore_cache_evictions_total`:                                                         5,
		`layerstore_layers{state="complete"}`:                                                      1,
		`layerstore_layers{state="failed"}`:                                                        0,
		`layerstore_layer_users`:                                                                   3,
		`layerstore_read_wait_seconds_bucket{le="0.005"}`:                                          1,
		`layerstore_read_wait_seconds_bucket{le="2.5"}`:                                            2,
		`layerstore_read_wait_seconds_bucket{le="60"}`:                                             2,
		`layerstore_read_wait_seconds_bucket{le="+Inf"}`:                                           3,
		`layerstore_read_wait_seconds_count`:                                                       3,
		`layerstore_read_wait_seconds_sum`:                                                         122.003,
		`layerstore_lookup_duration_seconds_bucket{outcome="served",source="registry",le="0.025"}`: 0,
		`layerstore_lookup_duration_seconds_bucket{outcome="served",source="registry",le="0.05"}`:  1,
		`layerstore_lookup_duration_seconds_count{outcome="served",source="registry"}`:             1,
		`layerstore_lookup_duration_seconds_count{outcome="failed",source="memory"}`:               0,
		`layerstore_lookup_duration_seconds_bucket{outcome="failed",source="memory",le="+Inf"}`:    0,
	} {
		if v, ok := got[series]; !ok || v != want {
			t.Errorf("%s = %v (present %v), want %v", series, v, ok, want)
		}
	}
	if strings.Contains(text, "sha256") || strings.Contains(text, "r/app") {
		t.Errorf("metrics carry digests or references:\n%s", text)
	}
	if t.Failed() {
		t.Logf("metrics:\n%s", text)
	}
}

// TestMetricsHandler: the handler of the TCP metrics address serves GET /metrics and nothing
// of the rest of the control API.
func TestMetricsHandler(t *testing.T) {
	st := protocol.Status{}
	st.Counters.Lookups = 4
	srv := httptest.NewServer(MetricsHandler(fakeStatus{st}))
	defer srv.Close()
	for _, c := range []struct {
		method, path string
		code         int
	}{
		{"GET", "/metrics", 200}, {"HEAD", "/metrics", 200}, {"POST", "/metrics", 405},
		{"GET", "/status", 404}, {"POST", "/pin", 404}, {"POST", "/unpin", 404}, {"POST", "/credentials", 404},
		{"GET", "/profiles", 404}, {"POST", "/profiles", 404},
		{"GET", "/", 404}, {"GET", "/metrics/x", 404},
	} {
		req, err := http.NewRequestWithContext(t.Context(), c.method, srv.URL+c.path, strings.NewReader(`{"ref":"x"}`))
		if err != nil {
			t.Fatal(err)
		}
		resp, err := srv.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		var body bytes.Buffer
		body.ReadFrom(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != c.code {
			t.Errorf("%s %s: %d, want %d", c.method, c.path, resp.StatusCode, c.code)
		}
		if c.code == 200 && c.method == "GET" {
			if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, "text/plain; version=0.0.4") {
				t.Errorf("content type %q", ct)
			}
			if !strings.Contains(body.String(), "layerstore_lookups_total 4\n") {
				t.Errorf("metrics:\n%s", body.String())
			}
			checkExposition(t, body.String())
		}
	}
}
