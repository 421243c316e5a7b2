package chunked

import (
	"fmt"
	"math/rand/v2"
	"testing"
)

// TestPathTable: the table answers as a map of the same paths does, through growth from a
// small size and replacements of a path's entry.
func TestPathTable(t *testing.T) {
	var names []string // entry i's path
	keyOf := func(id EntryID) string { return names[id] }
	tab := newPathTable(4, keyOf)
	want := map[string]EntryID{}
	rng := rand.New(rand.NewPCG(1, 2))
	for i := range 20000 {
		p := fmt.Sprintf("d%d/f%d", rng.IntN(50), rng.IntN(2000)) // paths recur: replacements
		names = append(names, p)
		tab.Set(p, EntryID(i))
		want[p] = EntryID(i)
	}
	if tab.Len() != len(want) {
		t.Fatalf("%d paths, want %d", tab.Len(), len(want))
	}
	for p, id := range want {
		if got, ok := tab.Get(p); !ok || got != id {
			t.Fatalf("%s: %d, %v; want %d", p, got, ok, id)
		}
	}
	for _, p := range []string{"", "d1", "d50/f1", "d1/f2000"} {
		if id, ok := tab.Get(p); ok {
			t.Errorf("%q found, entry %d", p, id)
		}
	}
	if 2*tab.Len() > len(tab.slots) {
		t.Errorf("%d paths in %d slots: more than half full", tab.Len(), len(tab.slots))
	}
}
