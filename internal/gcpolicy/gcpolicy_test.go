package gcpolicy

import (
	"runtime"
	"runtime/debug"
	"testing"
	"time"
)

func TestPercent(t *testing.T) {
	for _, c := range []struct {
		live, min  uint64
		base, want int
	}{
		{live: 4 << 20, min: 64 << 20, base: 100, want: 1500},   // 4 MiB + 15x = 64 MiB
		{live: 32 << 20, min: 64 << 20, base: 100, want: 100},   // doubling reaches the floor
		{live: 1 << 30, min: 64 << 20, base: 100, want: 100},    // a big parse: the default pace
		{live: 16 << 20, min: 64 << 20, base: 200, want: 300},   // GOGC=200: 16 MiB x3 < 64 MiB
		{live: 0, min: 64 << 20, base: 100, want: maxPercent},   // bounded
		{live: 100 << 20, min: 64 << 20, base: 50, want: 50},    // above the floor: GOGC's value
		{live: 60 << 20, min: 64 << 20, base: 0, want: 7},       // GOGC=0 still reaches the floor
		{live: 64<<20 - 1, min: 64 << 20, base: 100, want: 100}, // one byte short: doubling covers it
	} {
		if got := percent(c.live, c.min, c.base); got != c.want {
			t.Errorf("percent(%d, %d, %d) = %d, want %d", c.live, c.min, c.base, got, c.want)
		}
	}
}

// TestStartTunesAfterCollections: with a small live heap the percent rises so that the target
// is the floor; with a live heap above the floor it comes back to the base; stop restores the
// base and ends the tuning.
func TestStartTunesAfterCollections(t *testing.T) {
	t.Setenv("GOGC", "")
	old := debug.SetGCPercent(100)
	defer debug.SetGCPercent(old)
	current := func() int { p := debug.SetGCPercent(-1); debug.SetGCPercent(p); return p }
	waitPercent := func(what string, ok func(int) bool) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for !ok(current()) {
			if time.Now().After(deadline) {
				t.Fatalf("%s: percent %d", what, current())
			}
			runtime.GC()
			time.Sleep(10 * time.Millisecond)
		}
	}
	const floor = 256 << 20
	stop := Start(floor)
	waitPercent("small heap", func(p int) bool { return p > 100 })
	big := make([][]byte, 0, 64)
	for range 64 {
		big = append(big, make([]byte, 8<<20)) // 512 MiB live, above the floor
	}
	waitPercent("large heap", func(p int) bool { return p == 100 })
	runtime.KeepAlive(big)
	big = nil
	waitPercent("small heap again", func(p int) bool { return p > 100 })
	stop()
	if p := current(); p != 100 {
		t.Errorf("after stop: percent %d, want 100", p)
	}
	runtime.GC()
	runtime.GC()
	time.Sleep(50 * time.Millisecond)
	if p := current(); p != 100 {
		t.Errorf("tuned after stop: percent %d", p)
	}
}

func TestGOGCOffLeftAlone(t *testing.T) {
	t.Setenv("GOGC", "off")
	old := debug.SetGCPercent(100)
	defer debug.SetGCPercent(old)
	stop := Start(DefaultMin)
	runtime.GC()
	time.Sleep(20 * time.Millisecond)
	if p := debug.SetGCPercent(100); p != 100 {
		t.Errorf("GOGC=off: percent set to %d", p)
	}
	stop()
}
