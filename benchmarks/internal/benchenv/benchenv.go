// Package benchenv is what the benchmarks share about where they run and what they report:
// the machine (CPU, cores, memory, kernel, load), the Go toolchain, the layerstore version,
// the tools measured and the filesystem of the work directory, for a report's header; the
// layerstore module the benchmark measures and its work directory; and the report's file (the
// -out flag), benchmarks/results/<date>-<name>/<name>.md by default. Its functions keep no state
// and are safe for concurrent use (the flags' are for main, before flag.Parse).
package benchenv

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Machine returns the report's header lines: date, CPU, cores, memory, kernel, Go, the
// layerstore version (see DaemonVersion), the filesystem holding work and the load average now.
func Machine(modDir, work, daemon string) []string {
	var u unix.Utsname
	_ = unix.Uname(&u)
	return []string{
		"date: " + time.Now().Format(time.RFC3339),
		"CPU: " + cpuModel(),
		fmt.Sprintf("cores: %d", runtime.NumCPU()),
		"memory: " + memTotal(),
		"kernel: " + unix.ByteSliceToString(u.Release[:]),
		"Go: " + runtime.Version(),
		"layerstore: " + DaemonVersion(modDir, daemon),
		"work directory: " + FSOf(work),
		"load average at start: " + Loadavg(),
	}
}

// ToolVersion is the first line of what `name args...` prints (a tool's version), or "not
// installed" when it cannot run.
func ToolVersion(name string, args ...string) string {
	out, err := exec.Command(name, args...).Output()
	if err != nil {
		return "not installed"
	}
	return strings.SplitN(strings.TrimSpace(string(out)), "\n", 2)[0]
}

func cpuModel() string {
	f, err := os.Open("/proc/cpuinfo")
	if err != nil {
		return "?"
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if k, v, ok := strings.Cut(sc.Text(), ":"); ok && strings.TrimSpace(k) == "model name" {
			return strings.TrimSpace(v)
		}
	}
	return "?"
}

func memTotal() string {
	b, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return "?"
	}
	return strings.Join(strings.Fields(strings.SplitN(string(b), "\n", 2)[0])[1:], " ")
}

// DaemonVersion names the layerstore that runs: the binary daemon's own version when a
// benchmark is given one (-daemon; `layerstore version`, set at build time), since the module
// may have moved on since it was built; otherwise the module's (Version), which the benchmark
// builds the daemon from.
func DaemonVersion(modDir, daemon string) string {
	if daemon == "" {
		return Version(modDir) + " (`git describe --always`)"
	}
	out, err := exec.Command(daemon, "version").Output()
	if v := strings.TrimPrefix(strings.TrimSpace(string(out)), "layerstore "); err == nil && v != "" && v != "dev" {
		return v + " (`layerstore version` of the -daemon binary)"
	}
	return "unknown: the -daemon binary was built without a version (the module is at " + Version(modDir) + ")"
}

// Version names the checked-out commit, with "-dirty" when tracked files other than the
// results differ from it (a benchmark writing its results must not mark the next one dirty).
func Version(modDir string) string {
	git := func(args ...string) (string, error) {
		cmd := exec.Command("git", args...)
		cmd.Dir = modDir
		out, err := cmd.Output()
		return strings.TrimSpace(string(out)), err
	}
	v, err := git("describe", "--always")
	if err != nil {
		return "?"
	}
	if changed, err := git("status", "--porcelain", "--untracked-files=no", "--", ".", ":(exclude)benchmarks/results"); err != nil || changed != "" {
		v += "-dirty"
	}
	return v
}

// Loadavg returns the 1, 5 and 15 minute load averages: other work on the machine skews
// every figure.
func Loadavg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	return strings.Join(strings.Fields(string(b))[:3], " ")
}

// FSOf names the filesystem holding p, from /proc/self/mounts.
func FSOf(p string) string {
	b, err := os.ReadFile("/proc/self/mounts")
	if err != nil {
		return "?"
	}
	best, desc := "", "?"
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) < 3 {
			continue
		}
		mp := f[1]
		if (p == mp || strings.HasPrefix(p, strings.TrimSuffix(mp, "/")+"/")) && len(mp) >= len(best) {
			best, desc = mp, fmt.Sprintf("%s (%s, mounted at %s)", f[0], f[2], mp)
		}
	}
	return desc
}

// ModuleDir returns the root of the layerstore module: the daemon is built, and the
// results written, there. The benchmarks are their own module, which finds it by its
// replace directive; run them from inside the benchmarks module.
func ModuleDir() (string, error) {
	out, err := exec.Command("go", "list", "-m", "-f", "{{.Dir}}", "github.com/layerstore/layerstore").Output()
	dir := strings.TrimSpace(string(out))
	if err != nil || dir == "" {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			err = fmt.Errorf("%w: %s", err, bytes.TrimSpace(ee.Stderr))
		}
		return "", fmt.Errorf("finding the layerstore module (run from inside benchmarks/): %v", err)
	}
	return dir, nil
}

// Run runs a benchmark's body until it returns, ^C or SIGTERM arrives or timeout (its
// -timeout) passes, and exits with status 1 and the error when it fails.
func Run(name string, timeout time.Duration, run func(context.Context) error) {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	ctx, cancel := context.WithTimeout(ctx, timeout)
	err := run(ctx)
	cancel()
	stop()
	if err != nil {
		fmt.Fprintf(os.Stderr, "%s: FAIL: %v\n", name, err)
		os.Exit(1)
	}
}

// WorkDir is where the benchmarks keep what they build and reuse (layer blobs, images) and
// their temporary directories by default: benchmarks/work in the module at modDir.
func WorkDir(modDir string) string { return filepath.Join(modDir, "benchmarks", "work") }

// Header is the top of benchmark name's report: the title, the command line that ran it and
// the machine (the lines of Machine and the like, then the load average now, at the end). A
// report may add lines about the machine or the run right after it.
func Header(title, name string, machine []string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "# %s\n\n", title)
	fmt.Fprintf(&b, "Command: `%s`\n\n", strings.TrimSpace("cd benchmarks && go run ./cmd/"+name+" "+strings.Join(os.Args[1:], " ")))
	fmt.Fprintf(&b, "## Machine\n\n")
	for _, m := range machine {
		fmt.Fprintf(&b, "- %s\n", m)
	}
	fmt.Fprintf(&b, "- load average at the end: %s\n", Loadavg())
	return b.String()
}

// OutFlag defines -out, the file benchmark name writes its report to (see ReportPath); beside
// names what else goes next to it, if anything (", and the plots next to it").
func OutFlag(p *string, name, beside string) {
	flag.StringVar(p, "out", "", "write the report (Markdown) here"+beside+"; default benchmarks/results/<date>-"+name+"/"+name+".md in the module, \"-\" for none")
}

// ReportPath is the file benchmark name writes its report to: out (its -out flag) when set,
// none ("") for "-", by default benchmarks/results/<date>-<name>/<name>.md in the module at modDir:
// each run in a folder of its own, beside whatever else it writes (readybench's plots).
func ReportPath(modDir, name, out string) string {
	switch out {
	case "":
		return filepath.Join(modDir, "benchmarks", "results", time.Now().Format("2006-01-02")+"-"+name, name+".md")
	case "-":
		return ""
	}
	return out
}

// WriteReport prints the report text on stdout and writes it to path (see ReportPath),
// creating its directory; "" writes no file.
func WriteReport(path, text string) error {
	fmt.Print(text)
	if path == "" {
		return nil
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
		return err
	}
	fmt.Fprintln(os.Stderr, "results written to", path)
	return nil
}

// Median of xs; 0 for none.
func Median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}
