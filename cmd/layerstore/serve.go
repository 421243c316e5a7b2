package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/layerstore/layerstore/cache"
	"github.com/layerstore/layerstore/fetcher"
	storefs "github.com/layerstore/layerstore/fs"
	"github.com/layerstore/layerstore/internal/control"
	"github.com/layerstore/layerstore/internal/control/protocol"
	"github.com/layerstore/layerstore/internal/fdstore"
	"github.com/layerstore/layerstore/internal/gcpolicy"
	"github.com/layerstore/layerstore/internal/runtimestore"
	"github.com/layerstore/layerstore/internal/sdnotify"
	"github.com/layerstore/layerstore/layer"
)

const serveUsage = `usage: layerstore serve [flags] MOUNTPOINT

Mount the additional layer store at MOUNTPOINT and serve it until SIGTERM or SIGINT. Under a
service manager that keeps the store's FUSE session (systemd's file descriptor store,
$NOTIFY_SOCKET), a store in use (runtimes hold its layers, or files are open in it) is then
left mounted, the daemon stops serving, and the next daemon resumes the session: running
containers notice nothing (the unit detaches the mount at a stop for good). Otherwise it
unmounts; while running containers use the store the unmount fails, and
the daemon serves on until they stop, then unmounts and exits; a second signal detaches the
store at once instead (the files still open in it fail). SIGUSR2 re-executes the daemon's
binary (a new version after an upgrade) in place, handing it the session. SIGHUP reloads
registries.conf and its drop-ins, and the credential files for the next resolutions; an
invalid registries.conf is logged and the previous one kept.

flags:
`

// serveFlags are the command-line settings; they override the config file.
type serveFlags struct {
	config, cacheDir, registriesConf, socket, logLevel string
}

func runServe(ctx context.Context, args []string, stderr io.Writer) error {
	var f serveFlags
	fl := flag.NewFlagSet("serve", flag.ContinueOnError)
	fl.SetOutput(stderr)
	fl.Usage = func() { fmt.Fprint(stderr, serveUsage); fl.PrintDefaults() }
	fl.StringVar(&f.config, "config", defaultConfigPath(), "configuration file (TOML); a missing default file means all defaults")
	fl.StringVar(&f.cacheDir, "cache-dir", "", "cache directory (default "+defaultCacheDir()+")")
	fl.StringVar(&f.registriesConf, "registries-conf", "", "registries.conf to use, with its .d drop-ins (default: the system's)")
	fl.StringVar(&f.socket, "control-socket", "", "control socket path (default $"+protocol.SocketEnv+" or "+protocol.DefaultSocket+")")
	fl.StringVar(&f.logLevel, "log-level", "", "debug, info, warn or error (default info)")
	if err := fl.Parse(args); err != nil {
		return errUsage
	}
	if fl.NArg() != 1 {
		fl.Usage()
		return errUsage
	}
	explicit := false
	fl.Visit(func(fl *flag.Flag) { explicit = explicit || fl.Name == "config" })
	cfg, err := loadConfig(f.config, explicit)
	if err != nil {
		return err
	}
	cfg.CacheDir = or(f.cacheDir, or(cfg.CacheDir, defaultCacheDir()))
	cfg.ControlSocket = or(f.socket, or(cfg.ControlSocket, protocol.SocketPath()))
	cfg.LogLevel = or(f.logLevel, cfg.LogLevel)
	if f.registriesConf != "" {
		cfg.Registries.Conf, cfg.Registries.ConfDir = f.registriesConf, f.registriesConf+".d"
	}
	level, err := parseLevel(cfg.LogLevel)
	if err != nil {
		return err
	}
	return serve(ctx, cfg, fl.Arg(0), newLogger(stderr, level))
}

var errUsage = errors.New("usage")

// newLogger logs to w as key=value lines; under systemd (JOURNAL_STREAM set) without the time,
// which the journal records itself.
func newLogger(w io.Writer, level slog.Level) *slog.Logger {
	opts := &slog.HandlerOptions{Level: level}
	if os.Getenv("JOURNAL_STREAM") != "" {
		opts.ReplaceAttr = func(groups []string, a slog.Attr) slog.Attr {
			if len(groups) == 0 && a.Key == slog.TimeKey {
				return slog.Attr{}
			}
			return a
		}
	}
	return slog.New(slog.NewTextHandler(w, opts))
}

// stack is the daemon's parts, built from a configuration: the cache, the registry client
// with its in-memory keychain, the layer manager, and the FUSE mount serving it.
type stack struct {
	cache   *cache.Cache
	keys    *fetcher.MemoryKeychain
	client  *fetcher.Client
	manager *layer.Manager
	mount   *storefs.Server
	// stored is set while the service manager keeps the mount's FUSE session (the file
	// descriptor store): a stop may then leave the mount to the next process.
	stored  bool
	session protocol.SessionStatus // for status
	// recorder records the layers runtimes take from the store in their own storage; nil
	// when turned off.
	recorder *runtimestore.Recorder
}

// Status is the manager's status with the session's.
func (s *stack) Status() protocol.Status {
	st := s.manager.Status()
	sess := s.session
	st.Session = &sess
	st.Runtimes = runtimeRecords(s.recorder)
	return st
}

// Pin and Unpin are the manager's.
func (s *stack) Pin(ctx context.Context, ref, platform string) (protocol.Pin, error) {
	return s.manager.Pin(ctx, ref, platform)
}

func (s *stack) Unpin(ref, platform string) error { return s.manager.Unpin(ref, platform) }

func (s *stack) ExportProfiles(w io.Writer) (int, error) { return s.manager.ExportProfiles(w) }

func (s *stack) ImportProfiles(r io.Reader) (protocol.ProfileImport, error) {
	return s.manager.ImportProfiles(r)
}

// The names of the FUSE session's descriptors in the service manager's file descriptor store
// and in LISTEN_FDNAMES (docs/design/fd-store.md).
const (
	fdFUSE  = "fuse"
	fdState = "fuse-state"
)

// openStack builds the stack and mounts it at mountpoint: it resumes the FUSE session of the
// previous process when inherited holds one (LISTEN_FDS), and mounts anew otherwise, clearing
// a dead mount first.
func openStack(cfg *Config, mountpoint string, inherited []fdstore.Named, log *slog.Logger) (_ *stack, err error) {
	s := &stack{keys: fetcher.NewMemoryKeychain()}
	defer func() {
		if err != nil {
			s.Close()
		}
	}()
	s.cache, err = cache.New(cfg.CacheDir, cache.Config{MaxSize: int64(cfg.CacheMaxSize), Logger: log})
	if err != nil {
		return nil, fmt.Errorf("cache: %w", err)
	}
	if s.client, err = newClient(cfg, s.keys, log); err != nil {
		return nil, err
	}
	if s.manager, err = layer.New(layer.ClientRegistry(s.client), s.cache, layerConfig(cfg, log)); err != nil {
		return nil, err
	}
	opts := storefs.Config{Logger: log, Passthrough: orBool(cfg.FUSE.Passthrough, true)}
	if os.Geteuid() != 0 {
		if opts.IDs, err = rootlessIDs(); err != nil {
			return nil, err
		}
		if opts.Passthrough {
			log.Info("rootless: FUSE passthrough needs root (CAP_SYS_ADMIN): files are read through the daemon")
			opts.Passthrough = false
		}
	}
	var store storefs.Store = managerStore{s.manager}
	if s.recorder = newRecorder(cfg, mountpoint, log); s.recorder != nil {
		store = recordingStore{store, s.recorder}
	}
	if s.mount, s.session.Resumed, err = mountStore(mountpoint, store, opts, inherited, log); err != nil {
		return nil, err
	}
	s.session.Why = keepSession(s.mount, log)
	s.stored = s.session.Why == ""
	s.session.Kept = s.stored
	return s, nil
}

// rootlessIDs is how a rootless daemon shows the owners of layer files: through the user
// namespace its user's rootless podman runs containers in (root is the user, ids from 1 the
// user's first range in /etc/subuid and /etc/subgid).
func rootlessIDs() (*storefs.IDMap, error) {
	name := strconv.Itoa(os.Geteuid())
	if u, err := user.Current(); err == nil {
		name = u.Username
	}
	m, err := storefs.SystemRootlessIDMap(name)
	if err != nil {
		return nil, fmt.Errorf("rootless: %w", err)
	}
	return m, nil
}

// mountStore resumes the FUSE session in inherited, or mounts the store anew when there is
// none or it cannot be resumed (an older kernel, a session of an incompatible version): then
// the old session is let go, so that the kernel ends it (its open files fail), and its dead
// mount is cleared.
func mountStore(mountpoint string, store storefs.Store, opts storefs.Config, inherited []fdstore.Named, log *slog.Logger) (_ *storefs.Server, resumed bool, _ error) {
	if sess, ok := inheritedSession(inherited, log); ok {
		srv, err := storefs.Resume(mountpoint, sess, store, opts)
		if err == nil {
			log.Info("resumed the FUSE session of the previous process: running containers keep their files", "mountpoint", mountpoint)
			return srv, true, nil
		}
		log.Warn("cannot resume the FUSE session of the previous process: mounting anew; files open in the old mount fail", "mountpoint", mountpoint, "err", err)
		endSession(sess)
	}
	if err := storefs.ClearDeadMount(mountpoint); err != nil {
		return nil, false, err
	}
	if err := os.MkdirAll(mountpoint, 0o755); err != nil {
		return nil, false, err
	}
	srv, err := storefs.Mount(mountpoint, store, opts)
	if err != nil {
		return nil, false, fmt.Errorf("mounting %s: %w", mountpoint, err)
	}
	return srv, false, nil
}

// inheritedSession finds the FUSE session among the descriptors the process was started with,
// and closes the others.
func inheritedSession(inherited []fdstore.Named, log *slog.Logger) (storefs.Session, bool) {
	var sess storefs.Session
	for _, f := range inherited {
		switch {
		case f.Name == fdFUSE && sess.Dev == nil:
			sess.Dev = f.File
		case f.Name == fdState && sess.State == nil:
			sess.State = f.File
		default:
			log.Warn("closing a descriptor passed at start that the daemon does not use", "name", f.Name)
			f.File.Close()
		}
	}
	if sess.Dev == nil || sess.State == nil {
		if sess.Dev != nil || sess.State != nil {
			log.Warn("half a FUSE session passed at start: mounting anew", "fuse", sess.Dev != nil, "state", sess.State != nil)
			endSession(sess)
		}
		return storefs.Session{}, false
	}
	return sess, true
}

// endSession lets a FUSE session go: out of the service manager's store, and closed here, so
// that the kernel ends the connection once no process holds it.
func endSession(sess storefs.Session) {
	forgetSession()
	for _, f := range []*os.File{sess.Dev, sess.State} {
		if f != nil {
			f.Close()
		}
	}
}

// keepSession puts the mount's FUSE session in the service manager's file descriptor store,
// so that the connection outlives the process (a crash, a restart) and the next one resumes it.
// It returns why the manager does not keep it, "" when it does.
func keepSession(srv *storefs.Server, log *slog.Logger) (why string) {
	sess, ok := srv.Session()
	if !ok {
		why = "the mount has no FUSE session to keep (mounted through fusermount)"
		log.Warn(why + ": running containers break when the daemon stops or crashes")
		return why
	}
	for _, f := range []fdstore.Named{{Name: fdFUSE, File: sess.Dev}, {Name: fdState, File: sess.State}} {
		if err := fdstore.Store(f.Name, f.File); err != nil {
			if errors.Is(err, fdstore.ErrNoManager) {
				why = "no service manager keeps the FUSE session ($NOTIFY_SOCKET is not set)"
				log.Info(why + ": running containers break if the daemon crashes; SIGUSR2 restarts it in place without breaking them")
			} else {
				why = "the service manager did not take the FUSE session: " + err.Error()
				log.Warn(why + ": running containers break if the daemon crashes")
			}
			_ = fdstore.Remove(fdFUSE)
			return why
		}
	}
	if mark := sessionMark(); mark != "" {
		if err := os.WriteFile(mark, nil, 0o600); err != nil {
			log.Warn("writing the session mark for the unit's ExecStopPost=", "err", err)
		}
	}
	return ""
}

// sessionMark is the file that tells the unit's ExecStopPost= that the service manager keeps
// the store's FUSE session for the next daemon: the mount stays alive with no daemon serving
// it, and must be neither probed (nothing would answer) nor detached. It lives in the service's
// runtime directory ($RUNTIME_DIRECTORY, RuntimeDirectory=), which systemd removes at every
// stop once ExecStopPost= ran; "" without one.
func sessionMark() string {
	dir, _, _ := strings.Cut(os.Getenv("RUNTIME_DIRECTORY"), ":")
	if dir == "" {
		return ""
	}
	return filepath.Join(dir, "fuse-session")
}

// forgetSession takes the ended session out of the service manager's store, and its mark.
func forgetSession() {
	_ = fdstore.Remove(fdFUSE)
	_ = fdstore.Remove(fdState)
	if mark := sessionMark(); mark != "" {
		_ = os.Remove(mark)
	}
}

// Close unmounts (if still mounted) and releases everything.
func (s *stack) Close() error {
	var err error
	if s.mount != nil {
		if err = s.mount.Unmount(); err == nil {
			s.mount.Wait()
		}
	}
	if s.manager != nil {
		s.manager.Close()
	}
	if s.cache != nil {
		s.cache.Close()
	}
	return err
}

// serve runs the daemon until ctx is done or the mount goes away.
func serve(ctx context.Context, cfg *Config, mountpoint string, log *slog.Logger) error {
	defer gcpolicy.Start(gcpolicy.DefaultMin)() // a few collections per start, not dozens
	// SIGHUP reloads (see reload); from now on it never ends the daemon.
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	// SIGUSR2 re-executes the binary in place (see reexec).
	usr2 := make(chan os.Signal, 1)
	signal.Notify(usr2, syscall.SIGUSR2)
	defer signal.Stop(usr2)
	// The FUSE session of the previous process, from the service manager's store or from a
	// re-execution: taken first, so that a failure below does not leave it to children.
	inherited, err := fdstore.Listen()
	if err != nil {
		log.Warn("descriptors passed at start: ignored", "err", err)
	}
	ln, metricsLn, err := listen(cfg)
	if err != nil {
		return err
	}
	s, err := openStack(cfg, mountpoint, inherited, log)
	if err != nil {
		ln.Close()
		if metricsLn != nil {
			metricsLn.Close()
		}
		return err
	}
	api := &http.Server{
		Handler:           control.Handler(s, s.keys, time.Duration(or(cfg.CredentialTTL, Duration(control.DefaultCredentialTTL))), log),
		ReadHeaderTimeout: 10 * time.Second,
	}
	go api.Serve(ln)
	defer api.Close()
	servers := []*http.Server{api}
	attrs := []any{"mountpoint", mountpoint, "cache", cfg.CacheDir, "control", cfg.ControlSocket}
	if metricsLn != nil {
		m := metricsServer(s)
		go m.Serve(metricsLn)
		defer m.Close()
		servers = append(servers, m)
		attrs = append(attrs, "metrics", metricsLn.Addr().String())
	}
	startRecorder(ctx, s.recorder)
	startCrioPins(ctx, cfg, s.manager, log)
	log.Info("serving", append(attrs, "version", version)...)
	if err := sdnotify.Notify("READY=1\nSTATUS=" + servingStatus + mountpoint); err != nil {
		log.Warn("notifying systemd", "err", err)
	}
	// What only the start used: the heap first (its collection touches code and type data),
	// then the pages of the binary.
	releaseStartMemory()
	if n, err := pageOutStartCode(); err != nil {
		log.Debug("reclaiming the pages of the binary only the start used", "err", err)
	} else {
		log.Debug("reclaimed the pages of the binary only the start used", "mapped", n)
	}
	if err := s.run(ctx, mountpoint, hup, usr2, servers, log); err != nil {
		return err // the stack is closed: the re-execution failed after the store stopped
	}
	s.Close()
	return nil
}

// listen takes the control socket and the metrics address, when configured: before the
// mount, so that an address in use fails the start rather than a scrape later.
func listen(cfg *Config) (api, metrics net.Listener, err error) {
	if api, err = control.Listen(cfg.ControlSocket); err != nil {
		return nil, nil, err
	}
	if cfg.MetricsAddress != "" {
		if metrics, err = net.Listen("tcp", cfg.MetricsAddress); err != nil {
			api.Close()
			return nil, nil, fmt.Errorf("metrics-address %s: %w", cfg.MetricsAddress, err)
		}
	}
	return api, metrics, nil
}

// run serves until ctx is done, then unmounts (see unmount), or until the mount goes away. It
// reloads on SIGHUP (hup) and re-executes the binary on SIGUSR2 (usr2), returning only the
// error of a re-execution that failed after the store stopped serving.
func (s *stack) run(ctx context.Context, mountpoint string, hup, usr2 <-chan os.Signal, servers []*http.Server, log *slog.Logger) error {
	// A second SIGTERM or SIGINT while the store is busy detaches it (see unmount).
	again := stopNow(ctx)
	gone := make(chan struct{})
	go func() { s.mount.Wait(); close(gone) }()
	for {
		select {
		case <-hup:
			s.reload(log)
		case <-usr2:
			if err := s.reexec(log, servers...); err != nil {
				return err
			}
		case <-ctx.Done():
			log.Info("stopping", "mountpoint", mountpoint)
			_ = sdnotify.Notify("STOPPING=1")
			s.unmount(log, again, gone)
			return nil
		case <-gone:
			log.Warn("the mount went away; exiting", "mountpoint", mountpoint)
			s.mount = nil
			return nil
		}
	}
}

// metricsServer serves the metrics alone (GET /metrics) on the metrics address, bounded as the
// control socket is and more, since a TCP address may be reached by more than root: no request
// may hold a connection for long, nor send large headers.
func metricsServer(src control.MetricsSource) *http.Server {
	return &http.Server{
		Handler:           control.MetricsHandler(src),
		ReadHeaderTimeout: 10 * time.Second,
		ReadTimeout:       10 * time.Second,
		WriteTimeout:      30 * time.Second,
		IdleTimeout:       2 * time.Minute,
		MaxHeaderBytes:    16 << 10,
	}
}

// reload reads registries.conf and its drop-ins again and forgets the resolutions, so that the
// next ones follow the files as they are now, with the credentials the auth files hold now.
// Layers already served keep their sources. An invalid registries.conf is logged and the
// previous one kept.
func (s *stack) reload(log *slog.Logger) {
	if err := s.client.Reload(); err != nil {
		log.Error("SIGHUP: reloading the registries configuration failed; keeping the previous one", "err", err)
		return
	}
	log.Info("SIGHUP: reloaded the registries configuration; credentials are read again for the next resolutions")
}

// servingStatus starts the STATUS= the daemon sends once it serves, followed by the mountpoint
// (layerstore keep reads it).
const servingStatus = "serving "

// stopTimeout bounds how long a stop or a re-execution waits for the FUSE requests being
// answered: those left over are answered by the next process (FUSE_NOTIFY_RESEND).
const stopTimeout = 5 * time.Second

// reexec replaces the process with its binary as it is now on disk (a new version after an
// upgrade), at the same pid, handing it the FUSE session: the store stops serving without
// unmounting, the layers and the cache are closed, and the new program resumes the session
// (LISTEN_FDS). The binary is checked first (it runs: `layerstore version`): a binary that
// cannot run leaves the daemon serving as before. It returns only when the replacement
// failed after the store stopped serving: the daemon then exits with an error, and a service
// manager that keeps the session restarts it (Restart=on-failure).
func (s *stack) reexec(log *slog.Logger, servers ...*http.Server) error {
	sess, ok := s.mount.Session()
	if !ok {
		log.Error("SIGUSR2: not re-executing: the mount has no FUSE session to hand over")
		return nil
	}
	exe, err := os.Executable()
	if err == nil {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		var out []byte
		out, err = exec.CommandContext(ctx, exe, "version").CombinedOutput()
		cancel()
		if err != nil {
			err = fmt.Errorf("%s version: %w: %s", exe, err, bytes.TrimSpace(out))
		} else {
			log.Info("SIGUSR2: re-executing the daemon in place with its FUSE session", "binary", exe, "new", string(bytes.TrimSpace(out)), "old", version)
		}
	}
	if err != nil {
		log.Error("SIGUSR2: not re-executing: the binary does not run", "err", err)
		return nil
	}
	_ = sdnotify.Notify("STATUS=re-executing " + exe)
	for _, srv := range servers {
		srv.Close() // the sockets are free for the next program
	}
	ctx, cancel := context.WithTimeout(context.Background(), stopTimeout)
	if err := s.mount.Stop(ctx); err != nil {
		log.Warn("stopping the store: requests still being answered are left to the next program", "err", err)
	}
	cancel()
	s.mount = nil // not unmounted: the next program serves it
	s.Close()
	err = fdstore.Exec(exe, os.Args, os.Environ(), []fdstore.Named{{Name: fdFUSE, File: sess.Dev}, {Name: fdState, File: sess.State}})
	log.Error("SIGUSR2: re-executing failed after the store stopped serving: exiting", "err", err)
	return err
}

// unmountRetry is how often a busy store is unmounted again; unmountGrace how long a stop
// waits, after the unmount, for the FUSE connection to end.
const (
	unmountRetry = time.Second
	unmountGrace = 5 * time.Second
)

// inUse reports whether a runtime holds a layer of the store (its images depend on the store).
func (s *stack) inUse() bool {
	for _, l := range s.manager.Status().Layers {
		if l.Users > 0 {
			return true
		}
	}
	return false
}

// leave stops serving the store without unmounting it, for the next process: the service
// manager keeps the FUSE session and hands it over when it starts the daemon again (a restart,
// an upgrade). The daemon cannot tell a restart from a stop for good, so it leaves the session
// whenever the store is in use: runtimes hold its layers (their images depend on it; uses
// taken under earlier processes of the session count, see storefs.Resume), the session was
// resumed (from a version that may not have kept those uses in the session table), or an
// unmount fails (files open). It cannot wait for the unmount to tell: overlayfs holds private
// clones of the mount, so an unmount succeeds under running containers and would take the
// mountpoint from the next daemon. At a stop for good, the unit's ExecStopPost= (or `layerstore
// keep`) detaches the mount, and the manager closes the session, which ends the connection
// (files still open in the store fail, as they would at any stop).
func (s *stack) leave(log *slog.Logger) {
	log.Info("leaving the store's FUSE session to the service manager for the next daemon", "mountpoint", s.mount.Mountpoint())
	_ = sdnotify.Notify("STATUS=stopping: the store's session is left to the next daemon")
	ctx, cancel := context.WithTimeout(context.Background(), stopTimeout)
	defer cancel()
	if err := s.mount.Stop(ctx); err != nil {
		log.Warn("stopping the store: requests still being answered are left to the next daemon", "err", err)
	}
	s.mount = nil
}

// unmount ends the mount at a stop. When the service manager keeps the FUSE session and the
// store is in use, the daemon leaves the session to the next process instead (see leave).
// While the store is busy
// (running containers have files open in it: EBUSY), the daemon serves on, so that they keep working, and tries again every
// unmountRetry: it exits cleanly once they have stopped. A second SIGTERM or SIGINT (again)
// detaches the store instead: it leaves the mount namespace at once, so that runtimes never
// meet a dead mount, and the files still open in it fail once the daemon has exited. Under
// systemd, a stop that outlasts TimeoutStopSec= ends with SIGKILL, and ExecStopPost= detaches
// the dead mount. A mount someone else removed (gone) is left alone.
func (s *stack) unmount(log *slog.Logger, again <-chan os.Signal, gone <-chan struct{}) {
	if s.stored && (s.session.Resumed || s.inUse()) {
		s.leave(log)
		return
	}
	mp := s.mount.Mountpoint()
	for busy := false; ; busy = true {
		err := s.mount.Unmount()
		if err == nil {
			// The connection ends once no mount of it is left. Copies of the mount in other
			// mount namespaces (made before the unmount, without propagation back, as a
			// rootless runtime's namespace on a host without shared mounts) and overlayfs's
			// private clones keep it alive, maybe for ever: a stop does not wait for them.
			select {
			case <-gone:
			case <-again:
			case <-time.After(unmountGrace):
				log.Warn("unmounted; the FUSE connection is still held elsewhere (copies of the mount in other mount namespaces, overlay mounts): exiting, and reads through those fail from now on", "mountpoint", mp)
			}
			s.mount = nil
			if s.stored { // the connection ended: nothing for the next process
				forgetSession()
			}
			return
		}
		select {
		case <-gone:
			s.mount = nil
			return
		default:
		}
		if !errors.Is(err, syscall.EBUSY) {
			log.Warn("unmount failed: detaching the store", "mountpoint", mp, "err", err)
			break
		}
		if s.stored {
			s.leave(log)
			return
		}
		if !busy {
			log.Warn("the store is busy (running containers use it): serving until they stop; signal again to detach it now", "mountpoint", mp)
			_ = sdnotify.Notify("STATUS=stopping: the store is busy; serving until its containers stop")
		}
		select {
		case <-time.After(unmountRetry):
			continue
		case <-gone:
			s.mount = nil
			return
		case <-again:
			log.Warn("detaching the busy store: files still open in it fail once the daemon exits", "mountpoint", mp)
		}
		break
	}
	if err := s.mount.Detach(); err != nil {
		log.Error("detaching the store", "err", err)
	}
	s.mount = nil // files open in it keep it alive: Wait would wait for them
}

// newClient builds the registry client from the configuration. A negative count, which the
// file's integers let through, means the default, as zero does.
func newClient(cfg *Config, keys *fetcher.MemoryKeychain, log *slog.Logger) (*fetcher.Client, error) {
	r := &cfg.Registries
	return fetcher.NewClient(fetcher.Config{
		RegistriesConf:      r.Conf,
		RegistriesConfDir:   r.ConfDir,
		AuthFiles:           cfg.AuthFiles,
		Keychain:            keys,
		Logger:              log,
		TagTTL:              time.Duration(r.TagTTL),
		RequestTimeout:      time.Duration(r.Timeout),
		StallTimeout:        time.Duration(r.Stall),
		MaxAttempts:         max(r.Attempts, 0),
		ConcurrencyPerHost:  max(r.PerHost, 0),
		MaxGap:              int64(r.MaxGap),
		MaxSpan:             int64(r.MaxSpan),
		MaxRangesPerRequest: max(r.MaxRanges, 0),
	})
}

// layerConfig is the layer manager's configuration; a negative concurrency means the default,
// as newClient's counts do.
func layerConfig(cfg *Config, log *slog.Logger) layer.Config {
	l, p := &cfg.Layers, &cfg.Prefetch
	return layer.Config{
		Logger:              log,
		ResolveTimeout:      time.Duration(l.ResolveTimeout),
		ReadTimeout:         time.Duration(l.ReadTimeout),
		KeepTTL:             time.Duration(l.KeepTTL),
		NegativeTTL:         time.Duration(l.NegativeTTL),
		RequireDiffID:       l.RequireDiffID,
		NoPrefetch:          !orBool(p.Enabled, true),
		PrefetchConcurrency: max(p.Concurrency, 0),
		PrefetchBatch:       int64(p.BatchSize),
		PrefetchBandwidth:   int64(p.Bandwidth),
		PrefetchQuiet:       (*time.Duration)(p.Quiet),
	}
}
