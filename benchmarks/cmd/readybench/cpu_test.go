package main

import (
	"math"
	"os"
	"testing"
)

func TestParseProcStat(t *testing.T) {
	b := []byte("cpu  100 5 40 800 50 2 3 0 7 0\ncpu0 50 2 20 400 25 1 1 0 3 0\n")
	busy, all, err := parseProcStat(b)
	if err != nil {
		t.Fatal(err)
	}
	if math.Abs(busy-1.50) > 1e-9 || math.Abs(all-10.00) > 1e-9 {
		t.Errorf("busy %v, all %v: want 1.50, 10.00", busy, all)
	}
	for _, bad := range []string{"", "intr 1 2 3\n", "cpu 1 2 x 4 5 6 7 8\n", "cpu 1 2 3\n"} {
		if _, _, err := parseProcStat([]byte(bad)); err == nil {
			t.Errorf("%q: no error", bad)
		}
	}
}

func TestParsePidStat(t *testing.T) {
	// A name with a space and a parenthesis; utime 250, stime 50 ticks.
	b := []byte("4242 (lay er) s) S 1 4242 4242 0 -1 4194560 100 0 0 0 250 50 0 0 20 0 12 0 100 0 0\n")
	got, err := parsePidStat(b)
	if err != nil {
		t.Fatal(err)
	}
	if math.Abs(got-3.0) > 1e-9 {
		t.Errorf("%v seconds, want 3", got)
	}
	if _, err := parsePidStat([]byte("4242 (x) S 1 2")); err == nil {
		t.Error("a short line: no error")
	}
	// This process's own.
	if s := snapCPU(os.Getpid()); s.store < 0 || s.all <= 0 || s.busy > s.all {
		t.Errorf("own snapshot %+v", s)
	}
}

func TestCPUSpent(t *testing.T) {
	store, busy := cpuSpent(cpuSnap{busy: 10, all: 40, store: 1}, cpuSnap{busy: 13, all: 44, store: 1.5})
	if store != 0.5 || busy != 0.75 {
		t.Errorf("store %v busy %v: want 0.5, 0.75", store, busy)
	}
	if store, _ := cpuSpent(cpuSnap{store: -1}, cpuSnap{store: 2}); store != -1 {
		t.Errorf("no store: %v", store)
	}
}

func TestCPUColumn(t *testing.T) {
	lazy := []sample{{StoreCPU: 0.30, Busy: 0.9}, {StoreCPU: 0.50, Busy: 0.7}, {StoreCPU: 0.40, Busy: 0.8}}
	if got := cpuColumn(lazy); got != "0.40 s / 80%" {
		t.Errorf("lazy: %q", got)
	}
	full := []sample{{StoreCPU: -1, Busy: 0.55}}
	if got := cpuColumn(full); got != "- / 55%" {
		t.Errorf("full pull: %q", got)
	}
}

func TestPeakRSS(t *testing.T) {
	if n := peakRSS(os.Getpid()); n < 1<<20 || n > 1<<40 {
		t.Errorf("this process's peak RSS: %d bytes", n)
	}
	if n := peakRSS(-1); n != 0 {
		t.Errorf("no process: %d", n)
	}
}
