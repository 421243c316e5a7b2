package main

import (
	"crypto/sha256"
	"encoding/hex"
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

	"github.com/layerstore/layerstore/internal/fdstore"
	"github.com/layerstore/layerstore/internal/testutil/svcmanager"
	"github.com/layerstore/layerstore/internal/testutil/syncbuf"
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
	exited := make(chan struct{})
	go func() { d.exited <- cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		cmd.Process.Kill()
		<-exited
		syscall.Unmount(e.mnt, syscall.MNT_DETACH) // the manager may keep its session alive
	})
	if err := m.WaitReady(30*time.Second, exited); err != nil {
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
				d.cmd.Process.Kill()
				<-d.exited
			case "stop", "upgrade":
				d.cmd.Process.Signal(syscall.SIGTERM)
				if err := <-d.exited; err != nil {
					t.Fatalf("SIGTERM: %v", err)
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
	exited := make(chan error, 1)
	go func() { exited <- keep.Wait() }()
	t.Cleanup(func() {
		keep.Process.Kill()
		syscall.Unmount(e.mnt, syscall.MNT_DETACH)
		if t.Failed() {
			t.Logf("keep's log:\n%s", log.String())
		}
	})
	child := func() int {
		t.Helper()
		for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(20 * time.Millisecond) {
			// Children are listed by the thread that forked them.
			tasks, _ := filepath.Glob(filepath.Join("/proc", strconv.Itoa(keep.Process.Pid), "task", "*", "children"))
			for _, task := range tasks {
				b, _ := os.ReadFile(task)
				if pid, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil && strings.Contains(log.String(), "serving") {
					return pid
				}
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
	if !strings.Contains(log.String(), "resumed the FUSE session") {
		t.Errorf("no resumed session in the log")
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
