package storefs

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"runtime/debug"
	"strings"
	"syscall"
	"time"

	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"

	"github.com/layerstore/layerstore/internal/fusesession"
)

// SuperMagic is the filesystem type statfs(2) reports for every FUSE mount (the kernel's
// FUSE_SUPER_MAGIC): a path whose statfs reports another type is served by no FUSE server.
const SuperMagic = 0x65735546

// fsName is the filesystem name and subtype of the mount ("layerstore", "fuse.layerstore").
const fsName = "layerstore"

// Config configure Mount. Zero durations and a nil Logger take their defaults; the zero
// Config serves without passthrough.
type Config struct {
	// Logger receives the causes of EIO answers (warn) and mount events (info). The default
	// discards everything.
	Logger *slog.Logger
	// EntryTimeout is how long the kernel keeps entries of the immutable parts of the
	// namespace (diff trees, blob, the names diff, info and blob, reference directories),
	// failed lookups in diff trees included. The default is one hour. Layer directories and
	// failed lookups outside the diff trees are never cached.
	EntryTimeout time.Duration
	// AttrTimeout is how long the kernel keeps attributes of the immutable parts (diff
	// trees, blob, reference directories). The default is one hour.
	AttrTimeout time.Duration
	// Passthrough lets the kernel read files that a layer holds locally (Layer.Backing)
	// straight from the backing file (FUSE passthrough, Linux >= 6.9). Kernels without it are
	// detected at mount and served through the daemon.
	Passthrough bool
	// Debug logs every FUSE request and answer at debug level.
	Debug bool
	// IDs is how the owners of the diff trees' entries are shown; nil shows the layers' own
	// (a root daemon). A rootless daemon shows them through its user's rootless runtime's
	// user namespace (RootlessIDMap).
	IDs *IDMap

	// allowOther mounts with allow_other, so that requests of other users reach the daemon,
	// to test that the daemon refuses them itself.
	allowOther bool
	// forceBackingFiles makes the daemon offer backing files even when the kernel did not
	// grant passthrough, to test go-fuse's fallback when registering one fails.
	forceBackingFiles bool
}

// Default values of Config.
const (
	DefaultEntryTimeout = time.Hour
	DefaultAttrTimeout  = time.Hour
)

func (o Config) withDefaults() (Config, error) {
	if o.EntryTimeout < 0 || o.AttrTimeout < 0 {
		return o, errors.New("fs: timeouts must not be negative")
	}
	if o.EntryTimeout == 0 {
		o.EntryTimeout = DefaultEntryTimeout
	}
	if o.AttrTimeout == 0 {
		o.AttrTimeout = DefaultAttrTimeout
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	return o, nil
}

// Server is a mounted store.
type Server struct {
	fuse       *fuse.Server
	mountpoint string
	fsys       *filesystem
	// session is the descriptor and table the next process resumes from; nil files when
	// mounted without a session.
	session Session
	done    chan struct{} // closed once serving ended and the session files are closed
}

// The mount's FUSE settings. A process resuming a session repeats those of the session's
// first process (the table's header): the kernel keeps what INIT negotiated.
const (
	maxWrite     = 1 << 20
	maxReadAhead = 1 << 20
)

func mountOptions(opts Config) fuse.MountOptions {
	mo := fuse.MountOptions{
		AllowOther:   opts.allowOther,
		Options:      []string{"default_permissions", "nosuid", "nodev"},
		FsName:       fsName,
		Name:         fsName,
		MaxWrite:     maxWrite,
		MaxReadAhead: maxReadAhead,
		Debug:        opts.Debug,
		Logger:       slog.NewLogLogger(opts.Logger.Handler(), slog.LevelDebug),
		PanicHandler: func(v any) fuse.Status {
			opts.Logger.Error("panic in a FUSE handler: answering EIO", "panic", v, "stack", string(debug.Stack()))
			return fuse.EIO
		},
	}
	if !opts.Passthrough {
		mo.DisabledCapabilities |= fuse.CAP_PASSTHROUGH
	}
	return mo
}

// Mount mounts store at mountpoint, an existing directory, and serves it until Unmount. It
// returns once a stat of mountpoint answers from the new server, so the caller can tell the
// service manager it is ready. A dead mount left at mountpoint by a crashed daemon makes it
// fail: call ClearDeadMount first (or Resume its session).
//
// The mount uses default_permissions, nosuid and nodev, and 1 MiB reads, and not
// allow_other: the kernel lets only root use it (see the package doc). The daemon mounts
// with mount(2) itself, so that it holds the session's /dev/fuse descriptor (Session); when
// that is not permitted (not root), it falls back to go-fuse's mount (fusermount), without a
// session.
func Mount(mountpoint string, store Store, opts Config) (*Server, error) {
	opts, err := opts.withDefaults()
	if err != nil {
		return nil, err
	}
	if store == nil {
		return nil, errors.New("fs: nil store")
	}
	mountpoint, err = filepath.Abs(mountpoint)
	if err != nil {
		return nil, fmt.Errorf("fs: %w", err)
	}
	var before syscall.Stat_t
	if err := syscall.Stat(mountpoint, &before); err != nil {
		return nil, fmt.Errorf("fs: mountpoint %s: %w", mountpoint, err)
	}
	if before.Mode&syscall.S_IFMT != syscall.S_IFDIR {
		return nil, fmt.Errorf("fs: mountpoint %s is not a directory", mountpoint)
	}

	fsys := newFilesystem(store, opts.Logger, opts.EntryTimeout, opts.AttrTimeout, time.Now())
	fsys.ids = opts.IDs
	mo := mountOptions(opts)
	s := &Server{mountpoint: mountpoint, fsys: fsys, done: make(chan struct{})}
	fd, err := mountSelf(mountpoint, &mo)
	switch {
	case errors.Is(err, syscall.EPERM) || errors.Is(err, syscall.EACCES): // not root, or /dev/fuse root's alone
		opts.Logger.Warn("cannot mount with mount(2): mounting with fusermount, without a session to resume", "err", err)
		mo.DirectMount = true
		if s.fuse, err = fuse.NewServer(newRawFS(fsys), mountpoint, &mo); err != nil {
			return nil, fmt.Errorf("fs: mount %s: %w", mountpoint, err)
		}
		go s.serve()
		if err := s.fuse.WaitMount(); err != nil {
			_ = s.fuse.Unmount()
			return nil, fmt.Errorf("fs: mount %s: %w", mountpoint, err)
		}
	case err != nil:
		return nil, fmt.Errorf("fs: mount %s: %w", mountpoint, err)
	default:
		if err := s.startSession(fd, &mo, opts); err != nil {
			_ = syscall.Unmount(mountpoint, syscall.MNT_DETACH)
			return nil, err
		}
		if err := pollHack(mountpoint); err != nil {
			_ = s.Unmount()
			return nil, fmt.Errorf("fs: mount %s: %w", mountpoint, err)
		}
	}
	if err := s.checkServing(&before); err != nil {
		_ = s.Unmount()
		return nil, err
	}
	opts.Logger.Info("mounted layer store", "mountpoint", mountpoint, "passthrough", fsys.passthrough.Load(), "session", s.session.Dev != nil)
	return s, nil
}

// mountSelf opens /dev/fuse and mounts it at mountpoint with mount(2), as go-fuse's direct
// mount does, and returns the descriptor.
func mountSelf(mountpoint string, mo *fuse.MountOptions) (int, error) {
	fd, err := syscall.Open("/dev/fuse", syscall.O_RDWR|syscall.O_CLOEXEC, 0)
	if err != nil {
		return -1, err
	}
	data := []string{
		fmt.Sprintf("fd=%d", fd),
		"rootmode=40000",
		fmt.Sprintf("user_id=%d", os.Geteuid()),
		fmt.Sprintf("group_id=%d", os.Getegid()),
		fmt.Sprintf("max_read=%d", mo.MaxWrite),
		"default_permissions",
	}
	if mo.AllowOther {
		data = append(data, "allow_other")
	}
	if err := syscall.Mount(fsName, mountpoint, "fuse."+fsName, syscall.MS_NOSUID|syscall.MS_NODEV, strings.Join(data, ",")); err != nil {
		_ = syscall.Close(fd)
		return -1, err
	}
	return fd, nil
}

// startSession serves the mount on descriptor fd: it reads the kernel's INIT, writes the
// session table's header and starts serving.
func (s *Server) startSession(fd int, mo *fuse.MountOptions, opts Config) error {
	dev, err := unix.FcntlInt(uintptr(fd), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		_ = syscall.Close(fd)
		return fmt.Errorf("fs: %w", err)
	}
	s.session.Dev = os.NewFile(uintptr(dev), "/dev/fuse")
	if s.fuse, err = fuse.NewServer(newRawFS(s.fsys), fmt.Sprintf("/dev/fd/%d", fd), mo); err != nil {
		_ = syscall.Close(fd)
		s.session.Dev.Close()
		return fmt.Errorf("fs: mount %s: %w", s.mountpoint, err)
	}
	s.setPassthrough(opts)
	m, err := topMount(s.mountpoint)
	if err == nil && (!m.mounted || m.fstype != "fuse."+fsName) {
		err = fmt.Errorf("fs: %s shows no %s mount after mount(2)", s.mountpoint, fsName)
	}
	var tab *table
	if err == nil {
		h := &sessionHeader{
			dev:          m.dev,
			started:      s.fsys.started,
			maxWrite:     mo.MaxWrite,
			maxReadAhead: mo.MaxReadAhead,
			disabledCaps: mo.DisabledCapabilities,
			init:         fusesession.EncodeInit(s.fuse.KernelSettings()),
		}
		if s.fsys.passthrough.Load() {
			h.flags |= flagPassthrough
		}
		tab, err = newTable(h)
	}
	if err != nil {
		// Serve to end: the caller unmounts, which ends the connection.
		go s.serve()
		return err
	}
	s.fsys.tab, s.session.State = tab, tab.f
	go s.serve()
	return nil
}

// pollHack makes the kernel ask the server to poll a file of the mount once, which go-fuse
// answers ENOSYS, so that the kernel never asks again (go-fuse does the same when it
// mounts). Otherwise the Go runtime's registration of every file opened in the mount with its
// epoll, made outside of a system call as far as the scheduler knows, would wait for a POLL
// answer that a stopped world cannot give: a process using its own mount would hang.
func pollHack(mountpoint string) error {
	fd, err := syscall.Open(filepath.Join(mountpoint, ".go-fuse-epoll-hack"), syscall.O_RDONLY|syscall.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	_, _ = unix.Poll([]unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN | unix.POLLPRI | unix.POLLOUT}}, 0)
	return syscall.Close(fd)
}

// setPassthrough turns passthrough on when the kernel granted it and Config asked for it.
func (s *Server) setPassthrough(opts Config) {
	granted := s.fuse.KernelSettings().Flags64()&fuse.CAP_PASSTHROUGH != 0
	switch {
	case opts.forceBackingFiles || opts.Passthrough && granted:
		s.fsys.passthrough.Store(true)
	case opts.Passthrough:
		opts.Logger.Info("kernel lacks FUSE passthrough: all reads go through the daemon")
	}
}

// serve serves until the connection ends, then closes the session's files.
func (s *Server) serve() {
	s.fuse.Serve()
	s.fsys.release()
	if s.session.Dev != nil {
		s.session.Dev.Close()
	}
	if s.session.State != nil {
		s.session.State.Close()
	}
	close(s.done)
}

// Session returns the /dev/fuse descriptor and session table from which the next process
// resumes serving the mount (Resume), and false when mounted without a session. The files
// belong to the Server: they are closed when serving ends (an unmount); the caller dups them
// (or clears their close-on-exec flag) to hand them over.
func (s *Server) Session() (Session, bool) {
	return s.session, s.session.Dev != nil
}

// Resume serves the session of a previous process at mountpoint: no mount, no INIT, the
// previous numbering; RESEND of what the previous process left unanswered when the kernel
// can (log which). Fails cleanly (nothing left half-done) when the state does not decode or
// the mountpoint is not that session's mount; the caller then clears the dead mount and
// mounts anew. The Server takes sess over: its files are closed when serving ends.
//
// The settings that shape the session (passthrough, the FUSE settings) are the first process's;
// the rest (timeouts, logging) are opts.
func Resume(mountpoint string, sess Session, store Store, opts Config) (*Server, error) {
	opts, err := opts.withDefaults()
	if err != nil {
		return nil, err
	}
	if store == nil || sess.Dev == nil || sess.State == nil {
		return nil, errors.New("fs: resume: nil store or session")
	}
	mountpoint, err = resolveMountpoint(mountpoint)
	if err != nil {
		return nil, err
	}
	st, err := readSessionState(sess.State)
	if err != nil {
		return nil, err
	}
	in, err := fusesession.DecodeInit(st.hdr.init)
	if err != nil {
		return nil, fmt.Errorf("fs: session table: %w", err)
	}
	// The mountpoint must hold that session's mount; it is not touched (nobody answers it).
	m, err := topMount(mountpoint)
	if err != nil {
		return nil, err
	}
	if !m.mounted || m.fstype != "fuse."+fsName || m.dev != st.hdr.dev {
		return nil, fmt.Errorf("fs: resume: %s is not the mount of the session (%s device %d:%d, want %d:%d)", mountpoint,
			m.fstype, unix.Major(m.dev), unix.Minor(m.dev), unix.Major(st.hdr.dev), unix.Minor(st.hdr.dev))
	}

	fsys := newFilesystem(store, opts.Logger, opts.EntryTimeout, opts.AttrTimeout, st.hdr.started)
	fsys.ids = opts.IDs
	fsys.load(st)
	fsys.passthrough.Store(st.hdr.flags&flagPassthrough != 0)
	mo := mountOptions(opts)
	mo.MaxWrite, mo.MaxReadAhead, mo.DisabledCapabilities = st.hdr.maxWrite, st.hdr.maxReadAhead, st.hdr.disabledCaps
	mo.ResumeInit = in
	fd, err := unix.FcntlInt(sess.Dev.Fd(), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("fs: resume: %w", err)
	}
	// Before anything reads the connection: a request read by this process and resent would
	// be answered twice. Resent requests wait on the connection if the resume fails.
	resent := fusesession.CanResend(in)
	if resent {
		if err := fusesession.Resend(fd, in); err != nil {
			_ = syscall.Close(fd)
			return nil, fmt.Errorf("fs: resume: %w", err)
		}
	}
	s := &Server{mountpoint: mountpoint, fsys: fsys, session: sess, done: make(chan struct{})}
	if s.fuse, err = fuse.NewServer(newRawFS(fsys), fmt.Sprintf("/dev/fd/%d", fd), &mo); err != nil {
		_ = syscall.Close(fd)
		return nil, fmt.Errorf("fs: resume: %w", err)
	}
	// Records cut short by the previous process's death go; new ones follow the last whole one.
	if err := sess.State.Truncate(st.end); err != nil {
		opts.Logger.Warn("resume: cannot cut the session table's last record short", "err", err)
	}
	fsys.tab = &table{f: sess.State, off: st.end}
	go s.serve()
	ctx, cancel := context.WithCancel(context.Background())
	go func() { <-s.done; cancel() }()
	go fsys.restoreUses(ctx)
	if resent {
		opts.Logger.Info("resumed the FUSE session: requests the previous process left unanswered were resent",
			"mountpoint", mountpoint, "references", len(st.refs), "layers", len(st.blocks), "backing_ids", len(st.backing))
	} else {
		opts.Logger.Warn("resumed the FUSE session: the kernel cannot resend requests (Linux < 6.9): those the previous process left unanswered wait until the mount is aborted",
			"mountpoint", mountpoint, "references", len(st.refs), "layers", len(st.blocks))
	}
	return s, nil
}

// Stop stops serving without unmounting, for a restart: requests arriving from now on are
// not answered (held: the next process gets them re-sent), requests being answered finish
// (bounded by ctx); then it returns and the process may exit. The connection lives on as
// long as some process (the fd store) holds Session().Dev.
//
// A request whose answer go-fuse is still writing when the last handler returns is given a
// moment (stopGrace) to be written; one a reader takes after Stop stays held, and the next
// process has it resent.
func (s *Server) Stop(ctx context.Context) error {
	if err := s.fsys.stop(ctx); err != nil {
		return err
	}
	select {
	case <-time.After(stopGrace):
	case <-ctx.Done():
	}
	return nil
}

// stopGrace is how long Stop waits after the last answer for go-fuse to write it.
const stopGrace = 20 * time.Millisecond

// checkServing makes sure the mountpoint answers from the new server: a FUSE filesystem,
// on another device than the directory had before the mount.
func (s *Server) checkServing(before *syscall.Stat_t) error {
	var st syscall.Stat_t
	if err := syscall.Stat(s.mountpoint, &st); err != nil {
		return fmt.Errorf("fs: stat %s after mount: %w", s.mountpoint, err)
	}
	var sfs syscall.Statfs_t
	if err := syscall.Statfs(s.mountpoint, &sfs); err != nil {
		return fmt.Errorf("fs: statfs %s after mount: %w", s.mountpoint, err)
	}
	if st.Dev == before.Dev || sfs.Type != SuperMagic || st.Ino != rootIno {
		return fmt.Errorf("fs: %s does not answer from the new mount (dev %d, was %d; fs type %#x)",
			s.mountpoint, st.Dev, before.Dev, sfs.Type)
	}
	return nil
}

// Mountpoint returns the absolute path the store is mounted at.
func (s *Server) Mountpoint() string { return s.mountpoint }

// Unmount unmounts the store; Wait then returns. While files of the store are in use, e.g.
// by running containers, it fails at once with an error wrapping syscall.EBUSY, and the
// store serves on. (go-fuse's own Unmount retries for a while and then runs fusermount,
// whose error says nothing a caller can test.)
func (s *Server) Unmount() error {
	if err := unmount(s.mountpoint, 0); err != nil {
		return fmt.Errorf("fs: unmount %s: %w", s.mountpoint, err)
	}
	s.fsys.release()
	return nil
}

// Detach unmounts the store lazily (MNT_DETACH): it leaves the mount namespace at once, so
// that nobody meets it again, but files still open in it keep it alive; they fail
// (ENOTCONN) once this process exits. Wait does not return before they are closed.
func (s *Server) Detach() error {
	if err := unmount(s.mountpoint, syscall.MNT_DETACH); err != nil {
		return fmt.Errorf("fs: detach %s: %w", s.mountpoint, err)
	}
	s.fsys.release()
	return nil
}

// unmount is umount2(2), or for a user without the privilege, fusermount3 -u (with -z for
// MNT_DETACH), which unmounts the FUSE mounts the user made; a busy mount is EBUSY either way.
func unmount(mountpoint string, flags int) error {
	err := syscall.Unmount(mountpoint, flags)

	if !errors.Is(err, syscall.EPERM) || os.Geteuid() == 0 {
		return err
	}
	args := []string{"-u", "-q"}
	if flags&syscall.MNT_DETACH != 0 {
		args = append(args, "-z")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	out, ferr := exec.CommandContext(ctx, fusermount, append(args, "--", mountpoint)...).CombinedOutput()
	switch {
	case ferr == nil:
		return nil
	case strings.Contains(string(out), "busy"):
		return syscall.EBUSY
	default:
		return fmt.Errorf("%s: %v: %s", fusermount, ferr, strings.TrimSpace(string(out)))
	}
}

// fusermount is the setuid helper through which a user mounts and unmounts FUSE filesystems.
const fusermount = "fusermount3"

// Wait returns once the store is unmounted (by Unmount or by anyone else) and serving ended.
func (s *Server) Wait() { <-s.done }

// passthroughOn reports whether the daemon offers backing files to the kernel.
func (s *Server) passthroughOn() bool { return s.fsys.passthrough.Load() }

// Usable says why this process cannot mount the store, or nil when it can: mounting needs
// root (mount(2) of /dev/fuse) and a /dev/fuse it can open.
func Usable() error {
	if os.Geteuid() != 0 {
		return errors.New("not running as root")
	}
	f, err := os.OpenFile("/dev/fuse", os.O_RDWR, 0)
	if err != nil {
		return err
	}
	return f.Close()
}
