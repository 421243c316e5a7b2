package main

import (
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/BurntSushi/toml"
)

// DefaultConfigPath is where serve reads its configuration unless told otherwise, as root;
// a rootless daemon reads layerstore/config.toml in the user's configuration directory
// (defaultConfigPath).
const DefaultConfigPath = "/etc/layerstore/config.toml"

// defaultConfigPath is DefaultConfigPath for root, $XDG_CONFIG_HOME/layerstore/config.toml
// (~/.config/...) for another user.
func defaultConfigPath() string {
	if os.Geteuid() == 0 {
		return DefaultConfigPath
	}
	d, err := os.UserConfigDir()
	if err != nil {
		return DefaultConfigPath
	}
	return filepath.Join(d, "layerstore", "config.toml")
}

// defaultCacheDir is DefaultCacheDir for root, $XDG_CACHE_HOME/layerstore (~/.cache/...) for
// another user.
func defaultCacheDir() string {
	if os.Geteuid() == 0 {
		return DefaultCacheDir
	}
	d, err := os.UserCacheDir()
	if err != nil {
		return DefaultCacheDir
	}
	return filepath.Join(d, "layerstore")
}

// Config is the daemon's configuration file. Every key is optional; a missing file means all
// defaults. packaging/config.toml documents each key with its default.
type Config struct {
	CacheDir      string   `toml:"cache-dir"`
	CacheMaxSize  Size     `toml:"cache-max-size"`
	ControlSocket string   `toml:"control-socket"`
	LogLevel      string   `toml:"log-level"`
	AuthFiles     []string `toml:"auth-files"`

	// MetricsAddress, when set, is a TCP address ("127.0.0.1:9108", ":9108") serving GET
	// /metrics alone; off by default.
	MetricsAddress string `toml:"metrics-address"`

	Registries struct {
		Conf      string   `toml:"conf"`
		ConfDir   string   `toml:"conf-dir"`
		TagTTL    Duration `toml:"tag-ttl"`
		Timeout   Duration `toml:"request-timeout"`
		Stall     Duration `toml:"stall-timeout"`
		Attempts  int      `toml:"max-attempts"`
		PerHost   int      `toml:"concurrency-per-registry"`
		MaxGap    Size     `toml:"max-gap"`
		MaxSpan   Size     `toml:"max-span"`
		MaxRanges int      `toml:"max-ranges-per-request"`
	} `toml:"registries"`

	Layers struct {
		ResolveTimeout Duration `toml:"resolve-timeout"`
		ReadTimeout    Duration `toml:"read-timeout"`
		KeepTTL        Duration `toml:"keep-ttl"`
		NegativeTTL    Duration `toml:"negative-ttl"`
		RequireDiffID  bool     `toml:"require-diffid"`
	} `toml:"layers"`

	Prefetch struct {
		Enabled     *bool     `toml:"enabled"`
		Concurrency int       `toml:"concurrency"`
		BatchSize   Size      `toml:"batch-size"`
		Bandwidth   Size      `toml:"bandwidth"`
		Quiet       *Duration `toml:"quiet"`
	} `toml:"prefetch"`

	FUSE struct {
		Passthrough *bool `toml:"passthrough"`
	} `toml:"fuse"`

	// Runtimes is the runtimes' storage the daemon records the layers they take from the
	// store into (see internal/runtimestore).
	Runtimes struct {
		RecordLayers *bool    `toml:"record-layers"`
		Graphroots   []string `toml:"graphroots"`
		// CrioConfig and CrioConfigDir are CRI-O's configuration (its --config and
		// --config-dir): its root and its pinned images.
		CrioConfig    string `toml:"crio-config"`
		CrioConfigDir string `toml:"crio-config-dir"`
	} `toml:"runtimes"`

	CredentialTTL Duration `toml:"credential-ttl"`
}

// Defaults that belong to the daemon rather than a library.
const (
	DefaultCacheDir = "/var/cache/layerstore"
	DefaultLogLevel = "info"
)

// loadConfig reads path. A missing file gives the defaults unless required (the path was given
// explicitly); unknown keys are errors, so that a typo never silently means a default.
func loadConfig(path string, required bool) (*Config, error) {
	var c Config
	md, err := toml.DecodeFile(path, &c)
	switch {
	case errors.Is(err, fs.ErrNotExist) && !required:
		return &c, nil
	case err != nil:
		return nil, fmt.Errorf("config %s: %w", path, err)
	}
	if un := md.Undecoded(); len(un) > 0 {
		keys := make([]string, len(un))
		for i, k := range un {
			keys[i] = k.String()
		}
		return nil, fmt.Errorf("config %s: unknown keys: %s", path, strings.Join(keys, ", "))
	}
	if _, err := parseLevel(c.LogLevel); err != nil {
		return nil, fmt.Errorf("config %s: %w", path, err)
	}
	if c.MetricsAddress != "" {
		if _, _, err := net.SplitHostPort(c.MetricsAddress); err != nil {
			return nil, fmt.Errorf("config %s: metrics-address %q: want host:port, e.g. \"127.0.0.1:9108\" (%v)", path, c.MetricsAddress, err)
		}
	}
	return &c, nil
}

func parseLevel(s string) (slog.Level, error) {
	switch strings.ToLower(s) {
	case "", "info":
		return slog.LevelInfo, nil
	case "debug":
		return slog.LevelDebug, nil
	case "warn", "warning":
		return slog.LevelWarn, nil
	case "error":
		return slog.LevelError, nil
	}
	return 0, fmt.Errorf("log level %q: want debug, info, warn or error", s)
}

// Duration is a TOML string such as "30s" or "10m".
type Duration time.Duration

func (d *Duration) UnmarshalText(b []byte) error {
	v, err := time.ParseDuration(string(b))
	if err != nil {
		return err
	}
	if v < 0 {
		return fmt.Errorf("negative duration %q", b)
	}
	*d = Duration(v)
	return nil
}

// Size is a byte count: an integer, or a string with a unit ("512MiB", "10GiB", "100MB").
type Size int64

func (s *Size) UnmarshalTOML(v any) error {
	switch v := v.(type) {
	case int64:
		if v < 0 {
			return fmt.Errorf("negative size %d", v)
		}
		*s = Size(v)
		return nil
	case string:
		n, err := parseSize(v)
		*s = Size(n)
		return err
	}
	return fmt.Errorf("size %v: want a number of bytes or a string such as \"10GiB\"", v)
}

var sizeUnits = []struct {
	suffix string
	mult   int64
}{
	{"KiB", 1 << 10}, {"MiB", 1 << 20}, {"GiB", 1 << 30}, {"TiB", 1 << 40},
	{"KB", 1e3}, {"MB", 1e6}, {"GB", 1e9}, {"TB", 1e12}, {"B", 1},
}

func parseSize(s string) (int64, error) {
	t := strings.TrimSpace(s)
	mult := int64(1)
	for _, u := range sizeUnits {
		if num, ok := strings.CutSuffix(t, u.suffix); ok {
			t, mult = strings.TrimSpace(num), u.mult
			break
		}
	}
	n, err := strconv.ParseFloat(t, 64)
	if err != nil || n < 0 {
		return 0, fmt.Errorf("size %q: want a number of bytes or a string such as \"10GiB\"", s)
	}
	return int64(n * float64(mult)), nil
}

// or returns v unless it is the zero value, then def.
func or[T comparable](v, def T) T {
	var zero T
	if v == zero {
		return def
	}
	return v
}

func orBool(v *bool, def bool) bool {
	if v == nil {
		return def
	}
	return *v
}

func fileExists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}
