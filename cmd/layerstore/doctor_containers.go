package main

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"

	"github.com/BurntSushi/toml"

	"github.com/layerstore/layerstore/fetcher"
	"github.com/layerstore/layerstore/internal/control/protocol"
)

// The doctor's checks of the containers configuration: storage.conf (the store listed with
// :ref, the overlay driver), registries.conf and its drop-ins (the auth helper), and the
// c/storage layers that depend on the store.

// storageSetup is what storage.conf tells the other checks.
type storageSetup struct {
	store     string // the additional layer store to check: --store, or the entry with :ref
	graphroot string
}

type storageConf struct {
	Storage struct {
		Driver    string `toml:"driver"`
		GraphRoot string `toml:"graphroot"`
		Options   struct {
			AdditionalLayerStores []string `toml:"additionallayerstores"`
		} `toml:"options"`
	} `toml:"storage"`
}

// storageConfPath is the storage.conf containers/storage reads: as root, the system's; as
// another user (rootless), the user's own ($XDG_CONFIG_HOME/containers/storage.conf), where
// the store's line goes.
func storageConfPath() string {
	if p := os.Getenv(storageConfEnv); p != "" {
		return p
	}
	if os.Geteuid() != 0 {
		if d, err := os.UserConfigDir(); err == nil {
			return filepath.Join(d, "containers", "storage.conf")
		}
	}
	if !fileExists(defaultStorageConf) && fileExists(vendorStorageConf) {
		return vendorStorageConf
	}
	return defaultStorageConf
}

// graphRootDefault is where containers/storage keeps images when storage.conf does not say:
// the system's as root, $XDG_DATA_HOME/containers/storage (~/.local/share/...) rootless.
func graphRootDefault() string {
	if os.Geteuid() != 0 {
		if d := os.Getenv("XDG_DATA_HOME"); d != "" {
			return filepath.Join(d, "containers", "storage")
		}
		if h, err := os.UserHomeDir(); err == nil {
			return filepath.Join(h, ".local", "share", "containers", "storage")
		}
	}
	return defaultGraphRoot
}

// exampleStorePath is the store's mountpoint as installed: the system unit's as root, the
// user unit's (layerstore/store in the runtime directory) rootless.
func exampleStorePath() string {
	if os.Geteuid() != 0 {
		return filepath.Join(protocol.UserRuntimeDir(), "layerstore", "store")
	}
	return exampleStore
}

// alsEntry is one store of additionallayerstores, parsed the way c/storage's overlay driver
// does ("PATH[:ref]").
type alsEntry struct {
	path    string
	ref     bool
	problem string // why the overlay driver refuses it
}

func parseALSEntries(values []string) []alsEntry {
	var out []alsEntry
	for _, v := range values {
		if v == "" {
			continue
		}
		for s := range strings.SplitSeq(v, ",") {
			elems := strings.Split(s, ":")
			e := alsEntry{path: filepath.Clean(elems[0])}
			if !filepath.IsAbs(e.path) {
				e.problem = fmt.Sprintf("%q is not an absolute path", elems[0])
			}
			for _, o := range elems[1:] {
				switch {
				case o == "ref" && !e.ref:
					e.ref = true
				case o == "ref":
					e.problem = fmt.Sprintf("%q has :ref twice", s)
				default:
					e.problem = fmt.Sprintf("%q has the unknown option %q (only ref exists)", s, o)
				}
			}
			out = append(out, e)
		}
	}
	return out
}

// checkStorageConf checks that path selects the overlay driver and lists the store with :ref,
// and that every listed store exists (the overlay driver refuses to start otherwise). store,
// when not empty, is the store that must be listed.
func checkStorageConf(ctx context.Context, path, store string) (check, storageSetup) {
	const name = "storage.conf"
	setup := storageSetup{store: store, graphroot: graphRootDefault()}
	var sc storageConf
	if _, err := toml.DecodeFile(path, &sc); err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return check{name, statusFail, path + " does not exist: the runtime lists no additional layer store",
				fmt.Sprintf("create it with driver = \"overlay\" under [storage] and additionallayerstores = [\"%s:ref\"] under [storage.options]", or(store, exampleStorePath()))}, setup
		}
		return check{name, statusFail, fmt.Sprintf("%s does not parse (%v): podman and CRI-O refuse to start", path, err), "correct the TOML in " + path}, setup
	}
	if sc.Storage.GraphRoot != "" {
		setup.graphroot = os.ExpandEnv(sc.Storage.GraphRoot)
	}
	var f findings
	switch sc.Storage.Driver {
	case "overlay", "overlay2":
	case "":
		f.add(statusWarn, "no driver set (c/storage picks one; only overlay uses the store)", `set driver = "overlay" under [storage]`)
	default:
		f.add(statusFail, fmt.Sprintf("driver %q: only the overlay driver uses additional layer stores", sc.Storage.Driver),
			`set driver = "overlay" under [storage] (images stored with the old driver are not carried over)`)
	}
	entries := parseALSEntries(sc.Storage.Options.AdditionalLayerStores)
	var chosen *alsEntry
	for i := range entries {
		e := &entries[i]
		switch {
		case store != "" && e.path == filepath.Clean(store):
			chosen = e
		case store == "" && chosen == nil && e.ref:
			chosen = e
		}
	}
	if chosen == nil && store == "" && len(entries) > 0 {
		chosen = &entries[0]
	}
	switch {
	case len(entries) == 0:
		f.add(statusFail, "additionallayerstores lists no store: runtimes never look in it",
			fmt.Sprintf("add additionallayerstores = [\"%s:ref\"] under [storage.options]", or(store, exampleStorePath())))
	case chosen == nil:
		f.add(statusFail, store+" is not listed in additionallayerstores", fmt.Sprintf("add \"%s:ref\" to additionallayerstores under [storage.options]", store))
	case !chosen.ref:
		f.add(statusFail, chosen.path+" is listed without :ref: the runtime then does not put the image reference in the path, and the daemon cannot tell which image a layer comes from",
			fmt.Sprintf("write \"%s:ref\" in additionallayerstores", chosen.path))
	}
	if chosen != nil && setup.store == "" {
		setup.store = chosen.path
	}
	for _, e := range entries {
		if e.problem != "" {
			f.add(statusFail, "additionallayerstores: "+e.problem+": podman and CRI-O refuse to start", "correct the entry: \"/absolute/path:ref\"")
			continue
		}
		fi, err := statWithin(ctx, e.path, probeTimeout)
		switch {
		case errors.Is(err, fs.ErrNotExist):
			f.add(statusFail, e.path+" does not exist: the overlay driver refuses to start (can't stat additionallayerstore dir), so every podman/CRI-O command fails",
				"mkdir -p "+e.path+" and start the daemon, or remove the entry")
		case err != nil:
			f.add(statusFail, fmt.Sprintf("%v: every podman/CRI-O command fails", err),
				"restart the daemon (systemctl restart layerstore) or unmount the store: umount -l "+e.path)
		case !fi.IsDir():
			f.add(statusFail, e.path+" is not a directory: the overlay driver refuses to start", "make it the daemon's mountpoint")
		}
	}
	okMsg := path + ": driver overlay"
	if chosen != nil {
		okMsg += ", " + chosen.path + ":ref listed"
	}
	return f.check(name, okMsg), setup
}

// registriesPaths returns the registries.conf and the drop-in directories c/image reads.
func registriesPaths(conf, dir string) (string, []string) {
	conf = or(conf, or(os.Getenv(registriesConfEnv), defaultRegistriesConf))
	if dir != "" {
		return conf, []string{dir}
	}
	dirs := []string{defaultRegistriesConfDir}
	if home := fetcher.HomeDir(); home != "" {
		dirs = append(dirs, filepath.Join(home, ".config/containers/registries.conf.d"))
	}
	return conf, dirs
}

// checkAuthHelper checks that registries.conf or one of its drop-ins (the last one that sets
// it wins, as in c/image) names layerstore-auth-helper at the top level, and that it is
// installed.
func checkAuthHelper(conf string, dropInDirs []string) check {
	const name = "auth helper"
	files := []string{}
	if fileExists(conf) {
		files = append(files, conf)
	}
	for _, d := range dropInDirs {
		ents, _ := os.ReadDir(d) // sorted by name; a missing directory has no drop-ins
		for _, e := range ents {
			if !e.IsDir() && strings.HasSuffix(e.Name(), ".conf") {
				files = append(files, filepath.Join(d, e.Name()))
			}
		}
	}
	var setIn, value, misplaced string
	for _, p := range files {
		data, err := os.ReadFile(p)
		if err != nil {
			return check{name, statusFail, err.Error(), "make " + p + " readable"}
		}
		var m map[string]any
		md, err := toml.Decode(string(data), &m)
		if err != nil {
			return check{name, statusFail, fmt.Sprintf("%s does not parse (%v): every pull fails", p, err), "correct the TOML in " + p}
		}
		if v, ok := m[authHelperKey]; ok {
			s, isString := v.(string)
			if !isString {
				return check{name, statusFail, p + ": " + authHelperKey + " is not a string", fmt.Sprintf("%s = %q", authHelperKey, authHelperName)}
			}
			if s != "" {
				setIn, value = p, s
			}
		}
		for _, k := range md.Keys() {
			if len(k) > 1 && k[len(k)-1] == authHelperKey && misplaced == "" {
				table := "[" + k[:len(k)-1].String() + "]"
				if md.Type(k[:len(k)-1]...) == "ArrayHash" {
					table = "[" + table + "]"
				}
				misplaced = fmt.Sprintf("%s line %d: %s is inside the %s table above it (a TOML key after a table header belongs to that table), so c/image ignores it",
					p, lineOf(data, authHelperKey), authHelperKey, table)
			}
		}
	}
	line := fmt.Sprintf("%s = %q", authHelperKey, authHelperName)
	switch {
	case value != "":
		path, err := exec.LookPath(value)
		if err != nil {
			return check{name, statusFail, fmt.Sprintf("%s sets %s = %q, which cannot be run (%v): c/image only warns, and private registries' credentials never reach the daemon", setIn, authHelperKey, value, err),
				"install " + authHelperName + " in /usr/bin (go build -o /usr/bin/layerstore-auth-helper ./cmd/layerstore-auth-helper)"}
		}
		if filepath.Base(value) != authHelperName {
			return check{name, statusWarn, fmt.Sprintf("%s hands registry credentials to %s, not to %s", setIn, value, authHelperName), "set " + line}
		}
		return check{name, statusOK, fmt.Sprintf("%s sets %s (%s)", setIn, authHelperKey, path), ""}
	case misplaced != "":
		return check{name, statusWarn, misplaced, "move the line above the first table of that file, or into its own file in " + dropInDirs[0]}
	}
	return check{name, statusWarn, fmt.Sprintf("no %s in %s or the *.conf of %s: private registries need credentials the daemon can read itself (auth.json, docker config.json, credential helpers)",
		authHelperKey, conf, strings.Join(dropInDirs, " and ")),
		fmt.Sprintf("put %s at the top of %s (before any [[registry]]), or in %s", line, conf, filepath.Join(dropInDirs[0], "50-layerstore.conf"))}
}

var keyLine = regexp.MustCompile(`^\s*["']?` + regexp.QuoteMeta(authHelperKey) + `["']?\s*=`)

// lineOf returns the 1-based number of the first line of data that assigns key, or 0.
func lineOf(data []byte, key string) int {
	for i, l := range strings.Split(string(data), "\n") {
		if keyLine.MatchString(l) && strings.Contains(l, key) {
			return i + 1
		}
	}
	return 0
}

// checkDependents lists the layers of graphroot/overlay that link into an additional layer
// store and checks that each still resolves (its diff symlink's target answers), within
// resolveTimeout in all.
func checkDependents(ctx context.Context, graphroot string) (check, []dependentLayer) {
	const name = "dependent layers"
	layers := []dependentLayer{}
	marks, err := filepath.Glob(filepath.Join(graphroot, "overlay", "*", "additionallayer"))
	if err != nil {
		return check{name, statusFail, err.Error(), ""}, layers
	}
	if len(marks) == 0 {
		return check{name, statusOK, "no layer in " + filepath.Join(graphroot, "overlay") + " links into an additional layer store", ""}, layers
	}
	diffs := make([]string, len(marks))
	for i, m := range marks {
		dir := filepath.Dir(m)
		store, _ := os.ReadFile(m)
		l := dependentLayer{ID: filepath.Base(dir), Store: strings.TrimSpace(string(store))}
		if b, err := base64.StdEncoding.DecodeString(filepath.Base(filepath.Dir(l.Store))); err == nil {
			l.Ref = string(b)
		}
		diffs[i] = filepath.Join(dir, "diff")
		l.Target, _ = os.Readlink(diffs[i])
		layers = append(layers, l)
	}
	var broken []string
	for i, err := range statAll(ctx, diffs, resolveTimeout) {
		layers[i].Resolves = err == nil
		if err != nil {
			layers[i].Error = err.Error()
			broken = append(broken, or(layers[i].Ref, layers[i].ID))
		}
	}
	if len(broken) == 0 {
		return check{name, statusOK, fmt.Sprintf("%s: %s from the store, all resolve", filepath.Join(graphroot, "overlay"), plural(len(layers), "layer")), ""}, layers
	}
	imgs := uniq(broken)
	shown := imgs[:min(3, len(imgs))]
	more := ""
	if len(imgs) > len(shown) {
		more = fmt.Sprintf(" and %d more", len(imgs)-len(shown))
	}
	return check{name, statusFail, fmt.Sprintf("layers from the store that do not resolve: %d of %d (%s%s): containers of those images fail to start",
			len(broken), len(layers), strings.Join(shown, ", "), more),
			"start or restart the daemon (it serves them again on demand), or remove those images: layerstore dependents --remove"},
		layers
}

func uniq(s []string) []string {
	seen := map[string]bool{}
	var out []string
	for _, v := range s {
		if !seen[v] {
			seen[v] = true
			out = append(out, v)
		}
	}
	return out
}

// runtimeRoots are the graphroots of the node's runtimes the doctor looks at: storage.conf's
// and, as root, CRI-O's root where its configuration names one.
func runtimeRoots(graphroot string, crio crioPaths) []string {
	roots := []string{graphroot}
	if c, ok := crio.read(); ok && c.Crio.Root != "" && os.Geteuid() == 0 {
		roots = append(roots, c.Crio.Root)
	}
	return cleanPaths(roots)
}

// checkRuntimesRecords is checkRuntimeRecords of each graphroot, in one check: the worst
// status, the messages of those that are not ok (of all when all are).
func checkRuntimesRecords(roots []string, st *protocol.Status, crio crioPaths) check {
	var all, bad []check
	for _, r := range roots {
		c := checkRuntimeRecords(r, st, crio)
		all = append(all, c)
		if c.Status != statusOK {
			bad = append(bad, c)
		}
	}
	if len(bad) == 0 {
		bad = all
	}
	out := bad[0]
	for _, c := range bad[1:] {
		out.Message += "; " + c.Message
		if c.Fix != "" {
			out.Fix = strings.TrimPrefix(out.Fix+"; "+c.Fix, "; ")
		}
		if c.Status == statusFail {
			out.Status = statusFail
		}
	}
	return out
}

// checkRuntimeRecords checks that the runtime's own records (graphroot's layers.json) name the
// layers it took from a store, which containers/storage 1.58 and later do not write: the daemon
// writes them where it records into graphroot (st, its status, nil when it does not answer).
// Images that lost their layers already are named with the pull that mends each.
func checkRuntimeRecords(graphroot string, st *protocol.Status, crio crioPaths) check {
	const name = "runtime records"
	marks, _ := filepath.Glob(filepath.Join(graphroot, "overlay", "*", "additionallayer"))
	var layers []struct {
		ID string `json:"id"`
	}
	var images []storageImage
	err := readJSONFile(filepath.Join(graphroot, "overlay-layers", "layers.json"), &layers)
	if err == nil {
		err = readJSONFile(filepath.Join(graphroot, "overlay-images", "images.json"), &images)
	}
	if err != nil {
		return check{name, statusFail, err.Error(), "the runtime's storage does not load: see its own error"}
	}
	known := map[string]bool{}
	for _, l := range layers {
		known[l.ID] = true
	}
	unrecorded := 0
	for _, m := range marks {
		if !known[filepath.Base(filepath.Dir(m))] {
			unrecorded++
		}
	}
	records := st != nil && st.Runtimes != nil && slices.Contains(st.Runtimes.Graphroots, filepath.Clean(graphroot))
	broken, _ := brokenImages(graphroot, images, crio)
	if len(broken) > 0 {
		var fixes []string
		for _, b := range broken {
			fixes = append(fixes, b.Fix)
		}
		return check{name, statusFail, fmt.Sprintf("%s in %s lost their layers (taken from a store, not recorded by the runtime, removed at its start)", plural(len(broken), "image"), graphroot),
			strings.Join(fixes, "; ")}
	}
	switch {
	case records && unrecorded > 0:
		return check{name, statusOK, fmt.Sprintf("%s taken from the store not in %s's layers.json yet: the daemon records them at its next pass", plural(unrecorded, "layer"), graphroot), ""}
	case records:
		return check{name, statusOK, fmt.Sprintf("the daemon records the layers runtimes take from the store in %s where their containers/storage does not (%d recorded so far)", graphroot, st.Runtimes.Recorded), ""}
	case unrecorded > 0:
		return check{name, statusFail, fmt.Sprintf("%s of %d taken from a store are not in %s's layers.json: the runtime (containers/storage 1.58 or later) does not record them, and the daemon does not for it; the runtime's next start removes them",
			plural(unrecorded, "layer"), len(marks), graphroot),
			"set [runtimes] record-layers = true (the default) with " + graphroot + " among [runtimes] graphroots (or found in storage.conf or crio.conf), and restart the daemon"}
	case len(marks) > 0:
		return check{name, statusOK, fmt.Sprintf("the runtime records the layers it takes from the store itself (%d in %s)", len(marks), graphroot), ""}
	}
	return check{name, statusOK, "no layer of " + graphroot + " comes from a store", ""}
}
