package storefs

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
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

	"github.com/layerstore/layerstore/internal/testutil/testfuse"
)

// helperEnv makes the test binary run a helper (probe or overlay) instead of the tests.
const helperEnv = "LAYERSTORE_FS_TEST_HELPER"

// overlayRootEnv tells probe the root of the overlay, which "@" stands for in its paths.
const overlayRootEnv = "LAYERSTORE_FS_TEST_OVERLAY"

func TestMain(m *testing.M) {
	if h := os.Getenv(helperEnv); h != "" {
		os.Exit(runHelper(h, os.Args[1:]))
	}
	os.Exit(m.Run())
}

func runHelper(name string, args []string) int {
	switch name {
	case "probe":
		probeOps(os.Stdout, args)
		return 0
	case "resume-first", "resume-next":
		err := resumeFirst
		if name == "resume-next" {
			err = resumeNext
		}
		if err := err(); err != nil {
			fmt.Fprintln(os.Stderr, name+":", err)
			return 1
		}
		return 0
	case "exec":
		// execve itself, not execvp: a file the kernel refuses (ENOEXEC) is not then run as
		// a shell script.
		err := syscall.Exec(args[0], args[:1], nil)
		fmt.Fprintln(os.Stderr, "exec:", err)
		if errors.Is(err, syscall.ENOEXEC) {
			return 3
		}
		return 1
	case "overlay":
		if err := overlayProbe(args); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		return 0
	}
	fmt.Fprintf(os.Stderr, "unknown helper %q\n", name)
	return 2
}

// probeOps performs each "op:path" of ops (op stat, list, read or mmap) and writes one line
// "op:path errno" per op, errno 0 on success.
func probeOps(w *os.File, ops []string) {
	for _, o := range ops {
		op, path, _ := strings.Cut(o, ":")
		path = strings.ReplaceAll(path, "@", os.Getenv(overlayRootEnv))
		var err error
		switch op {
		case "stat":
			_, err = os.Stat(path)
		case "list":
			_, err = os.ReadDir(path)
		case "read":
			_, err = os.ReadFile(path)
		case "mmap":
			err = mmapRead(path)
		default:
			err = syscall.ENOSYS
		}
		var e syscall.Errno
		if err != nil && !errors.As(err, &e) {
			e = syscall.EIO
		}
		fmt.Fprintf(w, "%s %d\n", o, int(e))
	}
}

// mmapSink keeps the reads of mmapRead from being optimised away.
var mmapSink byte

// mmapRead maps the file at path and touches every page, so that its content is read by
// page faults of this process rather than by read(2).
func mmapRead(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return err
	}
	if fi.Size() == 0 {
		return syscall.ENODATA
	}
	b, err := syscall.Mmap(int(f.Fd()), 0, int(fi.Size()), syscall.PROT_READ, syscall.MAP_PRIVATE)
	if err != nil {
		return err
	}
	defer func() { _ = syscall.Munmap(b) }()
	for i := 0; i < len(b); i += os.Getpagesize() {
		mmapSink += b[i]
	}
	return nil
}

// overlayProbe runs in a private mount namespace: it mounts an overlay whose only lower
// layer is args[0], in the directory args[1], then runs probe as uid:gid args[2] with the
// ops args[3:], where "@" in a path stands for the overlay's root.
func overlayProbe(args []string) error {
	lower, dir, cred, ops := args[0], args[1], args[2], args[3:]
	uid, gid, err := parseCred(cred)
	if err != nil {
		return err
	}
	merged := filepath.Join(dir, "merged")
	for _, d := range []string{"upper", "work", "merged"} {
		if err := os.Mkdir(filepath.Join(dir, d), 0o755); err != nil {
			return err
		}
	}
	// The layer key holds ':', which separates lower layers: go through a symlink.
	link := filepath.Join(dir, "lower")
	if err := os.Symlink(lower, link); err != nil {
		return err
	}
	data := fmt.Sprintf("lowerdir=%s,upperdir=%s,workdir=%s", link, filepath.Join(dir, "upper"), filepath.Join(dir, "work"))
	if err := syscall.Mount("overlay", merged, "overlay", 0, data); err != nil {
		return fmt.Errorf("mount overlay: %w", err)
	}
	defer func() { _ = syscall.Unmount(merged, syscall.MNT_DETACH) }()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, os.Args[0], ops...)
	cmd.Env = append(os.Environ(), helperEnv+"=probe", overlayRootEnv+"="+merged)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uid, Gid: gid}}
	cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
	return cmd.Run()
}

func parseCred(s string) (uint32, uint32, error) {
	u, g, _ := strings.Cut(s, ":")
	uid, err1 := strconv.ParseUint(u, 10, 32)
	gid, err2 := strconv.ParseUint(g, 10, 32)
	if err := errors.Join(err1, err2); err != nil {
		return 0, 0, fmt.Errorf("credentials %q: %w", s, err)
	}
	return uint32(uid), uint32(gid), nil
}

// runHelperAs runs helper with args, as uid:gid unless cred is nil, in a private mount
// namespace when newNS, and returns the errno probe reported for each op.
func runHelperAs(t *testing.T, helper string, cred *syscall.Credential, newNS bool, args ...string) map[string]syscall.Errno {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, helperBinary(t), args...)
	cmd.Env = append(os.Environ(), helperEnv+"="+helper)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
	if newNS {
		// Go makes the new namespace's mounts private before running the helper.
		cmd.SysProcAttr.Unshareflags = syscall.CLONE_NEWNS
	}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("helper %s %q: %v: %s", helper, args, err, stderr.Bytes())
	}
	res := map[string]syscall.Errno{}
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		line := sc.Text()
		i := strings.LastIndexByte(line, ' ')
		n, err := strconv.Atoi(line[i+1:])
		if i < 0 || err != nil {
			t.Fatalf("helper %s: bad output line %q", helper, line)
		}
		res[line[:i]] = syscall.Errno(n)
	}
	return res
}

// helperBinary returns a copy of the test binary that every user may run.
func helperBinary(t *testing.T) string {
	t.Helper()
	self, err := os.ReadFile(os.Args[0])
	if err != nil {
		t.Fatal(err)
	}
	dir := testfuse.OpenTempDir(t)
	bin := filepath.Join(dir, "helper")
	if err := os.WriteFile(bin, self, 0o755); err != nil {
		t.Fatal(err)
	}
	return bin
}

// nobody is the credential of the other local user in these tests.
var nobody = &syscall.Credential{Uid: 65534, Gid: 65534}

// otherUserOps are the accesses another local user tries: every part of the namespace, a
// layer root has already resolved (so its entries are in the kernel's caches), a layer
// nobody resolved yet, and a reference nobody looked up yet.
func otherUserOps(mnt string, key digest.Digest) []string {
	unknown := digest.Digest("sha256:" + strings.Repeat("ab", 32))
	return []string{
		"stat:" + mnt,
		"list:" + mnt,
		"stat:" + filepath.Join(mnt, refDirName(testRef)),
		"stat:" + layerPath(mnt, testRef, key),
		"list:" + layerPath(mnt, testRef, key),
		"list:" + layerPath(mnt, testRef, key, "diff"),
		"stat:" + layerPath(mnt, testRef, key, "diff", "etc", "hostname"),
		"read:" + layerPath(mnt, testRef, key, "diff", "etc", "hostname"),
		"read:" + layerPath(mnt, testRef, key, "info"),
		"read:" + layerPath(mnt, testRef, key, "blob"),
		"stat:" + layerPath(mnt, testRef, unknown, "diff"),
		"stat:" + layerPath(mnt, "docker.io/library/private:latest", key, "diff"),
	}
}

// TestOtherUsersCannotUseTheStore checks that a local user other than root can neither
// look up a reference nor read anything under the mount, and never makes the Store
// resolve a layer, even for a layer root has just used.
func TestOtherUsersCannotUseTheStore(t *testing.T) {
	l := newTestLayer(t, fixture(t, "zstdchunked-modern"))
	m := mountLayer(t, l, defaultConfig())
	m.store.add("docker.io/library/private:latest", l)
	// Root (the runtime) uses the layer first.
	for _, p := range []string{m.path("diff", "etc", "hostname"), m.path("blob")} {
		if _, err := os.ReadFile(p); err != nil {
			t.Fatalf("root: %v", err)
		}
	}
	before := m.store.totalLookups()
	res := runHelperAs(t, "probe", nobody, false, otherUserOps(m.mnt, l.tocKey)...)
	for _, o := range otherUserOps(m.mnt, l.tocKey) {
		if e, ok := res[o]; !ok || e != syscall.EACCES {
			t.Errorf("uid 65534: %s: errno %d (%v), want EACCES", o, e, e)
		}
	}
	if n := m.store.totalLookups() - before; n != 0 {
		t.Errorf("uid 65534 made the store look up %d layers, want 0", n)
	}
}

// TestDaemonRefusesOtherUsers checks the daemon's own check, behind the kernel's: when
// requests of another user reach it (a mount with allow_other), lookups of layers, use,
// rmdir, info and blob answer EACCES and never reach the Store.
func TestDaemonRefusesOtherUsers(t *testing.T) {
	l := newTestLayer(t, fixture(t, "zstdchunked-modern"))
	opts := defaultConfig()
	opts.allowOther = true
	m := mountLayer(t, l, opts)
	m.store.add("docker.io/library/private:latest", l)
	if _, err := os.ReadFile(m.path("diff", "etc", "hostname")); err != nil {
		t.Fatalf("root: %v", err)
	}
	before := m.store.totalLookups()
	ops := otherUserOps(m.mnt, l.tocKey)
	res := runHelperAs(t, "probe", nobody, false, ops...)
	// What the kernel answers from its caches (the store root and the reference directory
	// root looked up) may succeed; everything from the layer directories down must not.
	for _, o := range ops[4:] {
		if e := res[o]; e != syscall.EACCES {
			t.Errorf("uid 65534: %s: errno %d (%v), want EACCES", o, e, e)
		}
	}
	if n := m.store.totalLookups() - before; n != 0 {
		t.Errorf("uid 65534 made the store look up %d layers, want 0", n)
	}
	// use and rmdir, which the kernel lets through to the daemon for a directory the
	// caller may write: the daemon refuses them.
	ctx := t.Context()
	for _, argv := range [][]string{
		{"/bin/touch", m.path("use")},
		{"/bin/rmdir", m.path()},
	} {
		if _, err := os.Stat(argv[0]); err != nil {
			t.Logf("skipping %s: %v", argv[0], err)
			continue
		}
		cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: nobody}
		if out, err := cmd.CombinedOutput(); err == nil {
			t.Errorf("uid 65534: %q succeeded: %s", argv, out)
		}
	}
	if u, r := m.store.count(m.store.uses, testRef, l.tocKey), m.store.count(m.store.releases, testRef, l.tocKey); u != 0 || r != 0 {
		t.Errorf("uid 65534 made the store count %d uses and %d releases, want none", u, r)
	}
}

// TestOverlayReadsAsOtherUsers checks that processes of any uid read a layer through
// overlayfs (as containers do) while the same paths are closed to them directly, that the
// tree's modes and owners apply to them through the overlay, and records which uid the
// daemon sees for their reads. home/user is 0750 1000:2000 and home/user/notes.txt 0640
// 1000:2000 in the fixture.
func TestOverlayReadsAsOtherUsers(t *testing.T) {
	l := newTestLayer(t, fixture(t, "zstdchunked-modern"))
	opts := defaultConfig()
	opts.Passthrough = false // every read reaches the daemon
	m := mountLayer(t, l, opts)
	diff := m.path("diff")
	if _, err := os.Stat(diff); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		uid, gid uint32
		want     map[string]syscall.Errno
	}{
		{1000, 1000, map[string]syscall.Errno{
			"read:@/etc/hostname":            0,
			"list:@/usr/share/doc/deep/er":   0,
			"mmap:@/usr/share/big.bin":       0,
			"read:@/home/user/notes.txt":     0, // owner rw-
			"read:" + diff + "/etc/hostname": syscall.EACCES,
			"list:" + diff:                   syscall.EACCES,
		}},
		{3000, 2000, map[string]syscall.Errno{
			"list:@/home/user":           0, // group r-x
			"read:@/home/user/notes.txt": 0, // group r--
		}},
		{3000, 3000, map[string]syscall.Errno{
			"read:@/usr/share/doc/deep/er/README": 0,
			"list:@/home/user":                    syscall.EACCES, // other ---
			"read:@/home/user/notes.txt":          syscall.EACCES,
		}},
	} {
		ops := make([]string, 0, len(c.want))
		for o := range c.want {
			ops = append(ops, o)
		}
		slices.Sort(ops)
		args := append([]string{diff, testfuse.OpenTempDir(t), fmt.Sprintf("%d:%d", c.uid, c.gid)}, ops...)
		res := runHelperAs(t, "overlay", nil, true, args...)
		for _, o := range ops {
			if e, ok := res[o]; !ok || e != c.want[o] {
				t.Errorf("uid %d gid %d: %s: errno %d (%v), want %d (%v)", c.uid, c.gid, o, e, e, c.want[o], c.want[o])
			}
		}
	}
	l.mu.Lock()
	var paths []string
	for id := range l.reads {
		paths = append(paths, l.Index().Path(id))
	}
	readers := fmt.Sprint(l.readers, paths)
	n := len(l.readers)
	l.mu.Unlock()
	// Observed on Linux 6.18: read(2) through the overlay reaches the daemon as uid 0 (the
	// overlay's mounter), page faults of a mapped file as the faulting process's uid.
	t.Logf("uids of the FUSE reads reaching the daemon (uid: reads), files read: %v", readers)
	if n == 0 {
		t.Error("no read reached the daemon: the test proves nothing")
	}
}
