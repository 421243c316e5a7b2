package profile

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/opencontainers/go-digest"

	"github.com/layerstore/layerstore/cache"
	"github.com/layerstore/layerstore/internal/control/protocol"
)

const repo = "registry.example/app"

func newStore(t *testing.T) *Store {
	c, err := cache.New(t.TempDir(), cache.Config{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return NewStore(c, slog.New(slog.DiscardHandler))
}

// TestCheck: what exceeds the bounds, or this package would not have written, is refused.
func TestCheck(t *testing.T) {
	long := strings.Repeat("a", MaxPath+1)
	many := make([]string, MaxFiles+1)
	for i := range many {
		many[i] = fmt.Sprint(i)
	}
	d := digest.FromString("x")
	for name, p := range map[string]Repo{
		"version":    {Version: 2, Repository: repo},
		"repository": {Version: 1, Repository: "a\nb"},
		"digest":     {Version: 1, Repository: repo, Layers: []LayerReads{{Layer: "sha256:zz", Files: []string{"a"}}}},
		"no files":   {Version: 1, Repository: repo, Layers: []LayerReads{{Layer: d}}},
		"many files": {Version: 1, Repository: repo, Layers: []LayerReads{{Layer: d, Files: many}}},
		"long path":  {Version: 1, Repository: repo, Layers: []LayerReads{{Layer: d, Files: []string{long}}}},
		"nul":        {Version: 1, Repository: repo, Layers: []LayerReads{{Layer: d, Files: []string{"a\x00b"}}}},
		"twice":      {Version: 1, Repository: repo, Layers: []LayerReads{{Layer: d, Files: []string{"a"}}, {Layer: d, Files: []string{"b"}}}},
	} {
		if err := p.Check(); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

// TestUnion: merged with a recording that read a file whole (or an older one without ends),
// the file is whole; the other files' ends are kept, after the layer's own files.
func TestUnion(t *testing.T) {
	pl := LayerReads{Files: []string{"usr/lib/big.so", "usr/bin/f00"}, Ends: []int64{4096, 0}}
	pl.Union(&LayerReads{Files: []string{"usr/bin/f01", "usr/lib/big.so"}, Ends: []int64{100, 0}})
	if !slices.Equal(pl.Files, []string{"usr/lib/big.so", "usr/bin/f00", "usr/bin/f01"}) || !slices.Equal(pl.Ends, []int64{0, 0, 100}) {
		t.Errorf("union: %q %v", pl.Files, pl.Ends)
	}
	pl.Union(&LayerReads{Files: []string{"usr/bin/f01"}})
	if pl.Ends != nil {
		t.Errorf("union with a whole file: ends %v, want none", pl.Ends)
	}
}

// TestStoreKeepsMaxLayers: a repository's profile keeps its MaxLayers most recent layers, the
// most recent first.
func TestStoreKeepsMaxLayers(t *testing.T) {
	s := newStore(t)
	base := time.Now().UTC()
	for i := range MaxLayers + 8 {
		slot := LayerReads{Layer: digest.FromString(fmt.Sprint(i)), Recorded: base.Add(time.Duration(i) * time.Second), Files: []string{"usr/bin/x"}}
		if err := s.Add(repo, slot); err != nil {
			t.Fatal(err)
		}
	}
	p := s.Get(repo)
	if p == nil || len(p.Layers) != MaxLayers {
		t.Fatalf("profile %+v", p)
	}
	if p.Layers[0].Layer != digest.FromString(fmt.Sprint(MaxLayers+7)) {
		t.Error("the most recent layer is not first")
	}
}

// TestExportImport: what one store exports, another imports as it was.
func TestExportImport(t *testing.T) {
	s := newStore(t)
	want := LayerReads{Layer: digest.FromString("a"), Recorded: time.Now().UTC().Truncate(time.Second), Files: []string{"usr/bin/a", "usr/lib/b.so"}, Ends: []int64{0, 4096}}
	if err := s.Add(repo, want); err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	if n, err := s.Export(&buf); err != nil || n != 1 {
		t.Fatalf("export: %d, %v", n, err)
	}
	s2 := newStore(t)
	imp, err := s2.Import(&buf)
	if err != nil || imp != (protocol.ProfileImport{Repositories: 1, Layers: 1}) {
		t.Fatalf("import: %+v, %v", imp, err)
	}
	got := s2.Get(repo)
	if got == nil || len(got.Layers) != 1 || !slices.Equal(got.Layers[0].Files, want.Files) || !slices.Equal(got.Layers[0].Ends, want.Ends) || !got.Layers[0].Recorded.Equal(want.Recorded) {
		t.Fatalf("imported %+v, want %+v", got, want)
	}

}

// TestImportRefuses: an import's first invalid line ends it with an error naming the line; a
// line is read no further than MaxLine.
func TestImportRefuses(t *testing.T) {
	s := newStore(t)
	d := digest.FromString("a")
	header := `{"format":"layerstore-profiles","version":1}` + "\n"
	line := func(p Repo) string { b, _ := json.Marshal(p); return string(b) + "\n" }
	good := Repo{Version: 1, Repository: "registry.example/b", Layers: []LayerReads{{Layer: d, Files: []string{"x"}}}}
	for name, tc := range map[string]struct{ in, want string }{
		"empty":         {"", "empty input"},
		"not an export": {"{}\n", "not an export"},
		"version":       {`{"format":"layerstore-profiles","version":9}` + "\n", "version 9"},
		"invalid JSON":  {header + "{\n", "line 2: invalid JSON"},
		"unknown field": {header + `{"version":1,"repository":"r","layers":[],"content":"x"}` + "\n", "line 2: invalid JSON"},
		"bad digest":    {header + line(good) + `{"version":1,"repository":"r","layers":[{"layer":"md5:x","files":["a"]}]}` + "\n", "line 3:"},
		"long line":     {header + strings.Repeat(" ", MaxLine+10) + "\n", "line 2: a line of more than"},
		"ends count":    {header + `{"version":1,"repository":"r","layers":[{"layer":"` + d.String() + `","files":["a","b"],"ends":[1]}]}` + "\n", "1 ends for 2 files"},
		"negative end":  {header + `{"version":1,"repository":"r","layers":[{"layer":"` + d.String() + `","files":["a"],"ends":[-5]}]}` + "\n", "negative end"},
	} {
		_, err := s.Import(strings.NewReader(tc.in))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want an error with %q", name, err, tc.want)
		}
	}
	// An endless line is read no further than the bound.
	r := &countingReader{r: endless{}}
	if _, err := s.Import(io.MultiReader(strings.NewReader(header), r)); err == nil {
		t.Error("an endless line was accepted")
	}
	if r.n > 2*MaxLine {
		t.Errorf("read %d bytes of an endless line", r.n)
	}
}

type endless struct{}

func (endless) Read(p []byte) (int, error) {
	for i := range p {
		p[i] = 'a'
	}
	return len(p), nil
}

type countingReader struct {
	r io.Reader
	n int
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += n
	return n, err
}
