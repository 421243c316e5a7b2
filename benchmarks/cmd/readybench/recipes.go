package main

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"strings"
)

// The Debian release every layer comes from, and where debootstrap and apt fetch it.
const (
	suite  = "bookworm"
	mirror = "http://deb.debian.org/debian"
)

// layerRecipe is one layer of the benchmark images: a debootstrap of the base system, or the
// files apt-get adds on top of its parent.
type layerRecipe struct {
	name     string
	parent   string   // the layer below; "" for the debootstrap base
	packages []string // installed with apt-get --no-install-recommends
	// generate, when set, writes the layer's tar itself (a generated layer, mlimage.go):
	// no tree is built, and its images have neither an estargz-prio format (no tree to
	// trace the workload in) nor a new version.
	generate func(w io.Writer) (size int64, diffID string, entries int, err error)
	genKey   func() string // identifies what generate writes
}

// layerRecipes are built in this order (parents first).
var layerRecipes = []layerRecipe{
	{name: "base"},
	{name: "python", parent: "base", packages: []string{"python3"}},
	{name: "gcc", parent: "base", packages: []string{"gcc", "libc6-dev"}},
	// About 1 GB of real files (some 20 000), of which the workload reads four small pieces:
	// LLVM 15 (libraries, tools, static libraries and headers), Clang's C++ library, Boost
	// headers, NumPy. Chosen for size per compressed byte (the gzip image is about 320 MB, so that
	// a full pull over 100 Mbit/s stays well under a minute and the default run within its
	// budget), an install of about a minute here, and no Go sources: trees and podman storage
	// under the module must not hold .go files, which `go vet ./...` and `gofmt -l .` would
	// take for the module's own.
	{name: "big", parent: "python", packages: []string{"libllvm15", "llvm-15", "llvm-15-dev", "libclang-cpp15",
		"libboost1.81-dev", "python3-numpy"}},
	{name: "ml", parent: "python", generate: writeMLTar, genKey: mlKey},
}

// key identifies what a recipe builds, with its parents: a changed recipe is rebuilt.
func (r layerRecipe) key() string {
	s := fmt.Sprintf("%s %s %s %s %s", suite, mirror, r.name, r.parent, strings.Join(r.packages, ","))
	if r.genKey != nil {
		s += " generated " + r.genKey()
	}
	if p, ok := recipeByName(r.parent); ok {
		s += " <- " + p.key()
	}
	h := sha256.Sum256([]byte(s))
	return hex.EncodeToString(h[:8])
}

func recipeByName(name string) (layerRecipe, bool) {
	for _, r := range layerRecipes {
		if r.name == name {
			return r, true
		}
	}
	return layerRecipe{}, false
}

// chain returns the layers of name from the top down: name, its parent, ..., base.
func chain(name string) []string {
	var out []string
	for name != "" {
		r, ok := recipeByName(name)
		if !ok {
			panic("no layer recipe " + name)
		}
		out = append(out, name)
		name = r.parent
	}
	return out
}

// imageSpec is a benchmark image: its layers (bottom first) and its workload, which prints
// the ready line when the container has done what it is for.
type imageSpec struct {
	name   string
	layers []string
	cmd    []string // the image's Cmd
	ready  string   // a line of the workload's output starting with this means ready
}

// largeScript reads three small files and the first 64 KiB of a 117 MB library of the big
// layer: under 1 MB of 1.2 GB.
const largeScript = `import hashlib
h = hashlib.sha256()
for f in ["/usr/lib/llvm-15/include/llvm/Config/llvm-config.h", "/usr/include/boost/version.hpp",
          "/usr/lib/python3/dist-packages/numpy/version.py"]:
    with open(f, "rb") as r:
        h.update(r.read())
with open("/usr/lib/x86_64-linux-gnu/libLLVM-15.so.1", "rb") as r:
    h.update(r.read(65536))
print("ready", h.hexdigest()[:16])
`

// gccScript writes a hello-world C program, compiles it and runs it.
const gccScript = `printf '#include <stdio.h>\nint main(void) { puts("hello, world"); return 0; }\n' > /tmp/hello.c && gcc -o /tmp/hello /tmp/hello.c && /tmp/hello`

var imageSpecs = []imageSpec{
	{name: "python", layers: []string{"base", "python"}, cmd: []string{"python3", "-c", `print("hello")`}, ready: "hello"},
	{name: "gcc", layers: []string{"base", "gcc"}, cmd: []string{"/bin/sh", "-c", gccScript}, ready: "hello, world"},
	{name: "large", layers: []string{"base", "python", "big"}, cmd: []string{"python3", "-c", largeScript}, ready: "ready "},
	{name: "ml", layers: []string{"base", "python", "ml"}, cmd: []string{"python3", "-c", mlScript}, ready: "ready "},
}

// defaultImages are the images measured unless -image says otherwise: ml (6 GB, its full
// pull 8 minutes at 100 Mbit/s) is measured when asked for.
var defaultImages = []string{"python", "gcc", "large"}

// generated reports whether one of the image's layers is generated (layerRecipe.generate).
func (img imageSpec) generated() bool {
	for _, l := range img.layers {
		if r, _ := recipeByName(l); r.generate != nil {
			return true
		}
	}
	return false
}

// imageEnv is the image's environment, as Debian's official images set it.
var imageEnv = []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}

// Formats every image is pushed in.
const (
	fmtGzip       = "gzip"         // plain gzip layers: always pulled in full
	fmtEStargz    = "estargz"      // estargz.Build defaults
	fmtEStargzPri = "estargz-prio" // estargz.Build with the workload's files prioritized
	fmtZstd       = "zstdchunked"  // the modern c/storage zstd:chunked compressor (e2e harness)
)

var allFormats = []string{fmtGzip, fmtEStargz, fmtEStargzPri, fmtZstd}

// lazyFormats are the formats the stores serve lazily.
var lazyFormats = []string{fmtEStargz, fmtEStargzPri, fmtZstd}
