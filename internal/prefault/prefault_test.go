package prefault_test

import (
	"bytes"
	"testing"

	"github.com/layerstore/layerstore/internal/prefault"
)

// Write changes none of the bytes, whatever the slice's alignment and size, and leaves
// those around the slice alone.
func TestWriteKeepsBytes(t *testing.T) {
	buf := make([]byte, 1<<20+8192)
	for i := range buf {
		buf[i] = byte(i * 7)
	}
	want := bytes.Clone(buf)
	for _, r := range [][2]int{{0, len(buf)}, {1, 1 << 20}, {4095, 4097 + 64<<10}, {100, 200}, {0, 0}} {
		prefault.Write(buf[r[0]:r[1]])
		if !bytes.Equal(buf, want) {
			t.Fatalf("Write(buf[%d:%d]) changed bytes", r[0], r[1])
		}
	}
}
