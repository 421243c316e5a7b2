package main

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/opencontainers/go-digest"

	"github.com/layerstore/layerstore/internal/control/protocol"
	"github.com/layerstore/layerstore/internal/testutil/testfuse"
)

// writeFile writes content to dir/name, creating dir, and returns the path.
func writeFile(t *testing.T, dir, name, content string, mode os.FileMode) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte(content), mode); err != nil {
		t.Fatal(err)
	}
	return p
}

// fakePath makes PATH a fresh directory holding only the given scripts (name -> shell body)
// and returns it.
func fakePath(t *testing.T, scripts map[string]string) string {
	t.Helper()
	dir := t.TempDir()
	for name, body := range scripts {
		writeFile(t, dir, name, "#!/bin/sh\n"+body+"\n", 0o755)
	}
	t.Setenv("PATH", dir)
	return dir
}

func storageConfText(driver, graphroot string, stores ...string) string {
	q := make([]string, len(stores))
	for i, s := range stores {
		q[i] = `"` + s + `"`
	}
	return "[storage]\ndriver = \"" + driver + "\"\ngraphroot = \"" + graphroot + "\"\n\n[storage.options]\nadditionallayerstores = [" +
		strings.Join(q, ", ") + "]\n"
}

func wantCheck(t *testing.T, c check, status checkStatus, substrs ...string) {
	t.Helper()
	if c.Status != status {
		t.Errorf("%s: status %s, want %s (%s)", c.Name, c.Status, status, c.Message)
	}
	for _, s := range substrs {
		if !strings.Contains(c.Message, s) {
			t.Errorf("%s: message %q lacks %q", c.Name, c.Message, s)
		}
	}
	if (c.Fix == "") != (status == statusOK || status == statusSkip) {
		t.Errorf("%s (%s): fix %q", c.Name, c.Status, c.Fix)
	}
}

func TestDoctorStorageConf(t *testing.T) {
	dir := t.TempDir()
	store := filepath.Join(dir, "store")
	if err := os.Mkdir(store, 0o755); err != nil {
		t.Fatal(err)
	}
	graph := filepath.Join(dir, "graph")
	for _, tc := range []struct {
		name, conf, store string
		status            checkStatus
		want              []string
		wantStore         string
	}{
		{"healthy", storageConfText("overlay", graph, store+":ref"), "", statusOK, []string{store + ":ref listed"}, store},
		{"healthy among others", storageConfText("overlay", graph, dir, store+":ref"), "", statusOK, []string{store + ":ref"}, store},
		{"--store", storageConfText("overlay", graph, dir+":ref", store+":ref"), store, statusOK, []string{store + ":ref"}, store},
		{"no :ref", storageConfText("overlay", graph, store), "", statusFail, []string{"without :ref", "which image"}, store},
		{"vfs", storageConfText("vfs", graph, store+":ref"), "", statusFail, []string{`driver "vfs"`, "only the overlay driver"}, store},
		{"no driver", storageConfText("", graph, store+":ref"), "", statusWarn, []string{"no driver set"}, store},
		{"store missing", storageConfText("overlay", graph, dir+"/gone:ref"), "", statusFail, []string{dir + "/gone does not exist", "refuses to start"}, dir + "/gone"},
		{"other store missing", storageConfText("overlay", graph, store+":ref", dir+"/gone"), "", statusFail, []string{"gone does not exist"}, store},
		{"not a directory", storageConfText("overlay", graph, writeFile(t, dir, "file", "", 0o644)+":ref"), "", statusFail, []string{"not a directory"}, dir + "/file"},
		{"unknown option", storageConfText("overlay", graph, store+":ref:lazy"), "", statusFail, []string{`unknown option "lazy"`, "refuse to start"}, store},
		{"relative", storageConfText("overlay", graph, "store:ref"), "", statusFail, []string{"not an absolute path"}, "store"},
		{"no stores", storageConfText("overlay", graph), "", statusFail, []string{"lists no store"}, ""},
		{"--store not listed", storageConfText("overlay", graph, dir+":ref"), store, statusFail, []string{store + " is not listed"}, store},
		{"parse error", "[storage\ndriver = overlay\n", "", statusFail, []string{"does not parse"}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := writeFile(t, t.TempDir(), "storage.conf", tc.conf, 0o644)
			c, setup := checkStorageConf(t.Context(), p, tc.store)
			wantCheck(t, c, tc.status, tc.want...)
			if setup.store != tc.wantStore {
				t.Errorf("store %q, want %q", setup.store, tc.wantStore)
			}
			if tc.name != "parse error" && setup.graphroot != graph {
				t.Errorf("graphroot %q, want %q", setup.graphroot, graph)
			}
		})
	}
	t.Run("missing file", func(t *testing.T) {
		c, setup := checkStorageConf(t.Context(), filepath.Join(dir, "none.conf"), "")
		wantCheck(t, c, statusFail, "does not exist")
		if setup.graphroot != defaultGraphRoot || setup.store != "" {
			t.Errorf("setup %+v", setup)
		}
	})
}

func TestDoctorAuthHelper(t *testing.T) {
	bin := fakePath(t, map[string]string{authHelperName: "exit 0", "other-helper": "exit 0"})
	line := `additional-layer-store-auth-helper = "layerstore-auth-helper"` + "\n"
	registry := "[[registry]]\nlocation = \"registry.example\"\ninsecure = true\n"
	for _, tc := range []struct {
		name, conf string
		dropIns    map[string]string
		status     checkStatus
		want       []string
	}{
		{"top level", "unqualified-search-registries = [\"docker.io\"]\n" + line + registry, nil, statusOK, []string{filepath.Join(bin, authHelperName)}},
		{"in a drop-in", registry, map[string]string{"50-layerstore.conf": line}, statusOK, []string{"50-layerstore.conf sets"}},
		{"absent", registry, map[string]string{"00-other.conf": "short-name-mode = \"permissive\"\n", "ignored.txt": line}, statusWarn,
			[]string{"no additional-layer-store-auth-helper", "private registries"}},
		{"inside [[registry]]", registry + line, nil, statusWarn, []string{"line 4", "inside the [[registry]] table", "belongs to that table"}},
		{"inside a drop-in's table", "", map[string]string{"10-mirrors.conf": "[aliases]\n" + line}, statusWarn, []string{"10-mirrors.conf line 2", "[aliases]"}},
		{"not installed", `additional-layer-store-auth-helper = "no-such-helper"` + "\n", nil, statusFail, []string{`"no-such-helper"`, "cannot be run"}},
		{"not executable", "", map[string]string{"50.conf": `additional-layer-store-auth-helper = "` + writeFile(t, t.TempDir(), authHelperName, "", 0o644) + `"` + "\n"},
			statusFail, []string{"cannot be run"}},
		{"another helper", `additional-layer-store-auth-helper = "other-helper"` + "\n", nil, statusWarn, []string{"not to layerstore-auth-helper"}},
		{"the last drop-in wins", line, map[string]string{"90-z.conf": `additional-layer-store-auth-helper = "other-helper"` + "\n"}, statusWarn, []string{"90-z.conf hands"}},
		{"a drop-in does not parse", line, map[string]string{"50.conf": "[[registry]\n"}, statusFail, []string{"50.conf does not parse", "every pull fails"}},
		{"no files at all", "", nil, statusWarn, []string{"no additional-layer-store-auth-helper"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			conf := filepath.Join(dir, "registries.conf")
			if tc.conf != "" {
				writeFile(t, dir, "registries.conf", tc.conf, 0o644)
			}
			dropIn := filepath.Join(dir, "registries.conf.d")
			for name, content := range tc.dropIns {
				writeFile(t, dropIn, name, content, 0o644)
			}
			wantCheck(t, checkAuthHelper(conf, []string{dropIn}), tc.status, tc.want...)
		})
	}
}

func TestDoctorRuntime(t *testing.T) {
	sleep, err := exec.LookPath("sleep")
	if err != nil {
		t.Skip("no sleep command")
	}
	for _, tc := range []struct {
		name, runtime, output string
		status                checkStatus
		want                  []string
	}{
		{"podman 5.6", "podman", "podman version 5.6.2", statusOK, []string{"5.6.2", "TOC digest (modern)", "auth helper supported"}},
		{"podman 5.1", "podman", "podman version 5.1.0", statusOK, []string{"TOC digest (modern)", "no auth helper (5.2+)"}},
		{"podman 4.3", "podman", "podman version 4.3.1", statusOK, []string{"4.3.1", "blob digest (legacy)", "uncompressed-size annotation", "tar-split"}},
		{"podman 3.2", "podman", "podman version 3.2.0", statusOK, []string{"blob digest (legacy)"}},
		{"podman 3.1", "podman", "podman version 3.1.2", statusFail, []string{"no additional layer store support"}},
		{"podman garbage", "podman", "what?", statusWarn, []string{"cannot tell"}},
		{"crio 1.31", "crio", "crio version 1.31.3\nGitCommit: abc", statusOK, []string{"CRI-O 1.31.3", "TOC digest (modern)"}},
		{"crio 1.28, old output", "crio", "INFO[0000] starting\nVersion:        1.28.2\nGitCommit: abc", statusOK, []string{"CRI-O 1.28.2", "blob digest (legacy)"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fakePath(t, map[string]string{tc.runtime: "echo '" + tc.output + "'"})
			wantCheck(t, checkRuntime(t.Context(), tc.runtime), tc.status, tc.want...)
		})
	}
	t.Run("not installed", func(t *testing.T) {
		fakePath(t, nil)
		wantCheck(t, checkRuntime(t.Context(), "crio"), statusSkip, "not installed")
	})
	t.Run("hangs", func(t *testing.T) {
		fakePath(t, map[string]string{"podman": "exec " + sleep + " 60"})
		defer func(d time.Duration) { commandTimeout = d }(commandTimeout)
		commandTimeout = 200 * time.Millisecond
		start := time.Now()
		wantCheck(t, checkRuntime(t.Context(), "podman"), statusWarn, "cannot tell")
		if d := time.Since(start); d > 5*time.Second {
			t.Errorf("took %v", d)
		}
	})
}

func TestDoctorPassthrough(t *testing.T) {
	for _, tc := range []struct {
		release string
		enabled bool
		status  checkStatus
		want    string
	}{
		{"6.9.0", true, statusOK, "has FUSE passthrough"},
		{"6.18.44-fc-v595", true, statusOK, "has FUSE passthrough"},
		{"7.0.1", true, statusOK, "has FUSE passthrough"},
		{"6.12.1", false, statusOK, "turned off in the config"},
		{"6.8.12-amd64", true, statusWarn, "no FUSE passthrough"},
		{"6.1.0-28-amd64", true, statusWarn, "no FUSE passthrough"},
		{"5.15.0", true, statusWarn, "no FUSE passthrough"},
		{"", true, statusWarn, "cannot read the kernel version"},
	} {
		wantCheck(t, checkPassthrough(tc.release, tc.enabled), tc.status, tc.want)
	}
	if kernelRelease() == "" {
		t.Error("kernelRelease is empty")
	}
}

func TestDoctorRestarts(t *testing.T) {
	kept := &protocol.Status{Session: &protocol.SessionStatus{Kept: true}}
	resumed := &protocol.Status{Session: &protocol.SessionStatus{Kept: true, Resumed: true}}
	lost := &protocol.Status{Session: &protocol.SessionStatus{Why: "no service manager keeps the FUSE session"}}
	for _, tc := range []struct {
		release string
		st      *protocol.Status
		status  checkStatus
		want    string
	}{
		{"6.18.44", kept, statusOK, "keeps the store's FUSE session"},
		{"6.18.44", resumed, statusOK, "resumed its predecessor's"},
		{"6.1.0-28-amd64", kept, statusWarn, "cannot re-send"},
		{"6.18.44", lost, statusWarn, "no service manager keeps the FUSE session: a crash of the daemon breaks running containers"},
		{"6.18.44", &protocol.Status{}, statusWarn, "does not say"},
		{"6.18.44", nil, statusWarn, "does not say"},
	} {
		wantCheck(t, checkRestarts(tc.release, tc.st), tc.status, tc.want)
	}
}

func TestDoctorCache(t *testing.T) {
	dir := t.TempDir()
	c := checkCache(t.Context(), dir, 0, 0)
	if c.Status == statusFail || !strings.Contains(c.Message, " free of ") {
		t.Errorf("cache: %+v", c)
	}
	wantCheck(t, checkCache(t.Context(), dir, 1<<60, 0), statusWarn, "cache-max-size 1.0 EiB does not fit")
	wantCheck(t, checkCache(t.Context(), filepath.Join(dir, "none"), 0, 0), statusWarn, "does not exist")
}

// graphLayer makes graphroot/overlay/id look like a layer c/storage took from an additional
// layer store: alPath in additionallayer, diff a symlink to alPath/diff.
func graphLayer(t *testing.T, graphroot, id, alPath string) {
	t.Helper()
	dir := filepath.Join(graphroot, "overlay", id)
	writeFile(t, dir, "additionallayer", alPath, 0o644)
	if err := os.Symlink(filepath.Join(alPath, "diff"), filepath.Join(dir, "diff")); err != nil {
		t.Fatal(err)
	}
}

func alPath(store, ref string, key digest.Digest) string {
	return filepath.Join(store, base64.StdEncoding.EncodeToString([]byte(ref)), key.String())
}

func TestDoctorDependents(t *testing.T) {
	graph := t.TempDir()
	c, layers := checkDependents(t.Context(), graph)
	wantCheck(t, c, statusOK, "no layer")
	if b, _ := json.Marshal(doctorReport{DependentLayers: layers}); !strings.Contains(string(b), `"dependentLayers":[]`) {
		t.Errorf("no dependent layers as JSON: %s", b)
	}
	store := t.TempDir()
	good := alPath(store, "example.com/app:v1", digest.FromString("good"))
	if err := os.MkdirAll(filepath.Join(good, "diff"), 0o755); err != nil {
		t.Fatal(err)
	}
	graphLayer(t, graph, "aaaa", good)
	c, layers = checkDependents(t.Context(), graph)
	wantCheck(t, c, statusOK, "1 layer from the store, all resolve")
	if len(layers) != 1 || !layers[0].Resolves || layers[0].Ref != "example.com/app:v1" || layers[0].Store != good || layers[0].Target != good+"/diff" {
		t.Errorf("layers %+v", layers)
	}
	graphLayer(t, graph, "bbbb", alPath(filepath.Join(store, "removed"), "example.com/gone:v2", digest.FromString("gone")))
	c, layers = checkDependents(t.Context(), graph)
	wantCheck(t, c, statusFail, "do not resolve: 1 of 2", "example.com/gone:v2", "fail to start")
	if !strings.Contains(c.Fix, "layerstore dependents --remove") {
		t.Errorf("fix %q", c.Fix)
	}
	if len(layers) != 2 || layers[0].ID != "aaaa" || !layers[0].Resolves || layers[1].ID != "bbbb" || layers[1].Resolves || layers[1].Error == "" {
		t.Errorf("layers %+v", layers)
	}
}

func TestDoctorMountNotServed(t *testing.T) {
	dir := t.TempDir()
	wantCheck(t, checkMount(t.Context(), dir), statusFail, "is not a FUSE mount")
	wantCheck(t, checkMount(t.Context(), filepath.Join(dir, "none")), statusFail, "does not exist")
	wantCheck(t, checkMount(t.Context(), ""), statusSkip, "no store")
}

func TestDoctorDaemonDown(t *testing.T) {
	dir := t.TempDir()
	c, st := checkDaemon(t.Context(), filepath.Join(dir, "none.sock"))
	wantCheck(t, c, statusFail, "daemon is not running")
	if st != nil {
		t.Error("a status without a daemon")
	}
	// A socket file nobody listens on, as a killed daemon leaves it.
	stale := filepath.Join(dir, "stale.sock")
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: stale, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	ln.SetUnlinkOnClose(false)
	ln.Close()
	c, _ = checkDaemon(t.Context(), stale)
	wantCheck(t, c, statusFail, "nothing listens")
}

func TestDoctorUsage(t *testing.T) {
	for _, args := range [][]string{{"doctor", "--bogus"}, {"doctor", "extra"}} {
		var out, errb bytes.Buffer
		if code := run(t.Context(), args, &out, &errb); code != 2 || !strings.Contains(errb.String(), "usage: layerstore doctor") {
			t.Errorf("%q: exit %d, stderr %q", args, code, errb.String())
		}
	}
}

// TestDoctorHungMount: a FUSE server that does not answer makes the mount check fail in
// bounded time instead of hanging doctor.
func TestDoctorHungMount(t *testing.T) {
	testfuse.Require(t)
	dir := t.TempDir()
	root := testfuse.NewStuckRoot()
	srv, err := testfuse.Mount(dir, "", root)
	if err != nil {
		t.Fatal(err)
	}
	conn := testfuse.Record(t, dir)
	root.Hang.Store(true)
	defer func() {
		close(root.Resume) // lets the abandoned probe return
		conn.Unmount(t, srv)
	}()
	defer func(d time.Duration) { probeTimeout = d }(probeTimeout)
	probeTimeout = 200 * time.Millisecond
	start := time.Now()
	c := checkMount(t.Context(), dir)
	wantCheck(t, c, statusFail, "does not answer", "no answer within 200ms")
	if !strings.Contains(c.Fix, "umount -l "+dir) {
		t.Errorf("fix %q", c.Fix)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("took %v", d)
	}
}

// doctorRun runs `layerstore doctor --json args...` and decodes its report.
func doctorRun(t *testing.T, args ...string) (int, doctorReport) {
	t.Helper()
	var out, errb bytes.Buffer
	code := run(t.Context(), append([]string{"doctor", "--json"}, args...), &out, &errb)
	var rep doctorReport
	if err := json.Unmarshal(out.Bytes(), &rep); err != nil {
		t.Fatalf("doctor --json (exit %d): %v\n%s\n%s", code, err, out.String(), errb.String())
	}
	return code, rep
}

func checkNamed(t *testing.T, rep doctorReport, name string) check {
	t.Helper()
	for _, c := range rep.Checks {
		if c.Name == name {
			return c
		}
	}
	t.Fatalf("no check %q in %+v", name, rep.Checks)
	return check{}
}

// TestDoctor runs doctor against a running daemon: a healthy node, then each broken setup it
// detects, ending with the daemon killed (a dead mount).
func TestDoctor(t *testing.T) {
	e := newServeEnv(t)
	d := e.start()
	dir := t.TempDir()
	fakePath(t, map[string]string{"podman": "echo 'podman version 5.6.2'", authHelperName: "exit 0"})

	graph := filepath.Join(dir, "graph")
	toc := digest.Digest(e.fixture.Desc.Annotations["io.github.containers.zstd-chunked.manifest-checksum"])
	graphLayer(t, graph, "live", e.layerDir(toc))
	writeFile(t, filepath.Join(graph, "overlay-layers"), "layers.json", `[{"id":"live"}]`, 0o600) // a runtime that records it
	storageConf := writeFile(t, dir, "storage.conf", storageConfText("overlay", graph, e.mnt+":ref"), 0o644)
	helperLine := `additional-layer-store-auth-helper = "layerstore-auth-helper"` + "\n"
	registry := "[[registry]]\nlocation = \"registry.example\"\n"
	registriesConf := writeFile(t, dir, "registries.conf", helperLine+registry, 0o644)
	dropIn := filepath.Join(dir, "registries.conf.d")
	base := []string{"--config", e.config, "--storage-conf", storageConf, "--registries-conf", registriesConf, "--registries-conf-dir", dropIn}

	// Healthy: no failure; the JSON has the documented shape.
	code, rep := doctorRun(t, base...)
	if code != 0 {
		t.Errorf("healthy: exit %d: %+v", code, rep.Checks)
	}
	for name, status := range map[string]checkStatus{"config": statusOK, "daemon": statusOK, "mount": statusOK, "storage.conf": statusOK,
		"auth helper": statusOK, "podman": statusOK, "crio": statusSkip, "dependent layers": statusOK} {
		if c := checkNamed(t, rep, name); c.Status != status {
			t.Errorf("healthy: %s: %s (%s), want %s", name, c.Status, c.Message, status)
		}
	}
	for _, c := range rep.Checks {
		if c.Status == statusFail {
			t.Errorf("healthy: %+v", c)
		}
	}
	if l := rep.DependentLayers; len(l) != 1 || l[0].ID != "live" || !l[0].Resolves || l[0].Ref != e.ref || l[0].Store != e.layerDir(toc) {
		t.Errorf("healthy: dependent layers %+v", l)
	}
	var out, errb bytes.Buffer
	run(t.Context(), append([]string{"doctor", "--json"}, base...), &out, &errb)
	var shape struct {
		Checks          []map[string]any `json:"checks"`
		DependentLayers []map[string]any `json:"dependentLayers"`
	}
	if err := json.Unmarshal(out.Bytes(), &shape); err != nil || len(shape.Checks) != 13 || len(shape.DependentLayers) != 1 {
		t.Fatalf("JSON shape (%v):\n%s", err, out.String())
	}
	for _, k := range []string{"name", "status", "message", "fix"} {
		if _, ok := shape.Checks[0][k]; !ok {
			t.Errorf("check without %q: %v", k, shape.Checks[0])
		}
	}
	for _, k := range []string{"id", "store", "target", "resolves"} {
		if _, ok := shape.DependentLayers[0][k]; !ok {
			t.Errorf("dependent layer without %q: %v", k, shape.DependentLayers[0])
		}
	}
	out.Reset()
	if code := run(t.Context(), append([]string{"doctor"}, base...), &out, &errb); code != 0 ||
		!strings.Contains(out.String(), "ok    daemon") || strings.Contains(out.String(), "FAIL") {
		t.Errorf("healthy, human: exit %d\n%s", code, out.String())
	}
	t.Logf("healthy:\n%s", out.String())

	// Each broken setup: the check that says so, and the exit code.
	for _, tc := range []struct {
		name          string
		storage, regs string
		args          []string
		code          int
		check         string
		status        checkStatus
		want          string
	}{
		{name: "no :ref", storage: storageConfText("overlay", graph, e.mnt), code: 1, check: "storage.conf", status: statusFail, want: "without :ref"},
		{name: "vfs", storage: storageConfText("vfs", graph, e.mnt+":ref"), code: 1, check: "storage.conf", status: statusFail, want: `driver "vfs"`},
		{name: "store missing", storage: storageConfText("overlay", graph, dir+"/gone:ref"), code: 1, check: "storage.conf", status: statusFail, want: "refuses to start"},
		{name: "store missing: mount", storage: storageConfText("overlay", graph, dir+"/gone:ref"), code: 1, check: "mount", status: statusFail, want: "does not exist"},
		{name: "helper line missing", regs: registry, code: 0, check: "auth helper", status: statusWarn, want: "no additional-layer-store-auth-helper"},
		{name: "helper line in [[registry]]", regs: registry + helperLine, code: 0, check: "auth helper", status: statusWarn, want: "inside the [[registry]] table"},
		{name: "daemon not running", args: []string{"--control-socket", filepath.Join(dir, "none.sock")}, code: 1, check: "daemon", status: statusFail, want: "not running"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			args := slices.Clone(base)
			if tc.storage != "" {
				args = append(args, "--storage-conf", writeFile(t, t.TempDir(), "storage.conf", tc.storage, 0o644))
			}
			if tc.regs != "" {
				args = append(args, "--registries-conf", writeFile(t, t.TempDir(), "registries.conf", tc.regs, 0o644))
			}
			code, rep := doctorRun(t, append(args, tc.args...)...)
			c := checkNamed(t, rep, tc.check)
			if code != tc.code || c.Status != tc.status || !strings.Contains(c.Message, tc.want) {
				t.Errorf("exit %d, %+v; want exit %d, %s %q", code, c, tc.code, tc.status, tc.want)
			}
		})
	}

	// A dangling dependent layer: its store was removed.
	graphLayer(t, graph, "dangling", alPath(filepath.Join(dir, "old-store"), e.ref, digest.FromString("gone")))
	code, rep = doctorRun(t, base...)
	if c := checkNamed(t, rep, "dependent layers"); code != 1 || c.Status != statusFail || !strings.Contains(c.Message, "do not resolve: 1 of 2") {
		t.Errorf("dangling: exit %d, %+v", code, c)
	}
	for _, l := range rep.DependentLayers {
		if l.Resolves != (l.ID == "live") {
			t.Errorf("dangling: %+v", l)
		}
	}
	out.Reset()
	run(t.Context(), append([]string{"doctor"}, base...), &out, &errb)
	if s := out.String(); !strings.Contains(s, "FAIL  dependent layers") || !strings.Contains(s, "fix: dependent layers:") ||
		!strings.Contains(s, "layers that do not resolve:\n  dangling  "+e.ref) {
		t.Errorf("dangling, human:\n%s", s)
	}

	// SIGKILL leaves a dead mount: ENOTCONN, found at once.
	d.kill()
	start := time.Now()
	code, rep = doctorRun(t, base...)
	if c := checkNamed(t, rep, "mount"); code != 1 || c.Status != statusFail ||
		!strings.Contains(c.Message, "transport endpoint is not connected") || !strings.Contains(c.Fix, "umount -l "+e.mnt) {
		t.Errorf("dead mount: exit %d, %+v", code, c)
	}
	if c := checkNamed(t, rep, "daemon"); c.Status != statusFail || !strings.Contains(c.Message, "nothing listens") {
		t.Errorf("dead mount: %+v", c)
	}
	if l := rep.DependentLayers; len(l) != 2 || l[0].Resolves || l[1].Resolves {
		t.Errorf("dead mount: dependent layers %+v", l)
	}
	if d := time.Since(start); d > 10*time.Second {
		t.Errorf("doctor took %v on a dead mount", d)
	}
}

// TestFindDependents: images whose layer chain (top layer, and the lower layers the overlay
// driver links) holds a layer from a store are dependent, with their containers; a layer from
// a store no image uses is an orphan; an image without one is not listed.
func TestFindDependents(t *testing.T) {
	graph := t.TempDir()
	store := t.TempDir()
	overlay := filepath.Join(graph, "overlay")
	layer := func(id string, fromStore bool, lowers ...string) {
		dir := filepath.Join(overlay, id)
		if fromStore {
			graphLayer(t, graph, id, alPath(store, "example.com/app:v1", digest.FromString(id)))
		} else if err := os.MkdirAll(filepath.Join(dir, "diff"), 0o755); err != nil {
			t.Fatal(err)
		}
		var links []string
		for _, l := range lowers {
			link := "l/" + strings.ToUpper(l)
			if err := os.MkdirAll(filepath.Join(overlay, "l"), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.Symlink("../"+l+"/diff", filepath.Join(overlay, link)); err != nil && !os.IsExist(err) {
				t.Fatal(err)
			}
			links = append(links, link)
		}
		if len(links) > 0 {
			writeFile(t, dir, "lower", strings.Join(links, ":"), 0o644)
		}
	}
	layer("base", false)
	layer("lazy", true, "base")
	layer("top", false, "lazy", "base")
	layer("plain", false, "base")
	layer("orphan", true)
	writeFile(t, filepath.Join(graph, "overlay-images"), "images.json",
		`[{"id":"img1","names":["example.com/app:v1"],"layer":"top"},{"id":"img2","names":["example.com/plain:v1"],"layer":"plain"},{"id":"img3","layer":"lazy"}]`, 0o644)
	writeFile(t, filepath.Join(graph, "overlay-containers"), "containers.json",
		`[{"id":"c1","names":["web"],"image":"img1","layer":"x"}]`, 0o644)
	rep, err := findDependents(graph, crioConf)
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Images) != 2 || rep.Images[0].ID != "img1" || !slices.Equal(rep.Images[0].Layers, []string{"lazy"}) ||
		!slices.Equal(rep.Images[0].Containers, []string{"web"}) || rep.Images[1].ID != "img3" {
		t.Errorf("dependent images %+v", rep.Images)
	}
	if !slices.Equal(rep.Orphans, []string{"orphan"}) {
		t.Errorf("orphans %q", rep.Orphans)
	}
	var out strings.Builder
	renderDependents(&out, rep)
	for _, want := range []string{"example.com/app:v1", "web", "1 layers from a store that no image"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("report lacks %q:\n%s", want, out.String())
		}
	}
	// Nothing from a store: nothing to read, nothing listed.
	empty, err := findDependents(t.TempDir(), crioConf)
	if err != nil || len(empty.Images) != 0 || len(empty.Orphans) != 0 {
		t.Errorf("empty storage: %+v, %v", empty, err)
	}
}

// TestCheckRuntimeRecords: the layers a runtime took from the store and did not record fail
// the check unless the daemon records into that graphroot; images that lost their layers
// fail it with the pull that mends each; a runtime that records them itself passes.
func TestCheckRuntimeRecords(t *testing.T) {
	graph := t.TempDir()
	if c := checkRuntimeRecords(graph, nil, crioConf); c.Status != statusOK || !strings.Contains(c.Message, "no layer") {
		t.Errorf("empty: %+v", c)
	}
	graphLayer(t, graph, "taken", "/store/cmVm/sha256:"+strings.Repeat("a", 64))
	c := checkRuntimeRecords(graph, nil, crioConf)
	if c.Status != statusFail || !strings.Contains(c.Message, "1 layer of 1") || !strings.Contains(c.Fix, "record-layers") {
		t.Errorf("unrecorded, no daemon: %+v", c)
	}
	st := &protocol.Status{Runtimes: &protocol.RuntimeRecords{Graphroots: []string{graph}, Recorded: 3}}
	if c := checkRuntimeRecords(graph, st, crioConf); c.Status != statusOK || !strings.Contains(c.Message, "next pass") {
		t.Errorf("unrecorded, the daemon records: %+v", c)
	}
	writeFile(t, filepath.Join(graph, "overlay-layers"), "layers.json", `[{"id":"taken"}]`, 0o600)
	if c := checkRuntimeRecords(graph, nil, crioConf); c.Status != statusOK || !strings.Contains(c.Message, "itself") {
		t.Errorf("recorded by the runtime: %+v", c)
	}
	if c := checkRuntimeRecords(graph, st, crioConf); c.Status != statusOK || !strings.Contains(c.Message, "3 recorded") {
		t.Errorf("recorded, the daemon records: %+v", c)
	}
	writeFile(t, filepath.Join(graph, "overlay-images"), "images.json",
		`[{"id":"i1","names":["reg.example/app:v1"],"layer":"lost"},{"id":"i2","layer":"taken"}]`, 0o600)
	c = checkRuntimeRecords(graph, st, crioConf)
	if c.Status != statusFail || !strings.Contains(c.Message, "1 image") || !strings.Contains(c.Fix, "podman pull reg.example/app:v1") {
		t.Errorf("an image that lost its layers: %+v", c)
	}
	// CRI-O runs, its configuration where the daemon's says (not the default path): the fix is
	// CRI-O's own pull.
	cdir := t.TempDir()
	sock := writeFile(t, cdir, "crio.sock", "", 0o600)
	crio := crioPaths{writeFile(t, cdir, "crio.conf", "[crio.api]\nlisten = \""+sock+"\"\n", 0o644), filepath.Join(cdir, "none")}
	if c := checkRuntimeRecords(graph, st, crio); c.Status != statusFail || !strings.Contains(c.Fix, "crictl pull reg.example/app:v1") {
		t.Errorf("an image that lost its layers, CRI-O running: %+v", c)
	}
	// Several graphroots (storage.conf's and CRI-O's): the failing one decides.
	other := t.TempDir()
	if c := checkRuntimesRecords([]string{other, graph}, st, crioConf); c.Status != statusFail || !strings.Contains(c.Message, graph) || strings.Contains(c.Message, other) {
		t.Errorf("two graphroots: %+v", c)
	}
	if c := checkRuntimesRecords([]string{other, other + "2"}, st, crioConf); c.Status != statusOK || !strings.Contains(c.Message, other+"2") {
		t.Errorf("two sound graphroots: %+v", c)
	}
}
