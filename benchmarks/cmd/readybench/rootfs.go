package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// stamp records that a build step finished, with what it built from; a step whose stamp is
// missing or has another key is redone.
type stamp struct {
	Key     string    `json:"key"`
	Seconds float64   `json:"seconds"` // how long the step took when it ran
	Built   time.Time `json:"built"`
	Size    int64     `json:"size,omitempty"`
	Digest  string    `json:"digest,omitempty"`
	Files   int       `json:"files,omitempty"`
}

func readStamp(p, key string) (stamp, bool) {
	var s stamp
	b, err := os.ReadFile(p)
	if err != nil || json.Unmarshal(b, &s) != nil || s.Key != key {
		return stamp{}, false
	}
	return s, true
}

func writeStamp(p string, s stamp) error {
	b, err := json.MarshalIndent(s, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(p, append(b, '\n'), 0o644)
}

// command runs a command in its own process group, its output appended to logPath; on
// cancellation the whole group is killed (debootstrap and apt start children).
func command(ctx context.Context, logPath string, name string, args ...string) error {
	lf, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	defer lf.Close()
	fmt.Fprintf(lf, "\n$ %s %s\n", name, strings.Join(args, " "))
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Stdout, cmd.Stderr = lf, lf
	cmd.Env = append(os.Environ(), "DEBIAN_FRONTEND=noninteractive", "LC_ALL=C")
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = 10 * time.Second
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("%s: %w (log: %s)\n%s", name, err, logPath, tail(logPath, 1500))
	}
	return nil
}

func tail(p string, n int) string {
	b, _ := os.ReadFile(p)
	if len(b) > n {
		b = b[len(b)-n:]
	}
	return string(b)
}

// privateNS runs a shell script in a new mount namespace: every mount it makes disappears
// with it, whatever happens. --kill-child ends the script if unshare is killed.
func privateNS(ctx context.Context, logPath, script string, args ...string) error {
	return command(ctx, logPath, "unshare", append([]string{"--mount", "--propagation", "private", "--fork", "--kill-child",
		"sh", "-euc", script, "readybench"}, args...)...)
}

// buildRootfs makes the tree of layer r under dir/rootfs/<name>: debootstrap for the base,
// otherwise the upper directory of an overlay mount on its parents in which apt-get installed
// the packages (so it holds exactly what the installation added or changed, whiteouts
// included).
func (c *imageCache) buildRootfs(ctx context.Context, r layerRecipe) (stamp, error) {
	dir := filepath.Join(c.dir, "rootfs", r.name)
	stampPath := dir + ".json"
	if s, ok := readStamp(stampPath, r.key()); ok {
		return s, nil
	}
	if err := os.RemoveAll(dir); err != nil {
		return stamp{}, err
	}
	logPath := filepath.Join(c.dir, "build.log")
	start := time.Now()
	if r.parent == "" {
		if _, err := exec.LookPath("debootstrap"); err != nil {
			return stamp{}, errors.New("debootstrap not found: apt-get install -y debootstrap")
		}
		fmt.Fprintf(os.Stderr, "debootstrap --variant=minbase %s (about a minute)\n", suite)
		// In a private mount namespace: debootstrap mounts /proc and /sys in the target.
		err := privateNS(ctx, logPath, `debootstrap --variant=minbase "$1" "$2" "$3"`, suite, dir, mirror)
		if err != nil {
			return stamp{}, err
		}
		// What a base image leaves out: downloaded packages and indexes, device nodes (the
		// runtime mounts its own /dev), the build host's DNS configuration.
		for _, pattern := range []string{"var/cache/apt/archives/*.deb", "var/cache/apt/*.bin", "var/lib/apt/lists/*", "dev/*"} {
			m, _ := filepath.Glob(filepath.Join(dir, pattern))
			for _, p := range m {
				if err := os.RemoveAll(p); err != nil {
					return stamp{}, err
				}
			}
		}
		if err := os.WriteFile(filepath.Join(dir, "etc/resolv.conf"), nil, 0o644); err != nil {
			return stamp{}, err
		}
	} else {
		fmt.Fprintf(os.Stderr, "installing %s on %s (layer %s)\n", strings.Join(r.packages, " "), r.parent, r.name)
		work := dir + ".work"
		merged := dir + ".merged"
		for _, d := range []string{dir, work, merged} {
			if err := os.MkdirAll(d, 0o755); err != nil {
				return stamp{}, err
			}
		}
		defer os.RemoveAll(work)
		defer os.Remove(merged)
		const script = `lower=$1 upper=$2 work=$3 m=$4; shift 4
mount -t overlay overlay -o "lowerdir=$lower,upperdir=$upper,workdir=$work" "$m"
mount -t proc proc "$m/proc"
mount -t tmpfs tmpfs "$m/tmp"
mount --rbind /dev "$m/dev"
mount --bind /etc/resolv.conf "$m/etc/resolv.conf"
chroot "$m" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root LC_ALL=C DEBIAN_FRONTEND=noninteractive \
  sh -euc 'apt-get update -qq; apt-get install -y -qq --no-install-recommends "$@"; apt-get clean; rm -rf /var/lib/apt/lists/*' apt "$@"`
		err := privateNS(ctx, logPath, script, append([]string{c.lowerDirs(r.parent), dir, work, merged}, r.packages...)...)
		if err != nil {
			return stamp{}, err
		}
	}
	if p := firstGoFile(dir); p != "" {
		os.RemoveAll(dir)
		return stamp{}, fmt.Errorf("layer %s holds Go sources (%s): choose other packages, the image cache and podman's "+
			"storage are under the module, where `go vet ./...` and `gofmt -l .` would take them for its own", r.name, p)
	}
	s := stamp{Key: r.key(), Seconds: time.Since(start).Seconds(), Built: time.Now()}
	return s, writeStamp(stampPath, s)
}

// firstGoFile returns a .go file under dir, or "".
func firstGoFile(dir string) string {
	found := ""
	filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() && strings.HasSuffix(d.Name(), ".go") {
			found = p
			return fs.SkipAll
		}
		return nil
	})
	return found
}

// lowerDirs is the overlay lowerdir option for the layers of name (top first).
func (c *imageCache) lowerDirs(name string) string {
	var dirs []string
	for _, l := range chain(name) {
		dirs = append(dirs, filepath.Join(c.dir, "rootfs", l))
	}
	return strings.Join(dirs, ":")
}

// recordProfile runs the image's workload in a chroot of its layers under strace and returns
// the regular files it opened or executed, in the order of first use, as paths in the image.
//
// strace -f -e trace=%file records every path the workload's processes hand to the kernel;
// only open, openat, openat2, creat, execve and execveat read a file's content, so only those
// make the profile (a stat or readlink needs the TOC, which a lazy pull has anyway).
// Paths are resolved in the image (symbolic links followed across the layers), and kept if
// they name a regular file of the image; files the workload creates (in /tmp) are not in it.
func (c *imageCache) recordProfile(ctx context.Context, img imageSpec) ([]string, stamp, error) {
	top := img.layers[len(img.layers)-1]
	r, _ := recipeByName(top)
	key := profileVersion + " " + r.key() + " " + strings.Join(img.cmd, "\x00")
	p := filepath.Join(c.dir, "profiles", img.name)
	if s, ok := readStamp(p+".json", key); ok {
		b, err := os.ReadFile(p + ".txt")
		if err == nil {
			return strings.Fields(string(b)), s, nil
		}
	}
	fmt.Fprintf(os.Stderr, "recording the file profile of %s under strace\n", img.name)
	tmp, err := os.MkdirTemp(c.dir, "profile-")
	if err != nil {
		return nil, stamp{}, err
	}
	defer os.RemoveAll(tmp)
	for _, d := range []string{"upper", "work", "merged", "trace"} {
		if err := os.MkdirAll(filepath.Join(tmp, d), 0o755); err != nil {
			return nil, stamp{}, err
		}
	}
	const script = `lower=$1 t=$2; shift 2
m=$t/merged
mount -t overlay overlay -o "lowerdir=$lower,upperdir=$t/upper,workdir=$t/work" "$m"
mount -t proc proc "$m/proc"
mount -t tmpfs tmpfs "$m/tmp"
mount --rbind /dev "$m/dev"
cd /
strace -ff -ttt -qq -z -e trace=%file,execve -o "$t/trace/t" env -i HOME=/root "$@" > "$t/stdout"`
	env := append([]string{}, imageEnv...)
	start := time.Now()
	logPath := filepath.Join(c.dir, "build.log")
	args := append([]string{c.lowerDirs(top), tmp}, env...)
	args = append(args, "chroot", filepath.Join(tmp, "merged"))
	if err := privateNS(ctx, logPath, script, append(args, img.cmd...)...); err != nil {
		return nil, stamp{}, err
	}
	out, _ := os.ReadFile(filepath.Join(tmp, "stdout"))
	if !readyIn(string(out), img.ready) {
		return nil, stamp{}, fmt.Errorf("%s: the workload did not print %q in the chroot; it printed %q", img.name, img.ready, out)
	}
	opened, err := parseStrace(filepath.Join(tmp, "trace"))
	if err != nil {
		return nil, stamp{}, err
	}
	var layerDirs []string
	for _, l := range chain(top) {
		layerDirs = append(layerDirs, filepath.Join(c.dir, "rootfs", l))
	}
	var files []string
	seen := map[string]bool{}
	for _, o := range opened {
		f, ok := resolveInLayers(layerDirs, o)
		if ok && !seen[f] {
			seen[f] = true
			files = append(files, f)
		}
	}
	if len(files) == 0 {
		return nil, stamp{}, fmt.Errorf("%s: the profile is empty (strace saw %d paths)", img.name, len(opened))
	}
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		return nil, stamp{}, err
	}
	if err := os.WriteFile(p+".txt", []byte(strings.Join(files, "\n")+"\n"), 0o644); err != nil {
		return nil, stamp{}, err
	}
	s := stamp{Key: key, Seconds: time.Since(start).Seconds(), Built: time.Now(), Files: len(files)}
	return files, s, writeStamp(p+".json", s)
}

// profileVersion changes when recordProfile records differently.
const profileVersion = "2"

func readyIn(out, ready string) bool {
	for _, l := range strings.Split(out, "\n") {
		if strings.HasPrefix(l, ready) {
			return true
		}
	}
	return false
}

// contentSyscalls are the calls that read (or execute) the file they name.
var contentSyscalls = map[string]bool{"open": true, "openat": true, "openat2": true, "creat": true, "execve": true, "execveat": true}

// parseStrace reads the per-process files of `strace -ff -ttt -z` and returns the paths of
// content syscalls, ordered by time. The first process runs env and chroot on the host: its
// calls before chroot(2) name files of the host and are skipped.
func parseStrace(dir string) ([]string, error) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	type call struct {
		t    float64
		path string
	}
	var calls []call
	first := -1
	for _, e := range ents {
		if pid, err := strconv.Atoi(strings.TrimPrefix(path.Ext(e.Name()), ".")); err == nil && (first < 0 || pid < first) {
			first = pid
		}
	}
	for _, e := range ents {
		f, err := os.Open(filepath.Join(dir, e.Name()))
		if err != nil {
			return nil, err
		}
		inImage := e.Name() != fmt.Sprintf("t.%d", first)
		sc := bufio.NewScanner(f)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			ts, rest, ok := strings.Cut(sc.Text(), " ")
			if !ok {
				continue
			}
			name, args, ok := strings.Cut(rest, "(")
			if !ok {
				continue
			}
			if name == "chroot" {
				inImage = true
				continue
			}
			if !inImage || !contentSyscalls[name] {
				continue
			}
			p, ok := firstQuoted(args)
			if !ok {
				continue
			}
			t, _ := strconv.ParseFloat(ts, 64)
			calls = append(calls, call{t, p})
		}
		f.Close()
		if err := sc.Err(); err != nil {
			return nil, err
		}
	}
	slices.SortStableFunc(calls, func(a, b call) int {
		switch {
		case a.t < b.t:
			return -1
		case a.t > b.t:
			return 1
		}
		return 0
	})
	out := make([]string, len(calls))
	for i, c := range calls {
		out[i] = c.path
	}
	return out, nil
}

// firstQuoted returns the first string argument strace printed ("..."), unescaped.
func firstQuoted(s string) (string, bool) {
	i := strings.IndexByte(s, '"')
	if i < 0 {
		return "", false
	}
	for j := i + 1; j < len(s); j++ {
		switch s[j] {
		case '\\':
			j++
		case '"':
			u, err := strconv.Unquote(s[i : j+1])
			return u, err == nil
		}
	}
	return "", false
}

// resolveInLayers resolves p (relative paths start at /, the workloads' directory) in the
// merged view of layers (top first), following symbolic links, and returns the file's path
// in the image without the leading slash if it is a regular file.
func resolveInLayers(layers []string, p string) (string, bool) {
	rest := strings.Split(strings.Trim(path.Clean("/"+p), "/"), "/")
	var cur []string
	for hops := 0; len(rest) > 0; {
		comp := rest[0]
		rest = rest[1:]
		switch comp {
		case "", ".":
			continue
		case "..":
			if len(cur) > 0 {
				cur = cur[:len(cur)-1]
			}
			continue
		}
		rel := path.Join(append(slices.Clone(cur), comp)...)
		fi, layer, ok := lstatInLayers(layers, rel)
		if !ok {
			return "", false
		}
		if fi.Mode()&fs.ModeSymlink != 0 {
			if hops++; hops > 40 {
				return "", false
			}
			target, err := os.Readlink(filepath.Join(layer, rel))
			if err != nil {
				return "", false
			}
			if strings.HasPrefix(target, "/") {
				cur = nil
			}
			rest = append(strings.Split(target, "/"), rest...)
			continue
		}
		cur = append(cur, comp)
		if len(rest) == 0 {
			return rel, fi.Mode().IsRegular()
		}
	}
	return "", false
}

// lstatInLayers finds rel in the topmost layer holding it; an overlay whiteout (a 0:0
// character device) hides it.
func lstatInLayers(layers []string, rel string) (fs.FileInfo, string, bool) {
	for _, l := range layers {
		fi, err := os.Lstat(filepath.Join(l, rel))
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return nil, "", false
		}
		if fi.Mode()&fs.ModeCharDevice != 0 {
			if st, ok := fi.Sys().(*syscall.Stat_t); ok && st.Rdev == 0 {
				return nil, "", false
			}
		}
		return fi, l, true
	}
	return nil, "", false
}

// dirSize is the apparent size of the regular files under dir.
func dirSize(dir string) int64 {
	var n int64
	filepath.WalkDir(dir, func(_ string, d fs.DirEntry, err error) error {
		if err == nil && d.Type().IsRegular() {
			if fi, err := d.Info(); err == nil {
				n += fi.Size()
			}
		}
		return nil
	})
	return n
}

// dropCaches writes back dirty pages and empties the page cache, dentries and inodes.
func dropCaches() error {
	unix.Sync()
	return os.WriteFile("/proc/sys/vm/drop_caches", []byte("3\n"), 0o200)
}
