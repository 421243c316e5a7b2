package layer

import (
	"slices"
	"testing"
	"time"

	"github.com/layerstore/layerstore/fetcher"
	"github.com/layerstore/layerstore/internal/testutil/testelf"
	"github.com/layerstore/layerstore/internal/testutil/testlayer"
	"github.com/layerstore/layerstore/layer/profile"
)

func exeEntry(name string, data []byte) testlayer.Entry {
	h := tarFile(name, int64(len(data)))
	h.Mode = 0o755
	return testlayer.Entry{Header: h, Data: data}
}

// TestPredictImageProgram: the program the image's config names is predicted when the
// runtime looks up its layer, before anything executes it: found through the config's PATH
// (a relative entry and a missing directory skipped), a script's interpreter named on its
// first line, the interpreter's loader and libraries, and glibc's ld.so.cache, all fetched
// without a read. The program is the merged tree's: a lower layer's file of the same path is
// not fetched. Nothing is fetched of a layer the runtime has not looked up (it may hold that
// layer itself): the prediction waits for that layer's lookup. The image's /etc/passwd and
// /etc/group, which the runtime reads to set the container's user, are fetched with the
// program, and for an image whose program is nowhere (alone, once every layer is live).
// Nothing is fetched with read-ahead off, nor when the repository has a startup profile (its
// replay knows the start).
func TestPredictImageProgram(t *testing.T) {
	const lib = "usr/lib/x86_64-linux-gnu/"
	base := []testlayer.Entry{
		regEntry("etc/ld.so.cache", make([]byte, 3000)),
		regEntry("etc/passwd", []byte("root:x:0:0:root:/root:/bin/sh\n")),
		regEntry("etc/group", []byte("root:x:0:\n")),
		regEntry(lib+"libc.so.6", testelf.File(11, testelf.Spec{Pad: 150 << 10})),
		regEntry(lib+"ld-linux-x86-64.so.2", testelf.File(13, testelf.Spec{Static: true, Pad: 10 << 10})),
		regEntry(lib+"libunused.so.1", testelf.File(14, testelf.Spec{Pad: 10 << 10})),
		exeEntry("usr/bin/tool", testelf.File(15, testelf.Spec{Pad: 20 << 10})), // shadowed by app's
		linkEntry("lib64/ld-linux-x86-64.so.2", "/"+lib+"ld-linux-x86-64.so.2"),
	}
	app := []testlayer.Entry{
		exeEntry("usr/bin/interp", testelf.File(21, testelf.Spec{Interp: "/lib64/ld-linux-x86-64.so.2", Needed: []string{"libc.so.6"}, Pad: 100 << 10})),
		exeEntry("usr/bin/tool", testelf.File(22, testelf.Spec{Pad: 20 << 10})),
		exeEntry("usr/local/bin/entry.sh", []byte("#! /usr/bin/interp -e\nexec tool\n")),
		regEntry("usr/local/bin/notexe", testelf.File(23, testelf.Spec{Pad: 10 << 10})),
	}
	bf, af := predictLayer(t, "base", base), predictLayer(t, "app", app)
	users := []string{"etc/group", "etc/passwd"}
	script := []string{"etc/group", "etc/ld.so.cache", "etc/passwd", lib + "ld-linux-x86-64.so.2", lib + "libc.so.6"}

	for _, c := range []struct {
		name      string
		start     fetcher.Start
		readAhead int64
		base, app []string // the files fetched
		profiled  bool     // the repository has a startup profile
	}{
		{"script", fetcher.Start{Program: "entry.sh", Path: "bin:/nowhere:/usr/local/bin"}, defaultReadAhead,
			script, []string{"usr/bin/interp", "usr/local/bin/entry.sh"}, false},
		{"shadowed", fetcher.Start{Program: "tool"}, defaultReadAhead, users, []string{"usr/bin/tool"}, false},
		{"path", fetcher.Start{Program: "/usr/local/bin/entry.sh"}, defaultReadAhead,
			script, []string{"usr/bin/interp", "usr/local/bin/entry.sh"}, false},
		{"not executable", fetcher.Start{Program: "notexe", Path: "/usr/local/bin"}, defaultReadAhead, users, nil, false},
		{"relative", fetcher.Start{Program: "bin/tool"}, defaultReadAhead, users, nil, false},
		{"nowhere", fetcher.Start{Program: "missing"}, defaultReadAhead, users, nil, false},
		{"read-ahead off", fetcher.Start{Program: "entry.sh", Path: "/usr/local/bin"}, 0, nil, nil, false},
		{"profiled", fetcher.Start{Program: "entry.sh", Path: "/usr/local/bin"}, defaultReadAhead, nil, nil, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			e := newProfEnv(t)
			ref := profRepo + ":v1"
			e.reg.push(ref, bf, af)
			e.reg.starts[ref] = c.start
			m, _ := e.start(withPrefetch(false), withReadAhead(c.readAhead))
			if c.profiled {
				pl := profile.LayerReads{Layer: af.Desc.Digest, Recorded: time.Now().UTC(), Files: []string{"usr/bin/tool"}}
				if err := m.profiles.Add(profRepo, pl); err != nil {
					t.Fatal(err)
				}
			}
			lb := lookupOK(t, m, ref, profKey(bf))
			// The lower layer alone looked up, again once the program's layer is live
			// (resolved ahead): that layer may be the runtime's own.
			waitFor(t, "the upper layer resolved ahead", func() bool {
				return len(m.live.all()) == 2
			})
			lookupOK(t, m, ref, profKey(bf))
			time.Sleep(100 * time.Millisecond)
			// An image whose program is nowhere has its user database fetched now; nothing
			// else is, before the program's layer is looked up.
			if got := slices.DeleteFunc(fetchedFiles(lb, e.reg.log(false)), func(p string) bool {
				return len(c.app) == 0 && slices.Contains(users, p)
			}); len(got) != 0 {
				t.Fatalf("fetched %q before the program's layer was looked up", got)
			}
			la := lookupOK(t, m, ref, profKey(af))
			if len(c.app) > 0 || len(c.base) > 0 {
				waitFor(t, "the program's files", func() bool {
					log := e.reg.log(false)
					return slices.Equal(fetchedFiles(la, log), c.app) && slices.Equal(fetchedFiles(lb, log), c.base)
				})
			}
			time.Sleep(100 * time.Millisecond) // anything more would come now
			log := e.reg.log(false)
			if got := fetchedFiles(lb, log); !slices.Equal(got, c.base) {
				t.Errorf("fetched of the lower layer: %q, want %q", got, c.base)
			}
			if got := fetchedFiles(la, log); !slices.Equal(got, c.app) {
				t.Errorf("fetched of the upper layer: %q, want %q", got, c.app)
			}
			if s := la.Status(); s.ReadChunks != 0 {
				t.Errorf("the prediction counts %d chunks read", s.ReadChunks)
			}
		})
	}
}

// TestPredictImageProgramEndsAtAnotherExec: when the runtime executes another program than
// the one the config names (a pod's own command), the prediction of the config's program
// stops: of a program of six batches, fetched two at a time from a slow registry, the
// batches not started by then are never fetched. Once the program itself has run, the
// execution of a file not named yet (its interpreter, before the prediction reached it; a
// program it runs) does not stop it.
func TestPredictImageProgramEndsAtAnotherExec(t *testing.T) {
	big := testelf.File(40, testelf.Spec{Pad: 6 * wholeBatch})
	other := testelf.File(41, testelf.Spec{Pad: 10 << 10})
	for _, c := range []struct {
		name  string
		execs []string
		whole bool
	}{
		{"another program", []string{"usr/bin/other"}, false},
		{"the program, then another", []string{"usr/bin/big", "usr/bin/other"}, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			fx := predictLayer(t, "app", []testlayer.Entry{exeEntry("usr/bin/big", big), exeEntry("usr/bin/other", other)})
			e := newProfEnv(t)
			ref := profRepo + ":v1"
			e.reg.push(ref, fx)
			e.reg.starts[ref] = fetcher.Start{Program: "big"}
			e.reg.delay = 100 * time.Millisecond
			m, _ := e.start(withPrefetch(false))
			l := lookupOK(t, m, ref, profKey(fx))
			id := fileOf(t, l, "usr/bin/big")
			chunks := l.Index().NumChunks(id)
			fetched := func() int {
				first, _ := l.Index().Chunk(id, 0)
				last, _ := l.Index().Chunk(id, chunks-1)
				n := 0
				for _, ev := range e.reg.log(false) {
					for _, r := range ev.ranges {
						if r.Offset >= first.Offset && r.End() <= last.End() {
							n++
						}
					}
				}
				return n
			}
			waitFor(t, "the prediction's first batches", func() bool { return fetched() > 0 })
			for _, p := range c.execs {
				l.Executing(fileOf(t, l, p))
			}
			if c.whole {
				waitFor(t, "the whole program", func() bool { return fetched() == chunks })
				return
			}
			time.Sleep(800 * time.Millisecond) // the six batches would have come by now
			if n := fetched(); n >= chunks {
				t.Errorf("%d of %d chunks of the config's program fetched after another program ran", n, chunks)
			} else {
				t.Logf("%d of %d chunks fetched", n, chunks)
			}
		})
	}
}

// TestUserFilesBounded: the image's user database is fetched with its program only up to
// maxUserFile per file: a larger /etc/passwd (a hostile image's) is left to the runtime's
// own reads, while /etc/group beside it comes.
func TestUserFilesBounded(t *testing.T) {
	fx := predictLayer(t, "users", []testlayer.Entry{
		regEntry("etc/passwd", make([]byte, maxUserFile+1)),
		regEntry("etc/group", []byte("root:x:0:\n")),
	})
	e := newProfEnv(t)
	ref := profRepo + ":v1"
	e.reg.push(ref, fx)
	m, _ := e.start(withPrefetch(false))
	l := lookupOK(t, m, ref, profKey(fx))
	e.reg.log(true)
	fetchUserFiles([]*Served{l})
	waitFor(t, "/etc/group", func() bool { return slices.Contains(fetchedFiles(l, e.reg.log(false)), "etc/group") })
	time.Sleep(100 * time.Millisecond) // anything more would come now
	if got := fetchedFiles(l, e.reg.log(false)); !slices.Equal(got, []string{"etc/group"}) {
		t.Errorf("fetched %q, want only etc/group", got)
	}
}
