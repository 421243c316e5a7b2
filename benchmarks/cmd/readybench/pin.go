package main

import (
	"context"
	"fmt"
	"io/fs"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"time"
)

// The pin cells (-modes pin): layerstore, on a fresh cache and with the page cache dropped,
// pins the image (`layerstore pin`: every layer it serves fetched and verified to fully local,
// after the check that the cache's filesystem has room for it) over the cell's link. Its time
// is the cell's pull time, beside the full pull of the same image; the daemon's peak RSS
// (VmHWM, and its VmRSS sampled every pinSample, whose largest must not be above) and the
// cache's disk use beside the content the pin reports are the cell's too.

// pinSample is how often the daemon's RSS is read during a pin.
const pinSample = 20 * time.Millisecond

// pinOnce measures one run of pin cell c.
func (b *bench) pinOnce(ctx context.Context, c cell, ph *phases) (s sample, err error) {
	dir, done, err := b.startRun(c, ph)
	if err != nil {
		return s, err
	}
	defer done()
	img := b.imageOf(c)
	ms, err := b.startStore(ctx, c, dir)
	if err != nil {
		return s, err
	}
	defer ms.stop()
	ls, ok := ms.(*runningLayerstore)
	if !ok {
		return s, fmt.Errorf("%s: not layerstore", c)
	}
	ph.mark("store start")
	if err := dropCaches(); err != nil {
		return s, fmt.Errorf("drop_caches: %w", err)
	}
	ph.mark("drop_caches")

	pid := ms.pid()
	var peak atomic.Int64
	stop := make(chan struct{})
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		t := time.NewTicker(pinSample)
		defer t.Stop()
		for {
			peak.Store(max(peak.Load(), rss(pid)))
			select {
			case <-stop:
				return
			case <-t.C:
			}
		}
	}()
	mark := b.reg.Mark()
	_, down0 := b.proxy.Bytes()
	cpu0 := snapCPU(pid)
	t0 := time.Now()
	out, err := exec.CommandContext(ctx, b.stores[c.store].(*layerstoreStore).bin, "pin", "--control-socket", ls.d.Socket,
		b.proxy.Addr()+"/"+img.Repo).CombinedOutput()
	s.Pull = time.Since(t0).Seconds()
	cpu1 := snapCPU(pid)
	close(stop)
	<-sampled
	if err != nil {
		return s, fmt.Errorf("%s: layerstore pin: %w: %s", c, err, strings.TrimSpace(string(out)))
	}
	ph.mark("pin")
	s.StoreCPU, s.Busy = cpuSpent(cpu0, cpu1)
	_, down1 := b.proxy.Bytes()
	s.Bytes = down1 - down0
	for _, g := range b.reg.BlobGets(mark) {
		s.Requests += g.Full + g.Ranged
	}
	s.StoreHWM, s.StoreRSSSampled = peakRSS(pid), peak.Load()
	st, err := ls.d.Client.Status(ctx)
	if err != nil {
		return s, fmt.Errorf("%s: status: %w", c, err)
	}
	for _, p := range st.Pins {
		if p.Present != p.Bytes {
			return s, fmt.Errorf("%s: the pin of %s holds %d bytes of %d", c, p.Ref, p.Present, p.Bytes)
		}
		s.Content += p.Bytes
	}
	if s.CacheDisk, err = diskUse(filepath.Join(dir, "cache")); err != nil {
		return s, err
	}
	ph.mark("status, du")
	return s, nil
}

// rss returns process pid's resident set (VmRSS) in bytes; 0 when it cannot be read.
func rss(pid int) int64 { return procStatusBytes(pid, "VmRSS:") }

// diskUse returns the bytes the files under dir take on disk (their blocks).
func diskUse(dir string) (int64, error) {
	var n int64
	err := filepath.WalkDir(dir, func(_ string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		if st, ok := fi.Sys().(*syscall.Stat_t); ok {
			n += st.Blocks * 512
		}
		return nil
	})
	return n, err
}
