package main

import (
	"archive/tar"
	"bytes"
	"io"
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"

	"github.com/layerstore/layerstore/benchmarks/internal/shaper"
)

func TestParseStrace(t *testing.T) {
	dir := t.TempDir()
	// pid 100 is chroot: its calls before chroot(2) are the host's.
	files := map[string]string{
		"t.100": `1.000 execve("/usr/sbin/chroot", ["chroot", "/m"], 0x7ffc /* 5 vars */) = 0
1.001 openat(AT_FDCWD, "/etc/ld.so.cache", O_RDONLY|O_CLOEXEC) = 3
1.002 chroot("/m") = 0
1.003 execve("/usr/bin/env", ["env", "-i"], 0x7ffc /* 5 vars */) = 0
1.004 openat(AT_FDCWD, "/lib/x86_64-linux-gnu/libc.so.6", O_RDONLY|O_CLOEXEC) = 3
1.006 newfstatat(AT_FDCWD, "/usr/lib/python3.11/os.py", {st_mode=S_IFREG|0644, st_size=39504, ...}, 0) = 0
1.009 openat(AT_FDCWD, "/usr/lib/python3.11/a\"b.py", O_RDONLY|O_CLOEXEC) = 3
`,
		"t.101": `1.005 execve("/usr/bin/python3", ["python3"], 0x7ffc /* 1 var */) = 0
1.008 open("/usr/lib/python3.11/os.py", O_RDONLY) = 3
`,
	}
	for n, c := range files {
		if err := os.WriteFile(filepath.Join(dir, n), []byte(c), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	got, err := parseStrace(dir)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"/usr/bin/env", "/lib/x86_64-linux-gnu/libc.so.6", "/usr/bin/python3", "/usr/lib/python3.11/os.py", `/usr/lib/python3.11/a"b.py`}
	if !slices.Equal(got, want) {
		t.Errorf("parseStrace = %q, want %q", got, want)
	}
}

func TestResolveInLayers(t *testing.T) {
	base, top := t.TempDir(), t.TempDir()
	mk := func(root, p, content string) {
		t.Helper()
		if err := os.MkdirAll(filepath.Join(root, filepath.Dir(p)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(root, p), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	link := func(root, p, target string) {
		t.Helper()
		if err := os.MkdirAll(filepath.Join(root, filepath.Dir(p)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(target, filepath.Join(root, p)); err != nil {
			t.Fatal(err)
		}
	}
	mk(base, "usr/lib/x86_64-linux-gnu/libc.so.6", "libc")
	link(base, "lib", "usr/lib")                // merged /usr, in the base
	link(top, "usr/bin/python3", "python3.11")  // relative, in the top layer
	mk(top, "usr/bin/python3.11", "python")     // ...
	link(top, "usr/bin/py", "/usr/bin/python3") // absolute, through another link
	mk(base, "etc/gone", "x")
	if err := os.MkdirAll(filepath.Join(top, "etc"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mknod(filepath.Join(top, "etc/gone"), syscall.S_IFCHR, 0); err != nil {
		t.Fatal(err) // an overlay whiteout
	}
	link(top, "loop", "loop")
	layers := []string{top, base}
	for _, tc := range []struct {
		in, want string
		ok       bool
	}{
		{"/lib/x86_64-linux-gnu/libc.so.6", "usr/lib/x86_64-linux-gnu/libc.so.6", true},
		{"/usr/bin/python3", "usr/bin/python3.11", true},
		{"/usr/bin/py", "usr/bin/python3.11", true},
		{"usr/bin/../bin/python3.11", "usr/bin/python3.11", true},
		{"/usr/bin", "usr/bin", false}, // a directory
		{"/etc/gone", "", false},       // whited out
		{"/tmp/hello.c", "", false},    // not in the image
		{"/loop", "", false},
	} {
		got, ok := resolveInLayers(layers, tc.in)
		if ok != tc.ok || (ok && got != tc.want) {
			t.Errorf("resolveInLayers(%q) = %q, %t; want %q, %t", tc.in, got, ok, tc.want, tc.ok)
		}
	}
}

func TestWriteLayerTar(t *testing.T) {
	root := t.TempDir()
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(os.MkdirAll(filepath.Join(root, "usr/bin"), 0o755))
	must(os.WriteFile(filepath.Join(root, "usr/bin/perl"), []byte("#!perl"), 0o755))
	must(os.Link(filepath.Join(root, "usr/bin/perl"), filepath.Join(root, "usr/bin/perl5.36")))
	must(os.Symlink("usr/lib", filepath.Join(root, "lib")))
	must(syscall.Mknod(filepath.Join(root, "usr/bin/removed"), syscall.S_IFCHR, 0))
	must(os.MkdirAll(filepath.Join(root, "dev/pts"), 0o755))
	must(os.WriteFile(filepath.Join(root, "dev/null-ish"), nil, 0o644))
	must(os.MkdirAll(filepath.Join(root, "opaque"), 0o755))
	opaque := syscall.Setxattr(filepath.Join(root, "opaque"), "trusted.overlay.opaque", []byte("y"), 0) == nil

	var buf bytes.Buffer
	size, diffID, n, err := writeLayerTar(&buf, root, map[string]bool{"dev": true})
	must(err)
	if size != int64(buf.Len()) || !strings.HasPrefix(diffID, "sha256:") {
		t.Errorf("size %d (tar is %d bytes), DiffID %q", size, buf.Len(), diffID)
	}
	var names []string
	tr := tar.NewReader(&buf)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		must(err)
		desc := h.Name
		switch h.Typeflag {
		case tar.TypeLink:
			desc += " link " + h.Linkname
		case tar.TypeSymlink:
			desc += " -> " + h.Linkname
		}
		if h.Uname != "" || h.Gname != "" {
			t.Errorf("%s: owner names %q/%q, want numeric owners only", h.Name, h.Uname, h.Gname)
		}
		names = append(names, desc)
	}
	want := []string{"dev/", "lib -> usr/lib", "opaque/", "usr/", "usr/bin/", "usr/bin/perl", "usr/bin/perl5.36 link usr/bin/perl", "usr/bin/.wh.removed"}
	if opaque {
		want = slices.Insert(want, 3, "opaque/.wh..wh..opq")
	}
	if !slices.Equal(names, want) || n != len(want) {
		t.Errorf("entries (%d) = %q, want %q", n, names, want)
	}
}

func TestPercentiles(t *testing.T) {
	for _, tc := range []struct {
		in       []float64
		p50, p95 float64
	}{
		{[]float64{5, 1, 4, 2, 3}, 3, 5},
		{[]float64{4, 1, 3, 2}, 2.5, 4},
		{[]float64{7}, 7, 7},
		{[]float64{10, 1, 9, 2, 8, 3, 7, 4, 6, 5, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20}, 10.5, 19},
	} {
		if got := percentiles(tc.in); got.p50 != tc.p50 || got.p95 != tc.p95 {
			t.Errorf("percentiles(%v) = %+v, want p50 %v p95 %v", tc.in, got, tc.p50, tc.p95)
		}
	}
}

func TestPlanAndOnly(t *testing.T) {
	o := options{samples: 5}
	if err := o.parse("100mbit/10ms,1gbit/1ms", "", "gzip", strings.Join(defaultImages, ",")); err != nil {
		t.Fatal(err)
	}
	if err := o.parseRuntimes("podman4,podman5", ""); err != nil {
		t.Fatal(err)
	}
	b := &bench{opts: o, stores: map[string]store{"layerstore": &layerstoreStore{}}}
	cells := b.plan()
	// 2 links x 3 images x 2 caches x 2 runtimes x (1 full + 3 lazy formats), and the cold
	// learned-profile cells: 2 links x 3 images x 2 runtimes x 3 formats x 2 modes.
	if len(cells) != 96+72 {
		t.Fatalf("%d cells, want %d", len(cells), 96+72)
	}
	names := map[string]bool{}
	for _, c := range cells {
		names[c.String()] = true
	}
	for _, n := range []string{"python:gzip:full:podman4:100mbit/10ms:cold", "large:zstdchunked:lazy:podman5:1gbit/1ms:warm",
		"gcc:estargz-prio:lazy:podman4:100mbit/10ms:warm"} {
		if !names[n] {
			t.Errorf("no cell %s", n)
		}
	}
	b.opts.only = regexp.MustCompile(`^python:.*:1gbit/1ms:cold$`)
	if got := len(b.plan()); got != 8+12 {
		t.Errorf("-only python cold on 1gbit: %d cells, want 20", got)
	}
	runs := b.schedule(b.plan())
	if len(runs) != 100 {
		t.Errorf("%d runs, want 100", len(runs))
	}
	b.opts.only = regexp.MustCompile(`^python:.*:podman5:1gbit/1ms:cold$`)
	if got := len(b.plan()); got != 4+6 {
		t.Errorf("-only python podman5 cold on 1gbit: %d cells, want 10", got)
	}
	b.opts.only = nil
	b.stores["stargz-store"] = &peerStore{bins: map[string]string{rtPodman4: "/usr/local/bin/stargz-store"}}
	if got := len(b.plan()); got != 168+36 {
		t.Errorf("with a peer for podman 4: %d cells, want %d (a lazy column more, podman 4 only)", got, 168+36)
	}
	b.stores["stargz-store"] = &peerStore{bins: map[string]string{rtPodman4: "/a/stargz-store", rtPodman5: "/b/stargz-store"}}
	if got := len(b.plan()); got != 168+72 {
		t.Errorf("with a peer for both: %d cells, want %d", got, 168+72)
	}
	for _, c := range b.plan() {
		if c.store == "stargz-store" && c.mode() != "lazy-stargz-store" {
			t.Errorf("peer cell %s: mode %s", c, c.mode())
		}
	}
}

func TestParseRuntimes(t *testing.T) {
	for _, tc := range []struct {
		runtimes, peer string
		want           []string
		peers          map[string]string
		bad            bool
	}{
		{runtimes: "podman4,podman5", want: []string{"podman4", "podman5"}, peers: map[string]string{}},
		{runtimes: "podman5", want: []string{"podman5"}, peers: map[string]string{}},
		{runtimes: " podman5 , podman4,podman5", want: []string{"podman5", "podman4"}, peers: map[string]string{}},
		// The old form: one binary, for podman 4.
		{runtimes: "podman4,podman5", peer: "/opt/sgz/stargz-store", want: []string{"podman4", "podman5"},
			peers: map[string]string{"podman4": "/opt/sgz/stargz-store"}},
		{runtimes: "podman4,podman5", peer: "podman4=/a/stargz-store,podman5=/b/stargz-store", want: []string{"podman4", "podman5"},
			peers: map[string]string{"podman4": "/a/stargz-store", "podman5": "/b/stargz-store"}},
		// A peer of a runtime not measured is left out.
		{runtimes: "podman5", peer: "podman4=/a/stargz-store,podman5=/b/stargz-store", want: []string{"podman5"},
			peers: map[string]string{"podman5": "/b/stargz-store"}},
		{runtimes: "podman3", bad: true},
		{runtimes: "", bad: true},
		{runtimes: "podman4", peer: "podman6=/a/stargz-store", bad: true},
		{runtimes: "podman4", peer: "podman4=", bad: true},
		{runtimes: "podman4", peer: "podman4=/a/x,podman4=/b/x", bad: true},
		{runtimes: "podman4", peer: "podman4=/a/x,/b/x", bad: true},
		{runtimes: "podman4", peer: "/usr/bin/layerstore", bad: true},
	} {
		var o options
		err := o.parseRuntimes(tc.runtimes, tc.peer)
		if tc.bad {
			if err == nil {
				t.Errorf("-runtimes %q -peer %q accepted", tc.runtimes, tc.peer)
			}
			continue
		}
		if err != nil {
			t.Errorf("-runtimes %q -peer %q: %v", tc.runtimes, tc.peer, err)
			continue
		}
		if !slices.Equal(o.runtimes, tc.want) || !maps.Equal(o.peers, tc.peers) {
			t.Errorf("-runtimes %q -peer %q: runtimes %q peers %v, want %q %v", tc.runtimes, tc.peer, o.runtimes, o.peers, tc.want, tc.peers)
		}
	}
	if n := (&peerStore{bins: map[string]string{rtPodman4: "/a/stargz-store-0.15", rtPodman5: "/b/stargz-store"}}).name(); n != "stargz-store" {
		t.Errorf("peer named %q, want podman 5's binary's name", n)
	}
}

func TestOptionErrors(t *testing.T) {
	for _, tc := range []struct{ links, only, full string }{
		{"100mbit", "", "gzip"},
		{"100mbit/10ms", "(", "gzip"},
		{"100mbit/10ms", "", "lz4"},
	} {
		o := options{samples: 5}
		if err := o.parse(tc.links, tc.only, tc.full, strings.Join(defaultImages, ",")); err == nil {
			t.Errorf("parse(%q, %q, %q) accepted", tc.links, tc.only, tc.full)
		}
	}
	if l, _ := shaper.ParseLink("unlimited"); l.String() != "unlimited" {
		t.Errorf("unlimited link named %q", l.String())
	}
}

// TestNeededImages checks what -only makes ensure build: the images and formats of the
// selected cells (a zstd:chunked image with the gzip image it is converted from), and the
// layers of those images only.
func TestNeededImages(t *testing.T) {
	all := []string{"python/gzip", "python/estargz", "python/estargz-prio", "python/zstdchunked",
		"gcc/gzip", "gcc/estargz", "gcc/estargz-prio", "gcc/zstdchunked",
		"large/gzip", "large/estargz", "large/estargz-prio", "large/zstdchunked"}
	for _, tc := range []struct {
		only, full string
		want       []string // image/format, in imageSpecs and allFormats order
		layers     []string
	}{
		{"", "gzip", all, []string{"base", "python", "gcc", "big"}},
		{"^python:estargz:", "gzip", []string{"python/estargz"}, []string{"base", "python"}},
		{"^python:estargz:lazy:podman4:1gbit/1ms:cold$", "gzip", []string{"python/estargz"}, []string{"base", "python"}},
		{"^(python|gcc):(estargz|zstdchunked):lazy.*:100mbit/10ms:cold$", "gzip", []string{"python/gzip", "python/estargz", "python/zstdchunked",
			"gcc/gzip", "gcc/estargz", "gcc/zstdchunked"}, []string{"base", "python", "gcc"}},
		{"^python:zstdchunked:", "gzip", []string{"python/gzip", "python/zstdchunked"}, []string{"base", "python"}},
		{"^gcc:gzip:full:", "gzip", []string{"gcc/gzip"}, []string{"base", "gcc"}},
		{"^large:estargz-prio:lazy:.*:warm$", "gzip", []string{"large/estargz-prio"}, []string{"base", "python", "big"}},
		{":full:", "gzip", []string{"python/gzip", "gcc/gzip", "large/gzip"}, []string{"base", "python", "gcc", "big"}},
		{":full:", "estargz", []string{"python/estargz", "gcc/estargz", "large/estargz"}, []string{"base", "python", "gcc", "big"}},
		{"^python:estargz:lazy|^gcc:zstdchunked:", "gzip", []string{"python/estargz", "gcc/gzip", "gcc/zstdchunked"}, []string{"base", "python", "gcc"}},
		{"^python:.*:1gbit/1ms:cold$", "gzip", []string{"python/gzip", "python/estargz", "python/estargz-prio", "python/zstdchunked"}, []string{"base", "python"}},
		{"^gcc:.*:lazy:", "", []string{"gcc/gzip", "gcc/estargz", "gcc/estargz-prio", "gcc/zstdchunked"}, []string{"base", "gcc"}},
		{"^gcc:(estargz|estargz-prio):lazy:", "", []string{"gcc/estargz", "gcc/estargz-prio"}, []string{"base", "gcc"}},
		{"^nothing$", "gzip", nil, nil},
	} {
		o := options{samples: 1}
		if err := o.parse("100mbit/10ms,1gbit/1ms", tc.only, tc.full, strings.Join(defaultImages, ",")); err != nil {
			t.Fatal(err)
		}
		if err := o.parseRuntimes("podman4,podman5", ""); err != nil {
			t.Fatal(err)
		}
		b := &bench{opts: o, stores: map[string]store{"layerstore": &layerstoreStore{},
			"stargz-store": &peerStore{bins: map[string]string{rtPodman4: "/usr/local/bin/stargz-store"}}}}
		need := needed(b.plan())
		var got []string
		for _, img := range need.images() {
			for _, f := range need.formats(img.name) {
				got = append(got, img.name+"/"+f)
			}
		}
		if len(got) != len(need) {
			t.Errorf("-only %q -full %q: %d pairs listed of %d in the set", tc.only, tc.full, len(got), len(need))
		}
		if !slices.Equal(got, tc.want) {
			t.Errorf("-only %q -full %q: needs %q, want %q", tc.only, tc.full, got, tc.want)
		}
		if l := need.layers(); !slices.Equal(l, tc.layers) {
			t.Errorf("-only %q -full %q: layers %q, want %q", tc.only, tc.full, l, tc.layers)
		}
	}
}
