package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"runtime/debug"
	"slices"

	"go.podman.io/storage"
	"golang.org/x/sys/unix"
)

// This file holds the storage steps CRI-O takes when it starts and stops (cmd/crio/main.go,
// server.New, lib.New and ContainerServer.Shutdown in CRI-O), each subcommand in a process of
// its own, as CRI-O is after a restart.

// libraries names the versions of c/storage and c/image this binary was built with.
type libraries struct {
	Storage string `json:"storage"`
	Image   string `json:"image"`
}

func builtWith() libraries {
	var l libraries
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return l
	}
	for _, d := range bi.Deps {
		if d.Replace != nil {
			d = d.Replace
		}
		switch d.Path {
		case "go.podman.io/storage":
			l.Storage = d.Version
		case "go.podman.io/image/v5":
			l.Image = d.Version
		}
	}
	return l
}

// openCRIOStore opens the store of storage.conf the way CRI-O does (RootConfig.GetStore): its
// defaults come from storage.conf, and it passes on the run root, graph root, image store,
// driver, driver options (which carry the additional layer stores) and pull options only.
func openCRIOStore(ctx context.Context) (storage.Store, error) {
	opts, err := storage.DefaultStoreOptions()
	if err != nil {
		return nil, fmt.Errorf("reading storage configuration: %w", err)
	}
	var store storage.Store
	err = bounded(ctx, "opening the store", func() error {
		var err error
		store, err = storage.GetStore(storage.StoreOptions{
			RunRoot:            opts.RunRoot,
			GraphRoot:          opts.GraphRoot,
			ImageStore:         opts.ImageStore,
			GraphDriverName:    opts.GraphDriverName,
			GraphDriverOptions: opts.GraphDriverOptions,
			PullOptions:        opts.PullOptions,
		})
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("opening store: %w", err)
	}
	return store, nil
}

// withCRIOStore opens the store, runs f, and shuts the store down (without unmounting what
// is mounted, as CRI-O's Shutdown does), bounded by ctx.
func withCRIOStore(ctx context.Context, f func(storage.Store) error) error {
	store, err := openCRIOStore(ctx)
	if err != nil {
		return err
	}
	err = f(store)
	serr := bounded(ctx, "shutting down the store", func() error {
		_, err := store.Shutdown(false)
		if errors.Is(err, storage.ErrLayerUsedByContainer) {
			return nil // still mounted by a container: CRI-O ignores this too
		}
		return err
	})
	if serr != nil {
		err = errors.Join(err, fmt.Errorf("shutting down store: %w", serr))
	}
	return err
}

// bounded runs f and returns its error, or an error naming step once ctx is done: c/storage's
// calls take no context, and one waiting for a lock would otherwise hang the harness past its
// --timeout. The process exits soon after, f still running.
func bounded(ctx context.Context, step string, f func() error) error {
	done := make(chan error, 1)
	go func() { done <- f() }()
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
		return fmt.Errorf("%s: %w", step, context.Cause(ctx))
	}
}

// storeContents is what a store knows (records) and holds (directories) at one moment.
type storeContents struct {
	layers, images, containers          []string // IDs in layers.json, images.json, containers.json (and volatile ones)
	layerDirs, imageDirs, containerDirs []string // <driver>/<id>, <driver>-images/<id>, <driver>-containers/<id>
}

// idRE matches the IDs c/storage names its directories with.
var idRE = regexp.MustCompile(`^[0-9a-f]{64}$`)

// contents reads what store knows and holds.
func contents(ctx context.Context, store storage.Store) (storeContents, error) {
	var c storeContents
	err := bounded(ctx, "listing the store", func() error {
		layers, err := store.Layers()
		if err != nil {
			return fmt.Errorf("listing layers: %w", err)
		}
		for _, l := range layers {
			c.layers = append(c.layers, l.ID)
		}
		images, err := store.Images()
		if err != nil {
			return fmt.Errorf("listing images: %w", err)
		}
		for _, i := range images {
			c.images = append(c.images, i.ID)
		}
		containers, err := store.Containers()
		if err != nil {
			return fmt.Errorf("listing containers: %w", err)
		}
		for _, ctr := range containers {
			c.containers = append(c.containers, ctr.ID)
		}
		return nil
	})
	if err != nil {
		return c, err
	}
	root, driver := store.GraphRoot(), store.GraphDriverName()
	for _, d := range []struct {
		dir string
		ids *[]string
	}{{driver, &c.layerDirs}, {driver + "-images", &c.imageDirs}, {driver + "-containers", &c.containerDirs}} {
		entries, err := os.ReadDir(filepath.Join(root, d.dir))
		if err != nil && !errors.Is(err, os.ErrNotExist) {
			return c, err
		}
		for _, e := range entries {
			if e.IsDir() && idRE.MatchString(e.Name()) {
				*d.ids = append(*d.ids, e.Name())
			}
		}
	}
	return c, nil
}

// removedItems is what a step removed from a store.
type removedItems struct {
	Layers        []string `json:"layers,omitempty"`        // records gone from layers.json
	Images        []string `json:"images,omitempty"`        // records gone from images.json
	Containers    []string `json:"containers,omitempty"`    // records gone from containers.json
	LayerDirs     []string `json:"layerDirs,omitempty"`     // <graphroot>/<driver>/<id> gone
	ImageDirs     []string `json:"imageDirs,omitempty"`     // <graphroot>/<driver>-images/<id> gone
	ContainerDirs []string `json:"containerDirs,omitempty"` // <graphroot>/<driver>-containers/<id> gone
}

func (r removedItems) empty() bool {
	return len(r.Layers)+len(r.Images)+len(r.Containers)+len(r.LayerDirs)+len(r.ImageDirs)+len(r.ContainerDirs) == 0
}

// gone returns the members of before missing from after, sorted.
func gone(before, after []string) []string {
	var out []string
	for _, id := range before {
		if !slices.Contains(after, id) {
			out = append(out, id)
		}
	}
	slices.Sort(out)
	return out
}

func removedBetween(before, after storeContents) removedItems {
	return removedItems{
		Layers:        gone(before.layers, after.layers),
		Images:        gone(before.images, after.images),
		Containers:    gone(before.containers, after.containers),
		LayerDirs:     gone(before.layerDirs, after.layerDirs),
		ImageDirs:     gone(before.imageDirs, after.imageDirs),
		ContainerDirs: gone(before.containerDirs, after.containerDirs),
	}
}

// knownCounts is how many records a store has.
type knownCounts struct {
	Layers     int `json:"layers"`
	Images     int `json:"images"`
	Containers int `json:"containers"`
}

func counts(c storeContents) knownCounts {
	return knownCounts{Layers: len(c.layers), Images: len(c.images), Containers: len(c.containers)}
}

// crioStartResult is the JSON printed by "harness crio-start".
type crioStartResult struct {
	Libraries libraries `json:"libraries"`
	GraphRoot string    `json:"graphRoot"`
	// Unclean is true when --clean-shutdown-file is set, FILE.supported exists and FILE does
	// not: CRI-O then checks and repairs the store (internal_repair) before anything else.
	Unclean bool          `json:"unclean"`
	Repair  *repairResult `json:"repair,omitempty"`
	// Restore is what CRI-O's restore removed: the containers it cannot restore (CRI-O's own,
	// their metadata naming a pod, without the config.json CRI-O writes), and their layers.
	Restore removedItems `json:"restore"`
	// GarbageCollect is what store.GarbageCollect() removed; GarbageCollectError its error,
	// which CRI-O logs before it goes on.
	GarbageCollect      removedItems `json:"garbageCollect"`
	GarbageCollectError string       `json:"garbageCollectError,omitempty"`
	Known               knownCounts  `json:"known"` // records after the start
}

func runCRIOStart(ctx context.Context, args []string) (any, error) {
	var common commonFlags
	fs := newFlagSet("crio-start", &common)
	cleanFile := fs.String("clean-shutdown-file", "", "CRI-O's clean_shutdown_file: repair the store first when FILE.supported exists and FILE does not, then remove FILE and create FILE.supported")
	pos, err := parseArgs(fs, args)
	if err != nil {
		return nil, err
	}
	if len(pos) != 0 {
		return nil, fmt.Errorf("%w: crio-start takes no arguments", errUsage)
	}
	ctx, cancel, err := common.apply(ctx)
	if err != nil {
		return nil, err
	}
	defer cancel()
	res := &crioStartResult{Libraries: builtWith()}
	err = withCRIOStore(ctx, func(store storage.Store) error {
		res.GraphRoot = store.GraphRoot()
		// lib.New: internal_repair (on by default) when the last shutdown was unclean.
		if *cleanFile != "" && shutdownWasUnclean(*cleanFile) {
			res.Unclean = true
			rep, err := internalRepair(ctx, store)
			res.Repair = rep
			if err != nil {
				return err
			}
		}
		// server.New: restore, which deletes the containers it cannot restore.
		before, err := contents(ctx, store)
		if err != nil {
			return err
		}
		if err := restore(ctx, store); err != nil {
			return err
		}
		after, err := contents(ctx, store)
		if err != nil {
			return err
		}
		res.Restore = removedBetween(before, after)
		// main: the clean shutdown file is removed, FILE.supported written...
		if *cleanFile != "" {
			if err := markStarted(*cleanFile); err != nil {
				return err
			}
		}
		// ...and the store garbage-collected, at every start.
		before = after
		gcErr := bounded(ctx, "GarbageCollect", store.GarbageCollect)
		after, err = contents(ctx, store)
		if err != nil {
			return err
		}
		res.GarbageCollect = removedBetween(before, after)
		res.Known = counts(after)
		if gcErr != nil {
			res.GarbageCollectError = gcErr.Error()
			return fmt.Errorf("GarbageCollect (CRI-O logs this error and starts anyway): %w", gcErr)
		}
		return nil
	})
	return res, failWith(res, err)
}

// shutdownWasUnclean is CRI-O's test: the clean shutdown file is supported (FILE.supported
// exists, written at every start) and missing (written only by a clean stop).
func shutdownWasUnclean(file string) bool {
	if _, err := os.Stat(file + ".supported"); err != nil {
		return false
	}
	_, err := os.Stat(file)
	return err != nil
}

// markStarted does what CRI-O does with the clean shutdown file once it is up: removes it and
// writes FILE.supported, then syncs the directory.
func markStarted(file string) error {
	if err := os.Remove(file); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(file), 0o755); err != nil {
		return err
	}
	if err := os.WriteFile(file+".supported", nil, 0o644); err != nil {
		return err
	}
	return syncDir(filepath.Dir(file))
}

func syncDir(dir string) error {
	f, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer f.Close()
	return f.Sync()
}

// crioMetadata is the part of CRI-O's container metadata (RuntimeContainerMetadata) that
// "harness run" writes and restore reads.
type crioMetadata struct {
	PodName       string `json:"pod-name"`
	PodID         string `json:"pod-id"`
	ImageName     string `json:"image-name"`
	ImageID       string `json:"image-id"`
	ContainerName string `json:"name"`
	MetadataName  string `json:"metadata-name"`
	CreatedAt     int64  `json:"created-at"`
	Pod           bool   `json:"pod,omitempty"`
}

// restore deletes the containers CRI-O would fail to restore at start-up: those whose metadata
// names a pod (CRI-O's own) but whose directory lacks config.json (written by CRI-O when it
// creates the container in its runtime, which the harness never does). CRI-O deletes them by
// name with store.DeleteContainer.
func restore(ctx context.Context, store storage.Store) error {
	return bounded(ctx, "restore", func() error {
		containers, err := store.Containers()
		if err != nil {
			return fmt.Errorf("listing containers: %w", err)
		}
		for _, c := range containers {
			var md crioMetadata
			if jsonUnmarshal(c.Metadata, &md) != nil || md.PodName == "" || md.PodID == "" {
				continue // not a CRI-O container: left alone
			}
			if _, err := store.FromContainerDirectory(c.ID, "config.json"); err == nil {
				continue
			}
			if err := store.DeleteContainer(c.ID); err != nil && !errors.Is(err, storage.ErrNotAContainer) {
				return fmt.Errorf("deleting container %s, which CRI-O could not restore: %w", c.ID, err)
			}
		}
		return nil
	})
}

// repairResult is what CRI-O's internal_repair did.
type repairResult struct {
	Check      checkReport `json:"check"`
	CheckError string      `json:"checkError,omitempty"`
	// HasErrors is CRI-O's CheckReportHasErrors: only then does it call Repair.
	HasErrors    bool     `json:"hasErrors"`
	Repaired     bool     `json:"repaired"`
	RepairErrors []string `json:"repairErrors,omitempty"`
	// WouldWipe: the check failed or the repair reported errors. CRI-O then removes the
	// whole graph root (RemoveStorageDirectory); the harness does not, and fails.
	WouldWipe bool         `json:"wouldWipe"`
	Removed   removedItems `json:"removed"` // by Repair
}

// checkReport is storage.CheckReport with the errors as text.
type checkReport struct {
	Layers     map[string][]string `json:"layers,omitempty"`
	ROLayers   map[string][]string `json:"roLayers,omitempty"`
	Images     map[string][]string `json:"images,omitempty"`
	ROImages   map[string][]string `json:"roImages,omitempty"`
	Containers map[string][]string `json:"containers,omitempty"`
}

func errorTexts(m map[string][]error) map[string][]string {
	if len(m) == 0 {
		return nil
	}
	out := map[string][]string{}
	for id, errs := range m {
		for _, e := range errs {
			out[id] = append(out[id], e.Error())
		}
	}
	return out
}

// crioCheckOptions are the options of CRI-O's internal_repair check (checkQuick in
// internal/lib): no layer digests and no contents (I/O and CPU bound), but mountable layers
// and all data items.
func crioCheckOptions() *storage.CheckOptions {
	return &storage.CheckOptions{
		LayerDigests:   false,
		LayerMountable: true,
		LayerContents:  false,
		LayerData:      true,
		ImageData:      true,
		ContainerData:  true,
	}
}

// internalRepair is CRI-O's internal_repair: Check with its options, and Repair with
// RepairEverything when the report has errors. A failed check or a repair with errors is an
// error (CRI-O would wipe the store).
func internalRepair(ctx context.Context, store storage.Store) (*repairResult, error) {
	res := &repairResult{}
	var report storage.CheckReport
	checkErr := bounded(ctx, "Check", func() error {
		var err error
		report, err = store.Check(crioCheckOptions())
		return err
	})
	if errors.Is(checkErr, context.DeadlineExceeded) || errors.Is(checkErr, context.Canceled) {
		return res, checkErr
	}
	res.Check = checkReport{
		Layers:     errorTexts(report.Layers),
		ROLayers:   errorTexts(report.ROLayers),
		Images:     errorTexts(report.Images),
		ROImages:   errorTexts(report.ROImages),
		Containers: errorTexts(report.Containers),
	}
	if checkErr != nil {
		res.CheckError = checkErr.Error()
		res.WouldWipe = true
		return res, fmt.Errorf("storage check failed (CRI-O would wipe %s): %w", store.GraphRoot(), checkErr)
	}
	res.HasErrors = len(report.Layers) > 0 || len(report.ROLayers) > 0 || len(report.Images) > 0 ||
		len(report.ROImages) > 0 || len(report.Containers) > 0
	if !res.HasErrors {
		return res, nil
	}
	before, err := contents(ctx, store)
	if err != nil {
		return res, err
	}
	var errs []error
	if err := bounded(ctx, "Repair", func() error {
		errs = store.Repair(report, storage.RepairEverything())
		return nil
	}); err != nil {
		return res, err
	}
	res.Repaired = true
	after, err := contents(ctx, store)
	if err != nil {
		return res, err
	}
	res.Removed = removedBetween(before, after)
	for _, e := range errs {
		res.RepairErrors = append(res.RepairErrors, e.Error())
	}
	if len(errs) > 0 {
		res.WouldWipe = true
		return res, fmt.Errorf("storage repair failed (CRI-O would wipe %s): %w", store.GraphRoot(), errors.Join(errs...))
	}
	return res, nil
}

// crioRepairResult is the JSON printed by "harness crio-repair".
type crioRepairResult struct {
	Libraries libraries `json:"libraries"`
	repairResult
	Known knownCounts `json:"known"` // records after the repair
}

func runCRIORepair(ctx context.Context, args []string) (any, error) {
	var common commonFlags
	fs := newFlagSet("crio-repair", &common)
	pos, err := parseArgs(fs, args)
	if err != nil {
		return nil, err
	}
	if len(pos) != 0 {
		return nil, fmt.Errorf("%w: crio-repair takes no arguments", errUsage)
	}
	ctx, cancel, err := common.apply(ctx)
	if err != nil {
		return nil, err
	}
	defer cancel()
	res := &crioRepairResult{Libraries: builtWith()}
	err = withCRIOStore(ctx, func(store storage.Store) error {
		rep, err := internalRepair(ctx, store)
		if rep != nil {
			res.repairResult = *rep
		}
		if err != nil {
			return err
		}
		after, err := contents(ctx, store)
		res.Known = counts(after)
		return err
	})
	return res, failWith(res, err)
}

// crioStopResult is the JSON printed by "harness crio-stop".
type crioStopResult struct {
	Libraries libraries `json:"libraries"`
	// StillMounted are the layers store.Shutdown(false) left mounted (containers' layers).
	StillMounted []string `json:"stillMounted,omitempty"`
	// CleanShutdownFile is the file written to say the stop was clean, if any.
	CleanShutdownFile string `json:"cleanShutdownFile,omitempty"`
}

// runCRIOStop is CRI-O's clean stop: store.Shutdown(false) (ContainerServer.Shutdown), a
// syncfs of the graph root, then the clean shutdown file, synced.
func runCRIOStop(ctx context.Context, args []string) (any, error) {
	var common commonFlags
	fs := newFlagSet("crio-stop", &common)
	cleanFile := fs.String("clean-shutdown-file", "", "write CRI-O's clean_shutdown_file FILE once the store is synced")
	pos, err := parseArgs(fs, args)
	if err != nil {
		return nil, err
	}
	if len(pos) != 0 {
		return nil, fmt.Errorf("%w: crio-stop takes no arguments", errUsage)
	}
	ctx, cancel, err := common.apply(ctx)
	if err != nil {
		return nil, err
	}
	defer cancel()
	res := &crioStopResult{Libraries: builtWith()}
	store, err := openCRIOStore(ctx)
	if err != nil {
		return nil, err
	}
	err = bounded(ctx, "shutting down the store", func() error {
		var err error
		res.StillMounted, err = store.Shutdown(false)
		if errors.Is(err, storage.ErrLayerUsedByContainer) {
			return nil
		}
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("shutting down store: %w", err)
	}
	if err := syncfs(store.GraphRoot()); err != nil {
		return nil, fmt.Errorf("syncing %s: %w", store.GraphRoot(), err)
	}
	if *cleanFile != "" {
		if err := os.MkdirAll(filepath.Dir(*cleanFile), 0o755); err != nil {
			return nil, err
		}
		if err := os.WriteFile(*cleanFile, nil, 0o644); err != nil {
			return nil, err
		}
		if err := syncDir(filepath.Dir(*cleanFile)); err != nil {
			return nil, err
		}
		res.CleanShutdownFile = *cleanFile
	}
	return res, nil
}

func syncfs(dir string) error {
	f, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer f.Close()
	return unix.Syncfs(int(f.Fd()))
}
