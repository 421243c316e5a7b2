package main

import (
	"bufio"
	"os"
	"runtime/debug"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// releaseStartMemory gives back, once the store is mounted and serving, memory that only the
// start used: the heap the start allocated and freed (configuration, registries.conf, the
// mount), which the runtime would otherwise return to the kernel only over minutes.
func releaseStartMemory() {
	debug.FreeOSMemory()
}

// pageOutStartCode asks the kernel to reclaim the pages of the daemon's binary (its code and
// read-only data) that this process alone maps (MADV_PAGEOUT): at start, package
// initialisation, flag and configuration parsing and the mount touch code in nearly every
// 64 KiB window of the binary, and the kernel maps a whole window (or a whole large folio)
// around each fault, so the idle daemon held about its binary's size resident. Unlike
// MADV_DONTNEED, which would only unmap them, the clean pages are dropped from the page cache:
// the memory is free. The pages the daemon needs afterwards are read again from the file when
// touched: the runtime's while idle, what the collection of the heap touches (a forced one
// every two minutes), the control socket's and the FUSE and registry code at the first
// requests (a few MiB, read once). Pages another process maps too (a concurrent layerstore
// status; layerstore keep unmaps its own, see unmapStartCode) are left, and so are mappings holding anonymous pages (a PIE
// binary's relocated read-only data): reclaiming those would mean swapping them. It returns
// the size of the mappings advised; a kernel without MADV_PAGEOUT (before 5.4) is no error:
// nothing is done.
func pageOutStartCode() (advised int64, err error) {
	return adviseBinary(unix.MADV_PAGEOUT)
}

// unmapStartCode unmaps the pages of the process's binary (its code and read-only data)
// without reclaiming them (MADV_DONTNEED): layerstore keep does it once it has started the
// daemon, which runs the same binary. The pages the start of keep touched stay in the page cache
// mapped by the daemon alone, so that the daemon's pageOutStartCode can reclaim them (it leaves
// the pages another process maps), and keep, which then only waits, holds what it touches
// while waiting. The same mappings as pageOutStartCode's: none holds anonymous pages, whose
// contents MADV_DONTNEED would drop.
func unmapStartCode() (advised int64, err error) {
	return adviseBinary(unix.MADV_DONTNEED)
}

// adviseBinary gives advice about the read-only mappings of the process's binary that hold no
// anonymous page; an advice the kernel does not know (EINVAL) is no error: nothing is done.
func adviseBinary(advice int) (advised int64, err error) {
	var st unix.Stat_t
	if err := unix.Stat("/proc/self/exe", &st); err != nil {
		return 0, err
	}
	ranges, err := binaryMappings(uint64(st.Dev), st.Ino)
	if err != nil {
		return 0, err
	}
	for _, r := range ranges {
		if _, _, e := unix.Syscall(unix.SYS_MADVISE, uintptr(r[0]), uintptr(r[1]-r[0]), uintptr(advice)); e != 0 {
			if e == unix.EINVAL {
				return advised, nil
			}
			return advised, e
		}
		advised += int64(r[1] - r[0])
	}
	return advised, nil
}

// binaryMappings returns the address ranges of this process's read-only private mappings of
// the file dev:ino that hold no anonymous page, from /proc/self/smaps.
func binaryMappings(dev, ino uint64) ([][2]uint64, error) {
	f, err := os.Open("/proc/self/smaps")
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out [][2]uint64
	var cur [2]uint64
	in := false
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		f := strings.Fields(line)
		if len(f) >= 5 && strings.Contains(f[0], "-") && !strings.HasSuffix(f[0], ":") {
			// A mapping: start-end perms offset major:minor inode [path].
			in = false
			start, end, ok := strings.Cut(f[0], "-")
			if !ok || len(f[1]) != 4 || f[1][0] != 'r' || f[1][1] != '-' || f[1][3] != 'p' {
				continue
			}
			maj, min, ok := strings.Cut(f[3], ":")
			if !ok {
				continue
			}
			s, err1 := strconv.ParseUint(start, 16, 64)
			e, err2 := strconv.ParseUint(end, 16, 64)
			ma, err3 := strconv.ParseUint(maj, 16, 32)
			mi, err4 := strconv.ParseUint(min, 16, 32)
			i, err5 := strconv.ParseUint(f[4], 10, 64)
			if err1 != nil || err2 != nil || err3 != nil || err4 != nil || err5 != nil {
				continue
			}
			if i == ino && uint64(unix.Major(dev)) == ma && uint64(unix.Minor(dev)) == mi {
				cur, in = [2]uint64{s, e}, true
			}
			continue
		}
		if in && len(f) >= 2 && f[0] == "Anonymous:" {
			in = false
			if f[1] == "0" {
				out = append(out, cur)
			}
		}
	}
	return out, sc.Err()
}
