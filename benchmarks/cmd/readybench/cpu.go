package main

import (
	"bytes"
	"fmt"
	"os"
	"strconv"
)

// What a start costs the processors: the store's own CPU time and how busy the machine's
// processors were, from the start of the pull to the ready line. At 1 Gbit/s a cold start
// decompresses and verifies chunks faster than the link could bring them only while
// processors are free; the floor counts the link alone.

// userHZ is the unit of the times in /proc (USER_HZ): 100 on every Linux architecture.
const userHZ = 100

// cpuSnap is the CPU time used up to one moment.
type cpuSnap struct {
	busy, all float64 // the machine's processors, summed: seconds busy, seconds in all
	store     float64 // the store's process (user + system seconds); -1 when there is none
}

// snapCPU reads the machine's CPU times and those of process pid (0 for none).
func snapCPU(pid int) cpuSnap {
	s := cpuSnap{store: -1}
	if b, err := os.ReadFile("/proc/stat"); err == nil {
		s.busy, s.all, _ = parseProcStat(b)
	}
	if pid > 0 {
		if b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid)); err == nil {
			if t, err := parsePidStat(b); err == nil {
				s.store = t
			}
		}
	}
	return s
}

// parseProcStat returns the seconds the processors were busy and in all, from the first
// ("cpu") line of /proc/stat: user nice system idle iowait irq softirq steal (guest time is
// within user's).
func parseProcStat(b []byte) (busy, all float64, err error) {
	line, _, _ := bytes.Cut(b, []byte("\n"))
	f := bytes.Fields(line)
	if len(f) < 9 || string(f[0]) != "cpu" {
		return 0, 0, fmt.Errorf("/proc/stat: unexpected first line %q", line)
	}
	var v [8]float64
	for i := range v {
		n, err := strconv.ParseUint(string(f[1+i]), 10, 64)
		if err != nil {
			return 0, 0, fmt.Errorf("/proc/stat: %w", err)
		}
		v[i] = float64(n) / userHZ
	}
	idle := v[3] + v[4]
	busy = v[0] + v[1] + v[2] + v[5] + v[6] + v[7]
	return busy, busy + idle, nil
}

// parsePidStat returns a process's user + system seconds from its /proc/PID/stat: the 14th
// and 15th fields, counted after its name (which may hold spaces and parentheses).
func parsePidStat(b []byte) (float64, error) {
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, fmt.Errorf("/proc/PID/stat: no command name")
	}
	f := bytes.Fields(b[i+1:]) // from the 3rd field (state)
	if len(f) < 13 {
		return 0, fmt.Errorf("/proc/PID/stat: %d fields", len(f)+2)
	}
	var t float64
	for _, s := range f[11:13] {
		n, err := strconv.ParseUint(string(s), 10, 64)
		if err != nil {
			return 0, fmt.Errorf("/proc/PID/stat: %w", err)
		}
		t += float64(n) / userHZ
	}
	return t, nil
}

// cpuSpent is what a start cost between two snapshots: the store's CPU seconds (-1 when
// unknown) and the share of the machine's processors that were busy.
func cpuSpent(from, to cpuSnap) (store, busy float64) {
	store = -1
	if from.store >= 0 && to.store >= 0 {
		store = to.store - from.store
	}
	if d := to.all - from.all; d > 0 {
		busy = (to.busy - from.busy) / d
	}
	return store, busy
}

// peakRSS returns process pid's peak resident set (VmHWM) in bytes; 0 when it cannot be read.
func peakRSS(pid int) int64 { return procStatusBytes(pid, "VmHWM:") }

// procStatusBytes returns the value of key (e.g. "VmHWM:", in kB) of /proc/PID/status, in
// bytes; 0 when it cannot be read.
func procStatusBytes(pid int, key string) int64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	for line := range bytes.Lines(b) {
		if v, ok := bytes.CutPrefix(line, []byte(key)); ok {
			f := bytes.Fields(v) // "123456 kB"
			if len(f) == 2 {
				if n, err := strconv.ParseInt(string(f[0]), 10, 64); err == nil {
					return n << 10
				}
			}
		}
	}
	return 0
}
