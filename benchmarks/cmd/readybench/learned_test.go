package main

import (
	"archive/tar"
	"bytes"
	"crypto/sha256"
	"fmt"
	"io"
	"math"
	"regexp"
	"slices"
	"strings"
	"testing"
)

func TestParseModes(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want []string
		bad  bool
	}{
		{in: "full,lazy,lazy-learned,lazy-newversion", want: defaultModes},
		{in: "pin,lazy", want: []string{"pin", "lazy"}},
		{in: " lazy-learned , lazy,lazy-learned", want: []string{"lazy-learned", "lazy"}},
		{in: "lazy-newversion", want: []string{"lazy-newversion"}},
		{in: "", bad: true},
		{in: " , ", bad: true},
		{in: "learned", bad: true},
		{in: "lazy-stargz-store", bad: true}, // a peer's cells are lazy ones
	} {
		var o options
		err := o.parseModes(tc.in)
		if tc.bad {
			if err == nil {
				t.Errorf("-modes %q accepted: %q", tc.in, o.modes)
			}
			continue
		}
		if err != nil || !slices.Equal(o.modes, tc.want) {
			t.Errorf("-modes %q: %q, %v; want %q", tc.in, o.modes, err, tc.want)
		}
	}
}

// TestPlanModes checks the learned-profile cells: layerstore's, cold only, one of each per
// lazy format, named by their mode, and what -modes keeps.
func TestPlanModes(t *testing.T) {
	o := options{samples: 3}
	if err := o.parse("100mbit/10ms", `^(python|gcc):`, "gzip", strings.Join(defaultImages, ",")); err != nil {
		t.Fatal(err)
	}
	if err := o.parseRuntimes("podman4", ""); err != nil {
		t.Fatal(err)
	}
	b := &bench{opts: o, stores: map[string]store{"layerstore": &layerstoreStore{},
		"stargz-store": &peerStore{bins: map[string]string{rtPodman4: "/a/stargz-store"}}}}
	count := func(modes string) map[string]int {
		t.Helper()
		if err := b.opts.parseModes(modes); err != nil {
			t.Fatal(err)
		}
		n := map[string]int{}
		for _, c := range b.plan() {
			n[c.mode()+":"+c.cache()]++
			if c.profile != "" && (c.warm || c.store != "layerstore") {
				t.Errorf("learned-profile cell %s: warm or not layerstore's", c)
			}
		}
		return n
	}
	// 2 images x (full cold, full warm; 3 formats x (lazy, peer) cold and warm; 3 formats x 2 learned, cold).
	want := map[string]int{"full:cold": 2, "full:warm": 2, "lazy:cold": 6, "lazy:warm": 6, "lazy-stargz-store:cold": 6,
		"lazy-stargz-store:warm": 6, "lazy-learned:cold": 6, "lazy-newversion:cold": 6}
	if got := count(strings.Join(defaultModes, ",")); !mapsEqual(got, want) {
		t.Errorf("all modes: %v, want %v", got, want)
	}
	if got := count("lazy-learned,lazy-newversion"); !mapsEqual(got, map[string]int{"lazy-learned:cold": 6, "lazy-newversion:cold": 6}) {
		t.Errorf("learned modes: %v", got)
	}
	if got := count("lazy"); !mapsEqual(got, map[string]int{"lazy:cold": 6, "lazy:warm": 6, "lazy-stargz-store:cold": 6, "lazy-stargz-store:warm": 6}) {
		t.Errorf("lazy: %v", got)
	}
	// The pin cells: layerstore's, cold, one per lazy format and image, of the first runtime.
	if got := count("pin"); !mapsEqual(got, map[string]int{"pin:cold": 6}) {
		t.Errorf("pin: %v", got)
	}
	b.opts.modes = nil // as a bench made without parseModes: the default modes
	if got := count(strings.Join(defaultModes, ",")); !mapsEqual(got, want) {
		t.Errorf("nil modes: %v", got)
	}
	// -only names the mode: the reduced run of the report.
	b.opts.only = regexp.MustCompile(`^(python|gcc):(gzip:full:podman4:100mbit/10ms:cold|(estargz|estargz-prio|zstdchunked):lazy(-learned|-newversion)?:podman4:100mbit/10ms:(cold|warm))$`)
	if got := count(strings.Join(defaultModes, ",")); !mapsEqual(got, map[string]int{"full:cold": 2, "lazy:cold": 6, "lazy:warm": 6,
		"lazy-learned:cold": 6, "lazy-newversion:cold": 6}) {
		t.Errorf("reduced run: %v", got)
	}
	names := map[string]bool{}
	for _, c := range b.plan() {
		names[c.String()] = true
	}
	for _, n := range []string{"gcc:zstdchunked:lazy-newversion:podman4:100mbit/10ms:cold", "python:estargz-prio:lazy-learned:podman4:100mbit/10ms:cold"} {
		if !names[n] {
			t.Errorf("no cell %s", n)
		}
	}
	// The new versions built: those of the newversion cells, with the gzip image a
	// zstd:chunked one is converted from.
	v2 := neededV2(b.plan())
	var got []string
	for _, img := range v2.images() {
		for _, f := range v2.formats(img.name) {
			got = append(got, img.name+"/"+f)
		}
	}
	if want := []string{"python/gzip", "python/estargz", "python/estargz-prio", "python/zstdchunked",
		"gcc/gzip", "gcc/estargz", "gcc/estargz-prio", "gcc/zstdchunked"}; !slices.Equal(got, want) {
		t.Errorf("new versions %q, want %q", got, want)
	}
	if err := b.opts.parseModes("lazy-learned"); err != nil {
		t.Fatal(err)
	}
	if v2 := neededV2(b.plan()); len(v2) != 0 {
		t.Errorf("new versions without newversion cells: %v", v2)
	}
}

func mapsEqual(a, b map[string]int) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}

func TestImageOf(t *testing.T) {
	v1, v2 := &pushedImage{Repo: "bench/gcc:estargz"}, &pushedImage{Repo: "bench/gcc:estargz-v2"}
	b := &bench{images: &imageCache{cat: catalogue{Images: map[string]map[string]*pushedImage{
		"gcc": {fmtEStargz: v1, v2Format(fmtEStargz): v2}}}}}
	gcc := imageSpecs[1]
	for _, tc := range []struct {
		c    cell
		want *pushedImage
	}{
		{cell{image: gcc, format: fmtEStargz, store: "layerstore"}, v1},
		{cell{image: gcc, format: fmtEStargz, store: "layerstore", profile: profileLearned}, v1},
		{cell{image: gcc, format: fmtEStargz, store: "layerstore", profile: profileNewVersion}, v2},
	} {
		if got := b.imageOf(tc.c); got != tc.want {
			t.Errorf("%s: image %v, want %v", tc.c, got, tc.want)
		}
	}
}

// TestFloorColumns checks the floor with the runtime's own time: the warm p50 plus the
// network floor, and the total over it.
func TestFloorColumns(t *testing.T) {
	for _, tc := range []struct {
		name                string
		total, net, warm    float64
		netOK, warmOK       bool
		wantNet, want, over string
	}{
		{"both", 2.4, 0.4, 1.2, true, true, "0.40", "1.60", "1.50"},
		{"no warm cell", 2.4, 0.4, 0, true, false, "0.40", "-", "-"},
		{"no read set", 2.4, 0, 1.2, false, true, "-", "-", "-"},
		{"unlimited link", 1.5, 0, 1.2, true, true, "0.00", "1.20", "1.25"},
		{"nothing at all", 1.5, 0, 0, true, true, "0.00", "0.00", "-"},
	} {
		n, f, o := floorColumns(tc.total, tc.net, tc.netOK, tc.warm, tc.warmOK)
		if n != tc.wantNet || f != tc.want || o != tc.over {
			t.Errorf("%s: %q %q %q, want %q %q %q", tc.name, n, f, o, tc.wantNet, tc.want, tc.over)
		}
	}
}

// TestWarmOf checks which warm cell gives a cold cell the runtime's time: the same store,
// image, format, runtime and link, the plain warm cell for a learned-profile one.
func TestWarmOf(t *testing.T) {
	o := options{samples: 1}
	if err := o.parse("100mbit/10ms", "", "gzip", strings.Join(defaultImages, ",")); err != nil {
		t.Fatal(err)
	}
	gcc := imageSpecs[1]
	cold := cell{image: gcc, format: fmtZstd, store: "layerstore", runtime: rtPodman4, link: o.links[0]}
	warm := cold
	warm.warm = true
	learned := cold
	learned.profile = profileNewVersion
	r := &report{opts: o, results: map[string][]sample{warm.String(): {{Pull: 1, Run: 0.5}, {Pull: 1, Run: 0.7}, {Pull: 1.2, Run: 0.6}}}}
	for _, c := range []cell{cold, learned} {
		if w, ok := r.warmOf(c); !ok || math.Abs(w-1.7) > 1e-9 { // totals 1.5, 1.7, 1.8
			t.Errorf("%s: warm %.2f %v, want 1.70", c, w, ok)
		}
	}
	if _, ok := r.warmOf(warm); ok {
		t.Errorf("a warm cell has a warm floor")
	}
	peer := cold
	peer.store = "stargz-store"
	if _, ok := r.warmOf(peer); ok {
		t.Errorf("%s: layerstore's warm cell taken for a peer's", peer)
	}
}

func TestNewVersionTar(t *testing.T) {
	elf := append([]byte("\x7fELF\x02\x01\x01"), make([]byte, 64)...)
	files := []struct {
		name    string
		content string
		changed bool
	}{
		{"usr/bin/gcc-12", string(elf), true},
		{"usr/include/stdio.h", "#ifndef _STDIO_H\n#endif\n", true},
		{"usr/lib/python3.11/os.py", "import abc\n", false}, // its .pyc records its size
		{"usr/lib/python3.11/__pycache__/os.cpython-311.pyc", "\xa7\x0d\x0d\x0a\x00\x00", false},
		{"usr/lib/x86_64-linux-gnu/libc_nonshared.a", "!<arch>\n\xff\xfe", false},
		{"etc/empty", "", false},
	}
	var src bytes.Buffer
	tw := tar.NewWriter(&src)
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(tw.WriteHeader(&tar.Header{Name: "usr/", Typeflag: tar.TypeDir, Mode: 0o755}))
	for _, f := range files {
		must(tw.WriteHeader(&tar.Header{Name: f.name, Typeflag: tar.TypeReg, Mode: 0o644, Size: int64(len(f.content)),
			PAXRecords: map[string]string{"SCHILY.xattr.user.x": "y"}}))
		_, err := tw.Write([]byte(f.content))
		must(err)
	}
	must(tw.WriteHeader(&tar.Header{Name: "usr/bin/cc", Typeflag: tar.TypeLink, Linkname: "usr/bin/gcc-12"}))
	must(tw.WriteHeader(&tar.Header{Name: "usr/bin/gcc", Typeflag: tar.TypeSymlink, Linkname: "gcc-12"}))
	must(tw.Close())

	var dst bytes.Buffer
	size, diffID, n, changed, err := newVersionTar(&dst, bytes.NewReader(src.Bytes()))
	must(err)
	if size != int64(dst.Len()) || diffID != fmt.Sprintf("sha256:%x", sha256.Sum256(dst.Bytes())) {
		t.Errorf("size %d (tar %d), DiffID %s", size, dst.Len(), diffID)
	}
	if n != len(files)+3 || changed != 2 {
		t.Errorf("%d entries, %d changed; want %d, 2", n, changed, len(files)+3)
	}
	tr := tar.NewReader(&dst)
	var names []string
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		must(err)
		names = append(names, h.Name)
		b, err := io.ReadAll(tr)
		must(err)
		for _, f := range files {
			if f.name != h.Name {
				continue
			}
			if h.PAXRecords["SCHILY.xattr.user.x"] != "y" {
				t.Errorf("%s: extended attributes lost", h.Name)
			}
			switch {
			case !f.changed && string(b) != f.content:
				t.Errorf("%s changed: %q", f.name, b)
			case f.changed && (!strings.HasPrefix(string(b), f.content) || len(b) == len(f.content)):
				t.Errorf("%s: %q, want its content with bytes appended", f.name, b)
			}
		}
	}
	if want := []string{"usr/", "usr/bin/gcc-12", "usr/include/stdio.h", "usr/lib/python3.11/os.py",
		"usr/lib/python3.11/__pycache__/os.cpython-311.pyc", "usr/lib/x86_64-linux-gnu/libc_nonshared.a", "etc/empty",
		"usr/bin/cc", "usr/bin/gcc"}; !slices.Equal(names, want) {
		t.Errorf("entries %q, want %q (the same paths, in the same order)", names, want)
	}
}

func TestProfileSummary(t *testing.T) {
	a := sample{ReadKnown: true, ProfileLayers: 2, ProfileSameLayer: 1, ProfileFiles: 58, ProfileBytes: 20_900_000, ProfileFetched: 20_900_000,
		Imported: "imported the startup profiles of 1 repositories (2 layers)"}
	b := a
	b.ProfileFetched = 10_000_000
	got := profileSummary([]sample{a, b, a, {}}, 2)
	want := "2/2 layers (1 own), 58 files, 20.9 MB of 20.9 MB (imported the startup profiles of 1 repositories (2 layers)) [2 of 4 samples] | " +
		"2/2 layers (1 own), 58 files, 10.0 MB of 20.9 MB (imported the startup profiles of 1 repositories (2 layers)) [1 of 4 samples] | " +
		"status unknown [1 of 4 samples]"
	if got != want {
		t.Errorf("profileSummary:\n%s\nwant\n%s", got, want)
	}
}
