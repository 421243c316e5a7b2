package main

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
	"path/filepath"
	"slices"
	"strings"
	"text/tabwriter"
	"time"
)

const dependentsUsage = `usage: layerstore dependents [--json] [--remove] [--storage-conf PATH]

Lists the images of the runtime's storage (podman's and CRI-O's containers/storage, as
storage.conf sets it) whose layers come from an additional layer store, with the containers
made from them. Those images work only while the daemon serves the store: before turning the
store off, remove them (--remove), then remove the additionallayerstores line from
storage.conf, then stop the service.

Where CRI-O runs (the socket its configuration names, /var/run/crio/crio.sock by default,
exists), its storage is the one of its configuration's root, and crictl, told that socket,
is its command; podman otherwise. Images that lost their layers (taken from a store, not
recorded by a runtime on containers/storage 1.58 or later, and removed at its next start
before the daemon recorded them) are listed as broken, with the pull that mends each.

--remove removes the dependent images through the runtime's own command (crictl rmi or podman
rmi). An image that containers still use is left, and said so:
remove those containers first. It can be run again at any time: what is gone stays gone.
Exit status: 0 when no image depends on a store and none is broken (after --remove: none is
left), 1 otherwise.

`

// dependentImage is an image of the runtime's storage with layers from an additional store.
type dependentImage struct {
	ID         string   `json:"id"`
	Names      []string `json:"names"`
	Layers     []string `json:"layersFromStore"` // its layers that link into a store
	Containers []string `json:"containers"`      // names (or IDs) of containers made from it
}

// brokenImage is an image of the runtime's storage that lost its layers, and the command that
// mends it.
type brokenImage struct {
	ID    string   `json:"id"`
	Names []string `json:"names"`
	Fix   string   `json:"fix"`
}

type dependentsReport struct {
	GraphRoot string           `json:"graphRoot"`
	Images    []dependentImage `json:"images"`
	// Orphans are layers from a store that no image or container of the storage uses: left
	// by a runtime that did not record them (podman 5, docs/upstream-cstorage.md) or by an
	// interrupted removal. The runtime no longer uses them.
	Orphans []string `json:"orphanLayers"`
	// Broken are images whose top layer the runtime's layers.json no longer names and whose
	// layer directory is gone: layers taken from a store that the runtime did not record
	// (containers/storage 1.58+) and that its next start removed, before the daemon recorded
	// them. Pulling each again through the store mends it.
	Broken  []brokenImage `json:"broken"`
	Removed []string      `json:"removed,omitempty"` // images removed by --remove
	Failed  []string      `json:"failed,omitempty"`  // images --remove could not remove, with why
}

func runDependents(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fl := flag.NewFlagSet("dependents", flag.ContinueOnError)
	fl.SetOutput(stderr)
	fl.Usage = func() { fmt.Fprint(stderr, dependentsUsage); fl.PrintDefaults() }
	asJSON := fl.Bool("json", false, "print the report as JSON")
	remove := fl.Bool("remove", false, "remove the dependent images through the runtime (podman rmi, crictl rmi)")
	conf := fl.String("storage-conf", "", "storage.conf (default $"+storageConfEnv+", "+defaultStorageConf+" or "+vendorStorageConf+")")
	if err := fl.Parse(args); err != nil {
		return 2
	}
	if fl.NArg() != 0 {
		fl.Usage()
		return 2
	}
	_, setup := checkStorageConf(ctx, or(*conf, storageConfPath()), "")
	// CRI-O's configuration where the daemon's says it is (its default file, optional).
	cfg, err := loadConfig(defaultConfigPath(), false)
	if err != nil {
		cfg = &Config{}
	}
	crio := crioPathsOf(cfg)
	if c, _ := crio.read(); *conf == "" && c.Crio.Root != "" {
		if _, ok := crio.socket(); ok {
			setup.graphroot = c.Crio.Root // CRI-O runs, with a root of its own
		}
	}
	rep, err := findDependents(setup.graphroot, crio)
	if err == nil && *remove {
		removeDependents(ctx, &rep, crio, stderr)
		var again dependentsReport
		if again, err = findDependents(setup.graphroot, crio); err == nil {
			again.Removed, again.Failed = rep.Removed, rep.Failed
			rep = again
		}
	}
	if err != nil {
		fmt.Fprintf(stderr, "layerstore dependents: %v\n", err)
		return 1
	}
	if *asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		if err := enc.Encode(rep); err != nil {
			fmt.Fprintf(stderr, "layerstore dependents: %v\n", err)
			return 1
		}
	} else {
		renderDependents(stdout, rep)
	}
	if len(rep.Images) > 0 || len(rep.Broken) > 0 {
		return 1
	}
	return 0
}

// storageImage and storageContainer are the parts of containers/storage's images.json and
// containers.json read here.
type storageImage struct {
	ID    string   `json:"id"`
	Names []string `json:"names"`
	Layer string   `json:"layer"` // the top layer
}

type storageContainer struct {
	ID    string   `json:"id"`
	Names []string `json:"names"`
	Image string   `json:"image"`
}

// findDependents reads the overlay driver's layers, images.json and containers.json of
// graphroot. It reads the driver's own directories rather than layers.json, which podman 5
// does not fill for layers taken from a store: overlay/<id>/additionallayer marks a layer from
// a store, and overlay/<id>/lower lists the lower layers of an image's top layer.
func findDependents(graphroot string, crio crioPaths) (dependentsReport, error) {
	rep := dependentsReport{GraphRoot: graphroot, Images: []dependentImage{}, Orphans: []string{}, Broken: []brokenImage{}}
	overlay := filepath.Join(graphroot, "overlay")
	marks, err := filepath.Glob(filepath.Join(overlay, "*", "additionallayer"))
	if err != nil {
		return rep, err
	}
	fromStore := map[string]bool{}
	for _, m := range marks {
		fromStore[filepath.Base(filepath.Dir(m))] = true
	}
	var images []storageImage
	if err := readJSONFile(filepath.Join(graphroot, "overlay-images", "images.json"), &images); err != nil {
		return rep, err
	}
	if rep.Broken, err = brokenImages(graphroot, images, crio); err != nil {
		return rep, err
	}
	if len(fromStore) == 0 {
		return rep, nil
	}
	var containers []storageContainer
	if err := readJSONFile(filepath.Join(graphroot, "overlay-containers", "containers.json"), &containers); err != nil {
		return rep, err
	}
	used := map[string]bool{}
	for _, img := range images {
		if img.Layer == "" {
			continue
		}
		var from []string
		for _, id := range layerChain(overlay, img.Layer) {
			used[id] = true
			if fromStore[id] {
				from = append(from, id)
			}
		}
		if len(from) == 0 {
			continue
		}
		d := dependentImage{ID: img.ID, Names: img.Names, Layers: from, Containers: []string{}}
		if d.Names == nil {
			d.Names = []string{}
		}
		for _, c := range containers {
			if c.Image == img.ID {
				d.Containers = append(d.Containers, or(strings.Join(c.Names, ","), c.ID))
			}
		}
		rep.Images = append(rep.Images, d)
	}
	for id := range fromStore {
		if !used[id] {
			rep.Orphans = append(rep.Orphans, id)
		}
	}
	slices.Sort(rep.Orphans)
	return rep, nil
}

// brokenImages lists the images whose top layer layers.json does not name and whose layer
// directory is gone, with the command that pulls each again (the runtime's own).
func brokenImages(graphroot string, images []storageImage, crio crioPaths) ([]brokenImage, error) {
	var layers []struct {
		ID string `json:"id"`
	}
	if err := readJSONFile(filepath.Join(graphroot, "overlay-layers", "layers.json"), &layers); err != nil {
		return nil, err
	}
	known := map[string]bool{}
	for _, l := range layers {
		known[l.ID] = true
	}
	tool := "podman pull"
	if _, ok := crio.socket(); ok {
		tool = "crictl pull"
	}
	broken := []brokenImage{}
	for _, img := range images {
		if img.Layer == "" || known[img.Layer] {
			continue
		}
		if _, err := os.Stat(filepath.Join(graphroot, "overlay", img.Layer)); err == nil {
			continue // not recorded yet: the daemon records it at its next pass
		}
		fix := "no name to pull it by: " + strings.Replace(tool, "pull", "rmi", 1) + " " + img.ID
		if len(img.Names) > 0 {
			fix = tool + " " + img.Names[0]
		}
		broken = append(broken, brokenImage{ID: img.ID, Names: or2(img.Names, img.ID), Fix: fix})
	}
	return broken, nil
}

// layerChain returns the top layer and the lower layers the overlay driver records for it
// (overlay/<top>/lower: "l/LINK:l/LINK...", each link a symlink to ../<id>/diff).
func layerChain(overlay, top string) []string {
	chain := []string{top}
	b, err := os.ReadFile(filepath.Join(overlay, top, "lower"))
	if err != nil {
		return chain
	}
	for _, l := range strings.Split(strings.TrimSpace(string(b)), ":") {
		target, err := os.Readlink(filepath.Join(overlay, l))
		if err != nil {
			continue
		}
		// "../<id>/diff"
		if id := filepath.Base(filepath.Dir(target)); id != "." && id != ".." && id != "" {
			chain = append(chain, id)
		}
	}
	return chain
}

func readJSONFile(path string, v any) error {
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	if len(strings.TrimSpace(string(b))) == 0 {
		return nil
	}
	if err := json.Unmarshal(b, v); err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	return nil
}

// crioDefaultSocket is where CRI-O listens unless its configuration says otherwise.
const crioDefaultSocket = "/var/run/crio/crio.sock"

// socket is CRI-O's socket, from its configuration at p ([crio.api] listen); ok when it
// exists: then CRI-O owns the images, and crictl, told that socket, removes and pulls them.
func (p crioPaths) socket() (string, bool) {
	c, _ := p.read()
	sock := or(c.Crio.API.Listen, crioDefaultSocket)
	return sock, fileExists(sock)
}

// removeDependents removes each dependent image through the runtime, bounded in time.
func removeDependents(ctx context.Context, rep *dependentsReport, crio crioPaths, stderr io.Writer) {
	tool, args := "podman", []string{"rmi"}
	if sock, ok := crio.socket(); ok {
		if _, err := exec.LookPath("crictl"); err == nil {
			tool, args = "crictl", []string{"--runtime-endpoint", "unix://" + sock, "rmi"}
		}
	}
	for _, img := range rep.Images {
		if len(img.Containers) > 0 {
			rep.Failed = append(rep.Failed, fmt.Sprintf("%s: used by containers %s: remove them first", imageName(img), strings.Join(img.Containers, " ")))
			continue
		}
		// By its names: podman refuses to remove by ID an image with several; untagging the
		// last name removes the image.
		cctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
		out, err := exec.CommandContext(cctx, tool, append(slices.Clone(args), or2(img.Names, img.ID)...)...).CombinedOutput()
		cancel()
		if err != nil {
			rep.Failed = append(rep.Failed, fmt.Sprintf("%s: %s rmi: %v: %s", imageName(img), tool, err, strings.TrimSpace(string(out))))
			continue
		}
		fmt.Fprintf(stderr, "removed %s (%s rmi)\n", imageName(img), tool)
		rep.Removed = append(rep.Removed, imageName(img))
	}
}

func imageName(img dependentImage) string {
	if len(img.Names) > 0 {
		return img.Names[0]
	}
	return img.ID[:min(12, len(img.ID))]
}

func renderDependents(w io.Writer, rep dependentsReport) {
	for _, r := range rep.Removed {
		fmt.Fprintf(w, "removed: %s\n", r)
	}
	for _, f := range rep.Failed {
		fmt.Fprintf(w, "not removed: %s\n", f)
	}
	if len(rep.Images) == 0 {
		fmt.Fprintf(w, "no image in %s depends on an additional layer store\n", rep.GraphRoot)
	} else {
		tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "IMAGE\tID\tLAYERS FROM THE STORE\tCONTAINERS")
		for _, img := range rep.Images {
			fmt.Fprintf(tw, "%s\t%s\t%d\t%s\n", strings.Join(img.Names, ","), img.ID[:min(12, len(img.ID))], len(img.Layers), strings.Join(img.Containers, ","))
		}
		tw.Flush()
	}
	for _, b := range rep.Broken {
		fmt.Fprintf(w, "broken: %s lost its layers (taken from a store, not recorded by the runtime, removed at its start): %s\n", b.Names[0], b.Fix)
	}
	if len(rep.Orphans) > 0 {
		fmt.Fprintf(w, "%d layers from a store that no image or container uses (the runtime does not use them)\n", len(rep.Orphans))
	}
}

// or2 returns names, or id alone when there are none.
func or2(names []string, id string) []string {
	if len(names) == 0 {
		return []string{id}
	}
	return names
}
