package chunked

import (
	"fmt"
	"math/rand/v2"
	"testing"
)

// TestPathTable: the table answers as a map of the same paths does, through growth from a
// small size and replacements of a path's entry.
func TestPathTable(t *testing.T) {
	for _, maxEntries := range []int{DefaultMaxEntries, 1 << 30} { // tagged, and not
		t.Run(fmt.Sprint(maxEntries), func(t *testing.T) { testPathTable(t, maxEntries) })
	}
}

func testPathTable(t *testing.T, maxEntries int) {
	var names []string // entry i's path
	reads := 0         // of paths, by the table
	keyOf := func(id EntryID) (string, string) {
		reads++
		return splitPath(names[id])
	}
	tab := newPathTable(4, maxEntries, keyOf)
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
	// A probe reads back only the paths whose tag matches its own: one in 256 of those it
	// passes on its way to an empty slot.
	reads = 0
	for i := range 10000 {
		tab.Get(fmt.Sprintf("absent%d", i))
	}
	if tagged := tab.idMask != ^uint32(0); tagged && reads > 200 || !tagged && reads < 2000 {
		t.Errorf("%d paths read back for 10000 lookups of absent paths (tagged: %v)", reads, tagged)
	}
}
