package main

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/BurntSushi/toml"
	"github.com/opencontainers/go-digest"

	storefs "github.com/layerstore/layerstore/fs"
	"github.com/layerstore/layerstore/internal/control/protocol"
	"github.com/layerstore/layerstore/internal/runtimestore"
)

// crioPaths are CRI-O's configuration file and its drop-in directory, read in that order (the
// drop-ins in lexical order), a later value winning, as CRI-O reads them.
type crioPaths struct{ file, dir string }

// crioConf is where CRI-O's configuration is unless [runtimes] crio-config says otherwise.
var crioConf = crioPaths{"/etc/crio/crio.conf", "/etc/crio/crio.conf.d"}

// crioPathsOf are the CRI-O configuration paths of cfg: its [runtimes] keys, else crioConf.
func crioPathsOf(cfg *Config) crioPaths {
	return crioPaths{or(cfg.Runtimes.CrioConfig, crioConf.file), or(cfg.Runtimes.CrioConfigDir, crioConf.dir)}
}

// crioConfig is what the daemon reads of CRI-O's configuration.
type crioConfig struct {
	Crio struct {
		Root string `toml:"root"`
		API  struct {
			Listen string `toml:"listen"`
		} `toml:"api"`
		Image struct {
			PinnedImages []string `toml:"pinned_images"`
		} `toml:"image"`
	} `toml:"crio"`
}

// read reads the configuration files at p that exist; ok is false when there are none.
func (p crioPaths) read() (c crioConfig, ok bool) {
	drops, _ := filepath.Glob(filepath.Join(p.dir, "*.conf"))
	slices.Sort(drops)
	for _, f := range append([]string{p.file}, drops...) {
		var one crioConfig
		md, err := toml.DecodeFile(f, &one)
		if err != nil {
			continue // missing, or CRI-O's own error to report
		}
		ok = true
		c.Crio.Root = or(one.Crio.Root, c.Crio.Root)
		c.Crio.API.Listen = or(one.Crio.API.Listen, c.Crio.API.Listen)
		if md.IsDefined("crio", "image", "pinned_images") {
			c.Crio.Image.PinnedImages = one.Crio.Image.PinnedImages
		}
	}
	return c, ok
}

// runtimeGraphroots are the runtimes' storage roots the daemon records layers into: the
// configured ones, else those of the node's runtimes: storage.conf's graphroot (podman's,
// buildah's, and CRI-O's unless its own configuration says otherwise; a rootless daemon's
// user's own) and CRI-O's root.
func runtimeGraphroots(cfg *Config) []string {
	if len(cfg.Runtimes.Graphroots) > 0 {
		return cleanPaths(cfg.Runtimes.Graphroots)
	}
	roots := []string{graphRootDefault()}
	var sc storageConf
	if _, err := toml.DecodeFile(storageConfPath(), &sc); err == nil && sc.Storage.GraphRoot != "" {
		roots[0] = os.ExpandEnv(sc.Storage.GraphRoot)
	}
	if c, ok := crioPathsOf(cfg).read(); ok && c.Crio.Root != "" && os.Geteuid() == 0 {
		roots = append(roots, c.Crio.Root)
	}
	return cleanPaths(roots)
}

// cleanPaths cleans and deduplicates absolute paths, dropping the others.
func cleanPaths(paths []string) []string {
	var out []string
	for _, p := range paths {
		if p = filepath.Clean(p); filepath.IsAbs(p) && !slices.Contains(out, p) {
			out = append(out, p)
		}
	}
	return out
}

// newRecorder returns the recorder of the runtimes' layers for the store at mountpoint, or
// nil when the configuration turns it off.
func newRecorder(cfg *Config, mountpoint string, log *slog.Logger) *runtimestore.Recorder {
	if !orBool(cfg.Runtimes.RecordLayers, true) {
		log.Info("not recording the runtimes' layers taken from the store ([runtimes] record-layers = false): runtimes on containers/storage 1.58 or later lose them at their next start")
		return nil
	}
	abs, err := filepath.Abs(mountpoint)
	if err != nil {
		abs = mountpoint
	}
	roots := runtimeGraphroots(cfg)
	log.Info("recording the layers runtimes take from the store where their containers/storage does not", "graphroots", roots)
	return runtimestore.New(runtimestore.Config{Store: abs, Graphroots: roots, Logger: log})
}

// runtimeRecords is the recorder's part of the status; nil without a recorder.
func runtimeRecords(r *runtimestore.Recorder) *protocol.RuntimeRecords {
	if r == nil {
		return nil
	}
	s := r.Stats()
	return &protocol.RuntimeRecords{Graphroots: s.Graphroots, Recorded: s.Recorded, Failures: s.Failures, LastError: s.LastError}
}

// recordingStore is the store that tells the recorder when a runtime takes a layer (its
// overlay driver creates the layer's use file right after writing overlay/<id>): the
// recorder's pass runs in its own goroutine, after the runtime saved its storage.
type recordingStore struct {
	storefs.Store
	rec *runtimestore.Recorder
}

func (s recordingStore) Use(ref string, key digest.Digest) {
	s.Store.Use(ref, key)
	s.rec.Poke()
}

// startRecordBound bounds the recorder's first pass, made before the daemon says it is ready.
const startRecordBound = 10 * time.Second

// startRecorder makes the recorder's first pass (bounded: layers taken before a crash or a
// reboot are recorded before the runtimes start again, where the unit orders them after the
// daemon) and runs it until ctx is done.
func startRecorder(ctx context.Context, r *runtimestore.Recorder) {
	if r == nil {
		return
	}
	first, cancel := context.WithTimeout(ctx, startRecordBound)
	r.Sync(first)
	cancel()
	go r.Run(ctx)
}
