package layer

import (
	"log/slog"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/layerstore/layerstore/cache"
)

// option changes the options of a test's manager, unchecked: tests set what [Config] has no
// field for (the clock, the read-ahead, the open files, the profile window) and values it
// reads as the default (a zero negative TTL).
type option func(*options)

func withLogger(l *slog.Logger) option          { return func(o *options) { o.log = l } }
func withClock(now func() time.Time) option     { return func(o *options) { o.now = now } }
func withResolveTimeout(d time.Duration) option { return func(o *options) { o.resolveTimeout = d } }
func withReadTimeout(d time.Duration) option    { return func(o *options) { o.readTimeout = d } }
func withKeepTTL(d time.Duration) option        { return func(o *options) { o.keepTTL = d } }
func withNegativeTTL(d time.Duration) option    { return func(o *options) { o.negativeTTL = d } }
func withPrefetch(on bool) option               { return func(o *options) { o.prefetch = on } }
func withPrefetchConcurrency(n int) option      { return func(o *options) { o.prefetchConcurrency = n } }
func withPrefetchBatch(n int64) option          { return func(o *options) { o.prefetchBatch = n } }
func withPrefetchBandwidth(n int64) option      { return func(o *options) { o.prefetchBandwidth = n } }
func withPrefetchQuiet(d time.Duration) option  { return func(o *options) { o.prefetchQuiet = d } }
func withReadAhead(n int64) option              { return func(o *options) { o.readAhead = n } }
func withOpenFiles(n int) option                { return func(o *options) { o.openFiles = n } }
func withRequireDiffID(on bool) option          { return func(o *options) { o.requireDiffID = on } }
func withProfileWindow(d time.Duration) option  { return func(o *options) { o.profileWindow = d } }

// newTestManager returns a manager with the default options changed by opts.
func newTestManager(reg Registry, c *cache.Cache, opts ...option) (*Manager, error) {
	o := defaultOptions()
	for _, opt := range opts {
		opt(&o)
	}
	return newManager(reg, c, o), nil
}

// TestConfig: the zero Config is the defaults, its fields reach the options, and negative
// values (or a batch below 64 KiB) are refused.
func TestConfig(t *testing.T) {
	o, err := Config{}.options()
	if err != nil {
		t.Fatal(err)
	}
	def := defaultOptions()
	o.log, def.log, o.now, def.now = nil, nil, nil, nil
	if !reflect.DeepEqual(o, def) {
		t.Errorf("zero Config: %+v, want %+v", o, def)
	}
	quiet := time.Duration(0)
	o, err = Config{ResolveTimeout: 1, ReadTimeout: 2, KeepTTL: 3, NegativeTTL: 4, NoPrefetch: true,
		PrefetchConcurrency: 5, PrefetchBatch: 1 << 20, PrefetchBandwidth: 6, PrefetchQuiet: &quiet, RequireDiffID: true}.options()
	if err != nil {
		t.Fatal(err)
	}
	if o.resolveTimeout != 1 || o.readTimeout != 2 || o.keepTTL != 3 || o.negativeTTL != 4 || o.prefetch ||
		o.prefetchConcurrency != 5 || o.prefetchBatch != 1<<20 || o.prefetchBandwidth != 6 || o.prefetchQuiet != 0 || !o.requireDiffID {
		t.Errorf("options %+v do not follow the Config", o)
	}
	negative := -time.Second
	for name, c := range map[string]Config{
		"resolve timeout": {ResolveTimeout: -1}, "read timeout": {ReadTimeout: -1}, "keep TTL": {KeepTTL: -1},
		"negative TTL": {NegativeTTL: -1}, "prefetch concurrency": {PrefetchConcurrency: -1},
		"prefetch batch": {PrefetchBatch: 1000}, "prefetch bandwidth": {PrefetchBandwidth: -1},
		"prefetch quiet": {PrefetchQuiet: &negative},
	} {
		if _, err := c.options(); err == nil || !strings.Contains(err.Error(), name) {
			t.Errorf("%s: err = %v, want an error naming it", name, err)
		}
	}
}
