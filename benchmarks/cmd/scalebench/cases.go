package main

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/opencontainers/go-digest"
	"golang.org/x/sys/unix"

	"github.com/layerstore/layerstore/benchmarks/internal/benchd"
	"github.com/layerstore/layerstore/internal/testutil/testregistry"
)

// sample is one run of a case on a fresh daemon.
type sample struct {
	Wall           float64 // the case's clock, seconds (see each case)
	Stat           float64 // large layers: the first stat of diff (resolution)
	Readdir        float64 // large layers: open + readdir of the root of diff
	Listed         int     // large layers: entries the root of diff listed
	Walk           float64 // large layers: a full walk of diff after the case (readdir + lstat of every entry), seconds
	Walked         int     // large layers: entries the walk saw, diff itself included
	WalkCPU        float64 // large layers: the daemon's CPU over the walk, seconds
	WalkRSS        int64   // large layers: the daemon's VmRSS after the walk, bytes
	Rewalk         float64 // large layers: the same walk again, on the caches the first filled, seconds
	RewalkCPU      float64 // large layers: the daemon's CPU over it, seconds
	PathWalk       float64 // large layers: a second walk, by paths from the mount's root, seconds
	Reopen         float64 // large layers: the first stat of diff after a restart on the same cache (from the layer's record), seconds
	ReopenRSS      int64   // large layers: the restarted daemon's VmRSS after that stat and a settle, bytes
	ReopenRequests int     // large layers: blob requests of that stat (0: answered from the record)
	Quiet          float64 // large layers: from the first stat until the daemon's background work ended (quiet), seconds
	QuietRSS       int64   // large layers: the daemon's VmRSS once quiet and a settle after it, bytes
	QuietAnon      int64   // large layers: its RssAnon then, bytes
	CPU            float64 // the daemon's user+system CPU over Wall, seconds
	RSS, HWM       int64   // the daemon's VmRSS and VmHWM after the case and a settle, bytes
	Anon           int64   // the daemon's RssAnon (heap, stacks: what is not a file's page) with RSS, bytes
	Layers         int     // layers the daemon reports resolved afterwards
	Requests       testregistry.BlobStats
	Fetched        int64 // background fetch: bytes the daemon fetched
}

// bench holds what every case shares.
type bench struct {
	opts     options
	reg      *testregistry.Registry
	regsConf string
	bin      string
	work     string
}

// start starts a fresh daemon with an empty cache.
func (b *bench) start(ctx context.Context, prefetch bool) (*benchd.Daemon, error) {
	dir, err := os.MkdirTemp(b.work, "daemon-")
	if err != nil {
		return nil, err
	}
	return benchd.Start(ctx, benchd.Config{Bin: b.bin, Dir: dir, RegistriesConf: b.regsConf, Prefetch: prefetch, Passthrough: true})
}

// layerDir is <mnt>/<base64 ref>/<key>, where a runtime finds a layer.
func (b *bench) layerDir(mnt, repoTag string, key digest.Digest) string {
	return filepath.Join(mnt, base64.StdEncoding.EncodeToString([]byte(b.reg.Host+"/"+repoTag)), key.String())
}

// guarded runs fn; if ctx ends first it stops the daemon, which makes a request stuck in the
// mount return, and waits for fn.
func guarded(ctx context.Context, d *benchd.Daemon, fn func() error) error {
	done := make(chan error, 1)
	go func() { done <- fn() }()
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
		d.Stop()
		<-done
		return ctx.Err()
	}
}

// finish lets the daemon settle, then reads its memory and the layers it reports.
func (b *bench) finish(ctx context.Context, d *benchd.Daemon, s *sample) error {
	select {
	case <-time.After(b.opts.settle):
	case <-ctx.Done():
		return ctx.Err()
	}
	m, err := d.Memory()
	if err != nil {
		return err
	}
	s.RSS, s.HWM, s.Anon = m.RSS, m.HWM, m.Anon
	st, err := d.Client.Status(ctx)
	if err != nil {
		return fmt.Errorf("status: %w", err)
	}
	s.Layers = len(st.Layers)
	return nil
}

// caseIdle: the daemon started and mounted, nothing resolved. Wall is the start until the
// mount answers; CPU is everything the daemon used from its start to the reading.
func (b *bench) caseIdle(ctx context.Context) (sample, error) {
	var s sample
	t0 := time.Now()
	d, err := b.start(ctx, b.opts.prefetch)
	if err != nil {
		return s, err
	}
	defer d.Stop()
	s.Wall = time.Since(t0).Seconds()
	if err := b.finish(ctx, d, &s); err != nil {
		return s, err
	}
	s.CPU, err = d.CPU()
	return s, err
}

// caseLarge resolves one large layer: the first stat of its diff directory (manifest, TOC
// fetch, verification, parse), then an open and readdir of the root of diff. With fetch, it
// instead waits until the background fetch made the layer fully local (CPU per GB fetched).
func (b *bench) caseLarge(ctx context.Context, repoTag string, l *builtLayer, fetch bool) (sample, error) {
	var s sample
	d, err := b.start(ctx, fetch || b.opts.prefetch)
	if err != nil {
		return s, err
	}
	defer d.Stop()
	diff := filepath.Join(b.layerDir(d.Cfg.Mountpoint, repoTag, l.key()), "diff")
	before := b.reg.Stats(l.Digest)
	cpu0, err := d.CPU()
	if err != nil {
		return s, err
	}
	t0 := time.Now()
	err = guarded(ctx, d, func() error {
		t0 = time.Now()
		if _, err := os.Stat(diff); err != nil {
			return fmt.Errorf("resolving: %w", err)
		}
		t1 := time.Now()
		s.Stat = t1.Sub(t0).Seconds()
		f, err := os.Open(diff)
		if err != nil {
			return err
		}
		names, err := f.Readdirnames(-1)
		f.Close()
		if err != nil {
			return fmt.Errorf("readdir: %w", err)
		}
		s.Readdir, s.Listed = time.Since(t1).Seconds(), len(names)
		s.Wall = time.Since(t0).Seconds()
		if !fetch {
			return nil
		}
		ls, err := d.WaitComplete(ctx, l.Digest, 25*time.Millisecond, b.opts.timeout)
		s.Wall, s.Fetched = time.Since(t0).Seconds(), ls.Prefetched+ls.OnDemand
		return err
	})
	if err != nil {
		return s, withLog(err, d)
	}
	cpu1, err := d.CPU()
	if err != nil {
		return s, err
	}
	s.CPU = cpu1 - cpu0
	after := b.reg.Stats(l.Digest)
	s.Requests = testregistry.BlobStats{Full: after.Full - before.Full, Ranged: after.Ranged - before.Ranged, Bytes: after.Bytes - before.Bytes}
	if err := b.finish(ctx, d, &s); err != nil || fetch {
		return s, err
	}
	if err := b.quiet(ctx, d, t0, &s); err != nil {
		return s, err
	}
	if err := b.walk(ctx, d, diff, l, &s); err != nil {
		return s, err
	}
	return s, b.reopen(ctx, d, repoTag, l, &s)
}

// quiet waits until the daemon's background work after a resolution has ended (the
// comparison of a zstd:chunked TOC with its tar-split, the record's storing, the release of
// memory): until it used less than 20 ms of CPU in half a second; then, after a settle, it
// reads the daemon's memory.
func (b *bench) quiet(ctx context.Context, d *benchd.Daemon, t0 time.Time, s *sample) error {
	deadline := time.Now().Add(2 * time.Minute)
	for {
		c0, err := d.CPU()
		if err != nil {
			return err
		}
		select {
		case <-time.After(500 * time.Millisecond):
		case <-ctx.Done():
			return ctx.Err()
		}
		c1, err := d.CPU()
		if err != nil {
			return err
		}
		if c1-c0 < 0.02 || time.Now().After(deadline) {
			break
		}
	}
	s.Quiet = time.Since(t0).Seconds()
	select {
	case <-time.After(b.opts.settle):
	case <-ctx.Done():
		return ctx.Err()
	}
	m, err := d.Memory()
	if err != nil {
		return err
	}
	s.QuietRSS, s.QuietAnon = m.RSS, m.Anon
	return nil
}

// caseFetchImage resolves every layer of an image with the background fetch on, and waits
// until every layer is fully local: the daemon's CPU over the fetch, and its memory once the
// fetch has ended (after the settle).
func (b *bench) caseFetchImage(ctx context.Context, repoTag string, ls []*builtLayer) (sample, error) {
	var s sample
	d, err := b.start(ctx, true)
	if err != nil {
		return s, err
	}
	defer d.Stop()
	before := make([]testregistry.BlobStats, len(ls))
	for i, l := range ls {
		before[i] = b.reg.Stats(l.Digest)
	}
	cpu0, err := d.CPU()
	if err != nil {
		return s, err
	}
	err = guarded(ctx, d, func() error {
		t0 := time.Now()
		defer func() { s.Wall = time.Since(t0).Seconds() }()
		for _, l := range ls {
			if _, err := os.Stat(filepath.Join(b.layerDir(d.Cfg.Mountpoint, repoTag, l.key()), "diff")); err != nil {
				return fmt.Errorf("resolving %s: %w", l.Name, err)
			}
		}
		for _, l := range ls {
			st, err := d.WaitComplete(ctx, l.Digest, 25*time.Millisecond, b.opts.timeout)
			if err != nil {
				return fmt.Errorf("fetching %s: %w", l.Name, err)
			}
			s.Fetched += st.Prefetched + st.OnDemand
		}
		return nil
	})
	if err != nil {
		return s, withLog(err, d)
	}
	cpu1, err := d.CPU()
	if err != nil {
		return s, err
	}
	s.CPU = cpu1 - cpu0
	for i, l := range ls {
		after := b.reg.Stats(l.Digest)
		s.Requests.Full += after.Full - before[i].Full
		s.Requests.Ranged += after.Ranged - before[i].Ranged
		s.Requests.Bytes += after.Bytes - before[i].Bytes
	}
	return s, b.finish(ctx, d, &s)
}

// reopen stops the daemon and starts it again on the same cache, as a restart or a reboot
// does, and times the first stat of the layer's diff: a lookup answered from the layer's
// record, without the registry.
func (b *bench) reopen(ctx context.Context, d *benchd.Daemon, repoTag string, l *builtLayer, s *sample) error {
	d.Stop()
	d2, err := benchd.Start(ctx, d.Cfg)
	if err != nil {
		return err
	}
	defer d2.Stop()
	diff := filepath.Join(b.layerDir(d2.Cfg.Mountpoint, repoTag, l.key()), "diff")
	before := b.reg.Stats(l.Digest)
	err = guarded(ctx, d2, func() error {
		t0 := time.Now()
		if _, err := os.Stat(diff); err != nil {
			return fmt.Errorf("resolving after a restart: %w", err)
		}
		s.Reopen = time.Since(t0).Seconds()
		return nil
	})
	if err != nil {
		return withLog(err, d2)
	}
	after := b.reg.Stats(l.Digest)
	s.ReopenRequests = after.Ranged + after.Full - before.Ranged - before.Full
	select {
	case <-time.After(b.opts.settle):
	case <-ctx.Done():
		return ctx.Err()
	}
	m, err := d2.Memory()
	s.ReopenRSS = m.RSS
	return err
}

// walk walks the whole tree of a resolved layer's diff as find or a security scanner does:
// every directory listed, every entry lstat'ed. It runs after the resolution was measured and
// the memory read, so that it changes neither. The same walk runs again on the caches the
// first filled (the kernel's: the tree is immutable, and cached for as long as the layer is
// served): what a second scanner, or `find` run twice, costs. A last walk lstats every entry
// again by its path from the mount's root (filepath.WalkDir and os.Lstat, what a scanner of the
// runtime's storage does, through its diff symlinks), on warm kernel caches: the cost of
// resolving <ref>/<key> again for every path.
func (b *bench) walk(ctx context.Context, d *benchd.Daemon, diff string, l *builtLayer, s *sample) error {
	cpu0, err := d.CPU()
	if err != nil {
		return err
	}
	var paths int
	err = guarded(ctx, d, func() error {
		t0 := time.Now()
		var err error
		s.Walked, err = walkTree(diff)
		s.Walk = time.Since(t0).Seconds()
		if err != nil {
			return err
		}
		m, err := d.Memory()
		if err != nil {
			return err
		}
		s.WalkRSS = m.RSS
		cpu1, err := d.CPU()
		s.WalkCPU = cpu1 - cpu0
		if err != nil {
			return err
		}
		t0 = time.Now()
		again, err := walkTree(diff)
		s.Rewalk = time.Since(t0).Seconds()
		if err != nil {
			return err
		}
		if again != s.Walked {
			return fmt.Errorf("the second walk saw %d entries, the first %d", again, s.Walked)
		}
		cpu2, err := d.CPU()
		s.RewalkCPU = cpu2 - cpu1
		if err != nil {
			return err
		}
		t0 = time.Now()
		err = filepath.WalkDir(diff, func(path string, _ fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			paths++
			_, err = os.Lstat(path)
			return err
		})
		s.PathWalk = time.Since(t0).Seconds()
		return err
	})
	if err != nil {
		return withLog(fmt.Errorf("walk: %w", err), d)
	}
	// The layer's entries are its tar's, plus diff itself.
	if s.Walked != l.Entries+1 || paths != s.Walked {
		return fmt.Errorf("walk: saw %d entries, then %d by path; the layer has %d (+1 for diff)", s.Walked, paths, l.Entries)
	}
	return nil
}

// walkTree lists every directory under dir and lstats every entry, relative to the directory
// that lists it (openat, fstatat), as find does, and as overlayfs does for a container (it
// holds the directories of its lower layers: no path is resolved again from the mount's root).
// It returns the entries seen, dir included.
func walkTree(dir string) (int, error) {
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return 0, fmt.Errorf("open %s: %w", dir, err)
	}
	n, err := walkDir(fd, dir)
	return n + 1, err
}

// walkDir walks the directory open as fd (named dir, for errors) and closes fd.
func walkDir(fd int, dir string) (int, error) {
	f := os.NewFile(uintptr(fd), dir)
	defer f.Close()
	names, err := f.Readdirnames(-1)
	if err != nil {
		return 0, fmt.Errorf("readdir %s: %w", dir, err)
	}
	n := 0
	for _, name := range names {
		var st unix.Stat_t
		if err := unix.Fstatat(fd, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			return n, fmt.Errorf("lstat %s/%s: %w", dir, name, err)
		}
		n++
		if st.Mode&unix.S_IFMT != unix.S_IFDIR {
			continue
		}
		sub, err := unix.Openat(fd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err != nil {
			return n, fmt.Errorf("open %s/%s: %w", dir, name, err)
		}
		k, err := walkDir(sub, dir+"/"+name)
		n += k
		if err != nil {
			return n, err
		}
	}
	return n, nil
}

// lookup is what a runtime does for each layer of a pull (docs/als-contract.md): stat diff, info
// and blob, then read info.
func lookup(dir string) error {
	for _, f := range []string{"diff", "info", "blob"} {
		if _, err := os.Stat(filepath.Join(dir, f)); err != nil {
			return err
		}
	}
	js, err := os.ReadFile(filepath.Join(dir, "info"))
	if err != nil {
		return err
	}
	if !json.Valid(js) {
		return fmt.Errorf("%s/info: not JSON", dir)
	}
	return nil
}

// image is one reference and the layers a runtime would look up in it.
type image struct {
	repoTag string
	layers  []*builtLayer
}

// caseLookups looks up every layer of every image, as a runtime pulling them would: one
// after the other, or all at once with concurrent. Wall is the time until every lookup
// answered.
func (b *bench) caseLookups(ctx context.Context, imgs []image, concurrent bool) (sample, error) {
	var s sample
	d, err := b.start(ctx, b.opts.prefetch)
	if err != nil {
		return s, err
	}
	defer d.Stop()
	var dirs []string
	for _, img := range imgs {
		for _, l := range img.layers {
			dirs = append(dirs, b.layerDir(d.Cfg.Mountpoint, img.repoTag, l.key()))
		}
	}
	cpu0, err := d.CPU()
	if err != nil {
		return s, err
	}
	err = guarded(ctx, d, func() error {
		t0 := time.Now()
		defer func() { s.Wall = time.Since(t0).Seconds() }()
		if !concurrent {
			for _, dir := range dirs {
				if err := lookup(dir); err != nil {
					return err
				}
			}
			return nil
		}
		errs := make([]error, len(dirs))
		var wg sync.WaitGroup
		for i, dir := range dirs {
			wg.Go(func() { errs[i] = lookup(dir) })
		}
		wg.Wait()
		return errors.Join(errs...)
	})
	if err != nil {
		return s, withLog(err, d)
	}
	cpu1, err := d.CPU()
	if err != nil {
		return s, err
	}
	s.CPU = cpu1 - cpu0
	if err := b.finish(ctx, d, &s); err != nil {
		return s, err
	}
	if s.Layers != len(dirs) {
		return s, fmt.Errorf("the daemon reports %d layers resolved, want %d", s.Layers, len(dirs))
	}
	return s, nil
}

// withLog adds to err the warnings and errors the daemon logged (or the end of its log).
func withLog(err error, d *benchd.Daemon) error {
	b, _ := os.ReadFile(d.LogPath)
	var lines []string
	for _, line := range strings.Split(string(b), "\n") {
		if strings.Contains(line, "level=WARN") || strings.Contains(line, "level=ERROR") {
			lines = append(lines, line)
		}
	}
	if len(lines) == 0 {
		return fmt.Errorf("%w\nend of the daemon's log:\n%s", err, d.Tail())
	}
	return fmt.Errorf("%w\nthe daemon's warnings and errors:\n%s", err, strings.Join(lines[max(0, len(lines)-10):], "\n"))
}
