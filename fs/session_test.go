package storefs

import (
	"bytes"
	"errors"
	"testing"
	"time"

	"github.com/opencontainers/go-digest"

	"github.com/layerstore/layerstore/chunked"
)

// sampleTable returns the bytes of a session table with a record of every kind.
func sampleTable(t testing.TB) []byte {
	t.Helper()
	tab, err := newTable(&sessionHeader{dev: 42, started: time.Unix(1, 2), maxWrite: 1 << 20, maxReadAhead: 1 << 20, flags: flagPassthrough, init: []byte("init")})
	if err != nil {
		t.Fatal(err)
	}
	defer tab.f.Close()
	key := digest.FromString("layer")
	for _, err := range []error{
		tab.appendRef(firstRefIno, refDirName(testRef)),
		tab.appendBlock(1, testRef, key, chunked.Sum{1}),
		tab.appendBlock(2, testRef, key, chunked.Sum{2}),
		tab.appendBacking(1<<blockShift+inoEntries+5, 3),
		tab.appendBacking(2<<blockShift+inoEntries, 4),
		tab.appendUses(useKey{testRef, key}, 2),
		tab.appendUses(useKey{testRef, key}, 1), // the last count is the one
		tab.appendUnbacking(1<<blockShift + inoEntries + 5),
	} {
		if err != nil {
			t.Fatal(err)
		}
	}
	data := make([]byte, tab.off)
	_, err = tab.f.ReadAt(data, 0)
	if err != nil {
		t.Fatal(err)
	}
	return data
}

// TestSessionState checks that a table decodes to what was written, that a record cut short
// at the end is left out, and that damage elsewhere is refused.
func TestSessionState(t *testing.T) {
	data := sampleTable(t)
	st, err := decodeSessionState(data)
	if err != nil {
		t.Fatal(err)
	}
	if st.hdr.dev != 42 || !st.hdr.started.Equal(time.Unix(1, 2)) || string(st.hdr.init) != "init" || st.hdr.flags != flagPassthrough ||
		len(st.refs) != 1 || st.refs[0].ref != testRef || len(st.blocks) != 2 || st.blocks[1].ident != (chunked.Sum{2}) ||
		len(st.backing) != 1 || st.backing[2<<blockShift+inoEntries] != 4 || st.end != int64(len(data)) ||
		len(st.uses) != 1 || st.uses[useKey{testRef, digest.FromString("layer")}] != 1 {
		t.Fatalf("decoded %+v", st)
	}
	cut, err := decodeSessionState(data[:len(data)-1])
	if err != nil || cut.end >= int64(len(data)) || len(cut.backing) != 2 {
		t.Errorf("a table cut short: %v, end %d of %d, %d backing IDs", err, cut.end, len(data), len(cut.backing))
	}
	for _, bad := range [][]byte{
		nil,
		[]byte(tableMagic), // no header
		append([]byte("XSFSTAB\x00"), data[len(tableMagic):]...),
	} {
		if _, err := decodeSessionState(bad); err == nil {
			t.Errorf("decoded a bad table %q", bad)
		}
	}
	// Uses of a layer directory no block numbers, and more uses than a table may hold.
	for _, u := range []struct {
		k useKey
		n int64
	}{{useKey{testRef, digest.FromString("other")}, 1}, {useKey{testRef, digest.FromString("layer")}, maxUses + 1}} {
		tab, err := newTable(&sessionHeader{maxWrite: 1 << 20, init: []byte("init")})
		if err != nil {
			t.Fatal(err)
		}
		defer tab.f.Close()
		if err := errors.Join(tab.appendBlock(1, testRef, digest.FromString("layer"), chunked.Sum{1}), tab.appendUses(u.k, u.n)); err != nil {
			t.Fatal(err)
		}
		b := make([]byte, tab.off)
		if _, err := tab.f.ReadAt(b, 0); err != nil {
			t.Fatal(err)
		}
		if _, err := decodeSessionState(b); err == nil {
			t.Errorf("decoded %d uses of %v", u.n, u.k)
		}
	}
	// A block record naming block 0.
	tab := append([]byte(nil), data...)
	i := bytes.Index(tab, append([]byte{0, 0, 0, recBlock}, 1))
	if i < 0 {
		t.Fatal("no block record")
	}
	tab[i+4] = 0
	if _, err := decodeSessionState(tab); err == nil {
		t.Error("decoded a table with block 0")
	}
}

// FuzzSessionState: decoding any bytes returns an error or a state whose numbers are in
// their ranges, never panics, and a state re-encoded decodes the same.
func FuzzSessionState(f *testing.F) {
	f.Add(sampleTable(f))
	f.Add([]byte(tableMagic))
	f.Fuzz(func(t *testing.T, data []byte) {
		st, err := decodeSessionState(data)
		if err != nil {
			return
		}
		if st.end > int64(len(data)) || st.end < int64(len(tableMagic)) {
			t.Fatalf("end %d of %d bytes", st.end, len(data))
		}
		for _, r := range st.refs {
			if r.ino < firstRefIno || r.ino > lastRefIno {
				t.Fatalf("reference number %#x", r.ino)
			}
		}
		for _, b := range st.blocks {
			if b.n < 1 || b.n > maxBlock {
				t.Fatalf("block %d", b.n)
			}
		}
		for k, n := range st.uses {
			if n < 1 || n > maxUses {
				t.Fatalf("%d uses of %v", n, k)
			}
		}
		again, err := decodeSessionState(data[:st.end])
		if err != nil || len(again.refs) != len(st.refs) || len(again.blocks) != len(st.blocks) || len(again.backing) != len(st.backing) || len(again.uses) != len(st.uses) {
			t.Fatalf("the whole records alone decode otherwise: %v", err)
		}
	})
}
