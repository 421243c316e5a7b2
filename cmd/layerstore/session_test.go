package main

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/opencontainers/go-digest"

	"github.com/layerstore/layerstore/internal/control/protocol"
	"github.com/layerstore/layerstore/internal/fdstore"
	"github.com/layerstore/layerstore/internal/testutil/svcmanager"
	"github.com/layerstore/layerstore/internal/testutil/syncbuf"
	"github.com/layerstore/layerstore/internal/testutil/testfuse"
	"github.com/layerstore/layerstore/internal/testutil/testlayer"
)

// startManaged starts `layerstore serve` (the binary at bin) under the service manager m,
// which hands it what the previous process stored, and returns once it is ready.
func (e *serveEnv) startManaged(m *svcmanager.Manager, bin string, log *syncbuf.Buffer) *daemon {
	t := e.t
	t.Helper()
	cmd, err := m.Command([]string{bin, "serve", "--config", e.config, e.mnt}, os.Environ())
	if err != nil {
		t.Fatal(err)
	}
	d := &daemon{t: t, cmd: cmd, mnt: e.mnt, socket: e.socket, log: log, exited: make(chan error, 1)}
	cmd.Stderr = log
	err = cmd.Start()
	fdstore.CloseExtra(cmd)
	if err != nil {
		t.Fatal(err)
	}
	d.watch()
	t.Cleanup(func() {
		cmd.Process.Kill()
		testfuse.WaitExit(t, e.mnt, d.done)
		syscall.Unmount(e.mnt, syscall.MNT_DETACH) // the manager may keep its session alive
	})
	if err := m.WaitReady(30*time.Second, d.done); err != nil {
		t.Fatalf("%v:\n%s", err, log.String())
	}
	return d
}

// openHalf opens usr/bin/tool of the served layer and reads its first half.
func (e *serveEnv) openHalf() (f *os.File, head []byte, ino uint64) {
	t := e.t
	t.Helper()
	toc := digest.Digest(e.fixture.Desc.Annotations["io.github.containers.zstd-chunked.manifest-checksum"])
	path := filepath.Join(e.layerDir(toc), "diff", "usr/bin/tool")
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	fi, err := f.Stat()
	if err != nil {
		t.Fatal(err)
	}
	head = make([]byte, fi.Size()/2)
	if _, err := io.ReadFull(f, head); err != nil {
		t.Fatal(err)
	}
	return f, head, fi.Sys().(*syscall.Stat_t).Ino
}

// readRest reads the rest of f and checks the whole content against the reference layer, and
// that the file still has inode number ino.
func (e *serveEnv) readRest(f *os.File, head []byte, ino uint64) {
	t := e.t
	t.Helper()
	rest, err := io.ReadAll(f)
	if err != nil {
		t.Fatalf("reading on after the restart: %v", err)
	}
	ref, err := testlayer.ReferenceTree(testlayer.Tar())
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(append(head, rest...))
	if got, want := hex.EncodeToString(sum[:]), ref["usr/bin/tool"].Content; got != want {
		t.Errorf("usr/bin/tool read across the restart: sha256 %s, want %s", got, want)
	}
	fi, err := os.Stat(f.Name())
	if err != nil {
		t.Fatalf("stat after the restart: %v", err)
	}
	if got := fi.Sys().(*syscall.Stat_t).Ino; got != ino {
		t.Errorf("inode %d after the restart, was %d", got, ino)
	}
}

// TestSessionSurvivesRestart plays systemd (the fd store, LISTEN_FDS) for the daemon: a file
// of the store opened and half read before the daemon is killed (kill -9), stopped while busy
// (SIGTERM), upgraded (another binary started with the session) or re-executed in place
// (SIGUSR2) reads on with the right bytes through the next daemon, which resumed the session:
// same mount, same inode.
func TestSessionSurvivesRestart(t *testing.T) {
	e := newServeEnv(t)
	next := filepath.Join(t.TempDir(), "layerstore-next")
	if out, err := exec.Command("go", "build", "-ldflags", "-X main.version=next", "-o", next, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	for _, tc := range []string{"kill", "stop", "upgrade", "reexec"} {
		t.Run(tc, func(t *testing.T) {
			e.t = t
			m := svcmanager.New(t, t.TempDir())
			log := &syncbuf.Buffer{}
			t.Cleanup(func() {
				if t.Failed() {
					t.Logf("daemon log:\n%s", log.String())
				}
			})
			d := e.startManaged(m, e.bin, log)
			if names := m.Names(); !slices.Equal(names, []string{fdFUSE, fdState}) {
				t.Fatalf("stored %q, want the FUSE session", names)
			}
			f, head, ino := e.openHalf()
			switch tc {
			case "kill":
				d.kill()
			case "stop", "upgrade":
				d.cmd.Process.Signal(syscall.SIGTERM)
				select {
				case err := <-d.exited:
					if err != nil {
						t.Fatalf("SIGTERM: %v", err)
					}
				case <-time.After(30 * time.Second):
					t.Fatal("the daemon did not exit 30s after SIGTERM")
				}
				if !strings.Contains(log.String(), "leaving the store's FUSE session") {
					t.Errorf("the store stopped without leaving its session")
				}
			case "reexec":
				d.cmd.Process.Signal(syscall.SIGUSR2)
				if err := m.WaitReady(30*time.Second, nil); err != nil {
					t.Fatalf("after SIGUSR2: %v", err)
				}
			}
			switch tc {
			case "kill", "stop":
				e.startManaged(m, e.bin, log)
			case "upgrade":
				e.startManaged(m, next, log)
			}
			e.readRest(f, head, ino)
			if tc == "upgrade" && !strings.Contains(log.String(), "version=next") {
				t.Errorf("the upgraded binary did not start")
			}
			if !strings.Contains(log.String(), "resumed the FUSE session") {
				t.Errorf("no resumed session in the log")
			}
			if st := e.status(); st.Session == nil || !st.Session.Kept || !st.Session.Resumed {
				t.Errorf("status of the session: %+v", st.Session)
			}
			f.Close()
		})
	}
}

// TestKeepRestartsCrashedDaemon: `layerstore keep` restarts a daemon killed with kill -9 with
// its FUSE session, and a file opened before the kill reads on; SIGTERM to keep stops the
// daemon and ends keep.
func TestKeepRestartsCrashedDaemon(t *testing.T) {
	e := newServeEnv(t)
	var log syncbuf.Buffer
	keep := exec.Command(e.bin, "keep", "--", e.bin, "serve", "--config", e.config, e.mnt)
	keep.Stderr = &log
	if err := keep.Start(); err != nil {
		t.Fatal(err)
	}
	exited, done := make(chan error, 1), make(chan struct{})
	go func() {
		exited <- keep.Wait()
		close(done)
	}()
	t.Cleanup(func() {
		select {
		case <-done:
		default:
			// keep's daemon goes with it: killed with keep, it would serve on.
			for _, pid := range childrenOf(keep.Process.Pid) {
				syscall.Kill(pid, syscall.SIGKILL)
			}
			keep.Process.Kill()
			testfuse.WaitExit(t, e.mnt, done)
		}
		syscall.Unmount(e.mnt, syscall.MNT_DETACH)
		if t.Failed() {
			t.Logf("keep's log:\n%s", log.String())
		}
	})
	child := func() int {
		t.Helper()
		for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(20 * time.Millisecond) {
			if pids := childrenOf(keep.Process.Pid); len(pids) == 1 && strings.Contains(log.String(), "serving") {
				return pids[0]
			}
			if time.Now().After(deadline) {
				t.Fatalf("no daemon under keep:\n%s", log.String())
			}
		}
	}
	first := child()
	f, head, ino := e.openHalf()
	if err := syscall.Kill(first, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	e.readRest(f, head, ino)
	if second := child(); second == first {
		t.Errorf("the same daemon after the kill")
	}
	// The next daemon answers the resent read before it logs the resume: wait for the line.
	for deadline := time.Now().Add(10 * time.Second); !strings.Contains(log.String(), "resumed the FUSE session"); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Errorf("no resumed session in the log")
			break
		}
	}
	f.Close()
	keep.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-exited:
		if err != nil {
			t.Errorf("keep exited with %v on SIGTERM", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("keep did not stop on SIGTERM")
	}
	if isMount(t, e.mnt) {
		t.Error("still mounted after keep stopped")
	}
}

// childrenOf returns the pids of the children of process pid.
func childrenOf(pid int) []int {
	var pids []int
	// Children are listed by the thread that forked them.
	tasks, _ := filepath.Glob(filepath.Join("/proc", strconv.Itoa(pid), "task", "*", "children"))
	for _, task := range tasks {
		b, _ := os.ReadFile(task)
		for _, f := range strings.Fields(string(b)) {
			if p, err := strconv.Atoi(f); err == nil {
				pids = append(pids, p)
			}
		}
	}
	return pids
}

// TestKillAtEveryPhase kills the daemon (kill -9) while a request of the kernel waits for it
// in each phase of its work, and checks that the next process, resuming the session, answers
// every request with the right bytes:
//   - lookup: a runtime's first lookup of a layer, while the daemon waits for the registry
//     (the TOC's range request hangs); the kernel re-sends the LOOKUP to the next process;
//   - fetch: a read of a file never fetched, while its chunks are being fetched (hanging);
//   - store: the background fetch, slowed to a trickle so that kills land while chunks are
//     written to the cache, killed three times; each next process takes back the runtime's
//     use of the layer from the session and resumes the fetch by itself, the last completes
//     it, and every file of the layer reads as the reference says, with no verification
//     failure.
func TestKillAtEveryPhase(t *testing.T) {
	ref, err := testlayer.ReferenceTree(testlayer.Tar())
	if err != nil {
		t.Fatal(err)
	}
	// checkFile reads one file through the store and compares it with the reference layer.
	checkFile := func(t *testing.T, diff, name string) error {
		b, err := os.ReadFile(filepath.Join(diff, name))
		if err != nil {
			return err
		}
		if got := fmt.Sprintf("%x", sha256.Sum256(b)); got != ref[name].Content {
			return fmt.Errorf("%s: sha256 %s, want %s", name, got, ref[name].Content)
		}
		return nil
	}
	// inFlight runs f in the background; the returned function waits for its result.
	inFlight := func(t *testing.T, f func() error) func(time.Duration) error {
		done := make(chan error, 1)
		go func() { done <- f() }()
		return func(bound time.Duration) error {
			select {
			case err := <-done:
				return err
			case <-time.After(bound):
				return fmt.Errorf("no answer within %v", bound)
			}
		}
	}
	// waitFor polls cond until it holds (failing after 30 s).
	waitFor := func(t *testing.T, what string, cond func() bool) {
		t.Helper()
		for deadline := time.Now().Add(30 * time.Second); !cond(); time.Sleep(5 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("%s: not within 30 s", what)
			}
		}
	}
	const tool = "usr/bin/tool"

	t.Run("lookup", func(t *testing.T) {
		e := newServeEnv(t)
		m, log := managedLog(t)
		d := e.startManaged(m, e.bin, log)
		blob := e.fixture.Desc.Digest
		e.reg.Hang(blob, true)
		diff := filepath.Join(e.layerDir(e.tocKey()), "diff")
		wait := inFlight(t, func() error { return checkFile(t, diff, tool) })
		waitFor(t, "the lookup's range request", func() bool { return e.reg.Stats(blob).Ranged > 0 })
		d.kill()
		e.reg.Hang(blob, false)
		start := time.Now()
		e.startManaged(m, e.bin, log)
		if err := wait(30 * time.Second); err != nil {
			t.Fatalf("the lookup in flight at the kill: %v", err)
		}
		t.Logf("the lookup in flight at the kill answered %v after the next process started", time.Since(start).Round(time.Millisecond))
		if st := e.status(); st.Counters.VerifyFailures != 0 || st.Session == nil || !st.Session.Resumed {
			t.Errorf("after the kill: counters %+v, session %+v", st.Counters, st.Session)
		}
	})

	t.Run("fetch", func(t *testing.T) {
		e := newServeEnv(t)
		e.setPrefetch("enabled = false\n")
		m, log := managedLog(t)
		d := e.startManaged(m, e.bin, log)
		blob := e.fixture.Desc.Digest
		diff := filepath.Join(e.layerDir(e.tocKey()), "diff")
		if _, err := os.Stat(diff); err != nil { // resolved, nothing fetched yet
			t.Fatal(err)
		}
		before := e.reg.Stats(blob).Ranged
		e.reg.Hang(blob, true)
		wait := inFlight(t, func() error { return checkFile(t, diff, tool) })
		waitFor(t, "the read's range request", func() bool { return e.reg.Stats(blob).Ranged > before })
		d.kill()
		e.reg.Hang(blob, false)
		e.startManaged(m, e.bin, log)
		if err := wait(30 * time.Second); err != nil {
			t.Fatalf("the read in flight at the kill: %v", err)
		}
	})

	t.Run("store", func(t *testing.T) {
		e := newServeEnv(t)
		// A trickle: the fixture's blob takes seconds, chunks are stored all along.
		e.setPrefetch("bandwidth = \"64KiB\"\nbatch-size = \"64KiB\"\nconcurrency = 1\nquiet = \"0s\"\n")
		m, log := managedLog(t)
		d := e.startManaged(m, e.bin, log)
		diff := filepath.Join(e.layerDir(e.tocKey()), "diff")
		f, head, ino := e.openHalf() // a file open across the kills
		// The runtime takes a use of the layer (as c/storage does when it puts the layer).
		if _, err := os.Create(filepath.Join(e.layerDir(e.tocKey()), "use")); !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("create of use: %v, want ENOENT", err)
		}
		if st := e.status(); len(st.Layers) != 1 || st.Layers[0].Users != 1 {
			t.Fatalf("after the create of use: %+v", st.Layers)
		}
		var files []string
		for name, n := range ref {
			if n.Type == "reg" && n.HardTo == "" && name != tool {
				files = append(files, name)
			}
		}
		slices.Sort(files)
		var last int64
		for kill := range 3 {
			// Kill once the background fetch has stored more than before, at a point of its own.
			waitFor(t, "background progress", func() bool { return e.status().Cache.Bytes > last })
			time.Sleep(time.Duration(50+kill*70) * time.Millisecond)
			st := e.status()
			last = st.Cache.Bytes
			if len(st.Layers) != 1 || st.Layers[0].State != protocol.StateFetching {
				t.Fatalf("kill %d: the background fetch is not running: %+v", kill, st.Layers)
			}
			t.Logf("kill %d with %d bytes in the cache", kill, last)
			d.kill()
			d = e.startManaged(m, e.bin, log)
			// The runtime's use is taken back from the session: the layer is resolved again
			// and its background fetch goes on with no request of the runtime's.
			waitFor(t, "the use taken back and the background fetch resumed", func() bool {
				st := e.status()
				return len(st.Layers) == 1 && st.Layers[0].Users == 1 && st.Layers[0].State == protocol.StateFetching
			})
			// A container reads on.
			if err := checkFile(t, diff, files[kill%len(files)]); err != nil {
				t.Fatalf("after kill %d: %v", kill, err)
			}
		}
		e.waitComplete()
		e.readRest(f, head, ino)
		for name, n := range ref {
			if n.Type == "reg" && n.HardTo == "" {
				if err := checkFile(t, diff, name); err != nil {
					t.Error(err)
				}
			}
		}
		if st := e.status(); st.Counters.VerifyFailures != 0 {
			t.Errorf("verification failures after the kills: %+v", st.Counters)
		}
	})
}

// tocKey is the key a modern runtime looks the fixture's layer up by: its TOC digest.
func (e *serveEnv) tocKey() digest.Digest {
	return digest.Digest(e.fixture.Desc.Annotations["io.github.containers.zstd-chunked.manifest-checksum"])
}

// setPrefetch appends a [prefetch] table with keys to the daemon's configuration.
func (e *serveEnv) setPrefetch(keys string) {
	e.t.Helper()
	b, err := os.ReadFile(e.config)
	if err != nil {
		e.t.Fatal(err)
	}
	mustWrite(e.t, e.config, string(b)+"[prefetch]\n"+keys)
}

// managedLog returns a service manager for a test's daemons and the buffer their log goes to,
// shown when the test fails.
func managedLog(t *testing.T) (*svcmanager.Manager, *syncbuf.Buffer) {
	m := svcmanager.New(t, t.TempDir())
	log := &syncbuf.Buffer{}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("daemon log:\n%s", log.String())
		}
	})
	return m, log
}
