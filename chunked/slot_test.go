package chunked_test

import (
	"context"
	"testing"

	"github.com/layerstore/layerstore/chunked"
)

// TestChunkSlots checks that ChunkSlot names every chunk of every file with a slot of its own
// (the same for hardlinks of one file), within ChunkSlots, and that SlotRange returns the
// chunk's bytes in the blob.
func TestChunkSlots(t *testing.T) {
	for _, f := range fixtures(t) {
		t.Run(f.Name, func(t *testing.T) {
			layout, _, js := fixtureTOC(t, f)
			x, err := chunked.Parse(context.Background(), layout, js, chunked.Limits{})
			if err != nil {
				t.Fatal(err)
			}
			owner := map[int]chunked.EntryID{} // slot -> inode
			chunks := 0
			for i := range x.Len() {
				id := chunked.EntryID(i)
				e := x.Meta(id)
				if e.Type != chunked.TypeReg {
					continue
				}
				cs := x.Chunks(id)
				for j, c := range cs {
					slot := x.ChunkSlot(id, j)
					if slot < 0 || slot >= x.ChunkSlots() {
						t.Fatalf("%s chunk %d: slot %d outside [0, %d)", x.Path(id), j, slot, x.ChunkSlots())
					}
					if o, ok := owner[slot]; ok && o != e.Inode {
						t.Fatalf("%s chunk %d: slot %d also names a chunk of entry %d", x.Path(id), j, slot, o)
					}
					if _, ok := owner[slot]; !ok {
						chunks++
					}
					owner[slot] = e.Inode
					if r, ok := x.SlotRange(slot); !ok || r != c.Range {
						t.Fatalf("%s chunk %d: SlotRange(%d) = %+v, %v; want %+v", x.Path(id), j, slot, r, ok, c.Range)
					}
				}
				if x.ChunkSlot(id, len(cs)) != -1 || x.ChunkSlot(id, -1) != -1 {
					t.Fatalf("%s: a slot for a chunk out of range", x.Path(id))
				}
			}
			if chunks == 0 {
				t.Fatal("no chunk")
			}
			if _, ok := x.SlotRange(x.ChunkSlots()); ok {
				t.Error("SlotRange past the end answered")
			}
		})
	}
}
