package storefs

import (
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hanwen/go-fuse/v2/fuse"
	"github.com/opencontainers/go-digest"

	"github.com/layerstore/layerstore/chunked"
)

// refusingLayer is a test layer that the Store refuses from some point on, as the layer
// package refuses a zstd:chunked layer whose tar-split contradicts its TOC (Refused).
type refusingLayer struct {
	*testLayer
	err atomic.Pointer[error]
}

func (l *refusingLayer) Refused() error {
	if p := l.err.Load(); p != nil {
		return *p
	}
	return nil
}

// TestRefusedLayerTreeNotServed: once the Store refuses a layer it handed out (the layer
// package refuses a zstd:chunked layer whose tar-split contradicts its TOC, after a lookup by
// TOC digest was answered), the mount answers nothing of its tree any more, though the block
// still holds the layer (every use renews that hold): lookups, attributes, opens (passthrough
// ones would reuse a backing ID registered before the refusal) and info fail, so that the
// contradicted metadata (a setuid bit the tar does not have) is not served from then on.
func TestRefusedLayerTreeNotServed(t *testing.T) {
	tl := newTestLayer(t, fixture(t, "zstdchunked-modern"))
	l := &refusingLayer{testLayer: tl}
	store := newTestStore()
	store.layers[testRef] = map[digest.Digest]Layer{tl.tocKey: l}
	r := newRawFS(newFilesystem(store, nil, time.Hour, time.Hour, time.Now()))
	in := func(ino uint64) *fuse.InHeader {
		return &fuse.InHeader{NodeId: ino, Caller: fuse.Caller{Owner: fuse.Owner{Uid: daemonUID}}}
	}
	lookup := func(parent uint64, name string) (uint64, fuse.Status) {
		var out fuse.EntryOut
		st := r.Lookup(nil, in(parent), name, &out)
		return out.NodeId, st
	}
	must := func(ino uint64, st fuse.Status) uint64 {
		t.Helper()
		if !st.Ok() || ino == 0 {
			t.Fatalf("lookup: %v (ino %d)", st, ino)
		}
		return ino
	}
	refIno := must(lookup(rootIno, refDirName(testRef)))
	dir := must(lookup(refIno, tl.tocKey.String()))
	diff := must(lookup(dir, "diff"))
	usr := must(lookup(diff, "usr"))
	id, ok := tl.Index().LookupPath(backedFile)
	if !ok {
		t.Fatalf("no %s", backedFile)
	}
	x := tl.Index()
	file := diff - uint64(x.Root()) + uint64(x.Meta(id).Inode)

	l.err.Store(new(error(errors.Join(chunked.ErrInvalid, errors.New("TOC and tar-split disagree")))))

	var attr fuse.AttrOut
	if st := r.GetAttr(nil, &fuse.GetAttrIn{InHeader: *in(usr)}, &attr); st.Ok() {
		t.Errorf("getattr of a refused layer's directory answered %o", attr.Mode)
	}
	if ino, st := lookup(usr, "share"); st.Ok() && ino != 0 {
		t.Error("a lookup in a refused layer's tree answered")
	}
	var open fuse.OpenOut
	if st := r.Open(nil, &fuse.OpenIn{InHeader: *in(file)}, &open); st.Ok() {
		t.Error("an open of a refused layer's file succeeded")
	}
	if _, st := lookup(dir, "info"); st.Ok() {
		t.Error("info of a refused layer answered")
	}
}
