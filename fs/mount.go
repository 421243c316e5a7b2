package storefs

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"runtime/debug"
	"syscall"
	"time"

	fusefs "github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
)

// SuperMagic is the filesystem type statfs(2) reports for every FUSE mount (the kernel's
// FUSE_SUPER_MAGIC): a path whose statfs reports another type is served by no FUSE server.
const SuperMagic = 0x65735546

// fsName is the filesystem name and subtype of the mount ("layerstore", "fuse.layerstore").
const fsName = "layerstore"

// Options configure Mount. Start from DefaultOptions: the zero Options is valid, but leaves
// Passthrough off. Zero durations and a nil Logger take their defaults.
type Options struct {
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
	// detected at mount and served through the daemon. On in DefaultOptions.
	Passthrough bool
	// Debug logs every FUSE request and answer at debug level.
	Debug bool

	// allowOther mounts with allow_other, so that requests of other users reach the daemon,
	// to test that the daemon refuses them itself.
	allowOther bool
	// forceBackingFiles makes the daemon offer backing files even when the kernel did not
	// grant passthrough, to test go-fuse's fallback when registering one fails.
	forceBackingFiles bool
}

// Default values of Options.
const (
	DefaultEntryTimeout = time.Hour
	DefaultAttrTimeout  = time.Hour
)

// DefaultOptions returns the options the daemon runs with: passthrough, one hour timeouts
// for the immutable tree, no logging.
func DefaultOptions() Options {
	return Options{
		EntryTimeout: DefaultEntryTimeout,
		AttrTimeout:  DefaultAttrTimeout,
		Passthrough:  true,
	}
}

func (o Options) withDefaults() (Options, error) {
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
	root       *rootNode
}

// Mount mounts store at mountpoint, an existing directory, and serves it until Unmount. It
// returns once a stat of mountpoint answers from the new server, so the caller can tell the
// service manager it is ready. A dead mount left at mountpoint by a crashed daemon makes it
// fail: call ClearDeadMount first.
//
// The mount uses default_permissions, nosuid and nodev, and 1 MiB reads, and not
// allow_other: the kernel lets only root use it (see the package doc). It is mounted with
// mount(2) directly (the daemon runs as root), falling back to fusermount when that fails.
func Mount(mountpoint string, store Store, opts Options) (*Server, error) {
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

	fsys := newFilesystem(store, opts.Logger, opts.EntryTimeout, opts.AttrTimeout)
	negative := opts.EntryTimeout
	fo := &fusefs.Options{
		MountOptions: fuse.MountOptions{
			AllowOther:   opts.allowOther,
			Options:      []string{"default_permissions", "nosuid", "nodev"},
			FsName:       fsName,
			Name:         fsName,
			MaxWrite:     1 << 20,
			MaxReadAhead: 1 << 20,
			DirectMount:  true,
			Debug:        opts.Debug,
			Logger:       slog.NewLogLogger(opts.Logger.Handler(), slog.LevelDebug),
			PanicHandler: func(v any) fuse.Status {
				opts.Logger.Error("panic in a FUSE handler: answering EIO", "panic", v, "stack", string(debug.Stack()))
				return fuse.EIO
			},
		},
		// Per-node timeouts are set by the nodes; only failed lookups in diff trees use the
		// global one (the namespace's own failures opt out, see uncached).
		NegativeTimeout: &negative,
		// Modes are reported as the layer has them: 0000 stays 0000.
		NullPermissions: true,
		RootStableAttr:  &fusefs.StableAttr{Ino: rootIno},
		Logger:          slog.NewLogLogger(opts.Logger.Handler(), slog.LevelWarn),
	}
	if !opts.Passthrough {
		fo.MountOptions.DisabledCapabilities |= fuse.CAP_PASSTHROUGH
	}
	root := &rootNode{fsys: fsys}
	srv, err := fusefs.Mount(mountpoint, root, fo)
	if err != nil {
		return nil, fmt.Errorf("fs: mount %s: %w", mountpoint, err)
	}
	s := &Server{fuse: srv, mountpoint: mountpoint, fsys: fsys, root: root}
	if err := s.checkServing(&before); err != nil {
		_ = srv.Unmount()
		return nil, err
	}

	granted := srv.KernelSettings().Flags64()&fuse.CAP_PASSTHROUGH != 0
	switch {
	case opts.forceBackingFiles || opts.Passthrough && granted:
		fsys.passthrough.Store(true)
	case opts.Passthrough:
		opts.Logger.Info("kernel lacks FUSE passthrough: all reads go through the daemon")
	}
	opts.Logger.Info("mounted layer store", "mountpoint", mountpoint, "passthrough", fsys.passthrough.Load())
	return s, nil
}

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
	if err := syscall.Unmount(s.mountpoint, 0); err != nil {
		return fmt.Errorf("fs: unmount %s: %w", s.mountpoint, err)
	}
	return nil
}

// Detach unmounts the store lazily (MNT_DETACH): it leaves the mount namespace at once, so
// that nobody meets it again, but files still open in it keep it alive; they fail
// (ENOTCONN) once this process exits. Wait does not return before they are closed.
func (s *Server) Detach() error {
	if err := syscall.Unmount(s.mountpoint, syscall.MNT_DETACH); err != nil {
		return fmt.Errorf("fs: detach %s: %w", s.mountpoint, err)
	}
	return nil
}

// Wait returns once the store is unmounted (by Unmount or by anyone else).
func (s *Server) Wait() { s.fuse.Wait() }

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
