package storefs

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
)

// IDMap is how the owners of the diff trees' entries are shown: the user namespace of a
// rootless runtime. A rootless podman runs its containers in a user namespace that maps its
// root to the user and the ids from 1 to the user's subordinate ids (/etc/subuid, /etc/subgid);
// the store, mounted by that user, is seen through it, so a file the layer gives to uid k is
// shown as owned by the host id that namespace maps k to. Ids outside the map are shown as
// the overflow id (65534), as the kernel shows unmapped ids. The zero IDMap shows the layer's
// own ids (a root daemon, whose runtimes see host ids).
type IDMap struct {
	UIDs, GIDs []IDRange
}

// IDRange maps Size ids from Container on to Host on.
type IDRange struct {
	Container, Host, Size uint32
}

// overflowID is how an id outside the map is shown (the kernel's default overflowuid).
const overflowID = 65534

// identity reports whether m shows ids as they are.
func (m *IDMap) identity() bool { return m == nil || (len(m.UIDs) == 0 && len(m.GIDs) == 0) }

func mapID(rs []IDRange, id uint32) uint32 {
	for _, r := range rs {
		if id >= r.Container && id-r.Container < r.Size {
			return r.Host + (id - r.Container)
		}
	}
	return overflowID
}

// RootlessIDMap returns the map of a rootless runtime of the user uid (name user): its root is
// the user, ids 1 on are the user's first range of subordinate ids in subuid and subgid (the
// contents of /etc/subuid and /etc/subgid), as podman maps them by default. Without a
// subordinate range, only root maps (to the user).
func RootlessIDMap(uid, gid uint32, user string, subuid, subgid io.Reader) (*IDMap, error) {
	m := &IDMap{UIDs: []IDRange{{0, uid, 1}}, GIDs: []IDRange{{0, gid, 1}}}
	for _, sub := range []struct {
		r    io.Reader
		id   uint32
		into *[]IDRange
	}{{subuid, uid, &m.UIDs}, {subgid, uid, &m.GIDs}} { // both files name the user, or its uid
		if sub.r == nil {
			continue
		}
		host, size, ok, err := firstSubRange(sub.r, user, sub.id)
		if err != nil {
			return nil, err
		}
		if ok {
			*sub.into = append(*sub.into, IDRange{1, host, size})
		}
	}
	return m, nil
}

// firstSubRange reads the first "NAME_OR_ID:START:COUNT" line of a subordinate id file for
// user or id.
func firstSubRange(r io.Reader, user string, id uint32) (start, count uint32, ok bool, err error) {
	sc := bufio.NewScanner(io.LimitReader(r, 4<<20))
	for sc.Scan() {
		f := strings.Split(strings.TrimSpace(sc.Text()), ":")
		if len(f) != 3 || (f[0] != user && f[0] != strconv.FormatUint(uint64(id), 10)) {
			continue
		}
		s, err1 := strconv.ParseUint(f[1], 10, 32)
		n, err2 := strconv.ParseUint(f[2], 10, 32)
		if err1 != nil || err2 != nil || n == 0 || s+n > 1<<32 {
			return 0, 0, false, fmt.Errorf("fs: subordinate ids: malformed line %q", sc.Text())
		}
		return uint32(s), uint32(n), true, nil
	}
	return 0, 0, false, sc.Err()
}

// SystemRootlessIDMap is RootlessIDMap for the current user from /etc/subuid and /etc/subgid.
func SystemRootlessIDMap(user string) (*IDMap, error) {
	var files []io.Reader
	for _, p := range []string{"/etc/subuid", "/etc/subgid"} {
		f, err := os.Open(p)
		if err != nil {
			if os.IsNotExist(err) {
				files = append(files, nil)
				continue
			}
			return nil, err
		}
		defer f.Close()
		files = append(files, f)
	}
	return RootlessIDMap(uint32(os.Geteuid()), uint32(os.Getegid()), user, files[0], files[1])
}
