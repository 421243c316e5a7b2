package storefs

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/layerstore/layerstore/internal/mountinfo"
)

// probeTimeout bounds how long ClearDeadMount waits for a mount to answer. Tests shorten it.
var probeTimeout = 5 * time.Second

// ClearDeadMount makes mountpoint usable for Mount after a crash. A FUSE mount there whose
// server is gone (it answers ENOTCONN), or a mount of ours that does not answer in time or
// answers with an error, is lazily unmounted (MNT_DETACH), as many times as such mounts are
// stacked there. A directory that is not a mountpoint, or a path that does not exist, is
// left alone. A mount that answers and
// is not ours, or one of ours that is alive (another daemon serves it), is an error.
//
// A probe that does not answer leaves one goroutine blocked in the kernel until the mount
// goes away.
func ClearDeadMount(mountpoint string) error {
	mp, err := resolveMountpoint(mountpoint)
	if errors.Is(err, os.ErrNotExist) {
		return nil // nothing can be mounted under a directory that does not exist
	}
	if err != nil {
		return err
	}
	for range 64 {
		m, err := topMount(mp)
		if err != nil || !m.mounted {
			return err
		}
		fstype := m.fstype
		ctx, cancel := context.WithTimeout(context.Background(), probeTimeout)
		perr := probe(ctx, mp)
		cancel()
		ours := fstype == "fuse."+fsName
		isFUSE := fstype == "fuse" || strings.HasPrefix(fstype, "fuse.")
		dead := isFUSE && (errors.Is(perr, syscall.ENOTCONN) || errors.Is(perr, syscall.ECONNABORTED))
		switch {
		case dead, ours && perr != nil:
			if err := unmount(mp, syscall.MNT_DETACH); err != nil {
				return fmt.Errorf("fs: detach stale %s mount at %s: %w", fstype, mp, err)
			}
		case ours:
			return fmt.Errorf("fs: %s is served by a running layerstore", mp)
		case perr != nil:
			return fmt.Errorf("fs: %s holds a %s mount that fails (%w); not ours to remove", mp, fstype, perr)
		default:
			return fmt.Errorf("fs: %s holds a live %s mount", mp, fstype)
		}
	}
	return fmt.Errorf("fs: too many stale mounts stacked at %s", mp)
}

// resolveMountpoint returns the absolute path of mountpoint with the symlinks of its parent
// resolved, as /proc/self/mountinfo shows it. The mountpoint itself is not touched: a dead
// mount there fails every access.
func resolveMountpoint(mountpoint string) (string, error) {
	abs, err := filepath.Abs(mountpoint)
	if err != nil {
		return "", fmt.Errorf("fs: %w", err)
	}
	if abs == "/" {
		return abs, nil
	}
	dir, err := filepath.EvalSymlinks(filepath.Dir(abs))
	if err != nil {
		return "", fmt.Errorf("fs: %w", err)
	}
	return filepath.Join(dir, filepath.Base(abs)), nil
}

// probe statfs's path, giving up when ctx is done.
func probe(ctx context.Context, path string) error {
	done := make(chan error, 1)
	go func() {
		var sfs syscall.Statfs_t
		done <- syscall.Statfs(path, &sfs)
	}()
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// mountInfo is what /proc/self/mountinfo says of the topmost mount at a path.
type mountInfo struct {
	mounted bool
	fstype  string
	dev     uint64 // st_dev of the mount's root
}

// topMount returns the last (topmost) mount at mountpoint in /proc/self/mountinfo. It does
// not touch the mount.
func topMount(mountpoint string) (mountInfo, error) {
	var m mountInfo
	data, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return m, fmt.Errorf("fs: %w", err)
	}
	mounts, err := mountinfo.Parse(data)
	if err != nil {
		return mountInfo{}, fmt.Errorf("fs: reading mountinfo: %w", err)
	}
	for _, mi := range mounts {
		if mi.Point == mountpoint {
			m = mountInfo{mounted: true, fstype: mi.FSType}
			if maj, min, ok := strings.Cut(mi.Dev, ":"); ok {
				a, err1 := strconv.ParseUint(maj, 10, 32)
				b, err2 := strconv.ParseUint(min, 10, 32)
				if err1 == nil && err2 == nil {
					m.dev = unix.Mkdev(uint32(a), uint32(b))
				}
			}
		}
	}
	return m, nil
}
