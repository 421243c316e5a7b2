package demo

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/opencontainers/go-digest"
)

// TestZstdChunkedIsTheFixture checks that the embedded zstd:chunked layer is the committed
// fixture made from the reference layer: regenerating the fixture, or changing the reference
// layer, must be followed by copying the fixture here.
func TestZstdChunkedIsTheFixture(t *testing.T) {
	dir := filepath.Join("..", "..", "chunked", "testdata", "fixtures", "zstdchunked-modern")
	for _, name := range []string{"blob", "descriptor.json"} {
		want, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		got, err := os.ReadFile(filepath.Join("zstdchunked", name))
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, want) {
			t.Errorf("zstdchunked/%s differs from %s: cp %[2]s zstdchunked/%[1]s", name, filepath.Join(dir, name))
		}
	}
	diffID, err := os.ReadFile(filepath.Join(dir, "diffid"))
	if err != nil {
		t.Fatal(err)
	}
	l, err := ZstdChunked()
	if err != nil {
		t.Fatal(err)
	}
	if want := digest.Digest(strings.TrimSpace(string(diffID))); l.DiffID != want {
		t.Errorf("the reference layer is %s, the fixture was made from %s", l.DiffID, want)
	}
}
