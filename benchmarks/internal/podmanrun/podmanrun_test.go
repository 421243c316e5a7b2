package podmanrun

import (
	"os"
	"path/filepath"
	"testing"
)

func TestLastLines(t *testing.T) {
	for _, c := range []struct {
		in   string
		n    int
		want string
	}{{"a\nb\nc\n", 2, "b\nc"}, {"a\n", 3, "a"}, {"", 1, ""}} {
		if got := LastLines(c.in, c.n); got != c.want {
			t.Errorf("LastLines(%q, %d) = %q, want %q", c.in, c.n, got, c.want)
		}
	}
}

func TestFromStoreCountsTheStoresLayers(t *testing.T) {
	p := &Podman{Dir: t.TempDir()}
	for _, id := range []string{"a", "b"} {
		d := filepath.Join(p.Dir, "graph", "overlay", id)
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
		if id == "a" {
			if err := os.WriteFile(filepath.Join(d, "additionallayer"), []byte("/store/x"), 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
	if n := p.FromStore(); n != 1 {
		t.Errorf("FromStore() = %d, want 1", n)
	}
}
