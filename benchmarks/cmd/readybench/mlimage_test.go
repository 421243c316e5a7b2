package main

import (
	"encoding/binary"
	"encoding/json"
	"strings"
	"testing"
)

// The ml layer is about 6 GB, of the shape its comment gives, with a header a safetensors
// reader takes; the same every time.
func TestMLLayerShape(t *testing.T) {
	files := mlFiles()
	var total, py, libs int64
	var nPy, nLibs int
	var model mlFile
	for _, f := range files {
		total += f.contentSize()
		switch {
		case strings.HasSuffix(f.path, ".py"):
			py += f.contentSize()
			nPy++
		case strings.HasSuffix(f.path, ".so"):
			libs += f.contentSize()
			nLibs++
		case f.path == mlModel:
			model = f
		}
	}
	if total < 5.8e9 || total > 6.4e9 {
		t.Errorf("%d bytes in all, want about 6 GB", total)
	}
	if nPy != mlPackages*(mlModules+1)+1 || nLibs != mlLibs+1 {
		t.Errorf("%d Python files and %d libraries", nPy, nLibs)
	}
	t.Logf("%d files: %d MB of Python, %d MB of libraries, %d MB of model", len(files), py>>20, libs>>20, model.contentSize()>>20)
	n := binary.LittleEndian.Uint64(model.content)
	var header map[string]any
	if err := json.Unmarshal(model.content[8:8+n], &header); err != nil || len(header) != mlTensors+1 {
		t.Errorf("the model's header: %v, %d entries", err, len(header))
	}
	if a, b := mlKey(), mlKey(); a != b {
		t.Errorf("the key changes: %s, %s", a, b)
	}
}

// The ml image is measured when asked for, and without the cells that need a tree of its
// layer.
func TestPlanML(t *testing.T) {
	o := options{samples: 1}
	if err := o.parse("1gbit/1ms", "", "gzip", "ml"); err != nil {
		t.Fatal(err)
	}
	if err := o.parseRuntimes("podman4", ""); err != nil {
		t.Fatal(err)
	}
	b := &bench{opts: o, stores: map[string]store{"layerstore": &layerstoreStore{}}}
	names := map[string]bool{}
	for _, c := range b.plan() {
		if c.image.name != "ml" {
			t.Errorf("cell %s: not of ml", c)
		}
		names[c.String()] = true
	}
	for _, n := range []string{"ml:gzip:full:podman4:1gbit/1ms:cold", "ml:estargz:lazy:podman4:1gbit/1ms:cold",
		"ml:zstdchunked:lazy-learned:podman4:1gbit/1ms:cold"} {
		if !names[n] {
			t.Errorf("no cell %s", n)
		}
	}
	for n := range names {
		if strings.Contains(n, "estargz-prio") || strings.Contains(n, modeNewVersion) {
			t.Errorf("cell %s: needs a tree of the generated layer", n)
		}
	}
	if err := o.parse("1gbit/1ms", "", "gzip", "tensorflow"); err == nil {
		t.Error("-image of an unknown image accepted")
	}
}
