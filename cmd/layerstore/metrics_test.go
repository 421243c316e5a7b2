package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/opencontainers/go-digest"

	"github.com/layerstore/layerstore/internal/control/protocol"
)

// operationsDocPath documents the metrics, in the table of its "## Metrics" section.
const operationsDocPath = "../../docs/operations.md"

// documentedMetrics returns the metric families the table of docs/operations.md lists.
func documentedMetrics(t *testing.T) []string {
	t.Helper()
	b, err := os.ReadFile(operationsDocPath)
	if err != nil {
		t.Fatal(err)
	}
	_, section, _ := strings.Cut(string(b), "\n## Metrics\n")
	section, _, _ = strings.Cut(section, "\n## ")
	name := regexp.MustCompile("`(layerstore_[a-z_]+)`")
	var names []string
	for _, line := range strings.Split(section, "\n") {
		first, _, _ := strings.Cut(strings.TrimPrefix(line, "| "), " | ")
		if !strings.HasPrefix(line, "| `layerstore_") {
			continue
		}
		for _, m := range name.FindAllStringSubmatch(first, -1) {
			names = append(names, m[1])
		}
	}
	if len(names) < 10 {
		t.Fatalf("%s lists %d metrics: the test no longer finds its table", operationsDocPath, len(names))
	}
	return names
}

// parseMetrics returns the samples of a Prometheus text exposition by series (name and
// labels as written), and the families its TYPE lines declare.
func parseMetrics(t *testing.T, text string) (samples map[string]float64, families []string) {
	t.Helper()
	samples = map[string]float64{}
	for _, line := range strings.Split(strings.TrimSpace(text), "\n") {
		if f, ok := strings.CutPrefix(line, "# TYPE "); ok {
			families = append(families, strings.Fields(f)[0])
			continue
		}
		if strings.HasPrefix(line, "#") {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if i < 0 || err != nil {
			t.Fatalf("not a sample: %q", line)
		}
		samples[line[:i]] = v
	}
	return samples, families
}

// TestMetricsAddress runs the daemon with metrics-address: the TCP address serves the metrics
// the documentation lists, and nothing else of the control API; the counters and histograms
// move with a lookup through the mount, a read that waits for the registry, and a blob the
// registry serves tampered with. An address in use fails the start.
func TestMetricsAddress(t *testing.T) {
	e := newServeEnv(t)
	conf, err := os.ReadFile(e.config)
	if err != nil {
		t.Fatal(err)
	}
	// A free port, chosen by the daemon; no background fetch, so that reads fetch on demand.
	mustWrite(t, e.config, "metrics-address = \"127.0.0.1:0\"\n"+string(conf)+"[prefetch]\nenabled = false\n")
	d := e.start()
	// READY=1 may come before the log line has been copied from the daemon's stderr.
	serving := regexp.MustCompile(`msg=serving .*\bmetrics=(127\.0\.0\.1:[0-9]+)`)
	var m []string
	for deadline := time.Now().Add(10 * time.Second); m == nil; time.Sleep(10 * time.Millisecond) {
		if m = serving.FindStringSubmatch(d.log.String()); m == nil && time.Now().After(deadline) {
			t.Fatalf("the serving line does not give the metrics address:\n%s", d.log.String())
		}
	}
	base := "http://" + m[1]
	hc := &http.Client{Timeout: 10 * time.Second}
	request := func(method, path string) (int, string) {
		t.Helper()
		req, err := http.NewRequestWithContext(t.Context(), method, base+path, strings.NewReader(`{"ref":"`+e.ref+`"}`))
		if err != nil {
			t.Fatal(err)
		}
		resp, err := hc.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		if err != nil {
			t.Fatal(err)
		}
		return resp.StatusCode, string(b)
	}
	scrape := func() map[string]float64 {
		t.Helper()
		code, body := request("GET", "/metrics")
		if code != http.StatusOK {
			t.Fatalf("GET /metrics: %d %s", code, body)
		}
		samples, _ := parseMetrics(t, body)
		return samples
	}

	code, body := request("GET", "/metrics")
	if code != http.StatusOK {
		t.Fatalf("GET /metrics: %d %s", code, body)
	}
	before, families := parseMetrics(t, body)
	documented := documentedMetrics(t)
	for _, name := range documented {
		if !slices.Contains(families, name) {
			t.Errorf("metric %s of %s missing", name, operationsDocPath)
		}
	}
	for _, name := range families {
		if !slices.Contains(documented, name) {
			t.Errorf("metric %s not in %s", name, operationsDocPath)
		}
	}
	socket, err := protocol.NewClient(e.socket).Metrics(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if _, fromSocket := parseMetrics(t, socket); !slices.Equal(fromSocket, families) {
		t.Errorf("the control socket's metrics %q, the metrics address's %q", fromSocket, families)
	}
	// Nothing of the control API: status, pins, credentials.
	for _, c := range []struct {
		method, path string
		want         []int
	}{
		{"GET", "/status", []int{404}}, {"POST", "/pin", []int{404, 405}}, {"POST", "/unpin", []int{404, 405}},
		{"POST", "/credentials", []int{404, 405}}, {"POST", "/metrics", []int{405}},
	} {
		if code, body := request(c.method, c.path); !slices.Contains(c.want, code) {
			t.Errorf("%s %s on the metrics address: %d %s, want %v", c.method, c.path, code, body, c.want)
		}
	}
	if st := e.status(); len(st.Pins) != 0 {
		t.Errorf("POST /pin on the metrics address pinned: %+v", st.Pins)
	}

	// A lookup through the mount.
	toc := digest.Digest(e.fixture.Desc.Annotations["io.github.containers.zstd-chunked.manifest-checksum"])
	if _, err := os.Stat(filepath.Join(e.layerDir(toc), "diff")); err != nil {
		t.Fatal(err)
	}
	after := scrape()
	const served = `layerstore_lookup_duration_seconds_count{outcome="served",source="registry"}`
	if after["layerstore_lookups_total"] <= before["layerstore_lookups_total"] || after[served] <= before[served] {
		t.Errorf("after a lookup: lookups %v -> %v, %s %v -> %v", before["layerstore_lookups_total"],
			after["layerstore_lookups_total"], served, before[served], after[served])
	}
	if inf := `layerstore_lookup_duration_seconds_bucket{outcome="served",source="registry",le="+Inf"}`; after[inf] != after[served] {
		t.Errorf("%s %v, count %v", inf, after[inf], after[served])
	}

	// A read that waits for the registry.
	before = after
	sha(t, filepath.Join(e.layerDir(toc), "diff", "usr/bin/tool"))
	after = scrape()
	for _, s := range []string{"layerstore_read_wait_seconds_count", `layerstore_fetched_bytes_total{kind="on_demand"}`} {
		if after[s] <= before[s] {
			t.Errorf("after a cold read: %s %v -> %v", s, before[s], after[s])
		}
	}
	if after["layerstore_read_wait_seconds_sum"] <= 0 {
		t.Errorf("read wait sum %v", after["layerstore_read_wait_seconds_sum"])
	}

	// Bytes that do not match their digest.
	before = after
	e.reg.Tamper(e.fixture.Desc.Digest, int64(len(e.fixture.Blob))/3)
	if _, err := os.ReadFile(filepath.Join(e.layerDir(toc), "blob")); err == nil {
		t.Error("the tampered blob was read")
	}
	after = scrape()
	if s := "layerstore_verify_failures_total"; after[s] <= before[s] {
		t.Errorf("after a tampered blob: %s %v -> %v", s, before[s], after[s])
	}
	d.stop()

	// An address in use fails the start, before anything is mounted.
	held, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	busy := filepath.Join(e.dir, "busy.toml")
	mustWrite(t, busy, fmt.Sprintf("metrics-address = %q\ncontrol-socket = %q\ncache-dir = %q\n",
		held.Addr().String(), filepath.Join(e.dir, "busy.sock"), filepath.Join(e.dir, "busy-cache")))
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, e.bin, "serve", "--config", busy, filepath.Join(e.dir, "busy-store")).CombinedOutput()
	if err == nil || !strings.Contains(string(out), "metrics-address "+held.Addr().String()) || !strings.Contains(string(out), "address already in use") {
		t.Errorf("serve with the metrics address in use: %v\n%s", err, out)
	}
}

// TestMetricsAddressConfig: metrics-address is off by default, and an address without a port
// is refused when the configuration loads (so `layerstore doctor` reports it too).
func TestMetricsAddressConfig(t *testing.T) {
	dir := t.TempDir()
	for _, c := range []struct {
		value string
		ok    bool
	}{{"", true}, {"127.0.0.1:9108", true}, {":9108", true}, {"[::1]:9108", true}, {"9108", false}, {"localhost", false}} {
		p := filepath.Join(dir, "config.toml")
		mustWrite(t, p, fmt.Sprintf("metrics-address = %q\n", c.value))
		cfg, err := loadConfig(p, true)
		if (err == nil) != c.ok {
			t.Errorf("metrics-address = %q: %v", c.value, err)
		} else if err == nil && cfg.MetricsAddress != c.value {
			t.Errorf("metrics-address = %q loaded as %q", c.value, cfg.MetricsAddress)
		}
	}
	cfg, err := loadConfig(filepath.Join(dir, "absent.toml"), false)
	if err != nil || cfg.MetricsAddress != "" {
		t.Errorf("default metrics-address %q, %v: want off", cfg.MetricsAddress, err)
	}
}
