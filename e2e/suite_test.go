package e2e

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/opencontainers/go-digest"

	storefs "github.com/layerstore/layerstore/fs"
	"github.com/layerstore/layerstore/internal/control/protocol"
	"github.com/layerstore/layerstore/internal/fdstore"
	"github.com/layerstore/layerstore/internal/testutil/svcmanager"
	"github.com/layerstore/layerstore/internal/testutil/syncbuf"
	"github.com/layerstore/layerstore/internal/testutil/testfuse"

	"github.com/layerstore/layerstore/internal/testutil/dockerregistry"
	"github.com/layerstore/layerstore/internal/testutil/podman5"
	"github.com/layerstore/layerstore/internal/testutil/testregistry"
)

// The private registry's account.
const (
	user     = "e2e-user"
	password = "e2e-secret-Pa55"
)

// suite is what every test shares: the binaries, two registries and the images on them.
type suite struct {
	dir               string
	bin               string // layerstore, layerstore-auth-helper and harness
	podman5           string // podman 5, built from its module (internal/testutil/podman5)
	open              *dockerregistry.Registry
	private           *dockerregistry.Registry // htpasswd auth
	images            map[string]*image
	privImg           *image            // the eStargz image on the private registry
	regConf           string            // registries.conf marking the registries insecure
	goodAuth, badAuth string            // auth.json files for the private registry
	refs              map[string]string // listings of the reference images, once made

	nextOnce sync.Once // builds next: a daemon binary of another version
	next     string
	nextErr  error
}

var (
	shared  *suite
	skipWhy string // why the suite could not run here
)

func TestMain(m *testing.M) {
	code := func() int {
		s, err := setUp()
		if err != nil {
			var skip skipError
			if !errors.As(err, &skip) || os.Getenv("LAYERSTORE_E2E") == "1" {
				fmt.Fprintf(os.Stderr, "e2e set-up: %v\n", err)
				return 1
			}
			skipWhy = err.Error()
		}
		shared = s
		defer s.tearDown()
		return m.Run()
	}()
	os.Exit(code)
}

// skipError is a missing prerequisite.
type skipError struct{ msg string }

func (e skipError) Error() string { return e.msg }

// need returns the suite, or skips the test when the machine lacks a prerequisite.
func need(t *testing.T) *suite {
	t.Helper()
	if shared == nil {
		t.Skipf("skipping end-to-end test: %s (LAYERSTORE_E2E=1 makes this a failure; .ci/run installs what is needed)", skipWhy)
	}
	return shared
}

func setUp() (_ *suite, err error) {
	if os.Geteuid() != 0 {
		return nil, skipError{"not root"}
	}
	if err := storefs.Usable(); err != nil {
		return nil, skipError{err.Error()}
	}
	for _, tool := range []string{"podman", "skopeo", "docker-registry", "runc", "htpasswd", "unshare"} {
		if _, err := exec.LookPath(tool); err != nil {
			return nil, skipError{tool + " not installed"}
		}
	}
	const busybox = "/bin/busybox"
	if !isStatic(busybox) {
		return nil, skipError{"no static " + busybox + " (busybox-static)"}
	}
	if _, err := os.Stat("/usr/include/seccomp.h"); err != nil {
		return nil, skipError{"no libseccomp-dev (the build of podman 5 needs it)"}
	}
	dir, err := os.MkdirTemp("", "layerstore-e2e-")
	if err != nil {
		return nil, err
	}
	s := &suite{dir: dir, bin: filepath.Join(dir, "bin")}
	defer func() {
		if err != nil {
			s.tearDown()
		}
	}()
	// Its own bound: a first build of podman takes minutes on two cores.
	bctx, bcancel := context.WithTimeout(context.Background(), 25*time.Minute)
	s.podman5, err = podman5.Build(bctx, dir)
	bcancel()
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	if err := s.build(ctx); err != nil {
		return nil, err
	}
	htpasswd := filepath.Join(dir, "htpasswd")
	if out, err := run(ctx, nil, "htpasswd", "-Bbc", htpasswd, user, password); err != nil {
		return nil, fmt.Errorf("htpasswd: %v\n%s", err, out)
	}
	for _, r := range []struct {
		reg  **dockerregistry.Registry
		name string
		auth string
	}{{&s.open, "open", ""}, {&s.private, "private", htpasswd}} {
		d := filepath.Join(dir, "registry-"+r.name)
		if err := os.MkdirAll(d, 0o755); err != nil {
			return nil, err
		}
		if *r.reg, err = dockerregistry.Start(ctx, dockerregistry.Config{DataDir: filepath.Join(d, "data"), ConfDir: d, Htpasswd: r.auth}); err != nil {
			return nil, err
		}
	}
	s.regConf = filepath.Join(dir, "registries.conf")
	if err := os.WriteFile(s.regConf, []byte(testregistry.RegistriesConf(s.open.Host, s.private.Host)), 0o644); err != nil {
		return nil, err
	}
	s.goodAuth = filepath.Join(dir, "auth-good.json")
	s.badAuth = filepath.Join(dir, "auth-bad.json")
	for path, pass := range map[string]string{s.goodAuth: password, s.badAuth: "wrong-password"} {
		if err := os.WriteFile(path, []byte(authJSON(s.private.Host, user, pass)), 0o600); err != nil {
			return nil, err
		}
	}
	b := &builder{dir: filepath.Join(dir, "build"), env: s.env("CONTAINERS_REGISTRIES_CONF=" + s.regConf), harness: filepath.Join(s.bin, "harness")}
	if s.images, err = b.pushAll(ctx, s.open, busybox); err != nil {
		return nil, err
	}
	auth := &authn.Basic{Username: user, Password: password}
	if s.privImg, err = copyImage(ctx, s.private, "private/estargz:v1", auth, s.images[imgEStargz]); err != nil {
		return nil, err
	}
	return s, nil
}

// build compiles the two product binaries and the modern runtime harness, twice: harness on
// the newest c/image and c/storage (go.mod), harness-crio on those CRI-O vendors (go.crio.mod).
func (s *suite) build(ctx context.Context) error {
	for _, b := range []struct{ dir, pkg, out, modfile string }{
		{"..", "./cmd/layerstore", "layerstore", ""},
		{"..", "./cmd/layerstore-auth-helper", "layerstore-auth-helper", ""},
		{"harness", ".", "harness", ""},
		{"harness", ".", "harness-crio", "go.crio.mod"},
	} {
		args := []string{"build", "-C", b.dir, "-o", filepath.Join(s.bin, b.out)}
		if b.dir == "harness" {
			args = append(args, "-tags", "exclude_graphdriver_btrfs exclude_graphdriver_devicemapper containers_image_openpgp")
		}
		if b.modfile != "" {
			args = append(args, "-modfile", b.modfile)
		}
		if out, err := run(ctx, nil, "go", append(args, b.pkg)...); err != nil {
			return fmt.Errorf("go build %s: %v\n%s", b.pkg, err, out)
		}
	}
	return nil
}

func (s *suite) tearDown() {
	if s == nil {
		return
	}
	for _, r := range []*dockerregistry.Registry{s.open, s.private} {
		if r != nil {
			r.Stop()
		}
	}
	if s.dir != "" {
		os.RemoveAll(s.dir)
	}
}

// env is a clean environment for a runtime or the daemon: no credentials or configuration of
// the machine's user, plus extra.
func (s *suite) env(extra ...string) []string {
	var env []string
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		switch k {
		case "HOME", "XDG_RUNTIME_DIR", "XDG_CONFIG_HOME", "DOCKER_CONFIG", "REGISTRY_AUTH_FILE",
			"CONTAINERS_CONF", "CONTAINERS_STORAGE_CONF", "CONTAINERS_REGISTRIES_CONF", "NOTIFY_SOCKET",
			"LAYERSTORE_CONTROL_SOCKET":
			continue
		}
		env = append(env, kv)
	}
	home := filepath.Join(s.dir, "home")
	os.MkdirAll(home, 0o700)
	os.WriteFile(filepath.Join(home, "no-auth.json"), []byte("{}"), 0o600) // podman 4.3 wants it to exist
	env = append(env, "HOME="+home, "XDG_RUNTIME_DIR="+home, "XDG_CONFIG_HOME="+home,
		"DOCKER_CONFIG="+home, "REGISTRY_AUTH_FILE="+filepath.Join(home, "no-auth.json"))
	// Later entries win, and each variable appears once: children of children see it too.
	env = append(env, extra...)
	seen := map[string]bool{}
	var out []string
	for i := len(env) - 1; i >= 0; i-- {
		if k, _, _ := strings.Cut(env[i], "="); !seen[k] {
			seen[k] = true
			out = append(out, env[i])
		}
	}
	slices.Reverse(out)
	return out
}

func authJSON(host, user, pass string) string {
	return fmt.Sprintf(`{"auths": {%q: {"auth": %q}}}`, host, base64.StdEncoding.EncodeToString([]byte(user+":"+pass)))
}

// daemon is a running `layerstore serve`.
type daemon struct {
	t       *testing.T // the test that started it
	s       *suite
	dir     string
	mnt     string
	socket  string
	cmd     *exec.Cmd
	manager *svcmanager.Manager // its service manager, across restarts
	log     *syncbuf.Buffer
	done    chan struct{}
	env     []string
}

// startDaemon mounts a daemon on a new store directory; extra environment (REGISTRY_AUTH_FILE)
// is the daemon's own.
func (s *suite) startDaemon(t *testing.T, extraEnv ...string) *daemon {
	t.Helper()
	return s.startDaemonWith(t, daemonConfig{}, extraEnv...)
}

// daemonConfig is what a test changes in a daemon's configuration.
type daemonConfig struct {
	registries string // registries.conf; the suite's when empty
	top        string // top-level keys (cache-max-size)
	tables     string // tables after [registries] ([layers], [prefetch])
}

// startDaemonWith is startDaemon with configuration of the test's own.
func (s *suite) startDaemonWith(t *testing.T, c daemonConfig, extraEnv ...string) *daemon {
	t.Helper()
	dir := t.TempDir()
	d := &daemon{t: t, s: s, dir: dir, mnt: filepath.Join(dir, "store"), socket: filepath.Join(dir, "control.sock"),
		env: s.env(extraEnv...)}
	if c.registries == "" {
		c.registries = s.regConf
	}
	cfg := fmt.Sprintf("cache-dir = %q\ncontrol-socket = %q\nlog-level = \"debug\"\n%s[registries]\nconf = %q\n%s",
		filepath.Join(dir, "cache"), d.socket, c.top, c.registries, c.tables)
	if err := os.WriteFile(filepath.Join(dir, "config.toml"), []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(d.mnt, 0o755); err != nil {
		t.Fatal(err)
	}
	d.start(t)
	t.Cleanup(func() {
		d.stop(syscall.SIGKILL)
		syscall.Unmount(d.mnt, syscall.MNT_DETACH)
		if t.Failed() {
			t.Logf("daemon log:\n%s", d.log.String())
		}
	})
	return d
}

// start runs the daemon and returns once it sent READY=1, which it does once the mount answers.
// The daemon's notify socket is its manager's: what the previous process stored there (its FUSE
// session) is handed to this one, as systemd does on a restart.
func (d *daemon) start(t *testing.T) {
	t.Helper()
	d.startBinary(t, filepath.Join(d.s.bin, "layerstore"))
}

// startBinary is start with the daemon binary at path (another version, for an upgrade).
func (d *daemon) startBinary(t *testing.T, path string) {
	t.Helper()
	if d.log == nil {
		d.log = &syncbuf.Buffer{}
	}
	if d.manager == nil {
		d.manager = svcmanager.New(t, d.dir)
	}
	cmd, err := d.manager.Command([]string{path, "serve", "--config", filepath.Join(d.dir, "config.toml"), d.mnt}, d.env)
	if err != nil {
		t.Fatal(err)
	}
	d.cmd = cmd
	d.cmd.Stdout, d.cmd.Stderr = d.log, d.log
	d.cmd.WaitDelay = 10 * time.Second // for its output, once it exited
	err = d.cmd.Start()
	fdstore.CloseExtra(cmd)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	d.done = done
	go func(c *exec.Cmd) { c.Wait(); close(done) }(d.cmd)
	if err := d.manager.WaitReady(60*time.Second, done); err != nil {
		t.Fatalf("%v\n%s", err, d.log.String())
	}
}

// stop signals the daemon and waits for it to exit; after 30 seconds it is killed, and waited
// for with a bound (testfuse.WaitExit: a daemon killed while it waits for an answer of a FUSE
// mount, its own kept alive by its service manager, cannot exit before the answer).
func (d *daemon) stop(sig syscall.Signal) {
	if d.cmd == nil || d.cmd.ProcessState != nil {
		return
	}
	select {
	case <-d.done:
		return
	default:
	}
	d.cmd.Process.Signal(sig)
	select {
	case <-d.done:
	case <-time.After(30 * time.Second):
		d.cmd.Process.Kill()
		testfuse.WaitExit(d.t, d.mnt, d.done)
	}
}

func (d *daemon) status(t *testing.T) protocol.Status {
	t.Helper()
	st, err := protocol.NewClient(d.socket).Status(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// users returns the daemon's users count of the layer with blob digest d (-1: not tracked).
func (d *daemon) users(t *testing.T, blob digest.Digest) int64 {
	for _, l := range d.status(t).Layers {
		if l.Digest == blob.String() {
			return l.Users
		}
	}
	return -1
}

// waitComplete waits (up to three minutes) until the background fetch of every layer of img the
// store serves has ended, so that what follows counts only its own requests.
func (d *daemon) waitComplete(t *testing.T, img *image) {
	t.Helper()
	// Three minutes: the background fetch verifies below the priority of everything else on
	// the machine (layer/idlecpu.go), the race-detecting test packages running beside this
	// one included.
	for deadline := time.Now().Add(3 * time.Minute); ; time.Sleep(50 * time.Millisecond) {
		busy := false
		for _, l := range d.status(t).Layers {
			if img.legacy[digest.Digest(l.Digest)] && l.State == protocol.StateFetching {
				busy = true
			}
		}
		if !busy {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("background fetch of %s still running after three minutes", img.ref)
		}
	}
}

// layerDir is where a runtime looks for the layer with key of the image ref.
func (d *daemon) layerDir(ref string, key digest.Digest) string {
	return filepath.Join(d.mnt, base64.StdEncoding.EncodeToString([]byte(ref)), key.String())
}

func unmount(path string) { syscall.Unmount(path, syscall.MNT_DETACH) }
