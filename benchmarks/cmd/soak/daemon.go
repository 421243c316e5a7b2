package main

import (
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
	"time"

	"github.com/layerstore/layerstore/benchmarks/internal/fuseproc"
	"github.com/layerstore/layerstore/benchmarks/internal/podmanconf"
	"github.com/layerstore/layerstore/internal/control/protocol"
)

// daemon is `layerstore keep -- layerstore serve ...`: keep holds the FUSE session and
// restarts a crashed serve with it at once, as systemd does with the shipped unit.
type daemon struct {
	bin            string
	dir            string
	mnt            string
	cache          string
	socket         string
	registriesConf string
	client         *protocol.Client

	proc   *fuseproc.Proc // keep
	starts int
	logs   []string // every log file, in order (keep and serve write to the same one)
}

func newDaemon(bin, dir, registriesConf string) *daemon {
	d := &daemon{bin: bin, dir: dir, mnt: filepath.Join(dir, "mnt"), cache: filepath.Join(dir, "cache"),
		socket: filepath.Join(dir, "control.sock"), registriesConf: registriesConf}
	d.client = protocol.NewClient(d.socket)
	return d
}

// start writes the config and starts keep, which starts serve; it returns once the mount and
// the control socket answer.
func (d *daemon) start(ctx context.Context) error {
	conf := fmt.Sprintf("cache-dir = %q\ncontrol-socket = %q\nlog-level = \"info\"\n\n[registries]\nconf = %q\nconf-dir = %q\n",
		d.cache, d.socket, d.registriesConf, d.registriesConf+".d")
	confPath := filepath.Join(d.dir, "config.toml")
	if err := os.WriteFile(confPath, []byte(conf), 0o644); err != nil {
		return err
	}
	if err := os.MkdirAll(d.mnt, 0o755); err != nil {
		return err
	}
	d.starts++
	log := filepath.Join(d.dir, fmt.Sprintf("daemon-%d.log", d.starts))
	d.logs = append(d.logs, log)
	cmd := exec.Command(d.bin, "keep", "--", d.bin, "serve", "--config", confPath, d.mnt)
	cmd.Env = podmanconf.CleanEnv(podmanconf.SocketActivation)
	p, err := fuseproc.Start(ctx, fuseproc.Spec{
		What:       "layerstore keep",
		Cmd:        cmd,
		Log:        log,
		Mountpoint: d.mnt,
		Stop:       syscall.SIGTERM, // keep passes it to serve: a stop for good
		Timeout:    30 * time.Second,
		Ready:      func(ctx context.Context) error { _, err := d.client.Status(ctx); return err },
	})
	if err != nil {
		return err
	}
	d.proc = p
	return nil
}

// stopTimeout bounds how long serve may take to exit after SIGTERM (it answers the requests
// under way first: at most a request timeout, 30 s) before it is killed.
const stopTimeout = 40 * time.Second

// stop ends keep and serve by their PIDs: SIGTERM to keep, which passes it to serve; serve is
// killed when it has not exited after stopTimeout. The mount is gone afterwards. It returns
// what went wrong, if anything: a daemon that does not stop is a finding.
func (d *daemon) stop() string {
	if d.proc == nil {
		return ""
	}
	defer d.proc.Stop() // keep killed after 10 s more, the mount detached
	if d.exited() {
		return ""
	}
	pid, _ := d.servePID()
	start := time.Now()
	_ = d.proc.Cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-d.proc.Exited():
		if took := time.Since(start); took > 10*time.Second {
			return fmt.Sprintf("the daemon took %v to exit after SIGTERM", took.Round(time.Millisecond))
		}
		return ""
	case <-time.After(stopTimeout):
	}
	mounts := mountsUnder(filepath.Dir(d.dir))
	if pid > 0 {
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
	return fmt.Sprintf("serve (PID %d) had not exited %v after SIGTERM: killed; mounts under the work directory then: %s",
		pid, stopTimeout, strings.Join(mounts, ", "))
}

// mountsUnder lists the mounts at or below dir, as mountpoint (type).
func mountsUnder(dir string) []string {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return nil
	}
	var out []string
	for _, l := range strings.Split(string(b), "\n") {
		f := strings.Fields(l)
		if len(f) < 5 || (f[4] != dir && !strings.HasPrefix(f[4], dir+"/")) {
			continue
		}
		typ := "?"
		if i := slices.Index(f, "-"); i >= 0 && i+1 < len(f) {
			typ = f[i+1]
		}
		out = append(out, fmt.Sprintf("%s (%s)", strings.TrimPrefix(f[4], dir+"/"), typ))
	}
	if len(out) == 0 {
		return []string{"none"}
	}
	return out
}

// exited tells whether keep has exited (it gives up after 5 starts in 10 s).
func (d *daemon) exited() bool {
	if d.proc == nil {
		return true
	}
	select {
	case <-d.proc.Exited():
		return true
	default:
		return false
	}
}

// servePID is the PID of keep's child, `layerstore serve`.
func (d *daemon) servePID() (int, error) {
	if d.exited() {
		return 0, errors.New("layerstore keep has exited")
	}
	keep := d.proc.Cmd.Process.Pid
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return 0, err
	}
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if ppid, comm := procParent(pid); ppid == keep && comm == "layerstore" {
			return pid, nil
		}
	}
	return 0, fmt.Errorf("no serve process under layerstore keep (PID %d)", keep)
}

// procParent reads a process's parent PID and command name from /proc/PID/stat.
func procParent(pid int) (int, string) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, ""
	}
	s := string(b)
	open, end := strings.IndexByte(s, '('), strings.LastIndexByte(s, ')')
	if open < 0 || end < open {
		return 0, ""
	}
	f := strings.Fields(s[end+1:])
	if len(f) < 2 {
		return 0, ""
	}
	ppid, _ := strconv.Atoi(f[1])
	return ppid, s[open+1 : end]
}

// kill sends SIGKILL to serve (by its PID) and returns that PID.
func (d *daemon) kill() (int, error) {
	pid, err := d.servePID()
	if err != nil {
		return 0, err
	}
	return pid, syscall.Kill(pid, syscall.SIGKILL)
}

// waitServing waits until a serve other than old runs and its control socket answers, and
// returns how long that took.
func (d *daemon) waitServing(ctx context.Context, old int, timeout time.Duration) (time.Duration, error) {
	start := time.Now()
	for {
		if pid, err := d.servePID(); err == nil && pid != old {
			if _, err := d.client.Status(ctx); err == nil {
				return time.Since(start), nil
			}
		}
		if d.exited() {
			return 0, fmt.Errorf("layerstore keep exited: %s", d.proc.Tail())
		}
		if time.Since(start) > timeout {
			return 0, fmt.Errorf("no serve answering %v after the kill", timeout)
		}
		select {
		case <-ctx.Done():
			return 0, ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// status returns the serving daemon's counters and its PID.
func (d *daemon) status(ctx context.Context) (protocol.Counters, int, error) {
	pid, err := d.servePID()
	if err != nil {
		return protocol.Counters{}, 0, err
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	st, err := d.client.Status(ctx)
	return st.Counters, pid, err
}

// emptyCache stops the daemon, removes its cache and starts it again; note is stop's.
func (d *daemon) emptyCache(ctx context.Context) (note string, err error) {
	note = d.stop()
	if err := os.RemoveAll(d.cache); err != nil {
		return note, err
	}
	return note, d.start(ctx)
}
