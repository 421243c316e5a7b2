package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"time"

	"github.com/layerstore/layerstore/cache"
	"github.com/layerstore/layerstore/fetcher"
	"github.com/layerstore/layerstore/fs"
	"github.com/layerstore/layerstore/internal/control"
	"github.com/layerstore/layerstore/internal/sdnotify"
	"github.com/layerstore/layerstore/layer"
)

const serveUsage = `usage: layerstore serve [flags] MOUNTPOINT

Mount the additional layer store at MOUNTPOINT and serve it until SIGTERM or SIGINT.

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
	fl.StringVar(&f.config, "config", DefaultConfigPath, "configuration file (TOML); a missing default file means all defaults")
	fl.StringVar(&f.cacheDir, "cache-dir", "", "cache directory (default "+DefaultCacheDir+")")
	fl.StringVar(&f.registriesConf, "registries-conf", "", "registries.conf to use, with its .d drop-ins (default: the system's)")
	fl.StringVar(&f.socket, "control-socket", "", "control socket path (default "+control.DefaultSocket+")")
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
	cfg.CacheDir = or(f.cacheDir, or(cfg.CacheDir, DefaultCacheDir))
	cfg.ControlSocket = or(f.socket, or(cfg.ControlSocket, control.DefaultSocket))
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

// serve runs the daemon until ctx is done or the mount goes away.
func serve(ctx context.Context, cfg *Config, mountpoint string, log *slog.Logger) error {
	c, err := cache.New(cfg.CacheDir, cache.WithMaxSize(int64(or(cfg.CacheMaxSize, Size(cache.DefaultMaxSize)))), cache.WithLogger(log))
	if err != nil {
		return fmt.Errorf("cache: %w", err)
	}
	defer c.Close()

	keys := fetcher.NewMemoryKeychain()
	client, err := newClient(cfg, keys, log)
	if err != nil {
		return err
	}
	m, err := layer.New(client, c, layerOptions(cfg, log)...)
	if err != nil {
		return err
	}
	defer m.Close()

	ln, err := control.Listen(cfg.ControlSocket)
	if err != nil {
		return err
	}
	api := &http.Server{
		Handler:           control.Handler(m, keys, time.Duration(or(cfg.CredentialTTL, Duration(control.DefaultCredentialTTL))), log),
		ReadHeaderTimeout: 10 * time.Second,
	}
	go api.Serve(ln)
	defer api.Close()

	if err := fs.ClearDeadMount(mountpoint); err != nil {
		return err
	}
	if err := os.MkdirAll(mountpoint, 0o755); err != nil {
		return err
	}
	srv, err := fs.Mount(mountpoint, m, fs.Options{
		Logger:      log,
		AllowOther:  orBool(cfg.FUSE.AllowOther, true),
		Passthrough: orBool(cfg.FUSE.Passthrough, true),
	})
	if err != nil {
		return fmt.Errorf("mounting %s: %w", mountpoint, err)
	}
	log.Info("serving", "mountpoint", mountpoint, "cache", cfg.CacheDir, "control", cfg.ControlSocket, "version", version)
	if err := sdnotify.Notify("READY=1\nSTATUS=serving " + mountpoint); err != nil {
		log.Warn("notifying systemd", "err", err)
	}

	gone := make(chan struct{})
	go func() { srv.Wait(); close(gone) }()
	select {
	case <-ctx.Done():
		log.Info("stopping", "mountpoint", mountpoint)
		_ = sdnotify.Notify("STOPPING=1")
		if err := srv.Unmount(); err != nil {
			log.Warn("unmount", "err", err)
		}
		<-gone
	case <-gone:
		log.Warn("the mount went away; exiting", "mountpoint", mountpoint)
	}
	return nil
}

// newClient builds the registry client from the configuration.
func newClient(cfg *Config, keys *fetcher.MemoryKeychain, log *slog.Logger) (*fetcher.Client, error) {
	r := &cfg.Registries
	var blob []fetcher.Option
	if r.Timeout > 0 {
		blob = append(blob, fetcher.WithRequestTimeout(time.Duration(r.Timeout)))
	}
	if r.Attempts > 0 {
		blob = append(blob, fetcher.WithMaxAttempts(r.Attempts))
	}
	if r.MaxGap > 0 {
		blob = append(blob, fetcher.WithMaxGap(int64(r.MaxGap)))
	}
	if r.MaxSpan > 0 {
		blob = append(blob, fetcher.WithMaxSpan(int64(r.MaxSpan)))
	}
	if r.MaxRanges > 0 {
		blob = append(blob, fetcher.WithMaxRangesPerRequest(r.MaxRanges))
	}
	blob = append(blob, fetcher.WithHostLimiter(fetcher.NewHostLimiter(r.PerHost)), fetcher.WithLogger(log))
	var res []fetcher.ResolverOption
	if r.TagTTL > 0 {
		res = append(res, fetcher.WithTagTTL(time.Duration(r.TagTTL)))
	}
	return fetcher.NewClient(
		fetcher.WithRegistriesConf(r.Conf, r.ConfDir),
		fetcher.WithAuthFiles(cfg.AuthFiles...),
		fetcher.WithMemoryKeychain(keys),
		fetcher.WithBlobOptions(blob...),
		fetcher.WithResolverOptions(res...),
		fetcher.WithClientLogger(log),
	)
}

func layerOptions(cfg *Config, log *slog.Logger) []layer.Option {
	l, p := &cfg.Layers, &cfg.Prefetch
	opts := []layer.Option{
		layer.WithLogger(log),
		layer.WithPrefetch(orBool(p.Enabled, true)),
		layer.WithRequireDiffID(l.RequireDiffID),
		layer.WithPrefetchBandwidth(int64(p.Bandwidth)),
	}
	if l.ResolveTimeout > 0 {
		opts = append(opts, layer.WithResolveTimeout(time.Duration(l.ResolveTimeout)))
	}
	if l.ReadTimeout > 0 {
		opts = append(opts, layer.WithReadTimeout(time.Duration(l.ReadTimeout)))
	}
	if l.KeepTTL > 0 {
		opts = append(opts, layer.WithKeepTTL(time.Duration(l.KeepTTL)))
	}
	if l.NegativeTTL > 0 {
		opts = append(opts, layer.WithNegativeTTL(time.Duration(l.NegativeTTL)))
	}
	if p.Concurrency > 0 {
		opts = append(opts, layer.WithPrefetchConcurrency(p.Concurrency))
	}
	if p.BatchSize > 0 {
		opts = append(opts, layer.WithPrefetchBatch(int64(p.BatchSize)))
	}
	return opts
}
