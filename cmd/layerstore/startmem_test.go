package main

import (
	"reflect"
	"testing"

	"golang.org/x/sys/unix"
)

// binaryMappings finds the mapping of the test binary's code, and pageOutStartCode advises it
// without error (the process keeps running: its pages are read again when touched).
func TestBinaryMappings(t *testing.T) {
	var st unix.Stat_t
	if err := unix.Stat("/proc/self/exe", &st); err != nil {
		t.Fatal(err)
	}
	ranges, err := binaryMappings(uint64(st.Dev), st.Ino)
	if err != nil {
		t.Fatal(err)
	}
	pc := uint64(reflect.ValueOf(TestBinaryMappings).Pointer())
	found := false
	for _, r := range ranges {
		if r[0] >= r[1] {
			t.Errorf("empty range %x-%x", r[0], r[1])
		}
		found = found || r[0] <= pc && pc < r[1]
	}
	if !found {
		t.Fatalf("no range of %v holds the code at %#x", ranges, pc)
	}
	n, err := pageOutStartCode()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("advised %d bytes in %d mappings", n, len(ranges))
}
