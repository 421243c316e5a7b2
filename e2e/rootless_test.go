package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/layerstore/layerstore/internal/testutil/testfuse"
	"github.com/layerstore/layerstore/internal/testutil/testregistry"
)

// The rootless user of the tests: it exists only inside a private mount namespace, whose
// /etc/passwd, group, subuid and subgid are copies with the user added.
const (
	rootlessUID    = 1500
	rootlessSubuid = 300000
)

// rootless is a user with subordinate ids that exists only inside private mount namespaces
// (see command), with a home and a runtime directory of its own.
type rootless struct {
	home, run string
	mounts    string // sh commands, as root in the namespace, that make the user exist
}

// newRootless prepares the rootless user: copies of /etc/passwd, group, subuid and subgid
// with it added, to bind over the originals in a private mount namespace (the machine's
// files are never changed).
func newRootless(t *testing.T) *rootless {
	t.Helper()
	dir := testfuse.OpenTempDir(t)
	for p := filepath.Dir(dir); p != "/"; p = filepath.Dir(p) {
		if fi, err := os.Stat(p); err == nil && fi.Mode().Perm()&0o001 == 0 {
			t.Skipf("skipping: %s is not traversable by other users", p)
		}
	}
	r := &rootless{home: filepath.Join(dir, "home"), run: filepath.Join(dir, "run")}
	for _, d := range []string{r.home, r.run} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.Chown(d, rootlessUID, rootlessUID); err != nil {
			t.Fatal(err)
		}
	}
	for _, f := range []struct{ name, add string }{
		{"passwd", fmt.Sprintf("lsuser:x:%d:%d::%s:/bin/sh\n", rootlessUID, rootlessUID, r.home)},
		{"group", fmt.Sprintf("lsuser:x:%d:\n", rootlessUID)},
		{"subuid", fmt.Sprintf("lsuser:%d:65536\n", rootlessSubuid)},
		{"subgid", fmt.Sprintf("lsuser:%d:65536\n", rootlessSubuid)},
	} {
		target := "/etc/" + f.name
		old, err := os.ReadFile(target)
		if err != nil {
			t.Skipf("skipping: the rootless user needs %s to exist (it is never created): %v", target, err)
		}
		if len(old) > 0 && old[len(old)-1] != '\n' {
			old = append(old, '\n')
		}
		c := filepath.Join(dir, f.name)
		if err := os.WriteFile(c, append(old, f.add...), 0o644); err != nil {
			t.Fatal(err)
		}
		r.mounts += fmt.Sprintf("mount --bind %s %s\n", shellQuote(c), target)
	}
	// /dev/fuse is 0666 on the distributions (fusermount3 opens it as the user); where it is
	// root's alone, a 0666 node of the same device is bound over it in the namespace.
	if fi, err := os.Stat("/dev/fuse"); err == nil && fi.Mode().Perm()&0o006 != 0o006 {
		node := filepath.Join(dir, "fuse")
		r.mounts += fmt.Sprintf("mknod -m 666 %s c 10 229\nmount --bind %s /dev/fuse\n", shellQuote(node), shellQuote(node))
	}
	return r
}

// command returns the command that runs script with sh, as root, in a private mount namespace
// where the user exists; script runs commands as a user with setpriv.
func (r *rootless) command(script string) []string {
	// Shared mounts, as systemd makes them, but in a peer group of the namespace's own (its
	// mounts were made private first): the mounts of the daemon propagate into the rootless
	// runtime's namespace, and nothing reaches the machine's. The FUSE mounts the namespace
	// inherits are other tests' (the user's store is mounted later, inside): detached first,
	// lest the namespaces of the user's processes (its podman's pause process) keep their
	// connections alive after their unmounts.
	return []string{"unshare", "--mount", "--propagation", "private", "sh", "-c",
		"set -e\n" + testfuse.DetachScript() + r.mounts + "mount --make-rshared /\n" + script}
}

// killLeftovers kills, when the test ends (failed or not), the user's processes that outlive
// its script: its podman's pause process, which rootless podman leaves running to keep its
// user namespace (pid in $XDG_RUNTIME_DIR/libpod/tmp/pause.pid), and its daemon, when the
// script failed before stopping it.
func (r *rootless) killLeftovers(t *testing.T) {
	t.Cleanup(func() {
		for _, f := range []string{filepath.Join(r.run, "libpod", "tmp", "pause.pid"), filepath.Join(r.home, "daemon.pid")} {
			r.kill(t, f)
		}
	})
}

// kill kills the user's process whose pid is in pidFile, if it still runs, and checks that it
// is gone within ten seconds.
func (r *rootless) kill(t *testing.T, pidFile string) {
	b, err := os.ReadFile(pidFile)
	if err != nil {
		return // never started
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || pid <= 1 {
		t.Errorf("%s: %q is not a pid", pidFile, b)
		return
	}
	if !runsAs(pid, rootlessUID) {
		return // ended (its pid may be another process's now)
	}
	comm, _ := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid))
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Errorf("kill %d (%s): %v", pid, strings.TrimSpace(string(comm)), err)
		return
	}
	for deadline := time.Now().Add(10 * time.Second); runsAs(pid, rootlessUID); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Errorf("process %d (%s) of the rootless user still runs 10s after SIGKILL", pid, strings.TrimSpace(string(comm)))
			return
		}
	}
	t.Logf("killed process %d (%s) of the rootless user, from %s", pid, strings.TrimSpace(string(comm)), filepath.Base(pidFile))
}

// runsAs reports whether process pid exists, has not ended (a zombie waiting for its parent
// has) and runs as uid.
func runsAs(pid, uid int) bool {
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return false
	}
	var state, uids string
	for _, line := range strings.Split(string(status), "\n") {
		if v, ok := strings.CutPrefix(line, "State:"); ok {
			state = strings.TrimSpace(v)
		}
		if v, ok := strings.CutPrefix(line, "Uid:"); ok {
			uids = v
		}
	}
	f := strings.Fields(uids)
	return !strings.HasPrefix(state, "Z") && !strings.HasPrefix(state, "X") && len(f) > 0 && f[0] == strconv.Itoa(uid)
}

// shellQuote quotes each argument for sh, separated by spaces.
func shellQuote(args ...string) string {
	var q []string
	for _, a := range args {
		q = append(q, "'"+strings.ReplaceAll(a, "'", `'\''`)+"'")
	}
	return strings.Join(q, " ")
}

// TestRootless: a user with subordinate ids (made in a private mount namespace) runs its own
// `layerstore serve` with the per-user defaults (cache, control socket, configuration under
// its own directories), mounted through fusermount3, and its rootless podman (4.3.1) takes an
// eStargz image's layers from that store: the container lists the reference content, owners
// included (the daemon shows them through the user's namespace); the layers came from the
// store; `layerstore status` and `doctor` find the daemon at the user's socket; another user
// gets nothing from the store; after a restart of the daemon the image runs again.
func TestRootless(t *testing.T) {
	s := need(t)
	refs := s.references(t)
	img := s.images[imgEStargz]
	dir := testfuse.OpenTempDir(t)
	regConf := filepath.Join(dir, "registries.conf")
	if err := os.WriteFile(regConf, []byte(testregistry.RegistriesConf(s.open.Host)), 0o644); err != nil {
		t.Fatal(err)
	}
	// The user cannot enter the suite's private directories: its own copy of the binary.
	ls := filepath.Join(dir, "layerstore")
	if out, err := run(t.Context(), nil, "cp", filepath.Join(s.bin, "layerstore"), ls); err != nil {
		t.Fatal(err, out)
	}
	list := filepath.Join(dir, "list.sh")
	if err := os.WriteFile(list, []byte(listScript), 0o644); err != nil {
		t.Fatal(err)
	}
	// As the user: the storage.conf line and the daemon's registries, nothing else.
	// Functions of the user's shells: start and stop its daemon as a user unit would.
	user := `store=$XDG_RUNTIME_DIR/layerstore/store
export CONTAINERS_REGISTRIES_CONF=$REGCONF
start() {
	setsid "$LS" serve "$store" >>"$HOME/daemon.log" 2>&1 < /dev/null &
	echo $! > "$HOME/daemon.pid"
	for i in $(seq 300); do "$LS" status >/dev/null 2>&1 && return 0; sleep 0.1; done
	echo "daemon not serving"; return 1
}
stop() {
	kill -TERM "$(cat "$HOME/daemon.pid")"
	for i in $(seq 300); do kill -0 "$(cat "$HOME/daemon.pid")" 2>/dev/null || return 0; sleep 0.1; done
	echo "daemon did not stop"; return 1
}
`
	script := `as() { u=$1; shift; setpriv --reuid $u --regid $u --clear-groups env -i HOME="$UHOME" XDG_RUNTIME_DIR="$URUN" USER=lsuser PATH="$PATH" REGCONF="$REGCONF" LS="$LS" IMG="$IMG" LIST="$LIST" sh -ec "$USERFUNCS
$*"; }
trap 'cat "$UHOME/daemon.log" >&2' EXIT
as 1500 'mkdir -p "$store" "$HOME/.config/containers" "$HOME/.config/layerstore"
printf "[storage]\ndriver = \"overlay\"\n[storage.options]\nadditionallayerstores = [\"%s:ref\"]\n" "$store" > "$HOME/.config/containers/storage.conf"
printf "log-level = \"debug\"\n[registries]\nconf = \"%s\"\n" "$REGCONF" > "$HOME/.config/layerstore/config.toml"
start
podman run --name first --net=none "$IMG" /bin/busybox sh -c "$(cat "$LIST")" > "$HOME/listing1"
podman rm first >/dev/null
"$LS" status --json > "$HOME/status.json"
"$LS" doctor > "$HOME/doctor.txt" 2>&1 || true
ls "$HOME"/.local/share/containers/storage/overlay/*/additionallayer > "$HOME/additional"'
if as 1501 'ls "$XDG_RUNTIME_DIR/layerstore/store" 2>&1; ls /proc/$(cat "$HOME/daemon.pid")/root/ 2>&1 | head -1'; then echo OTHER-USER-READ; else echo OTHER-USER-REFUSED; fi
as 1500 'stop
start
podman run --name second --net=none --pull=never "$IMG" /bin/busybox sh -c "$(cat "$LIST")" > "$HOME/listing2"
podman rm second >/dev/null
podman rmi "$IMG" >/dev/null
stop'
`
	r := newRootless(t)
	r.killLeftovers(t)
	home := r.home
	env := []string{"UHOME=" + r.home, "URUN=" + r.run, "REGCONF=" + regConf, "LS=" + ls, "IMG=" + img.ref, "LIST=" + list,
		"USERFUNCS=" + user}
	argv := r.command(script)
	out, stderr, err := output(t.Context(), append(os.Environ(), env...), false, argv[0], argv[1:]...)
	read := func(name string) string {
		b, _ := os.ReadFile(filepath.Join(home, name))
		return string(b)
	}
	if err != nil {
		t.Fatalf("rootless run: %v\n%s%s\ndaemon log:\n%s", err, out, stderr, read("daemon.log"))
	}
	t.Logf("%s", out)
	sameListing(t, "rootless run", read("listing1"), refs[img.ref0])
	sameListing(t, "rootless run after a restart of the daemon", read("listing2"), refs[img.ref0])
	if n := strings.Count(read("additional"), "additionallayer"); n != count(img.legacy) {
		t.Errorf("%d layers taken from the store, want %d", n, count(img.legacy))
	}
	if !strings.Contains(out, "OTHER-USER-REFUSED") {
		t.Errorf("another user read the store")
	}
	if st := read("status.json"); !strings.Contains(st, string(img.layers[len(img.layers)-1])) {
		t.Errorf("status at the user's socket does not list the layer:\n%s", st)
	}
	t.Logf("doctor as the user:\n%s", read("doctor.txt"))
	if log := read("daemon.log"); !strings.Contains(log, "rootless: FUSE passthrough needs root") {
		t.Errorf("the daemon did not say why it reads files itself:\n%s", log)
	}
}
