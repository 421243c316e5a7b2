package e2e

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/opencontainers/go-digest"

	"github.com/layerstore/layerstore/internal/testutil/testfuse"
)

// nonRootFiles are world-readable files of the reference layer that containers of any user
// read in TestNonRootContainers.
var nonRootFiles = []string{"t/etc/hostname", "t/usr/bin/tool", "t/usr/share/big.bin", "t/usr/share/doc/deep/er/README"}

// TestNonRootContainers: containers whose processes are not root read a lazily served image
// through the store, the image's own busybox included (executed from the store), while the
// same users on the host are refused by the mount. Containers run as uid 1000, as uid 1000
// in a user namespace given explicitly (--uidmap, which needs no /etc/subuid), and with
// --userns=auto (with subordinate ids for the "containers" user: withContainersUser).
func TestNonRootContainers(t *testing.T) {
	s := need(t)
	refs := s.references(t)
	d := s.startDaemon(t)
	p := s.newPodman(t, d.mnt)
	img := s.images[imgEStargz]
	t.Cleanup(func() { p.try(t, "rmi", "--force", img.ref) })
	mark := s.open.Mark()
	p.must(t, "pull", img.ref)
	checkPull(t, img, s.open.BlobGets(mark), func(d digest.Digest) bool { return img.legacy[d] })
	if n := fromStore(t, filepath.Join(p.dir, "graph")); n != count(img.legacy) || n == 0 {
		t.Fatalf("%d layers taken from the store, want %d", n, count(img.legacy))
	}

	// The expected sha256 of each file, from the reference listing.
	var want []string
	for _, f := range nonRootFiles {
		sum := ""
		for _, line := range strings.Split(refs[imgGzip], "\n") {
			if fields := strings.Fields(line); len(fields) == 8 && fields[0] == f {
				sum = fields[7]
			}
		}
		if sum == "" {
			t.Fatalf("%s is not a file of the reference listing", f)
		}
		want = append(want, sum+"  /"+f)
	}
	script := "/bin/busybox id -u; /bin/busybox sha256sum /" + strings.Join(nonRootFiles, " /")

	for _, c := range []struct {
		name, uid string
		args      []string
		auto      bool
	}{
		{name: "user-1000", uid: "1000", args: []string{"--user", "1000:1000"}},
		{name: "uidmap", uid: "1000", args: []string{"--uidmap", "0:300000:65536", "--gidmap", "0:300000:65536", "--user", "1000:1000"}},
		{name: "userns-auto", uid: "0", args: []string{"--userns=auto"}, auto: true},
	} {
		t.Run(c.name, func(t *testing.T) {
			p.containers++
			name := fmt.Sprintf("nonroot-%d", p.containers)
			args := append([]string{"run", "--name", name, "--net=none"}, c.args...)
			args = append(args, img.ref, "/bin/busybox", "sh", "-c", script)
			cmd := append([]string{p.bin}, args...)
			if c.auto {
				cmd = withContainersUser(t, cmd, d.mnt)
			}
			start := time.Now()
			out, stderr, err := output(t.Context(), p.env, false, cmd[0], cmd[1:]...)
			t.Logf("podman run %s: %s", strings.Join(c.args, " "), time.Since(start).Round(time.Millisecond))
			if err != nil {
				t.Fatalf("podman run %s: %v\n%s%s", strings.Join(c.args, " "), err, out, stderr)
			}
			// podman 4.3 may fail to remove a user-namespaced container's shm mount; the
			// storage is reset when the test ends anyway.
			if out, err := p.try(t, "rm", "--force", name); err != nil {
				t.Logf("podman rm: %v: %s", err, out)
			}
			layers, _ := filepath.Glob(filepath.Join(p.dir, "graph", "overlay", "*", "diff"))
			t.Logf("%d layers in c/storage, %d of them from the store", len(layers), fromStore(t, filepath.Join(p.dir, "graph")))
			lines := strings.Split(strings.TrimSpace(out), "\n")
			if got := strings.Join(lines, "\n"); got != strings.Join(append([]string{c.uid}, want...), "\n") {
				t.Errorf("in the container (%s):\n%s\nwant uid %s and\n%s", strings.Join(c.args, " "), got, c.uid, strings.Join(want, "\n"))
			}
		})
	}

	// Directly, the same users get nothing from the mount, not even a lookup of the layers
	// the containers use.
	for l := range served(img.legacy) {
		for _, path := range []string{
			filepath.Join(d.layerDir(img.ref, l), "diff", "t", "etc", "hostname"),
			filepath.Join(d.layerDir(img.ref, l), "blob"),
			filepath.Join(d.layerDir(img.ref, l), "info"),
		} {
			cmd := exec.CommandContext(t.Context(), "cat", path)
			cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 1000, Gid: 1000}}
			cmd.WaitDelay = 10 * time.Second
			if out, err := cmd.CombinedOutput(); err == nil || !strings.Contains(string(out), "Permission denied") {
				t.Errorf("uid 1000 on the host: cat %s: %v: %.200s; want permission denied", path, err, out)
			}
		}
	}
}

// withContainersUser returns argv run so that --userns=auto finds subordinate ids for the
// "containers" user, as podman's documentation sets them up: where the machine's /etc/subuid
// has none, argv runs in a private mount namespace in which /etc/subuid, /etc/subgid,
// /etc/passwd and /etc/group are copies that add them (the machine's files are untouched).
// The namespace keeps the FUSE mounts at keep (the store argv's runtime reads) and detaches
// the other FUSE mounts it inherits, other tests', whose connections it would keep alive
// after their unmounts for as long as the container runs.
func withContainersUser(t *testing.T, argv []string, keep ...string) []string {
	t.Helper()
	subuid, _ := os.ReadFile("/etc/subuid")
	subgid, _ := os.ReadFile("/etc/subgid")
	if strings.Contains("\n"+string(subuid), "\ncontainers:") && strings.Contains("\n"+string(subgid), "\ncontainers:") {
		return argv
	}
	dir := t.TempDir()
	script := testfuse.DetachScript(keep...)
	for _, f := range []struct{ name, add string }{
		{"subuid", "containers:2147483647:2147483648\n"},
		{"subgid", "containers:2147483647:2147483648\n"},
		{"passwd", "containers:x:999:999:containers:/nonexistent:/usr/sbin/nologin\n"},
		{"group", "containers:x:999:\n"},
	} {
		target := "/etc/" + f.name
		old, err := os.ReadFile(target)
		if err != nil {
			t.Skipf("skipping: --userns=auto needs %s to exist: %v", target, err)
		}
		if f.name == "passwd" || f.name == "group" {
			if strings.Contains("\n"+string(old), "\ncontainers:") {
				continue
			}
		}
		if len(old) > 0 && old[len(old)-1] != '\n' {
			old = append(old, '\n')
		}
		copyPath := filepath.Join(dir, f.name)
		if err := os.WriteFile(copyPath, append(old, f.add...), 0o644); err != nil {
			t.Fatal(err)
		}
		script += fmt.Sprintf("mount --bind %q %q && ", copyPath, target)
	}
	return append([]string{"unshare", "--mount", "--propagation", "private", "sh", "-c", script + `exec "$@"`, "sh"}, argv...)
}
