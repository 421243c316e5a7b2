package layer

import (
	"archive/tar"
	"bytes"
	"debug/elf"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/layerstore/layerstore/chunked"
	"github.com/layerstore/layerstore/internal/control/protocol"
	"github.com/layerstore/layerstore/internal/testutil/testelf"
	"github.com/layerstore/layerstore/internal/testutil/testlayer"
)

// Tests of prediction (predict.go): the files an ELF file's loader opens are fetched once
// its header is read, across the image's layers, and nothing else. The reading of ELF files
// is package execdeps's, tested there.

// predictLayer builds an eStargz layer of entries, in 64 KiB chunks.
func predictLayer(t *testing.T, name string, es []testlayer.Entry) testlayer.Fixture {
	t.Helper()
	fx, err := testlayer.BuildEStargz(name, testlayer.Build(es), estargzChunkSize(64<<10))
	if err != nil {
		t.Fatal(err)
	}
	return fx
}

func regEntry(name string, data []byte) testlayer.Entry {
	return testlayer.Entry{Header: tarFile(name, int64(len(data))), Data: data}
}

func linkEntry(name, target string) testlayer.Entry {
	return testlayer.Entry{Header: tar.Header{Typeflag: tar.TypeSymlink, Name: name, Linkname: target, Mode: 0o777, ModTime: testlayer.Epoch}}
}

// fetchedFiles returns the paths of l whose first chunk a logged fetch of its blob fetched.
func fetchedFiles(l *Served, log []fetchEvent) []string {
	first := map[int64]string{}
	x := l.Index()
	for id := chunked.EntryID(0); int(id) < x.Len(); id++ {
		if e := x.Meta(id); e.Type == chunked.TypeReg && e.Inode == id && x.NumChunks(id) > 0 {
			c, _ := x.Chunk(id, 0)
			first[c.Offset] = x.Path(id)
		}
	}
	var out []string
	for _, ev := range log {
		if ev.blob != l.Digest() {
			continue
		}
		for _, r := range ev.ranges {
			if p, ok := first[r.Offset]; ok && !slices.Contains(out, p) {
				out = append(out, p)
			}
		}
	}
	slices.Sort(out)
	return out
}

// TestPredictLoadedFiles: executing a program fetches, without any read, the program whole,
// its interpreter and the libraries it names, whole too (found through its
// run path, symlinks and the merged-/usr links of the image's lower layer), and theirs in
// turn; a name found nowhere is skipped; a read of a shared object, not of its start, predicts
// nothing; nothing of a layer of another image is fetched, and none of it counts as the
// workload's reads or enters a profile. With read-ahead off, nothing is predicted.
func TestPredictLoadedFiles(t *testing.T) {
	const lib = "usr/lib/x86_64-linux-gnu/"
	base := []testlayer.Entry{
		regEntry(lib+"libonlydata.so", testelf.File(10, testelf.Spec{Pad: 20 << 10})), // first in the blob: no read-ahead reaches it
		regEntry(lib+"libc.so.6", testelf.File(11, testelf.Spec{Pad: 150 << 10})),
		regEntry(lib+"libz.so.1.2.13", testelf.File(12, testelf.Spec{Needed: []string{"libc.so.6"}, Pad: 30 << 10})),
		linkEntry(lib+"libz.so.1", "libz.so.1.2.13"),
		regEntry(lib+"ld-linux-x86-64.so.2", testelf.File(13, testelf.Spec{Static: true, Pad: 10 << 10})),
		linkEntry("lib", "usr/lib"),
		linkEntry("lib64/ld-linux-x86-64.so.2", "/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2"),
	}
	app := []testlayer.Entry{
		regEntry("usr/lib/app/libfoo.so", testelf.File(20, testelf.Spec{Needed: []string{"libc.so.6", "libnowhere.so.9"}, Pad: 40 << 10})),
		regEntry("usr/bin/prog", testelf.File(21, testelf.Spec{
			Interp: "/lib64/ld-linux-x86-64.so.2", Needed: []string{"libfoo.so", "libz.so.1", "libmissing.so.3"},
			Runpath: "$ORIGIN/../lib/app", Pad: 300 << 10,
		})),
		regEntry("usr/lib/app/data.so", testelf.File(22, testelf.Spec{Needed: []string{"libonlydata.so"}, Pad: 10 << 10})),
	}
	decoy := []testlayer.Entry{regEntry(lib+"libz.so.1", testelf.File(30, testelf.Spec{Pad: 10 << 10}))}
	bf, af, df := predictLayer(t, "base", base), predictLayer(t, "app", app), predictLayer(t, "decoy", decoy)

	for _, readAhead := range []int64{defaultReadAhead, 0} {
		e := newProfEnv(t)
		e.reg.push(profRepo+":v1", bf, af)
		e.reg.push("registry.example/other:v1", bf, df)
		m, _ := e.start(withPrefetch(false), withReadAhead(readAhead), withProfileWindow(time.Second))
		lb := lookupOK(t, m, profRepo+":v1", profKey(bf))
		la := lookupOK(t, m, profRepo+":v1", profKey(af))
		ld := lookupOK(t, m, "registry.example/other:v1", profKey(df))
		lookupOK(t, m, "registry.example/other:v1", profKey(bf))
		e.reg.log(true)

		// Read first, not from its start (nothing predicted: TestPredictLoadedLibrary), then
		// executed.
		if _, err := la.ReadFile(t.Context(), fileOf(t, la, "usr/lib/app/data.so"), make([]byte, 4096), 4096); err != nil {
			t.Fatal(err)
		}
		la.Executing(fileOf(t, la, "usr/bin/prog"))
		wantBase := []string{lib + "ld-linux-x86-64.so.2", lib + "libc.so.6", lib + "libz.so.1.2.13"}
		if readAhead == 0 {
			time.Sleep(200 * time.Millisecond)
			if got := fetchedFiles(lb, e.reg.log(false)); len(got) != 0 {
				t.Fatalf("read-ahead off: fetched %q", got)
			}
			continue
		}
		waitFor(t, "the predicted files", func() bool {
			log := e.reg.log(false)
			return slices.Equal(fetchedFiles(lb, log), wantBase) && slices.Contains(fetchedFiles(la, log), "usr/lib/app/libfoo.so")
		})
		time.Sleep(100 * time.Millisecond) // anything more would come now
		log := e.reg.log(false)
		if got := fetchedFiles(lb, log); !slices.Equal(got, wantBase) {
			t.Errorf("fetched of the lower layer: %q, want %q", got, wantBase)
		}
		// Each predicted file is fetched whole (each under maxPredictWhole).
		fetched := map[int64]bool{}
		for _, ev := range log {
			for _, r := range ev.ranges {
				fetched[r.Offset] = true
			}
		}
		for _, f := range []struct {
			l *Served
			p string
		}{{lb, lib + "libc.so.6"}, {lb, lib + "libz.so.1.2.13"}, {la, "usr/bin/prog"}, {la, "usr/lib/app/libfoo.so"}} {
			cs := f.l.Index().Chunks(fileOf(t, f.l, f.p))
			if len(cs) < 2 && (f.p == "usr/bin/prog" || f.p == lib+"libc.so.6") {
				t.Fatalf("%s: %d chunks", f.p, len(cs))
			}
			for i, c := range cs {
				if !fetched[c.Offset] {
					t.Errorf("%s: chunk %d of %d not fetched", f.p, i, len(cs))
				}
			}
		}
		for _, ev := range log {
			if ev.blob == df.Desc.Digest {
				t.Errorf("fetched from the other image's layer %s", ld.Digest())
			}
		}
		// The loader's reads find the libraries in the cache: no fetch.
		e.reg.log(true)
		readPaths(t, lb, lib+"libc.so.6", lib+"libz.so.1.2.13")
		readPaths(t, la, "usr/lib/app/libfoo.so")
		if log := e.reg.log(false); len(log) != 0 {
			t.Errorf("%d fetches for the predicted files' reads", len(log))
		}
		waitFor(t, "the recordings", func() bool { return la.Status().ProfileRecorded == 2 && lb.Status().ProfileRecorded == 2 })
		if s := lb.Status(); s.ReadChunks > int64(lb.Index().NumChunks(fileOf(t, lb, lib+"libc.so.6"))+lb.Index().NumChunks(fileOf(t, lb, lib+"libz.so.1.2.13"))) {
			t.Errorf("the lower layer counts %d chunks read", s.ReadChunks)
		}
	}
}

// TestPredictLoadedLibrary: a runtime's read of the start of a shared object (a library a
// program loads itself, dlopen) predicts it as an execution does: the file whole and the
// libraries it names, without a read of them; a read elsewhere in it, a read of the start of an
// ELF file of another type (an object a linker reads), and any read while the layer replays a
// startup profile (which knows what the start loads) predict nothing.
func TestPredictLoadedLibrary(t *testing.T) {
	const dir = "usr/lib/app/"
	fx := predictLayer(t, "dlopen", []testlayer.Entry{
		// Before the files read in the blob: no read-ahead reaches them.
		regEntry(dir+"libdep.so", testelf.File(50, testelf.Spec{Pad: 150 << 10})),
		regEntry(dir+"libother.so", testelf.File(51, testelf.Spec{Pad: 10 << 10})),
		regEntry(dir+"tool.o", testelf.File(52, testelf.Spec{Needed: []string{"libother.so"}, Runpath: "$ORIGIN", Type: elf.ET_REL, Pad: 10 << 10})),
		regEntry(dir+"plugin.so", testelf.File(53, testelf.Spec{Needed: []string{"libdep.so"}, Runpath: "$ORIGIN", Pad: 200 << 10})),
	})
	e := newProfEnv(t)
	e.reg.push(profRepo+":v1", fx)
	m, _ := e.start(withPrefetch(false))
	l := lookupOK(t, m, profRepo+":v1", profKey(fx))
	e.reg.log(true)
	read := func(p string, off int64) {
		t.Helper()
		if _, err := l.ReadFile(t.Context(), fileOf(t, l, p), make([]byte, 4096), off); err != nil {
			t.Fatal(err)
		}
	}
	replaying := func(on bool) {
		l.prefetch.mu.Lock()
		l.prefetch.profileFiles = map[bool]int{true: 1}[on]
		l.prefetch.mu.Unlock()
	}
	read(dir+"tool.o", 0)
	read(dir+"plugin.so", 100<<10)
	replaying(true)
	read(dir+"plugin.so", 0)
	replaying(false)
	time.Sleep(200 * time.Millisecond) // a prediction would fetch now
	if got := fetchedFiles(l, e.reg.log(false)); slices.Contains(got, dir+"libother.so") || slices.Contains(got, dir+"libdep.so") {
		t.Fatalf("fetched %q before the shared object's start was read outside a replay", got)
	}

	e.reg.log(true)
	read(dir+"plugin.so", 0)
	fetched := map[int64]bool{}
	whole := func(p string) bool {
		for _, ev := range e.reg.log(false) {
			for _, r := range ev.ranges {
				fetched[r.Offset] = true
			}
		}
		for _, c := range l.Index().Chunks(fileOf(t, l, p)) {
			if !fetched[c.Offset] {
				return false
			}
		}
		return true
	}
	complete := func(p string) bool { return l.env.cache.Has(l.Index().Meta(fileOf(t, l, p)).Digest) }
	waitFor(t, "the library the shared object names, whole", func() bool { return whole(dir + "libdep.so") })
	waitFor(t, "the shared object, whole", func() bool { return complete(dir + "plugin.so") })
	if n := len(l.Index().Chunks(fileOf(t, l, dir+"libdep.so"))); n < 2 {
		t.Fatalf("libdep.so: %d chunks", n)
	}
	time.Sleep(100 * time.Millisecond) // anything more would come now
	if whole(dir + "libother.so") {
		t.Error("the object file's library was fetched")
	}
	// The library was fetched, not read: the reads counted are the plugin's and the object's.
	want := int64(0)
	for _, p := range []string{dir + "tool.o", dir + "plugin.so"} {
		want += int64(l.Index().NumChunks(fileOf(t, l, p)))
	}
	if s := l.Status(); s.ReadChunks > want {
		t.Errorf("%d chunks counted as read, at most %d", s.ReadChunks, want)
	}
}

// TestResolvePathBounded: symlink loops and chains of more than maxLinkHops resolve to
// nothing; ".." stops at the root.
func TestResolvePathBounded(t *testing.T) {
	es := []testlayer.Entry{
		linkEntry("a", "b"), linkEntry("b", "/a"),
		linkEntry("self", "./self/x"),
		linkEntry("up", "../../../../etc/f"),
		regEntry("etc/f", []byte("x")),
	}
	for i := range maxLinkHops + 2 { // chain/0 -> chain/1 -> ... -> etc/f
		target := fmt.Sprintf("/chain/%d", i+1)
		if i == maxLinkHops+1 {
			target = "/etc/f"
		}
		es = append(es, linkEntry(fmt.Sprintf("chain/%d", i), target))
	}
	fx := predictLayer(t, "loops", es)
	e := newProfEnv(t)
	e.reg.push(profRepo+":v1", fx)
	m, _ := e.start(withPrefetch(false))
	l := lookupOK(t, m, profRepo+":v1", profKey(fx))
	for p, want := range map[string]bool{"/a": false, "/self": false, "/up": true, "/chain/0": false, "/chain/2": true, "/etc/f": true, "/etc": false, "/": false, "": false} {
		if _, ok := resolvePath([]*Served{l}, p); ok != want {
			t.Errorf("%q: %v, want %v", p, ok, want)
		}
	}
}

// TestPredictedBounded: a layer predicts at most maxPredicted files, each once, and nothing
// with read-ahead off.
func TestPredictedBounded(t *testing.T) {
	fx := predictLayer(t, "bound", []testlayer.Entry{regEntry("f", []byte("x"))})
	for _, readAhead := range []int64{defaultReadAhead, 0} {
		e := newProfEnv(t)
		e.reg.push(profRepo+":v1", fx)
		m, _ := e.start(withPrefetch(false), withReadAhead(readAhead))
		l := lookupOK(t, m, profRepo+":v1", profKey(fx))
		n := 0
		for id := range chunked.EntryID(maxPredicted + 50) {
			if l.markPredicted(id) {
				n++
			}
			if l.markPredicted(id) {
				t.Fatalf("file %d predicted twice", id)
			}
		}
		want := maxPredicted
		if readAhead == 0 {
			want = 0
		}
		if n != want {
			t.Errorf("read-ahead %d: %d files predicted, want %d", readAhead, n, want)
		}
	}
}

// TestPredictWholeInBatches: an executed file larger than a batch is fetched whole without
// any read, in requests of at most a batch of content; a file of more than maxPredictWhole is
// not fetched whole: the chunks of its header and dynamic section only (a prediction's reads
// fetch no read-ahead nor region). (At most wholeBatches at once:
// TestParallelBounded.)
func TestPredictWholeInBatches(t *testing.T) {
	big := testelf.File(40, testelf.Spec{Pad: 2*wholeBatch + wholeBatch/2})
	huge := testelf.File(41, testelf.Spec{Pad: 64 << 10, Zeros: maxPredictWhole})
	fx := predictLayer(t, "whole", []testlayer.Entry{regEntry("usr/bin/big", big), regEntry("usr/bin/huge", huge)})
	e := newProfEnv(t)
	e.reg.push(profRepo+":v1", fx)
	m, _ := e.start(withPrefetch(false))
	l := lookupOK(t, m, profRepo+":v1", profKey(fx))
	x := l.Index()
	// fileEvents returns the logged fetches of chunks of file p and how much of its content
	// they fetched.
	fileEvents := func(p string) (evs []fetchEvent, content int64) {
		cs := x.Chunks(fileOf(t, l, p))
		byOffset := map[int64]int64{}
		for _, c := range cs {
			byOffset[c.Offset] = c.Size
		}
		for _, ev := range e.reg.log(false) {
			mine := false
			for _, r := range ev.ranges {
				for c := range byOffset {
					if c >= r.Offset && c < r.End() {
						mine = true
						content += byOffset[c]
						delete(byOffset, c)
					}
				}
			}
			if mine {
				evs = append(evs, ev)
			}
		}
		return evs, content
	}

	l.Executing(fileOf(t, l, "usr/bin/big"))
	waitFor(t, "the whole file", func() bool { _, n := fileEvents("usr/bin/big"); return n == int64(len(big)) })
	evs, _ := fileEvents("usr/bin/big")
	if len(evs) < 3 {
		t.Errorf("%d requests for %d bytes: want batches of at most %d", len(evs), len(big), wholeBatch)
	}
	for _, ev := range evs {
		var n int64
		for _, r := range ev.ranges {
			n += r.Length
		}
		if n > wholeBatch+wholeBatch/64 { // a batch of content, compressed (random bytes: a little more)
			t.Errorf("a request of %d bytes: over a batch", n)
		}
	}
	e.reg.log(true)
	l.Executing(fileOf(t, l, "usr/bin/huge"))
	dyn := x.ChunkAt(fileOf(t, l, "usr/bin/huge"), int64(len(huge)-1))
	waitFor(t, "the dynamic section", func() bool {
		c, _ := x.Chunk(fileOf(t, l, "usr/bin/huge"), dyn)
		for _, ev := range e.reg.log(false) {
			for _, r := range ev.ranges {
				if c.Offset >= r.Offset && c.Offset < r.End() {
					return true
				}
			}
		}
		return false
	})
	time.Sleep(100 * time.Millisecond) // anything more would come now
	// The chunks of its header, program headers and string table (the first) and of its
	// dynamic section (the last); nothing around them.
	if _, n := fileEvents("usr/bin/huge"); n > 2*64<<10 {
		t.Errorf("%d bytes of a file of %d fetched: more than its header and dynamic section", n, len(huge))
	}
}

// TestPredictHoldsBackground: a prediction's fetches are a container starting: the background
// fetch of the rest of the layer waits for the quiet period after the last of them, as it
// does after a demand fetch, however long the prediction takes; and it does not fetch again
// what the prediction fetched after its plan was made.
func TestPredictHoldsBackground(t *testing.T) {
	big := testelf.File(42, testelf.Spec{Pad: 2*wholeBatch + wholeBatch/2})
	es := []testlayer.Entry{regEntry("usr/bin/big", big)}
	for i := range 8 {
		es = append(es, regEntry(fmt.Sprintf("usr/share/data%d", i), bytes.Repeat([]byte{byte(i)}, 64<<10)))
	}
	fx := predictLayer(t, "held", es)
	e := newProfEnv(t)
	e.reg.push(profRepo+":v1", fx)
	e.reg.mu.Lock()
	e.reg.delay = 150 * time.Millisecond // the prediction's fetches take longer than the quiet period
	e.reg.mu.Unlock()
	const quiet = 250 * time.Millisecond // a stall this long between the lookup and the exec would start the background first
	m, _ := e.start(withPrefetchQuiet(quiet))
	l := lookupOK(t, m, profRepo+":v1", profKey(fx))
	l.Executing(fileOf(t, l, "usr/bin/big"))
	x := l.Index()
	bigChunks := map[int64]bool{}
	for _, c := range x.Chunks(fileOf(t, l, "usr/bin/big")) {
		bigChunks[c.Offset] = true
	}
	waitFor(t, "the background fetch", func() bool { return l.Status().State == protocol.StateComplete })
	var lastPredict time.Time
	var background []fetchEvent
	times := map[int64]int{}
	for _, ev := range e.reg.log(false) {
		predicted := false
		for _, r := range ev.ranges {
			predicted = predicted || bigChunks[r.Offset]
			times[r.Offset]++
		}
		if predicted && ev.end.After(lastPredict) {
			lastPredict = ev.end
		} else if !predicted {
			background = append(background, ev)
		}
	}
	for off := range bigChunks {
		if times[off] != 1 {
			t.Errorf("the chunk at %d of the predicted file fetched %d times: the background fetch fetched again what the prediction had", off, times[off])
			break
		}
	}
	if len(background) == 0 {
		t.Fatal("test premise: no background fetch logged")
	}
	for _, ev := range background {
		if ev.start.Before(lastPredict.Add(quiet * 3 / 4)) {
			t.Errorf("a background fetch started %v after the prediction's last fetch ended, within the quiet period of %v",
				ev.start.Sub(lastPredict), quiet)
		}
	}
}
