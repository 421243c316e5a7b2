package runtimestore

import (
	"bufio"

	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.podman.io/storage/pkg/lockfile"
)

// fixture is a runtime's graphroot and a store (a plain directory here: what is recorded
// depends only on paths and on the info files).
type fixture struct {
	t               *testing.T
	graphroot, root string
	store           string
	links           map[string]string // layer id -> its overlay/l link
	warnings        []string
}

// existing is layers.json as a newer c/storage might have left it: a field this package does
// not know, an order of its own, an escaped character.
const existing = `[{"id":"` + baseID + `","names":["x\u003cy"],"created":"2026-01-02T03:04:05.123456789Z","compressed-diff-digest":"sha256:` + hex1 + `","diff-size":42,"future-field":{"nested":[1,2,3]},"uidset":[0]}]`

const (
	baseID = "1111111111111111111111111111111111111111111111111111111111111111"
	midID  = "2222222222222222222222222222222222222222222222222222222222222222"
	topID  = "3333333333333333333333333333333333333333333333333333333333333333"
	hex1   = "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
	hex2   = "bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb"
	hex3   = "cccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccc"
)

func newFixture(t *testing.T) *fixture {
	t.Helper()
	dir := t.TempDir()
	f := &fixture{t: t, graphroot: filepath.Join(dir, "graph"), store: filepath.Join(dir, "store"), links: map[string]string{}}
	for _, d := range []string{"overlay-layers", "overlay/l", "overlay-images"} {
		if err := os.MkdirAll(filepath.Join(f.graphroot, d), 0o700); err != nil {
			t.Fatal(err)
		}
	}
	f.write("overlay-layers/layers.json", existing)
	f.layerDir(baseID, "", "") // a layer the runtime pulled itself, recorded
	return f
}

func (f *fixture) write(rel, content string) {
	f.t.Helper()
	p := filepath.Join(f.graphroot, rel)
	if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
		f.t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
		f.t.Fatal(err)
	}
}

func (f *fixture) read(rel string) string {
	f.t.Helper()
	b, err := os.ReadFile(filepath.Join(f.graphroot, rel))
	if err != nil {
		f.t.Fatal(err)
	}
	return string(b)
}

// layerDir makes overlay/<id> as the overlay driver does: link, l/<link>, lower (the parent's
// link, then the parent's lower), and for a layer from a store, additionallayer.
func (f *fixture) layerDir(id, parent, mark string) {
	f.t.Helper()
	link := strings.ToUpper(id[:26])
	f.links[id] = link
	f.write("overlay/"+id+"/link", link)
	if err := os.Symlink("../"+id+"/diff", filepath.Join(f.graphroot, "overlay/l", link)); err != nil {
		f.t.Fatal(err)
	}
	if parent != "" {
		lower := "l/" + f.links[parent]
		if pl, err := os.ReadFile(filepath.Join(f.graphroot, "overlay", parent, "lower")); err == nil {
			lower += ":" + string(pl)
		}
		f.write("overlay/"+id+"/lower", lower)
	}
	if mark != "" {
		f.write("overlay/"+id+"/additionallayer", mark)
	}
}

// storeLayer makes a layer directory of the store with an info as the daemon serves it, and
// returns its path.
func (f *fixture) storeLayer(ref string, key string, info string) string {
	f.t.Helper()
	p := filepath.Join(f.store, base64.StdEncoding.EncodeToString([]byte(ref)), key)
	if err := os.MkdirAll(p, 0o755); err != nil {
		f.t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(p, "info"), []byte(info), 0o644); err != nil {
		f.t.Fatal(err)
	}
	return p
}

func (f *fixture) record() ([]string, error) {
	ids, _, err := record(context.Background(), f.graphroot, f.store, f.opts(5*time.Second))
	return ids, err
}

func (f *fixture) opts(lockWait time.Duration) recordOpts {
	return recordOpts{lockWait: lockWait, warn: func(msg string, args ...any) {
		f.warnings = append(f.warnings, fmt.Sprint(append([]any{msg}, args...)...))
	}}
}

func info(toc string) string {
	return `{"toc-digest":"sha256:` + toc + `","flags":{"expected-layer-diffid":"sha256:` + hex1 + `"},"compressed-size":1234,"diff-size":-1,"compression":2}`
}

// A layer chain taken from the store, the first on a layer the runtime recorded itself: both
// appended after the existing bytes, parents first, with the entries a fixed c/storage writes;
// a second pass changes nothing.
func TestRecordAppends(t *testing.T) {
	f := newFixture(t)
	mid := f.storeLayer("reg/img:1", "sha256:"+hex2, info(hex2))
	top := f.storeLayer("reg/img:1", "sha256:"+hex3, info(hex3))
	f.layerDir(midID, baseID, mid)
	f.layerDir(topID, midID, top)
	ids, err := f.record()
	if err != nil {
		t.Fatal(err)
	}
	if strings.Join(ids, ",") != midID+","+topID {
		t.Fatalf("recorded %v, want mid then top", ids)
	}
	got := f.read("overlay-layers/layers.json")
	prefix := strings.TrimSuffix(existing, "]")
	if !strings.HasPrefix(got, prefix+",") {
		t.Fatalf("the existing bytes changed:\n%s", got)
	}
	var layers []map[string]any
	if err := json.Unmarshal([]byte(got), &layers); err != nil {
		t.Fatal(err)
	}
	if len(layers) != 3 {
		t.Fatalf("%d entries", len(layers))
	}
	fi, _ := os.Stat(filepath.Join(f.graphroot, "overlay", topID, "additionallayer"))
	wantTop := fmt.Sprintf(`{"id":"%s","parent":"%s","created":"%s","compressed-size":1234,"toc-digest":"sha256:%s","diff-size":-1,"compression":2,"flags":{"expected-layer-diffid":"sha256:%s"}}`,
		topID, midID, fi.ModTime().UTC().Format(time.RFC3339Nano), hex3, hex1)
	if !strings.HasSuffix(got, ","+wantTop+"]") {
		t.Errorf("the top layer's entry:\n got %s\nwant %s", got, wantTop)
	}
	if layers[1]["parent"] != baseID {
		t.Errorf("mid's parent %v", layers[1]["parent"])
	}
	if ids, err := f.record(); err != nil || len(ids) > 0 {
		t.Errorf("second pass: %v %v", ids, err)
	}
	if f.read("overlay-layers/layers.json") != got {
		t.Error("the second pass changed layers.json")
	}
	if len(f.warnings) > 0 {
		t.Errorf("warnings: %q", f.warnings)
	}
}

// A layer whose tar size the store does not know yet is held back while hold says so, then
// recorded with its size once the store gives it; a layer with its size is never held.
func TestRecordHoldsForSize(t *testing.T) {
	f := newFixture(t)
	sized := f.storeLayer("r", "sha256:"+hex2, strings.Replace(info(hex2), `"diff-size":-1`, `"diff-size":4096`, 1))
	unsized := f.storeLayer("r", "sha256:"+hex3, info(hex3))
	f.layerDir(midID, baseID, sized)
	f.layerDir(topID, baseID, unsized)
	opts := f.opts(time.Second)
	var asked []string
	opts.hold = func(_, id string) bool { asked = append(asked, id); return true }
	ids, held, err := record(context.Background(), f.graphroot, f.store, opts)
	if err != nil || held != 1 || len(ids) != 1 || ids[0] != midID || len(asked) != 1 || asked[0] != topID {
		t.Fatalf("first pass: added %v, held %d, asked %v, %v", ids, held, asked, err)
	}
	if err := os.WriteFile(filepath.Join(unsized, "info"), []byte(strings.Replace(info(hex3), `"diff-size":-1`, `"diff-size":8192`, 1)), 0o644); err != nil {
		t.Fatal(err)
	}
	if ids, held, err = record(context.Background(), f.graphroot, f.store, opts); err != nil || held != 0 || len(ids) != 1 {
		t.Fatalf("once the size is known: added %v, held %d, %v", ids, held, err)
	}
	if got := f.read("overlay-layers/layers.json"); !strings.Contains(got, `"diff-size":8192`) || !strings.Contains(got, `"diff-size":4096`) {
		t.Errorf("the sizes: %s", got)
	}
}

// The Recorder holds a layer without a size for SizeWait after the first pass that met it,
// then records it without.
func TestRecorderSizeWait(t *testing.T) {
	r := New(Config{SizeWait: 50 * time.Millisecond})
	if !r.holdForSize("/g", "a") || !r.holdForSize("/g", "a") {
		t.Fatal("not held at first")
	}
	time.Sleep(60 * time.Millisecond)
	if r.holdForSize("/g", "a") {
		t.Error("held past SizeWait")
	}
}

// Where the runtime records the layer itself (podman 4, a fixed c/storage), nothing is
// written: not the file, not the lock's last writer.
func TestRecordNothingWhenRecorded(t *testing.T) {
	f := newFixture(t)
	f.layerDir(midID, baseID, f.storeLayer("r", "sha256:"+hex2, info(hex2)))
	f.write("overlay-layers/layers.json", strings.TrimSuffix(existing, "]")+`,{"id":"`+midID+`","parent":"`+baseID+`"}]`)
	before := f.read("overlay-layers/layers.json")
	lockBefore := lastWriter(t, f)
	fi0, _ := os.Stat(filepath.Join(f.graphroot, "overlay-layers/layers.json"))
	if ids, err := f.record(); err != nil || len(ids) > 0 {
		t.Fatalf("%v %v", ids, err)
	}
	fi1, _ := os.Stat(filepath.Join(f.graphroot, "overlay-layers/layers.json"))
	if f.read("overlay-layers/layers.json") != before || !fi0.ModTime().Equal(fi1.ModTime()) {
		t.Error("layers.json was written")
	}
	if lastWriter(t, f) != lockBefore {
		t.Error("the lock's last writer changed")
	}
}

// lastWriter is the last-writer record in the graphroot's layers.lock.
func lastWriter(t *testing.T, f *fixture) string {
	b, err := os.ReadFile(filepath.Join(f.graphroot, "overlay-layers/layers.lock"))
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	return string(b)
}

// Hostile and odd inputs: nothing written for them, a clear warning where it is a layer of
// the store's, and the well-formed layer beside them still recorded.
func TestRecordRefusesOddInput(t *testing.T) {
	f := newFixture(t)
	good := f.storeLayer("r", "sha256:"+hex2, info(hex2))
	f.layerDir(midID, baseID, good)
	odd := map[string]func(id string){
		"malformed lower": func(id string) {
			f.layerDir(id, "", good)
			f.write("overlay/"+id+"/lower", "../../etc/passwd")
		},
		"malformed lower-layers": func(id string) {
			f.layerDir(id, baseID, good)
			f.write("overlay/"+id+"/lower-layers", "../../etc:"+baseID)
		},
		"lower link to no layer": func(id string) {
			f.layerDir(id, "", good)
			f.write("overlay/"+id+"/lower", "l/EVIL")
			_ = os.Symlink("../../../etc", filepath.Join(f.graphroot, "overlay/l/EVIL"))
		},
		"another store": func(id string) {
			other := filepath.Join(filepath.Dir(f.store), "other", "cmVm", "sha256:"+hex2)
			f.layerDir(id, baseID, other)
		},
		"escaping the store": func(id string) {
			f.layerDir(id, baseID, f.store+"/../other/cmVm/sha256:"+hex2)
		},
		"no layer directory of the store": func(id string) {
			f.layerDir(id, baseID, f.store+"/cmVm")
		},
		"info that does not parse": func(id string) {
			f.layerDir(id, baseID, f.storeLayer("bad", "sha256:"+hex3, `{"toc-digest": 5`))
		},
		"info with a bad digest": func(id string) {
			f.layerDir(id, baseID, f.storeLayer("bad2", "sha256:"+hex3, `{"toc-digest":"sha256:xyz"}`))
		},
		"info too large": func(id string) {
			f.layerDir(id, baseID, f.storeLayer("big", "sha256:"+hex3, `{"flags":{"a":"`+strings.Repeat("x", maxInfoSize)+`"}}`))
		},
		"parent not recorded": func(id string) {
			unrecorded := "4444444444444444444444444444444444444444444444444444444444444444"
			f.layerDir(unrecorded, "", "")
			f.layerDir(id, unrecorded, good)
		},
	}
	n := 5
	var oddIDs []string
	for _, make := range odd {
		id := strings.Repeat(fmt.Sprintf("%x", n), 64)
		n++
		make(id)
		oddIDs = append(oddIDs, id)
	}
	f.write("overlay/not-an-id/additionallayer", good)
	ids, err := f.record()
	if err != nil {
		t.Fatal(err)
	}
	if len(ids) != 1 || ids[0] != midID {
		t.Errorf("recorded %v, want only the well-formed %s", ids, midID)
	}
	got := f.read("overlay-layers/layers.json")
	for _, id := range oddIDs {
		if strings.Contains(got, `"id":"`+id) {
			t.Errorf("recorded an odd layer %s", id)
		}
	}
	t.Logf("warnings:\n%s", strings.Join(f.warnings, "\n"))
	for _, want := range []string{"malformed lower", "malformed lower-layers", "not to a layer", "does not parse", "invalid checksum digest", "larger than", "no layer directory"} {
		if !strings.Contains(strings.Join(f.warnings, "\n"), want) {
			t.Errorf("no warning says %q", want)
		}
	}
}

// A layers.json that does not parse, or is not an array, is left alone; a missing graphroot
// or one no runtime used is no error and gets nothing; an empty or null file gets an array.
func TestRecordFiles(t *testing.T) {
	for _, bad := range []string{`[{"id":`, `{"id":"x"}`, `[]]`} {
		f := newFixture(t)
		f.layerDir(midID, baseID, f.storeLayer("r", "sha256:"+hex2, info(hex2)))
		f.write("overlay-layers/layers.json", bad)
		if _, err := f.record(); err == nil {
			t.Errorf("%q: no error", bad)
		}
		if got := f.read("overlay-layers/layers.json"); got != bad {
			t.Errorf("%q was changed to %q", bad, got)
		}
	}
	for _, empty := range []string{"", "null", "[]", " [ ] \n"} {
		f := newFixture(t)
		f.layerDir(midID, "", f.storeLayer("r", "sha256:"+hex2, info(hex2)))
		f.write("overlay-layers/layers.json", empty)
		if ids, err := f.record(); err != nil || len(ids) != 1 {
			t.Fatalf("%q: %v %v", empty, ids, err)
		}
		var layers []map[string]any
		if err := json.Unmarshal([]byte(f.read("overlay-layers/layers.json")), &layers); err != nil || len(layers) != 1 {
			t.Errorf("%q: %v %v", empty, layers, err)
		}
	}
	dir := t.TempDir()
	for _, root := range []string{filepath.Join(dir, "missing"), dir} {
		ids, _, err := record(context.Background(), root, "/store", recordOpts{lockWait: time.Second})
		if err != nil || len(ids) > 0 {
			t.Errorf("%s: %v %v", root, ids, err)
		}
		if _, err := os.Stat(filepath.Join(root, "overlay-layers")); err == nil {
			t.Errorf("%s: overlay-layers created", root)
		}
	}
}

// A graphroot another user may write, or that is not the daemon's, is refused: its layer
// directories would make the daemon look layers up and write entries on that user's word.
func TestRecordRefusesOthersStorage(t *testing.T) {
	f := newFixture(t)
	f.layerDir(midID, baseID, f.storeLayer("r", "sha256:"+hex2, info(hex2)))
	for _, d := range []string{f.graphroot, filepath.Join(f.graphroot, "overlay"), filepath.Join(f.graphroot, "overlay-layers")} {
		if err := os.Chmod(d, 0o777); err != nil {
			t.Fatal(err)
		}
		if _, err := f.record(); err == nil || !strings.Contains(err.Error(), "other users") {
			t.Errorf("%s writable by others: %v", d, err)
		}
		if err := os.Chmod(d, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	if os.Geteuid() == 0 {
		if err := os.Chown(filepath.Join(f.graphroot, "overlay"), 1000, 1000); err != nil {
			t.Fatal(err)
		}
		if _, err := f.record(); err == nil || !strings.Contains(err.Error(), "uid 1000") {
			t.Errorf("another user's overlay: %v", err)
		}
		if err := os.Chown(filepath.Join(f.graphroot, "overlay"), 0, 0); err != nil {
			t.Fatal(err)
		}
	}
	if f.read("overlay-layers/layers.json") != existing {
		t.Error("written")
	}
	if ids, err := f.record(); err != nil || len(ids) != 1 {
		t.Errorf("the daemon's own storage: %v %v", ids, err)
	}
}

// The runtime's lock is respected: while another process holds it, nothing is written and
// the pass gives up after its bound; once released, the entry is added and the lock's last
// writer changed, so that running runtimes reload.
func TestRecordTakesTheRuntimesLock(t *testing.T) {
	f := newFixture(t)
	f.layerDir(midID, baseID, f.storeLayer("r", "sha256:"+hex2, info(hex2)))
	before := lastWriter(t, f)
	holder := helper(t, "hold", filepath.Join(f.graphroot, "overlay-layers/layers.lock"))
	stdin, _ := holder.StdinPipe()
	stdout, _ := holder.StdoutPipe()
	if err := holder.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = holder.Process.Kill(); _ = holder.Wait() }()
	if line, _ := bufio.NewReader(stdout).ReadString('\n'); line != "locked\n" {
		t.Fatalf("holder: %q", line)
	}
	start := time.Now()
	_, _, err := record(context.Background(), f.graphroot, f.store, f.opts(300*time.Millisecond))
	if err == nil || !strings.Contains(err.Error(), "held by a runtime") {
		t.Errorf("with the lock held: %v", err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("gave up after %v", d)
	}
	if f.read("overlay-layers/layers.json") != existing {
		t.Error("written while the runtime held the lock")
	}
	stdin.Close() // the holder unlocks and exits
	if err := holder.Wait(); err != nil {
		t.Fatal(err)
	}
	if ids, err := f.record(); err != nil || len(ids) != 1 {
		t.Fatalf("after the release: %v %v", ids, err)
	}
	if lastWriter(t, f) == before {
		t.Error("the lock's last writer was not changed")
	}
}

// A kill -9 at every step of a write leaves layers.json as it was or complete, never
// partial, and the next pass completes the work and removes what the killed one left.
func TestRecordKilledAtEachStep(t *testing.T) {
	for _, step := range []string{"locked", "recorded-write", "temp-created", "temp-written", "temp-synced", "renamed"} {
		t.Run(step, func(t *testing.T) {
			f := newFixture(t)
			f.layerDir(midID, baseID, f.storeLayer("r", "sha256:"+hex2, info(hex2)))
			cmd := helper(t, "kill", f.graphroot, f.store, step)
			err := cmd.Run()
			var ee *exec.ExitError
			if !errorsAs(err, &ee) || ee.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
				t.Fatalf("the helper was not killed: %v", err)
			}
			got := f.read("overlay-layers/layers.json")
			var layers []map[string]any
			if err := json.Unmarshal([]byte(got), &layers); err != nil {
				t.Fatalf("layers.json after the kill: %v\n%s", err, got)
			}
			if !strings.HasPrefix(got, strings.TrimSuffix(existing, "]")) {
				t.Fatalf("the existing entries changed:\n%s", got)
			}
			if ids, err := f.record(); err != nil {
				t.Fatal(err)
			} else if (step == "renamed") != (len(ids) == 0) {
				t.Errorf("the next pass added %v", ids)
			}
			if n := strings.Count(f.read("overlay-layers/layers.json"), midID); n != 1 {
				t.Errorf("the layer is named %d times", n)
			}
			if tmp, _ := filepath.Glob(filepath.Join(f.graphroot, "overlay-layers", tmpPrefix+"*")); len(tmp) > 0 {
				t.Errorf("temporary files left: %v", tmp)
			}
		})
	}
}

func errorsAs(err error, target **exec.ExitError) bool {
	e, ok := err.(*exec.ExitError)
	*target = e
	return ok
}

// helper runs this test binary as a helper process (TestHelperProcess) doing what.
func helper(t *testing.T, what string, args ...string) *exec.Cmd {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestHelperProcess$", "--")
	cmd.Env = append(os.Environ(), "RUNTIMESTORE_HELPER="+what, "RUNTIMESTORE_ARGS="+strings.Join(args, "\x1f"))
	cmd.Stderr = os.Stderr
	return cmd
}

// TestHelperProcess is not a test: it is the helper of the tests above, and of
// e2e.TestRecordKilledAtEachStep, which runs it on a runtime's real storage (RUNTIMESTORE_HELPER
// "record" or "kill", RUNTIMESTORE_ARGS the graphroot, the store and the step, separated by
// \x1f).
func TestHelperProcess(t *testing.T) {
	what := os.Getenv("RUNTIMESTORE_HELPER")
	if what == "" {
		t.Skip("a helper process of other tests")
	}
	args := strings.Split(os.Getenv("RUNTIMESTORE_ARGS"), "\x1f")
	switch what {
	case "hold": // holds the lock until stdin closes, as a runtime would
		l, err := lockfile.GetLockFile(args[0])
		if err != nil {
			t.Fatal(err)
		}
		l.Lock()
		fmt.Println("locked")
		_, _ = bufio.NewReader(os.Stdin).ReadString('\n')
		l.Unlock()
		os.Exit(0)
	case "record": // one pass, as the daemon's next start makes
		ids, _, err := record(context.Background(), args[0], args[1], recordOpts{lockWait: 5 * time.Second, warn: func(string, ...any) {}})
		fmt.Println(strings.Join(ids, " "))
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		os.Exit(0)
	case "kill": // records, killing itself at the step named
		hook = func(step string) {
			if step == args[2] {
				_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
				time.Sleep(time.Minute)
			}
		}
		_, _, err := record(context.Background(), args[0], args[1], recordOpts{lockWait: 5 * time.Second, warn: func(string, ...any) {}})
		fmt.Fprintln(os.Stderr, "not killed:", err)
		os.Exit(3)
	}
}

// A layer not ready at a pass (here its lower file names a link a concurrent runtime has not
// made yet) is looked at again a second later, without another poke or the minute's pass.
func TestRecorderRetriesWhatWasNotReady(t *testing.T) {
	f := newFixture(t)
	f.layerDir(midID, baseID, f.storeLayer("r", "sha256:"+hex2, strings.Replace(info(hex2), `"diff-size":-1`, `"diff-size":1`, 1)))
	link := filepath.Join(f.graphroot, "overlay/l", f.links[baseID])
	if err := os.Rename(link, link+".away"); err != nil {
		t.Fatal(err)
	}
	r := New(Config{Store: f.store, Graphroots: []string{f.graphroot}, Interval: time.Hour, Settle: time.Millisecond})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { r.Run(ctx); close(done) }()
	defer func() { cancel(); <-done }()
	r.Poke()
	time.Sleep(300 * time.Millisecond)
	if strings.Contains(f.read("overlay-layers/layers.json"), midID) {
		t.Fatal("recorded with its parent's link missing")
	}
	if err := os.Rename(link+".away", link); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(10 * time.Second); !strings.Contains(f.read("overlay-layers/layers.json"), midID); time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("not recorded once ready, 10 s later")
		}
	}
	// The count follows the write: wait for it as for the file.
	st := r.Stats()
	for deadline := time.Now().Add(10 * time.Second); st.Recorded < 1 && time.Now().Before(deadline); st = r.Stats() {
		time.Sleep(10 * time.Millisecond)
	}
	if st.Recorded != 1 {
		t.Errorf("stats: %+v", st)
	}
}

// A layer whose parent was made again under a new link (a runtime that lost the parent from
// its memory in a concurrent pull removes its directory, link included, and makes it anew)
// names the old link in its lower file and the parent by its id in lower-layers, which the
// overlay driver reads first: it is recorded on that parent, as the driver mounts it.
func TestRecordParentMadeAgain(t *testing.T) {
	f := newFixture(t)
	f.layerDir(midID, baseID, f.storeLayer("r", "sha256:"+hex2, info(hex2)))
	f.write("overlay/"+midID+"/lower-layers", baseID)
	old := filepath.Join(f.graphroot, "overlay/l", f.links[baseID])
	if err := os.Remove(old); err != nil {
		t.Fatal(err)
	}
	f.write("overlay/"+baseID+"/link", "NEWLINKNEWLINKNEWLINKNEWLI")
	if err := os.Symlink("../"+baseID+"/diff", filepath.Join(f.graphroot, "overlay/l/NEWLINKNEWLINKNEWLINKNEWLI")); err != nil {
		t.Fatal(err)
	}
	ids, err := f.record()
	if err != nil {
		t.Fatal(err)
	}
	if len(ids) != 1 || ids[0] != midID {
		t.Fatalf("recorded %v, want %s; warnings: %v", ids, midID, f.warnings)
	}
	if got := f.read("overlay-layers/layers.json"); !strings.Contains(got, `"id":"`+midID+`","parent":"`+baseID+`"`) {
		t.Errorf("not recorded on its parent: %s", got)
	}
}
