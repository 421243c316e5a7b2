package main

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/opencontainers/go-digest"

	storefs "github.com/layerstore/layerstore/fs"
	"github.com/layerstore/layerstore/internal/control/protocol"
	"github.com/layerstore/layerstore/internal/testutil/syncbuf"
	"github.com/layerstore/layerstore/internal/testutil/testfuse"
	"github.com/layerstore/layerstore/internal/testutil/testlayer"
	"github.com/layerstore/layerstore/internal/testutil/testregistry"
)

// daemon is a `layerstore serve` child process.
type daemon struct {
	t      *testing.T
	cmd    *exec.Cmd
	mnt    string
	socket string
	log    *syncbuf.Buffer
	exited chan error    // cmd.Wait's error, once
	done   chan struct{} // closed at the exit
}

// watch waits for the daemon's exit in the background (exited, done).
func (d *daemon) watch() {
	d.done = make(chan struct{})
	go func() {
		d.exited <- d.cmd.Wait()
		close(d.done)
	}()
}

// kill kills the daemon and waits for its exit, with a bound: a daemon killed while it waits
// for an answer of its own mount (a service manager keeps the connection) could not exit
// before the connection is aborted (testfuse.WaitExit).
func (d *daemon) kill() {
	d.t.Helper()
	d.cmd.Process.Kill()
	testfuse.WaitExit(d.t, d.mnt, d.done)
}

// stop sends SIGTERM, as systemctl stop does, and waits for a clean exit.
func (d *daemon) stop() {
	d.t.Helper()
	d.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-d.exited:
		if err != nil {
			d.t.Errorf("daemon exited with %v on SIGTERM", err)
		}
	case <-time.After(20 * time.Second):
		d.t.Fatal("daemon did not stop on SIGTERM")
	}
}

type serveEnv struct {
	t       *testing.T
	bin     string
	dir     string
	reg     *testregistry.Registry
	config  string
	socket  string
	mnt     string
	notify  *net.UnixConn
	fixture testlayer.Fixture
	ref     string
}

func newServeEnv(t *testing.T) *serveEnv {
	t.Helper()
	testfuse.Require(t)
	dir := t.TempDir()
	bin := filepath.Join(dir, "layerstore")
	build := exec.Command("go", "build", "-o", bin, ".")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	reg, err := testregistry.Start()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { reg.Close() })
	fixtures, err := testlayer.Fixtures()
	if err != nil {
		t.Fatal(err)
	}
	f := fixtures[0]
	if _, err := reg.Push(t.Context(), "serve/app:v1", []testregistry.LayerBlob{{
		Blob: f.Blob, MediaType: f.Desc.MediaType, Annotations: f.Desc.Annotations, DiffID: f.DiffID}}); err != nil {
		t.Fatal(err)
	}
	conf := filepath.Join(dir, "registries.conf")
	mustWrite(t, conf, testregistry.RegistriesConf(reg.Host))
	e := &serveEnv{t: t, bin: bin, dir: dir, reg: reg, fixture: f, ref: reg.Host + "/serve/app:v1",
		socket: filepath.Join(dir, "control.sock"), mnt: filepath.Join(dir, "store")}
	e.config = filepath.Join(dir, "config.toml")
	mustWrite(t, e.config, fmt.Sprintf("cache-dir = %q\ncontrol-socket = %q\nlog-level = \"debug\"\n[registries]\nconf = %q\n",
		filepath.Join(dir, "cache"), e.socket, conf))
	notify := filepath.Join(dir, "notify.sock")
	e.notify, err = net.ListenUnixgram("unixgram", &net.UnixAddr{Name: notify, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.notify.Close() })
	return e
}

func mustWrite(t *testing.T, p, s string) {
	t.Helper()
	if err := os.WriteFile(p, []byte(s), 0o644); err != nil {
		t.Fatal(err)
	}
}

// start runs the daemon and returns once it told systemd it is ready.
func (e *serveEnv) start() *daemon {
	cmd := exec.Command(e.bin, "serve", "--config", e.config, e.mnt)
	cmd.Env = os.Environ()
	return e.startCmd(cmd)
}

// startUnmanaged runs the daemon without a service manager ($NOTIFY_SOCKET unset: nobody keeps
// its FUSE session) and returns once it serves.
func (e *serveEnv) startUnmanaged() *daemon {
	t := e.t
	t.Helper()
	cmd := exec.Command(e.bin, "serve", "--config", e.config, e.mnt)
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "NOTIFY_SOCKET=") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	d := &daemon{t: t, cmd: cmd, mnt: e.mnt, socket: e.socket, log: &syncbuf.Buffer{}, exited: make(chan error, 1)}
	cmd.Stderr = d.log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	d.watch()
	t.Cleanup(func() {
		cmd.Process.Kill()
		testfuse.WaitExit(t, e.mnt, d.done)
		syscall.Unmount(e.mnt, syscall.MNT_DETACH)
		if t.Failed() {
			t.Logf("daemon log:\n%s", d.log.String())
		}
	})
	for deadline := time.Now().Add(30 * time.Second); !strings.Contains(d.log.String(), "msg=serving"); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the daemon does not serve:\n%s", d.log.String())
		}
	}
	return d
}

// startCmd runs cmd, a `layerstore serve`, with NOTIFY_SOCKET added to its environment, and
// returns once the daemon said READY=1, checking that the mount answered by then.
func (e *serveEnv) startCmd(cmd *exec.Cmd) *daemon {
	t := e.t
	t.Helper()
	d := &daemon{t: t, cmd: cmd, mnt: e.mnt, socket: e.socket, log: &syncbuf.Buffer{}, exited: make(chan error, 1)}
	d.cmd.Env = append(d.cmd.Env, "NOTIFY_SOCKET="+e.notify.LocalAddr().String())
	d.cmd.Stderr = d.log
	if err := d.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	d.watch()
	t.Cleanup(func() {
		d.cmd.Process.Kill()
		testfuse.WaitExit(t, e.mnt, d.done)
		syscall.Unmount(e.mnt, syscall.MNT_DETACH)
		if t.Failed() {
			t.Logf("daemon log:\n%s", d.log.String())
		}
	})
	deadline := time.Now().Add(30 * time.Second)
	buf := make([]byte, 256)
	for {
		e.notify.SetReadDeadline(time.Now().Add(100 * time.Millisecond))
		n, err := e.notify.Read(buf)
		if err == nil && strings.Contains(string(buf[:n]), "READY=1") {
			break
		}
		select {
		case err := <-d.exited:
			d.exited <- err
			t.Fatalf("the daemon exited (%v) without READY=1:\n%s", err, d.log.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("no READY=1 from the daemon: %v\n%s", err, d.log.String())
		}
	}
	var st syscall.Statfs_t
	if err := syscall.Statfs(e.mnt, &st); err != nil || st.Type != storefs.SuperMagic {
		t.Fatalf("READY=1 before the mount answers: statfs type %#x, %v", st.Type, err)
	}
	return d
}

func (e *serveEnv) layerDir(key digest.Digest) string {
	return filepath.Join(e.mnt, base64.StdEncoding.EncodeToString([]byte(e.ref)), key.String())
}

func (e *serveEnv) status() protocol.Status {
	e.t.Helper()
	st, err := protocol.NewClient(e.socket).Status(e.t.Context())
	if err != nil {
		e.t.Fatal(err)
	}
	return st
}

// waitComplete waits until every layer is fully local.
func (e *serveEnv) waitComplete() {
	e.t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for time.Now().Before(deadline) {
		st := e.status()
		done := len(st.Layers) > 0
		for _, l := range st.Layers {
			done = done && l.State == protocol.StateComplete
		}
		if done {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	e.t.Fatalf("layers not complete: %+v", e.status().Layers)
}

func sha(t *testing.T, p string) string {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return fmt.Sprintf("%x", sha256.Sum256(b))
}

// TestServe runs the daemon: lookups through the mount, the control socket, SIGTERM.
func TestServe(t *testing.T) {
	e := newServeEnv(t)
	d := e.start()
	tree, err := testlayer.ReferenceTree(testlayer.Tar())
	if err != nil {
		t.Fatal(err)
	}
	toc := digest.Digest(e.fixture.Desc.Annotations["io.github.containers.zstd-chunked.manifest-checksum"])
	diff := filepath.Join(e.layerDir(toc), "diff")
	if got, want := sha(t, filepath.Join(diff, "usr/bin/tool")), tree["usr/bin/tool"].Content; got != want {
		t.Errorf("usr/bin/tool: %s, want %s", got, want)
	}
	var in map[string]any
	b, err := os.ReadFile(filepath.Join(e.layerDir(e.fixture.Desc.Digest), "info"))
	if err != nil || json.Unmarshal(b, &in) != nil || in["diff-digest"] != e.fixture.DiffID.String() {
		t.Errorf("legacy info %s, %v", b, err)
	}
	if _, err := os.Stat(filepath.Join(e.layerDir(digest.FromString("no such layer")), "diff")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("unknown key: %v", err)
	}
	// use and rmdir count users.
	if _, err := os.Create(filepath.Join(e.layerDir(toc), "use")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("create use: %v", err)
	}
	if u := e.status().Layers[0].Users; u != 1 {
		t.Errorf("users %d after use, want 1", u)
	}
	if err := os.Remove(e.layerDir(toc)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("rmdir: %v", err)
	}
	if u := e.status().Layers[0].Users; u != 0 {
		t.Errorf("users %d after rmdir, want 0", u)
	}
	// The human status, JSON status and metrics.
	var out, errb bytes.Buffer
	if code := run(t.Context(), []string{"status", "--control-socket", e.socket}, &out, &errb); code != 0 ||
		!strings.Contains(out.String(), e.ref) || !strings.Contains(out.String(), "zstd:chunked") {
		t.Errorf("status: %d %s %s", code, out.String(), errb.String())
	}
	metrics, err := protocol.NewClient(e.socket).Metrics(t.Context())
	if err != nil || !strings.Contains(metrics, "layerstore_lookups_total") || strings.Contains(metrics, "sha256:") {
		t.Errorf("metrics (%v):\n%s", err, metrics)
	}
	if !strings.Contains(d.log.String(), "layer served lazily") {
		t.Errorf("no log line for the resolved layer:\n%s", d.log.String())
	}
	// SIGTERM unmounts and exits cleanly.
	d.stop()
	if isMount(t, e.mnt) {
		t.Error("still mounted after SIGTERM")
	}
}

// TestRestartAfterKill: SIGKILL with files open leaves a dead mount; a new daemon clears it,
// serves again and reuses the complete cache without asking the registry for content.
func TestRestartAfterKill(t *testing.T) {
	e := newServeEnv(t)
	d := e.start()
	toc := digest.Digest(e.fixture.Desc.Annotations["io.github.containers.zstd-chunked.manifest-checksum"])
	tool := filepath.Join(e.layerDir(toc), "diff", "usr/bin/tool")
	want := sha(t, tool)
	e.waitComplete()
	open, err := os.Open(tool)
	if err != nil {
		t.Fatal(err)
	}
	defer open.Close()
	d.kill()
	if _, err := os.Stat(tool); !errors.Is(err, syscall.ENOTCONN) {
		t.Fatalf("stat after SIGKILL: %v, want ENOTCONN", err)
	}
	e.start()
	// Resolution reads the TOC again; the content comes from the cache.
	if _, err := os.Stat(filepath.Join(e.layerDir(toc), "diff")); err != nil {
		t.Fatal(err)
	}
	before := e.reg.Stats(e.fixture.Desc.Digest)
	if got := sha(t, tool); got != want {
		t.Errorf("after restart: %s, want %s", got, want)
	}
	walkFiles(t, filepath.Join(e.layerDir(toc), "diff"))
	e.waitComplete()
	if after := e.reg.Stats(e.fixture.Desc.Digest); after != before {
		t.Errorf("content requested again after the restart: %+v -> %+v", before, after)
	}
}

func walkFiles(t *testing.T, root string) {
	t.Helper()
	err := filepath.Walk(root, func(p string, fi os.FileInfo, err error) error {
		if err != nil || !fi.Mode().IsRegular() {
			return err
		}
		_, err = os.ReadFile(p)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
}

func isMount(t *testing.T, p string) bool {
	t.Helper()
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	s := bufio.NewScanner(f)
	for s.Scan() {
		if fields := strings.Fields(s.Text()); len(fields) > 4 && fields[4] == p {
			return true
		}
	}
	return false
}

// TestStopWhileBusy: without a service manager keeping its session, SIGTERM while a file of
// the store is open (a running container) cannot
// unmount. The daemon serves on and exits cleanly once the file is closed; a second signal
// detaches the store at once.
func TestStopWhileBusy(t *testing.T) {
	e := newServeEnv(t)
	toc := digest.Digest(e.fixture.Desc.Annotations["io.github.containers.zstd-chunked.manifest-checksum"])
	tool := filepath.Join(e.layerDir(toc), "diff", "usr/bin/tool")
	stopped := func(d *daemon, within time.Duration) bool {
		select {
		case err := <-d.exited:
			if err != nil {
				t.Errorf("daemon exited with %v", err)
			}
			return true
		case <-time.After(within):
			return false
		}
	}
	busy := func(d *daemon) *os.File {
		f, err := os.Open(tool)
		if err != nil {
			t.Fatal(err)
		}
		d.cmd.Process.Signal(syscall.SIGTERM)
		for deadline := time.Now().Add(10 * time.Second); !strings.Contains(d.log.String(), "the store is busy"); {
			if time.Now().After(deadline) {
				t.Fatalf("no busy line after SIGTERM with a file open:\n%s", d.log.String())
			}
			time.Sleep(10 * time.Millisecond)
		}
		return f
	}

	t.Run("serves until the store is free", func(t *testing.T) {
		e.t = t
		d := e.startUnmanaged()
		f := busy(d)
		if stopped(d, 2*unmountRetry) {
			t.Fatal("the daemon exited while the store was busy")
		}
		if got, err := io.ReadAll(f); err != nil || len(got) == 0 {
			t.Errorf("reading the open file while stopping: %d bytes, %v", len(got), err)
		}
		if _, err := os.Stat(tool); err != nil {
			t.Errorf("the store stopped answering while busy: %v", err)
		}
		f.Close()
		if !stopped(d, 10*unmountRetry) {
			t.Fatal("the daemon did not exit once the store was free")
		}
		if isMount(t, e.mnt) {
			t.Error("still mounted after the daemon exited")
		}
	})

	t.Run("a second signal detaches", func(t *testing.T) {
		e.t = t
		d := e.startUnmanaged()
		f := busy(d)
		defer f.Close()
		d.cmd.Process.Signal(syscall.SIGTERM)
		if !stopped(d, 10*time.Second) {
			t.Fatal("the daemon did not exit on a second SIGTERM")
		}
		if isMount(t, e.mnt) {
			t.Error("the store is still in the mount table after the detach")
		}
		// Runtimes see the plain directory again, never a dead mount. (The open file itself may
		// still read: a complete file is served by FUSE passthrough from the cache.)
		if _, err := os.Stat(tool); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("stat in the detached store: %v, want ENOENT", err)
		}
	})
}

// TestReloadOnSIGHUP: SIGHUP never ends the daemon; it reloads registries.conf, whose changes
// apply to the next lookups, and keeps the previous configuration when the new one is invalid.
func TestReloadOnSIGHUP(t *testing.T) {
	e := newServeEnv(t)
	f := e.fixture
	for _, ref := range []string{"serve/other:v1", "serve/third:v1", "serve/fourth:v1"} {
		if _, err := e.reg.Push(t.Context(), ref, []testregistry.LayerBlob{{
			Blob: f.Blob, MediaType: f.Desc.MediaType, Annotations: f.Desc.Annotations, DiffID: f.DiffID}}); err != nil {
			t.Fatal(err)
		}
	}
	d := e.start()
	toc := digest.Digest(f.Desc.Annotations["io.github.containers.zstd-chunked.manifest-checksum"])
	diffOf := func(ref string) string {
		return filepath.Join(e.mnt, base64.StdEncoding.EncodeToString([]byte(e.reg.Host+"/"+ref)), toc.String(), "diff")
	}
	tool := filepath.Join(e.layerDir(toc), "diff", "usr/bin/tool")
	want := sha(t, tool)
	conf := filepath.Join(e.dir, "registries.conf")
	// waitLog waits for the log to hold wantLog more than n times.
	waitLog := func(wantLog string, n int) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for strings.Count(d.log.String(), wantLog) <= n {
			select {
			case err := <-d.exited:
				d.exited <- err
				t.Fatalf("the daemon exited on SIGHUP: %v", err)
			default:
			}
			if time.Now().After(deadline) {
				t.Fatalf("no %q in the log after SIGHUP", wantLog)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	hup := func(wantLog string) {
		t.Helper()
		n := strings.Count(d.log.String(), wantLog)
		if err := d.cmd.Process.Signal(syscall.SIGHUP); err != nil {
			t.Fatal(err)
		}
		waitLog(wantLog, n)
	}

	// Blocking the registry applies to the next lookup.
	mustWrite(t, conf, testregistry.RegistriesConf(e.reg.Host)+"blocked = true\n")
	hup("reloaded the registries configuration")
	if _, err := os.Stat(diffOf("serve/other:v1")); err == nil {
		t.Error("a reference of the blocked registry was resolved after the reload")
	}
	waitLog("registry blocked", 0)

	// An invalid file keeps the previous configuration (still blocked).
	mustWrite(t, conf, "[[registry]\nthis is not TOML\n")
	hup("keeping the previous one")
	if _, err := os.Stat(diffOf("serve/third:v1")); err == nil {
		t.Error("the invalid registries.conf replaced the blocking one")
	}

	// Unblocked again (for a reference whose failure the store does not remember); the daemon
	// served throughout.
	mustWrite(t, conf, testregistry.RegistriesConf(e.reg.Host))
	hup("reloaded the registries configuration")
	if _, err := os.Stat(diffOf("serve/fourth:v1")); err != nil {
		t.Errorf("after unblocking: %v", err)
	}
	if got := sha(t, tool); got != want {
		t.Errorf("usr/bin/tool after the reloads: %s, want %s", got, want)
	}
	d.stop()
}

// TestStopWithMountCopyElsewhere: a copy of the store's mount in another mount namespace (made
// before the stop, without propagation back: a rootless runtime's namespace on a host whose
// mounts are not shared) keeps the FUSE connection alive after the daemon's unmount; the
// daemon still exits, within unmountGrace, and says so.
func TestStopWithMountCopyElsewhere(t *testing.T) {
	e := newServeEnv(t)
	d := e.startUnmanaged()
	// The holder keeps its copy of the store's mount and detaches those of other tests' FUSE
	// mounts, whose connections it would keep alive after their unmounts.
	holder := exec.Command("unshare", "--mount", "--propagation", "private", "sh", "-c", testfuse.DetachScript(e.mnt)+"exec sleep 60")
	holder.Stderr = os.Stderr
	if err := holder.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { holder.Process.Kill(); holder.Wait() })
	// The copy is private once the holder runs sleep in its own namespace: unshare makes the
	// namespace, then its mounts private, then executes sh, which executes sleep; an unmount
	// between the first two steps would propagate to the copy.
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		ns, _ := os.Readlink(fmt.Sprintf("/proc/%d/ns/mnt", holder.Process.Pid))
		self, _ := os.Readlink("/proc/self/ns/mnt")
		comm, _ := os.ReadFile(fmt.Sprintf("/proc/%d/comm", holder.Process.Pid))
		if ns != "" && ns != self && strings.TrimSpace(string(comm)) == "sleep" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the holder has no mount namespace of its own")
		}
	}
	start := time.Now()
	d.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-d.exited:
		if err != nil {
			t.Errorf("daemon exited with %v", err)
		}
	case <-time.After(unmountGrace + 20*time.Second):
		t.Fatalf("the daemon did not exit %v after SIGTERM:\n%s", time.Since(start), d.log.String())
	}
	t.Logf("exited %v after SIGTERM", time.Since(start).Round(time.Millisecond))
	if !strings.Contains(d.log.String(), "still held elsewhere") {
		t.Errorf("no line about the connection held elsewhere:\n%s", d.log.String())
	}
	if isMount(t, e.mnt) {
		t.Errorf("still mounted here")
	}
}
