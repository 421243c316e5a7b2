package main

// layerstore doctor: checks a node's setup end to end and says what to fix. Each check is a
// function of the paths it looks at, so that tests can point it at temporary files; anything
// that can hang (a FUSE mount whose server does not answer, a runtime binary, the control
// socket) is bounded in time.

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"os/user"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"golang.org/x/sys/unix"

	storefs "github.com/layerstore/layerstore/fs"
	"github.com/layerstore/layerstore/internal/control/protocol"
)

const doctorUsage = `usage: layerstore doctor [flags]

Check this node's setup end to end and say what to fix: the daemon, its mount, storage.conf,
the auth helper in registries.conf, the installed runtimes, the kernel, the cache directory and
the runtime's layers that depend on the store. Exit status: 0 when no check failed (warnings
allowed), 1 when one did, 2 on a usage error.

flags:
`

// Where containers/storage and containers/image read their configuration unless told otherwise.
const (
	storageConfEnv           = "CONTAINERS_STORAGE_CONF"
	defaultStorageConf       = "/etc/containers/storage.conf"
	vendorStorageConf        = "/usr/share/containers/storage.conf"
	defaultGraphRoot         = "/var/lib/containers/storage"
	registriesConfEnv        = "CONTAINERS_REGISTRIES_CONF"
	defaultRegistriesConf    = "/etc/containers/registries.conf"
	defaultRegistriesConfDir = "/etc/containers/registries.conf.d"
	exampleStore             = "/var/lib/layerstore/store"

	authHelperKey  = "additional-layer-store-auth-helper"
	authHelperName = "layerstore-auth-helper"

	overlayfsSuperMagic = 0x794c7630
)

// Time bounds of what can hang; tests shorten them.
var (
	probeTimeout   = 5 * time.Second  // one stat or statfs of the store or the cache directory
	resolveTimeout = 20 * time.Second // stat of every dependent layer's diff (a lookup may ask the registry)
	commandTimeout = 10 * time.Second // the control socket; podman --version, crio --version
)

type checkStatus string

const (
	statusOK   checkStatus = "ok"
	statusWarn checkStatus = "warn"
	statusFail checkStatus = "fail"
	statusSkip checkStatus = "skip" // nothing to check (a runtime that is not installed)
)

// check is one line of the report: a finding and, unless it is ok, how to fix it.
type check struct {
	Name    string      `json:"name"`
	Status  checkStatus `json:"status"`
	Message string      `json:"message"`
	Fix     string      `json:"fix"`
}

// dependentLayer is a layer of the runtime's overlay storage that links into an additional
// layer store: c/storage wrote the layer's path in the store into overlay/<id>/additionallayer
// and made overlay/<id>/diff a symlink to its diff.
type dependentLayer struct {
	ID       string `json:"id"`
	Store    string `json:"store"`         // the content of additionallayer: <store>/<b64 ref>/<key>
	Ref      string `json:"ref,omitempty"` // the image reference decoded from that path
	Target   string `json:"target"`        // where overlay/<id>/diff points
	Resolves bool   `json:"resolves"`
	Error    string `json:"error,omitempty"`
}

type doctorReport struct {
	Checks          []check          `json:"checks"`
	DependentLayers []dependentLayer `json:"dependentLayers"`
}

func (r *doctorReport) failed() bool {
	for _, c := range r.Checks {
		if c.Status == statusFail {
			return true
		}
	}
	return false
}

// doctorPaths is what the checks look at; empty fields take the system's defaults.
type doctorPaths struct {
	config, socket, storageConf, registriesConf, registriesConfDir, store string
	explicitConfig                                                        bool
}

func runDoctor(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	var p doctorPaths
	fl := flag.NewFlagSet("doctor", flag.ContinueOnError)
	fl.SetOutput(stderr)
	fl.Usage = func() { fmt.Fprint(stderr, doctorUsage); fl.PrintDefaults() }
	asJSON := fl.Bool("json", false, "print the report as JSON")
	fl.StringVar(&p.config, "config", defaultConfigPath(), "the daemon's configuration file (a missing default file means all defaults)")
	fl.StringVar(&p.socket, "control-socket", "", "the daemon's control socket (default: the config's, $"+protocol.SocketEnv+" or "+protocol.DefaultSocket+")")
	fl.StringVar(&p.storageConf, "storage-conf", "", "storage.conf (default $"+storageConfEnv+", "+defaultStorageConf+" or "+vendorStorageConf+")")
	fl.StringVar(&p.registriesConf, "registries-conf", "", "registries.conf (default $"+registriesConfEnv+" or "+defaultRegistriesConf+")")
	fl.StringVar(&p.registriesConfDir, "registries-conf-dir", "", "registries.conf drop-in directory (default "+defaultRegistriesConfDir+" and ~/.config/containers/registries.conf.d)")
	fl.StringVar(&p.store, "store", "", "the additional layer store (default: the entry with :ref in storage.conf)")
	if err := fl.Parse(args); err != nil {
		return 2
	}
	if fl.NArg() != 0 {
		fl.Usage()
		return 2
	}
	fl.Visit(func(f *flag.Flag) { p.explicitConfig = p.explicitConfig || f.Name == "config" })
	rep := diagnose(ctx, p)
	if *asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		if err := enc.Encode(rep); err != nil {
			fmt.Fprintf(stderr, "layerstore doctor: %v\n", err)
			return 1
		}
	} else {
		renderDoctor(stdout, rep)
	}
	if rep.failed() {
		return 1
	}
	return 0
}

// diagnose runs every check, in the order of the report.
func diagnose(ctx context.Context, p doctorPaths) doctorReport {
	cfgCheck, cfg := checkConfig(p.config, p.explicitConfig)
	daemon, st := checkDaemon(ctx, or(p.socket, or(cfg.ControlSocket, protocol.SocketPath())))
	storage, setup := checkStorageConf(ctx, or(p.storageConf, storageConfPath()), p.store)
	conf, dirs := registriesPaths(p.registriesConf, p.registriesConfDir)
	var cacheUsed int64
	if st != nil {
		cacheUsed = st.Cache.Bytes
	}
	deps, layers := checkDependents(ctx, setup.graphroot)
	return doctorReport{
		Checks: []check{
			cfgCheck,
			daemon,
			checkMount(ctx, setup.store),
			storage,
			checkAuthHelper(conf, dirs),
			checkRuntime(ctx, "podman"),
			checkRuntime(ctx, "crio"),
			checkRootless(),
			checkPassthrough(kernelRelease(), orBool(cfg.FUSE.Passthrough, true)),
			checkRestarts(kernelRelease(), st),
			checkCache(ctx, or(cfg.CacheDir, defaultCacheDir()), int64(cfg.CacheMaxSize), cacheUsed),
			deps,
			checkRuntimesRecords(runtimeRoots(setup.graphroot, crioPathsOf(cfg)), st, crioPathsOf(cfg)),
		},
		DependentLayers: layers,
	}
}

// checkConfig reads the daemon's configuration the way serve does. The defaults stand in for
// a file that does not load.
func checkConfig(path string, explicit bool) (check, *Config) {
	cfg, err := loadConfig(path, explicit)
	if err != nil {
		return check{"config", statusFail, err.Error(), "correct " + path + ": the daemon refuses to start with it"}, &Config{}
	}
	if !fileExists(path) {
		return check{"config", statusOK, "no " + path + ": the defaults apply", ""}, cfg
	}
	return check{"config", statusOK, path + " loads", ""}, cfg
}

// checkDaemon asks the daemon for its status over the control socket.
func checkDaemon(ctx context.Context, socket string) (check, *protocol.Status) {
	const name = "daemon"
	ctx, cancel := context.WithTimeout(ctx, commandTimeout)
	defer cancel()
	st, err := protocol.NewClient(socket).Status(ctx)
	if err != nil {
		fix := "start the daemon: systemctl start layerstore (or layerstore serve STORE)"
		switch {
		case errors.Is(err, fs.ErrNotExist):
			return check{name, statusFail, "no control socket at " + socket + ": the daemon is not running", fix}, nil
		case errors.Is(err, syscall.ECONNREFUSED):
			return check{name, statusFail, "nothing listens on " + socket + " (a daemon that died left it)", fix}, nil
		case errors.Is(err, fs.ErrPermission):
			return check{name, statusFail, socket + ": permission denied", "run layerstore doctor as root (the control socket is root's)"}, nil
		}
		return check{name, statusFail, err.Error(), "check the daemon's log: journalctl -u layerstore"}, nil
	}
	states := map[protocol.State]int{}
	var users int64
	for _, l := range st.Layers {
		states[l.State]++
		users += l.Users
	}
	layers := plural(len(st.Layers), "layer")
	if len(st.Layers) > 0 {
		layers += fmt.Sprintf(" (%d complete, %d fetching, %d failed)", states[protocol.StateComplete], states[protocol.StateFetching], states[protocol.StateFailed])
	}
	msg := fmt.Sprintf("%s answers: %s, %s, cache %s", socket, layers, plural(int(users), "user"), humanBytes(st.Cache.Bytes))
	if st.Counters.VerifyFailures > 0 {
		return check{name, statusWarn, fmt.Sprintf("%s; %d verification failures", msg, st.Counters.VerifyFailures),
			"a registry or mirror served bytes that do not match the image (none reached a container): see the daemon's log"}, &st
	}
	return check{name, statusOK, msg, ""}, &st
}

// checkMount checks that store is a FUSE mount that answers.
func checkMount(ctx context.Context, store string) check {
	const name = "mount"
	if store == "" {
		return check{name, statusSkip, "no store to check: storage.conf lists none (or pass --store)", ""}
	}
	restart := "restart the daemon (systemctl restart layerstore; it clears a dead mount) or unmount it: umount -l " + store
	sfs, err := statfsWithin(ctx, store, probeTimeout)
	if err == nil {
		_, err = statWithin(ctx, store, probeTimeout)
	}
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return check{name, statusFail, store + " does not exist", "mkdir -p " + store + " and start the daemon: layerstore serve " + store}
	case isDeadMount(err):
		return check{name, statusFail, store + " is a dead FUSE mount (" + cause(err).Error() + "): every podman/CRI-O command fails", restart}
	case errors.Is(err, errNoAnswer):
		return check{name, statusFail, store + " does not answer (" + cause(err).Error() + "): a hung FUSE server stalls every pull", restart}
	case err != nil:
		return check{name, statusFail, err.Error(), restart}
	case uint64(sfs.Type) != storefs.SuperMagic:
		return check{name, statusFail, fmt.Sprintf("%s is not a FUSE mount (filesystem type %#x): the daemon does not serve it and runtimes pull every layer normally", store, sfs.Type),
			"start the daemon: systemctl start layerstore (or layerstore serve " + store + ")"}
	}
	return check{name, statusOK, store + " is a FUSE mount and answers", ""}
}

var versionRE = regexp.MustCompile(`(?i)version:?\s+v?(\d+)\.(\d+)(\.\d+)?`)

// checkRuntime finds name (podman or crio) in PATH, asks its version and says which lookup
// generation it uses (docs/als-contract.md).
func checkRuntime(ctx context.Context, name string) check {
	bin, err := exec.LookPath(name)
	if err != nil {
		return check{name, statusSkip, "not installed", ""}
	}
	ctx, cancel := context.WithTimeout(ctx, commandTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, "--version")
	cmd.WaitDelay = time.Second
	out, err := cmd.Output()
	m := versionRE.FindStringSubmatch(string(out))
	if err != nil || m == nil {
		return check{name, statusWarn, fmt.Sprintf("%s --version: %v %q: cannot tell which lookup it uses", bin, err, firstLine(out)), "run " + bin + " --version"}
	}
	major, _ := strconv.Atoi(m[1])
	minor, _ := strconv.Atoi(m[2])
	v, ver := major*1000+minor, m[1]+"."+m[2]+m[3]
	const (
		modern = "looks layers up by TOC digest (modern): every eStargz and zstd:chunked layer can be lazy"
		legacy = "looks layers up by blob digest (legacy): eStargz needs the uncompressed-size annotation, zstd:chunked needs a tar-split"
	)
	switch {
	case name == "crio" && v >= 1031:
		return check{name, statusOK, "CRI-O " + ver + " " + modern + "; auth helper supported", ""}
	case name == "crio":
		return check{name, statusOK, "CRI-O " + ver + " " + legacy + "; no auth helper (1.31+)", ""}
	case v >= 5002:
		return check{name, statusOK, "podman " + ver + " " + modern + "; auth helper supported", ""}
	case v >= 5001:
		return check{name, statusOK, "podman " + ver + " " + modern + "; no auth helper (5.2+)", ""}
	case v >= 3002:
		return check{name, statusOK, "podman " + ver + " " + legacy + "; no auth helper (5.2+)", ""}
	}
	return check{name, statusFail, "podman " + ver + " has no additional layer store support (3.2+)", "upgrade podman: 5.1+ looks layers up by TOC digest"}
}

func firstLine(b []byte) string {
	s, _, _ := strings.Cut(strings.TrimSpace(string(b)), "\n")
	return s
}

func kernelRelease() string {
	var u unix.Utsname
	if err := unix.Uname(&u); err != nil {
		return ""
	}
	return unix.ByteSliceToString(u.Release[:])
}

var kernelRE = regexp.MustCompile(`^(\d+)\.(\d+)`)

// kernel69 reports whether the kernel release (as uname gives it) is 6.9 or later, the version
// with FUSE passthrough and FUSE_NOTIFY_RESEND, and whether the release could be read.
func kernel69(release string) (is69, known bool) {
	m := kernelRE.FindStringSubmatch(release)
	if m == nil {
		return false, false
	}
	major, _ := strconv.Atoi(m[1])
	minor, _ := strconv.Atoi(m[2])
	return major > 6 || major == 6 && minor >= 9, true
}

// checkPassthrough says whether the kernel (release as uname gives it) has FUSE passthrough
// (6.9+), which serves complete cached files at native speed. Informational: never fails.
func checkPassthrough(release string, enabled bool) check {
	const name = "passthrough"
	is69, known := kernel69(release)
	switch {
	case os.Geteuid() != 0:
		return check{name, statusOK, "rootless: FUSE passthrough needs root (CAP_SYS_ADMIN): cached files are read through the daemon", ""}
	case !known:
		return check{name, statusWarn, fmt.Sprintf("cannot read the kernel version %q", release), "FUSE passthrough needs Linux 6.9+"}
	case !is69:
		return check{name, statusWarn, "kernel " + release + " has no FUSE passthrough (6.9+): reads of cached files go through the daemon",
			"a 6.9+ kernel serves complete cached files at native speed"}
	case !enabled:
		return check{name, statusOK, "kernel " + release + " has FUSE passthrough; turned off in the config ([fuse] passthrough = false)", ""}
	}
	return check{name, statusOK, "kernel " + release + " has FUSE passthrough: complete cached files are read at native speed", ""}
}

// checkRestarts says whether running containers survive a crash, a restart or an upgrade of the
// daemon (st, the daemon's status, nil when it does not answer; release, the kernel's): the
// service manager must keep the store's FUSE session, and Linux 6.9+ re-sends what the old
// daemon was answering. Informational: never fails.
func checkRestarts(release string, st *protocol.Status) check {
	const name = "restarts"
	fix := "run the daemon as the shipped unit (FileDescriptorStoreMax=) or restart it with SIGUSR2"
	if os.Geteuid() != 0 {
		fix = "rootless: a mount made through fusermount3 cannot be handed over; stop the containers that use the store before restarting the daemon"
	}
	if st == nil || st.Session == nil {
		return check{name, statusWarn, "the daemon does not say what becomes of its FUSE session", "an older daemon: upgrade it"}
	}
	msg := "the service manager keeps the store's FUSE session: running containers wait for a restarted daemon instead of failing"
	if st.Session.Resumed {
		msg += "; this daemon resumed its predecessor's"
	}
	if !st.Session.Kept {
		return check{name, statusWarn, st.Session.Why + ": a crash of the daemon breaks running containers (SIGUSR2 re-executes it without breaking them)", fix}
	}
	if is69, known := kernel69(release); known && !is69 {
		return check{name, statusWarn, msg + "; but kernel " + release + " cannot re-send the requests a crashed daemon was answering (6.9+): processes waiting on them hang",
			"a 6.9+ kernel; a graceful restart (systemctl restart) answers them before it stops"}
	}
	return check{name, statusOK, msg, ""}
}

// checkRootless checks what a rootless daemon needs (skipped as root): /dev/fuse that the user
// can open and fusermount3 to mount it, and subordinate ids, without which the files of
// owners other than root show as nobody in containers (and podman runs none).
func checkRootless() check {
	const name = "rootless"
	if os.Geteuid() == 0 {
		return check{name, statusSkip, "running as root", ""}
	}
	if f, err := os.OpenFile("/dev/fuse", os.O_RDWR, 0); err != nil {
		return check{name, statusFail, "/dev/fuse cannot be opened (" + err.Error() + "): the store cannot be mounted", "the distribution's default is mode 0666 (udev rule of the fuse package)"}
	} else {
		f.Close()
	}
	fm, err := exec.LookPath("fusermount3")
	if err != nil {
		return check{name, statusFail, "no fusermount3: a user cannot mount the store", "install the fuse3 package"}
	}
	if fi, err := os.Stat(fm); err != nil || fi.Mode()&os.ModeSetuid == 0 {
		return check{name, statusFail, fm + " is not setuid root: a user cannot mount the store", "reinstall the fuse3 package"}
	}
	u := strconv.Itoa(os.Geteuid())
	if cur, err := user.Current(); err == nil {
		u = cur.Username
	}
	m, err := storefs.SystemRootlessIDMap(u)
	if err != nil {
		return check{name, statusFail, err.Error(), "correct /etc/subuid and /etc/subgid"}
	}
	if len(m.UIDs) < 2 || len(m.GIDs) < 2 {
		return check{name, statusWarn, "no subordinate ids for " + u + " in /etc/subuid and /etc/subgid: files of owners other than root show as nobody",
			"usermod --add-subuids 100000-165535 --add-subgids 100000-165535 " + u}
	}
	return check{name, statusOK, fmt.Sprintf("user %s: /dev/fuse and %s usable; containers see owners through subordinate ids %d-%d", u, fm, m.UIDs[1].Host, m.UIDs[1].Host+m.UIDs[1].Size-1), ""}
}

// checkCache checks the free space on the cache directory's filesystem: maxSize is the
// configured cache-max-size (0: not configured), used what the cache holds now.
func checkCache(ctx context.Context, dir string, maxSize, used int64) check {
	const name = "cache"
	sfs, err := statfsWithin(ctx, dir, probeTimeout)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return check{name, statusWarn, dir + " does not exist", "nothing to do: the daemon creates it when it starts"}
	case err != nil:
		return check{name, statusFail, err.Error(), "check the filesystem of " + dir + " or set cache-dir in the config"}
	}
	free, total := int64(sfs.Bavail)*int64(sfs.Bsize), int64(sfs.Blocks)*int64(sfs.Bsize)
	pct := 100.0
	if total > 0 {
		pct = float64(free) * 100 / float64(total)
	}
	msg := fmt.Sprintf("%s: %s free of %s (%.0f%%)", dir, humanBytes(free), humanBytes(total), pct)
	var f findings
	if pct < 10 {
		f.add(statusWarn, msg+": under 10% free", "free space on that filesystem, or set cache-dir to a larger one")
	}
	if maxSize > 0 && free+used < maxSize {
		f.add(statusWarn, fmt.Sprintf("%s: cache-max-size %s does not fit in %s free + %s held", dir, humanBytes(maxSize), humanBytes(free), humanBytes(used)),
			"lower cache-max-size or free space: the cache evicts only down to that size")
	}
	if uint64(sfs.Type) == overlayfsSuperMagic {
		f.add(statusWarn, dir+" is on overlayfs: FUSE passthrough cannot stack a cache file from it under the runtime's overlayfs",
			"put cache-dir on a plain filesystem (ext4, xfs, tmpfs)")
	}
	return f.check(name, msg)
}

// errNoAnswer is what a probe of a path that did not answer in time returns.
var errNoAnswer = errors.New("no answer")

// within runs f and waits for it at most d. A call that does not return in time (a FUSE
// server that does not answer) leaves its goroutine blocked in the kernel until the mount
// answers or goes away; a short-lived command can afford that.
func within[T any](ctx context.Context, d time.Duration, f func() (T, error)) (T, error) {
	ctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	type result struct {
		v   T
		err error
	}
	done := make(chan result, 1)
	go func() {
		v, err := f()
		done <- result{v, err}
	}()
	select {
	case r := <-done:
		return r.v, r.err
	case <-ctx.Done():
		var zero T
		if errors.Is(ctx.Err(), context.DeadlineExceeded) {
			return zero, fmt.Errorf("%w within %v", errNoAnswer, d)
		}
		return zero, ctx.Err()
	}
}

// statWithin and statfsWithin return *fs.PathError errors, errNoAnswer among them.
func statWithin(ctx context.Context, path string, d time.Duration) (os.FileInfo, error) {
	fi, err := within(ctx, d, func() (os.FileInfo, error) { return os.Stat(path) })
	if err != nil && !errors.As(err, new(*fs.PathError)) {
		err = &fs.PathError{Op: "stat", Path: path, Err: err}
	}
	return fi, err
}

func statfsWithin(ctx context.Context, path string, d time.Duration) (unix.Statfs_t, error) {
	st, err := within(ctx, d, func() (unix.Statfs_t, error) {
		var st unix.Statfs_t
		return st, unix.Statfs(path, &st)
	})
	if err != nil {
		err = &fs.PathError{Op: "statfs", Path: path, Err: err}
	}
	return st, err
}

// cause is err without the operation and path of a *fs.PathError.
func cause(err error) error {
	if pe, ok := errors.AsType[*fs.PathError](err); ok {
		return pe.Err
	}
	return err
}

// statAll stats paths, 16 at a time, and waits for all of them at most d in all. A path not
// answered in time gets errNoAnswer.
func statAll(ctx context.Context, paths []string, d time.Duration) []error {
	ctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	type result struct {
		i   int
		err error
	}
	results := make(chan result, len(paths)) // late answers never block
	sem := make(chan struct{}, 16)
	go func() {
		for i, p := range paths {
			select {
			case sem <- struct{}{}:
			case <-ctx.Done():
				return
			}
			go func() {
				_, err := os.Stat(p)
				<-sem
				results <- result{i, err}
			}()
		}
	}()
	errs := make([]error, len(paths))
	for i := range errs {
		errs[i] = &fs.PathError{Op: "stat", Path: paths[i], Err: fmt.Errorf("%w within %v", errNoAnswer, d)}
	}
	for range paths {
		select {
		case r := <-results:
			errs[r.i] = r.err
		case <-ctx.Done():
			return errs
		}
	}
	return errs
}

func isDeadMount(err error) bool {
	return errors.Is(err, syscall.ENOTCONN) || errors.Is(err, syscall.ECONNABORTED)
}

// findings gathers the problems one check found; the worst decides its status.
type findings struct {
	status      checkStatus
	msgs, fixes []string
}

func (f *findings) add(s checkStatus, msg, fix string) {
	if s == statusFail || f.status == "" {
		f.status = s
	}
	f.msgs = append(f.msgs, msg)
	if fix != "" {
		f.fixes = append(f.fixes, fix)
	}
}

// check returns the check, with okMsg when nothing was found.
func (f *findings) check(name, okMsg string) check {
	if len(f.msgs) == 0 {
		return check{name, statusOK, okMsg, ""}
	}
	return check{name, f.status, strings.Join(f.msgs, "; "), strings.Join(f.fixes, "; ")}
}

// renderDoctor writes the report for a person: one line per check, then how to fix what is
// not ok, then the dependent layers that do not resolve.
func renderDoctor(w io.Writer, rep doctorReport) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	counts := map[checkStatus]int{}
	for _, c := range rep.Checks {
		counts[c.Status]++
		label := string(c.Status)
		if c.Status == statusWarn || c.Status == statusFail {
			label = strings.ToUpper(label)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\n", label, c.Name, c.Message)
	}
	tw.Flush()
	first := true
	for _, c := range rep.Checks {
		if c.Fix != "" && (c.Status == statusWarn || c.Status == statusFail) {
			if first {
				fmt.Fprintln(w)
				first = false
			}
			fmt.Fprintf(w, "fix: %s: %s\n", c.Name, c.Fix)
		}
	}
	first = true
	for _, l := range rep.DependentLayers {
		if !l.Resolves {
			if first {
				fmt.Fprintln(w, "\nlayers that do not resolve:")
				first = false
			}
			fmt.Fprintf(w, "  %s  %s  -> %s\n", l.ID, or(l.Ref, "?"), l.Target)
		}
	}
	fmt.Fprintf(w, "\n%d ok, %s, %d failed, %d skipped\n",
		counts[statusOK], plural(counts[statusWarn], "warning"), counts[statusFail], counts[statusSkip])
}

func plural(n int, noun string) string {
	if n == 1 {
		return "1 " + noun
	}
	return fmt.Sprintf("%d %ss", n, noun)
}

func humanBytes(n int64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	div, exp := int64(unit), 0
	for m := n / unit; m >= unit; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(n)/float64(div), "KMGTPE"[exp])
}
