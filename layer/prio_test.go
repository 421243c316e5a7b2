package layer

import (
	"slices"
	"testing"
	"time"

	"github.com/containerd/stargz-snapshotter/estargz"

	"github.com/layerstore/layerstore/internal/testutil/testlayer"
)

// TestPrioritizedRequestsBounded: the prioritized files of an eStargz layer (its producer's
// profile) are fetched at once, but at most prioSlots requests at a time: each request in
// flight sits on the link ahead of the container's own reads (the big layer of the large
// image prioritizes a 117 MB library of which its start reads 64 KiB).
func TestPrioritizedRequestsBounded(t *testing.T) {
	data := testlayer.RandomBytes(6<<20, 1)
	fx := prioFixture(t, 256<<10, "usr/lib/big.so", dirEntry("usr/"), dirEntry("usr/bin/"), dirEntry("usr/lib/"),
		regEntry("usr/bin/rest", data[:1<<20]), regEntry("usr/lib/big.so", data))
	e := newProfEnv(t)
	ref := profRepo + ":v1"
	e.reg.push(ref, fx)
	e.reg.delay = 50 * time.Millisecond
	m, _ := e.start(withPrefetchQuiet(time.Hour))
	l := lookupOK(t, m, ref, profKey(fx))
	id := fileOf(t, l, "usr/lib/big.so")
	last, _ := l.Index().Chunk(id, l.Index().NumChunks(id)-1)
	waitFor(t, "the prioritized file", func() bool {
		for _, ev := range e.reg.log(false) {
			if !ev.end.IsZero() && ev.ranges[len(ev.ranges)-1].End() >= last.End() {
				return true
			}
		}
		return false
	})
	log := e.reg.log(false)
	most := 0
	for _, a := range log {
		n := 0
		for _, b := range log {
			if !b.start.After(a.start) && (b.end.IsZero() || b.end.After(a.start)) {
				n++
			}
		}
		most = max(most, n)
	}
	if most > prioSlots || len(log) < 4 {
		t.Errorf("%d requests of prioritized files in flight at once (of %d), want at most %d", most, len(log), prioSlots)
	}
}

// TestPrioritizedSpanFollowsLink: requests of prioritized files span what the link carries in
// urgentTime at the rate the layer's fetches measure: urgentBatch on a link of 100 Mbit/s,
// more on one of 1 Gbit/s (fewer requests, each paying the registry's latency once), never
// more than the batch size, and still at most prioSlots in flight. Each layer measures its
// own fetches: another layer of the same manager, which fetched nothing yet, starts at
// urgentBatch.
func TestPrioritizedSpanFollowsLink(t *testing.T) {
	data := testlayer.RandomBytes(16<<20, 3)
	fx := prioFixture(t, 128<<10, "big.so", regEntry("rest", data[:1<<20]), regEntry("big.so", data))
	other, err := testlayer.BuildEStargz("other", testlayer.Build([]testlayer.Entry{regEntry("other", data[:1<<20])}))
	if err != nil {
		t.Fatal(err)
	}
	for _, link := range []struct {
		name    string
		rate    float64
		latency time.Duration
	}{{"100mbit", 12.5e6, 10 * time.Millisecond}, {"1gbit", 125e6, time.Millisecond}} {
		t.Run(link.name, func(t *testing.T) {
			e := newProfEnv(t)
			ref := profRepo + ":v1"
			e.reg.push(ref, fx)
			e.reg.delay, e.reg.rate = link.latency, link.rate
			m, _ := e.start(withPrefetchQuiet(time.Hour))
			l := lookupOK(t, m, ref, profKey(fx))
			id := fileOf(t, l, "big.so")
			last, _ := l.Index().Chunk(id, l.Index().NumChunks(id)-1)
			waitFor(t, "the prioritized file", func() bool {
				for _, ev := range e.reg.log(false) {
					if !ev.end.IsZero() && ev.ranges[len(ev.ranges)-1].End() >= last.End() {
						return true
					}
				}
				return false
			})
			log := e.reg.log(false)
			var widest int64
			most := 0
			for _, a := range log {
				widest = max(widest, a.ranges[len(a.ranges)-1].End()-a.ranges[0].Offset)
				n := 0
				for _, b := range log {
					if !b.start.After(a.start) && (b.end.IsZero() || b.end.After(a.start)) {
						n++
					}
				}
				most = max(most, n)
			}
			if most > prioSlots {
				t.Errorf("%d requests of prioritized files in flight at once, want at most %d", most, prioSlots)
			}
			t.Logf("%d requests, the widest %d bytes", len(log), widest)
			// The rate a loaded machine measures is below the simulated link's (its sleeps
			// overshoot): at 1 Gbit/s, only a span wider than urgentBatch is asked for (a
			// measured rate above 12.5 MB/s); the span of a given rate is linkrate_test.go's.
			switch {
			case widest > DefaultPrefetchBatch:
				t.Errorf("a request spans %d bytes, above the batch size", widest)
			case link.rate < 20e6 && widest > urgentBatch:
				t.Errorf("a request spans %d bytes at 100 Mbit/s, above urgentBatch (%d)", widest, urgentBatch)
			case link.rate > 100e6 && widest <= urgentBatch:
				t.Errorf("the widest request spans %d bytes at 1 Gbit/s, no more than urgentBatch (%d)", widest, urgentBatch)
			}
			e.reg.push(profRepo+":other", other)
			l2 := lookupOK(t, m, profRepo+":other", profKey(other))
			if got := l2.link.urgentSpan(DefaultPrefetchBatch); got != urgentBatch {
				t.Errorf("a layer that fetched nothing spans %d bytes, want urgentBatch (%d): it took another's rate", got, urgentBatch)
			}
		})
	}
}

// TestProfileSupersedesPrioritized: a layer whose background fetch replays a startup profile
// fetches its producer's prioritized files with the rest of the layer, after the quiet
// period, not at once beside the replay: the profile is what a start read, and the
// prioritized files would share the link with the replay and the start's reads. Without a
// profile they go out at once (TestPrioritizedRequestsBounded).
func TestProfileSupersedesPrioritized(t *testing.T) {
	data := testlayer.RandomBytes(2<<20, 5)
	fx := prioFixture(t, 256<<10, "usr/lib/big.so", dirEntry("usr/"), dirEntry("usr/bin/"), dirEntry("usr/lib/"),
		regEntry("usr/bin/app", data[:256<<10]), regEntry("usr/lib/big.so", data))
	e := newProfEnv(t)
	ref := profRepo + ":v1"
	e.reg.push(ref, fx)
	m, stop := e.start(withPrefetch(false), withReadAhead(0), withProfileWindow(200*time.Millisecond))
	l := lookupOK(t, m, ref, profKey(fx))
	readPaths(t, l, "usr/bin/app")
	if got := waitProfile(t, m, profRepo, fx.Desc.Digest); !slices.Equal(got, []string{"usr/bin/app"}) {
		t.Fatalf("profile %q", got)
	}
	stop()

	e.evict()
	e.reg.log(true)
	m, _ = e.start(withPrefetchQuiet(time.Hour))
	l = lookupOK(t, m, ref, profKey(fx))
	app := fileOf(t, l, "usr/bin/app")
	waitFor(t, "the profile's replay", func() bool { return m.env.cache.Has(l.Index().Meta(app).Digest) })
	time.Sleep(300 * time.Millisecond)
	offs := fileRanges(t, l, "usr/lib/big.so")
	for _, ev := range e.reg.log(false) {
		for _, p := range pathsOf(ev, offs) {
			if p == "usr/lib/big.so" {
				t.Fatalf("a prioritized file was fetched at once beside the profile's replay (%d ranges from %d)", len(ev.ranges), ev.ranges[0].Offset)
			}
		}
	}
	if st := l.Status(); st.Profile == nil || st.Profile.Files != 1 {
		t.Errorf("status profile %+v, want the replay of 1 file", st.Profile)
	}
}

// prioFixture builds an eStargz layer of es, in chunks of chunk bytes, whose producer
// prioritizes the file named prioritized.
func prioFixture(t *testing.T, chunk int64, prioritized string, es ...testlayer.Entry) testlayer.Fixture {
	t.Helper()
	fx, err := testlayer.BuildEStargz("prio", testlayer.Build(es), estargzChunkSize(chunk),
		estargz.WithPrioritizedFiles([]string{prioritized}))
	if err != nil {
		t.Fatal(err)
	}
	return fx
}
