package storefs

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/layerstore/layerstore/internal/testutil/testfuse"
	"github.com/layerstore/layerstore/internal/testutil/testlayer"
)

// TestRootlessIDMap: root maps to the user, ids from 1 to the user's first subordinate range
// (by name or by uid), anything else to the overflow id; a malformed range is an error.
func TestRootlessIDMap(t *testing.T) {
	sub := "other:100000:65536\nlsuser:300000:65536\nlsuser:900000:10\n"
	m, err := RootlessIDMap(1500, 1600, "lsuser", strings.NewReader(sub), strings.NewReader("1500:400000:1000\n"))
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ id, uid, gid uint32 }{
		{0, 1500, 1600}, {1, 300000, 400000}, {1000, 300999, 400999}, {1001, 301000, overflowID}, {65536, 365535, overflowID}, {65537, overflowID, overflowID},
	} {
		if u, g := mapID(m.UIDs, c.id), mapID(m.GIDs, c.id); u != c.uid || g != c.gid {
			t.Errorf("id %d: uid %d gid %d, want %d %d", c.id, u, g, c.uid, c.gid)
		}
	}
	if none, err := RootlessIDMap(1500, 1500, "lsuser", strings.NewReader(""), nil); err != nil || len(none.UIDs) != 1 || len(none.GIDs) != 1 {
		t.Errorf("without subordinate ids: %+v, %v", none, err)
	}
	if _, err := RootlessIDMap(1500, 1500, "lsuser", strings.NewReader("lsuser:x:10\n"), nil); err == nil {
		t.Error("a malformed range accepted")
	}
	if !(*IDMap)(nil).identity() || m.identity() {
		t.Error("identity")
	}
}

// TestIDsShowOwners: with Config.IDs, the diff tree's entries are shown owned by the mapped
// ids, and the synthetic directories by the daemon's user.
func TestIDsShowOwners(t *testing.T) {
	testfuse.Require(t)
	f := fixture(t, "estargz")
	l := newTestLayer(t, f)
	ids := &IDMap{UIDs: []IDRange{{0, 1500, 1}, {1, 300000, 65536}}, GIDs: []IDRange{{0, 1600, 1}, {1, 400000, 65536}}}
	opts := defaultConfig()
	opts.IDs = ids
	m := mountLayer(t, l, opts)
	ref, err := testlayer.ReferenceTree(testlayer.Tar())
	if err != nil {
		t.Fatal(err)
	}
	diff := m.path("diff")
	checked := 0
	for name, n := range ref {
		if name == "" || n.Type == "char" {
			continue
		}
		var st syscall.Stat_t
		if err := syscall.Lstat(filepath.Join(diff, name), &st); err != nil {
			continue // not every reference path is in every fixture's tree
		}
		if st.Uid != mapID(ids.UIDs, n.UID) || st.Gid != mapID(ids.GIDs, n.GID) {
			t.Errorf("%s: owner %d:%d, want %d:%d (layer's %d:%d)", name, st.Uid, st.Gid, mapID(ids.UIDs, n.UID), mapID(ids.GIDs, n.GID), n.UID, n.GID)
		}
		checked++
	}
	if checked < 5 {
		t.Fatalf("%d entries checked", checked)
	}
	var st syscall.Stat_t
	if err := syscall.Stat(m.path(), &st); err != nil || st.Uid != uint32(os.Geteuid()) {
		t.Errorf("layer directory owned by %d (%v), want the daemon's user", st.Uid, err)
	}
}
