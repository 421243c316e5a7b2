package testfuse

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"syscall"

	"github.com/layerstore/layerstore/internal/mountinfo"
)

// mount is what a line of a mountinfo file says of a mount.
type mount struct {
	point  string // unescaped
	dev    string // "major:minor"
	minor  string // the fusectl name of a FUSE mount's connection
	fstype string
}

// readMounts parses a mountinfo file (proc(5)):
//
//	36 35 98:0 /mnt1 /mnt2 rw,noatime master:1 - ext3 /dev/root rw,errors=continue
func readMounts(path string) ([]mount, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	parsed, err := mountinfo.Parse(data)
	if err != nil {
		return nil, err
	}
	ms := make([]mount, len(parsed))
	for i, m := range parsed {
		_, minor, _ := strings.Cut(m.Dev, ":")
		ms[i] = mount{point: m.Point, dev: m.Dev, minor: minor, fstype: m.FSType}
	}
	return ms, nil
}

// findMount returns the topmost (last) FUSE mount at mnt in this process's namespace.
func findMount(mnt string) (mount, bool) {
	ms, _ := readMounts("/proc/self/mountinfo")
	var found mount
	ok := false
	for _, m := range ms {
		if m.point == mnt && IsFUSE(m.fstype) {
			found, ok = m, true
		}
	}
	return found, ok
}

// IsFUSE reports whether a mountinfo filesystem type is a FUSE one (fuse, fuse.<name>,
// fuseblk, fuseblk.<name>); fusectl is not.
func IsFUSE(fstype string) bool {
	return fstype == "fuse" || fstype == "fuseblk" || strings.HasPrefix(fstype, "fuse.") || strings.HasPrefix(fstype, "fuseblk.")
}

// DetachForeign detaches (MNT_DETACH) every FUSE mount of this process's mount namespace but
// those at keep: for a test process in a private mount namespace of its own, so that it holds
// no copy of another test's mount, which would keep that mount's connection alive after its
// unmount. It is DetachScript in Go, and likewise refuses to run in its parent's namespace.
func DetachForeign(keep ...string) error {
	self, err := os.Readlink("/proc/self/ns/mnt")
	if err != nil {
		return err
	}
	if parent, _ := os.Readlink(fmt.Sprintf("/proc/%d/ns/mnt", os.Getppid())); parent == self {
		return errors.New("testfuse: not in a mount namespace of its own: no mount detached")
	}
	ms, err := readMounts("/proc/self/mountinfo")
	if err != nil {
		return err
	}
	kept := map[string]bool{}
	for _, k := range keep {
		kept[resolveParent(k)] = true
	}
	for _, m := range ms {
		if IsFUSE(m.fstype) && !kept[m.point] {
			_ = syscall.Unmount(m.point, syscall.MNT_DETACH)
		}
	}
	return nil
}
