package runtimestore

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/opencontainers/go-digest"
	"go.podman.io/storage/pkg/lockfile"
)

// Bounds on what is read from a runtime's storage and from the store.
const (
	maxMarkSize  = 4 << 10  // an additionallayer file: one path
	maxLowerSize = 64 << 10 // a lower file: 500 links of a deep image and then some
	maxInfoSize  = 64 << 10 // the store's info: a few hundred bytes
	// maxLayersJSON bounds layers.json: about 2 KiB a layer, 128 Ki layers.
	maxLayersJSON = 256 << 20
	// maxLayerDirs bounds the directories of overlay/ looked at in one pass.
	maxLayerDirs = 1 << 20
)

// tmpPrefix starts the names of the temporary files this package writes in overlay-layers.
const tmpPrefix = ".layerstore-layers.json-"

var (
	layerID  = regexp.MustCompile(`^[0-9a-f]{64}$`)
	linkName = regexp.MustCompile(`^[A-Za-z0-9]{1,64}$`)
)

// candidate is a runtime layer directory pointing into the store that layers.json lacks,
// with the entry to add for it.
type candidate struct {
	id     string
	mark   string // the additionallayer file's content: the store's layer directory
	parent string
	size   int64 // the tar's size the store gave, -1 when unknown
	entry  []byte
	gone   bool // removed, or made anew, since the scan
}

// entry is the JSON a c/storage with the fix writes for a layer taken from an additional
// store: the fields of its Layer type, in their order, that the store's info or
// PutAdditionalLayer set. c/storage drops the info's other fields; so does this type.
type entry struct {
	ID                 string         `json:"id"`
	Parent             string         `json:"parent,omitempty"`
	Created            time.Time      `json:"created"`
	CompressedDigest   digest.Digest  `json:"compressed-diff-digest,omitempty"`
	CompressedSize     int64          `json:"compressed-size,omitempty"`
	UncompressedDigest digest.Digest  `json:"diff-digest,omitempty"`
	TOCDigest          digest.Digest  `json:"toc-digest,omitempty"`
	UncompressedSize   int64          `json:"diff-size,omitempty"`
	CompressionType    int            `json:"compression,omitempty"`
	Flags              map[string]any `json:"flags,omitempty"`
}

// recordOpts are how record goes about it.
type recordOpts struct {
	lockWait time.Duration // bounds the wait for the runtime's lock
	warn     func(msg string, args ...any)
	// hold, when set, says whether to leave a layer whose tar size the store does not know
	// yet for a later pass (its size is what the runtime reports for the image).
	hold func(graphroot, id string) bool
}

// record adds to graphroot's layers.json the layers that point into store and that it lacks,
// and returns the ids it added and how many it left for a later pass: held back for their
// size (opts.hold), or not ready (a parent not recorded, a lower file or an info that did not
// read: a runtime may be in the middle of writing them).
func record(ctx context.Context, graphroot, store string, opts recordOpts) (ids []string, pending int, err error) {
	dir := filepath.Join(graphroot, "overlay-layers")
	if fi, err := os.Stat(dir); err != nil || !fi.IsDir() {
		return nil, 0, nil // no runtime has used this graphroot (yet)
	}
	for _, d := range []string{graphroot, filepath.Join(graphroot, "overlay"), dir} {
		if err := owned(d); err != nil {
			return nil, 0, err
		}
	}
	jsonPath := filepath.Join(dir, "layers.json")
	removeStaleTemps(dir)

	// Unlocked: what is missing, and the entries for it (the store's info may take a lookup).
	known, _, _, err := readLayers(jsonPath)
	if err != nil {
		return nil, 0, err
	}
	cands := scan(graphroot, store, known, opts.warn)
	if len(cands) == 0 {
		return nil, 0, nil
	}
	for _, c := range cands {
		if err := c.build(ctx, graphroot); err != nil {
			opts.warn("not recording a runtime layer taken from the store", "graphroot", graphroot, "layer", c.id, "err", err)
		} else if c.size < 0 && opts.hold != nil && opts.hold(graphroot, c.id) {
			c.entry = nil
		}
	}
	pending = len(cands)

	lock, err := lockfile.GetLockFile(filepath.Join(dir, "layers.lock"))
	if err != nil {
		return nil, pending, err
	}
	if err := tryLock(ctx, lock, opts.lockWait); err != nil {
		return nil, pending, fmt.Errorf("%s: %w", filepath.Join(dir, "layers.lock"), err)
	}
	defer lock.Unlock()
	hook("locked")

	known, n, data, err := readLayers(jsonPath)
	if err != nil {
		return nil, pending, err
	}
	add := ready(graphroot, cands, known)
	pending = 0
	for _, c := range cands {
		if !c.gone && !slices.Contains(add, c) {
			pending++
		}
	}
	if len(add) == 0 {
		return nil, pending, nil // the runtime recorded them itself, or removed them
	}
	if _, err := lock.RecordWrite(); err != nil {
		return nil, pending, err
	}
	hook("recorded-write")
	out, err := appendEntries(data, n > 0, add)
	if err != nil {
		return nil, pending, fmt.Errorf("%s: %w", jsonPath, err)
	}
	if err := writeAtomic(jsonPath, out); err != nil {
		return nil, pending, err
	}
	for _, c := range add {
		ids = append(ids, c.id)
	}
	return ids, pending, nil
}

// owned refuses a directory of the runtime's storage that another user than the daemon's owns
// or may write: what it holds would make the daemon look layers up and write entries on that
// user's word. A runtime's storage is its user's alone (c/storage makes it 0700).
func owned(dir string) error {
	fi, err := os.Lstat(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	switch {
	case !fi.IsDir():
		return fmt.Errorf("%s is not a directory: not recording into it", dir)
	case ok && int(st.Uid) != os.Geteuid():
		return fmt.Errorf("%s belongs to uid %d, not to the daemon's: not recording into it", dir, st.Uid)
	case fi.Mode().Perm()&0o022 != 0:
		return fmt.Errorf("%s may be written by other users (mode %v): not recording into it", dir, fi.Mode().Perm())
	}
	return nil
}

// tryLock takes lock for writing, trying until wait has passed: a runtime holds it for the
// length of one storage operation, and waiting holds nothing of its.
func tryLock(ctx context.Context, lock *lockfile.LockFile, wait time.Duration) error {
	deadline := time.Now().Add(wait)
	for delay := time.Millisecond; ; delay = min(2*delay, 100*time.Millisecond) {
		err := lock.TryLock()
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("held by a runtime for more than %v: %w", wait, err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(delay):
		}
	}
}

// readLayers reads layers.json: the ids it names, its number of entries and its bytes. A
// missing file is empty.
func readLayers(path string) (map[string]bool, int, []byte, error) {
	data, err := readBounded(path, maxLayersJSON)
	if errors.Is(err, fs.ErrNotExist) {
		return map[string]bool{}, 0, nil, nil
	}
	if err != nil {
		return nil, 0, nil, err
	}
	var layers []struct {
		ID string `json:"id"`
	}
	if len(bytes.TrimSpace(data)) > 0 {
		if err := json.Unmarshal(data, &layers); err != nil {
			return nil, 0, nil, fmt.Errorf("%s does not parse, leaving it alone: %w", path, err)
		}
	}
	known := make(map[string]bool, len(layers))
	for _, l := range layers {
		known[l.ID] = true
	}
	return known, len(layers), data, nil
}

// scan lists the layer directories of graphroot whose additionallayer file names a layer
// directory of store and whose id is not known.
func scan(graphroot, store string, known map[string]bool, warn func(string, ...any)) []*candidate {
	overlay := filepath.Join(graphroot, "overlay")
	d, err := os.Open(overlay)
	if err != nil {
		return nil
	}
	defer d.Close()
	names, _ := d.Readdirnames(maxLayerDirs)
	var out []*candidate
	for _, id := range names {
		if !layerID.MatchString(id) || known[id] {
			continue
		}
		mark, err := readBounded(filepath.Join(overlay, id, "additionallayer"), maxMarkSize)
		if err != nil {
			continue // not a layer from an additional store, or gone
		}
		if !inStore(store, string(mark)) {
			if strings.HasPrefix(string(mark), store+"/") {
				warn("a runtime layer names a path in the store that is no layer directory: not recorded", "graphroot", graphroot, "layer", id, "additionallayer", string(mark))
			}
			continue // another store's
		}
		out = append(out, &candidate{id: id, mark: string(mark)})
	}
	return out
}

// inStore reports whether p is a layer directory of store: store/<reference>/<digest>,
// clean and absolute.
func inStore(store, p string) bool {
	if !filepath.IsAbs(p) || filepath.Clean(p) != p {
		return false
	}
	rel, err := filepath.Rel(store, p)
	if err != nil {
		return false
	}
	ref, key, ok := strings.Cut(rel, "/")
	if !ok || ref == "" || ref == ".." || ref == "." || strings.Contains(key, "/") {
		return false
	}
	_, err = digest.Parse(key)
	return err == nil
}

// build makes c's entry: the store's info, the parent (parentOf), the time the runtime took
// the layer.
func (c *candidate) build(ctx context.Context, graphroot string) error {
	dir := filepath.Join(graphroot, "overlay", c.id)
	parent, err := parentOf(graphroot, c.id)
	if err != nil {
		return err
	}
	fi, err := os.Stat(filepath.Join(dir, "additionallayer"))
	if err != nil {
		return err
	}
	info, err := readInfo(ctx, filepath.Join(c.mark, "info"))
	if err != nil {
		return err
	}
	e := entry{ID: c.id, Parent: parent, Created: fi.ModTime().UTC()}
	if err := json.Unmarshal(info, &e); err != nil {
		return fmt.Errorf("the store's info does not parse: %w", err)
	}
	e.ID, e.Parent, e.Created = c.id, parent, fi.ModTime().UTC() // the info cannot set these
	for _, d := range []digest.Digest{e.CompressedDigest, e.UncompressedDigest, e.TOCDigest} {
		if d != "" {
			if err := d.Validate(); err != nil {
				return fmt.Errorf("the store's info: %w", err)
			}
		}
	}
	if c.entry, err = json.Marshal(e); err != nil {
		return err
	}
	c.parent, c.size = parent, e.UncompressedSize
	if e.UncompressedSize == 0 {
		c.size = -1 // absent from the info
	}
	return nil
}

// parentOf reads the parent of layer id as the overlay driver does: the first layer its
// lower-layers file names (c/storage 1.64 and later write it), else the first link of its
// lower file, which overlay/l/<link> resolves to ../<parent>/diff. No lower file: no parent.
//
// lower-layers comes first, as for the driver: a layer's link is not for ever. A runtime that
// makes a layer again (one that lost it from its memory in a concurrent pull removes its
// directory, link included, and makes it anew under a new link) leaves the layers above it
// naming the old link in their lower files, and their parent by its id in lower-layers.
func parentOf(graphroot, id string) (string, error) {
	overlay := filepath.Join(graphroot, "overlay")
	ids, err := readBounded(filepath.Join(overlay, id, "lower-layers"), maxLowerSize)
	if err == nil {
		first, _, _ := strings.Cut(strings.TrimSpace(string(ids)), ":")
		if !layerID.MatchString(first) {
			return "", fmt.Errorf("malformed lower-layers file %q", truncate(string(ids)))
		}
		return first, nil
	}
	if !errors.Is(err, fs.ErrNotExist) {
		return "", err
	}
	lower, err := readBounded(filepath.Join(overlay, id, "lower"), maxLowerSize)
	if errors.Is(err, fs.ErrNotExist) {
		return "", nil
	}
	if err != nil {
		return "", err
	}
	first, _, _ := strings.Cut(strings.TrimSpace(string(lower)), ":")
	link, ok := strings.CutPrefix(first, "l/")
	if !ok || !linkName.MatchString(link) {
		return "", fmt.Errorf("malformed lower file %q", truncate(string(lower)))
	}
	target, err := os.Readlink(filepath.Join(overlay, "l", link))
	if err != nil {
		return "", fmt.Errorf("the lower file's first link: %w", err)
	}
	parent, ok := strings.CutPrefix(target, "../")
	if parent, ok = strings.CutSuffix(parent, "/diff"); !ok || !layerID.MatchString(parent) {
		return "", fmt.Errorf("the lower file's first link %s points to %q, not to a layer", link, truncate(target))
	}
	return parent, nil
}

// readInfo reads the store's info of a layer, bounded by ctx: through the store's mount, as
// the runtime read it, which may wait for a lookup.
func readInfo(ctx context.Context, path string) ([]byte, error) {
	type result struct {
		b   []byte
		err error
	}
	done := make(chan result, 1)
	go func() {
		b, err := readBounded(path, maxInfoSize)
		done <- result{b, err}
	}()
	select {
	case r := <-done:
		return r.b, r.err
	case <-ctx.Done():
		return nil, fmt.Errorf("reading %s: %w", path, ctx.Err())
	}
}

// ready returns the candidates to add now: built, not known, still pointing into the store on
// the same parent, and with their parent known or added before them (parents first).
func ready(graphroot string, cands []*candidate, known map[string]bool) []*candidate {
	var add []*candidate
	have := func(id string) bool { return id == "" || known[id] }
	for progress := true; progress; {
		progress = false
		for _, c := range cands {
			if c.entry == nil || known[c.id] || !have(c.parent) {
				continue
			}
			mark, err := readBounded(filepath.Join(graphroot, "overlay", c.id, "additionallayer"), maxMarkSize)
			if err != nil || string(mark) != c.mark {
				c.entry, c.gone = nil, true // removed meanwhile
				continue
			}
			if parent, err := parentOf(graphroot, c.id); err != nil || parent != c.parent {
				c.entry = nil // made anew meanwhile, on another parent: the next pass builds it again
				continue
			}
			add = append(add, c)
			known[c.id] = true
			progress = true
		}
	}
	return add
}

// appendEntries returns data with the entries of add appended to its JSON array, every byte
// before them unchanged. nonEmpty says whether the array has elements.
func appendEntries(data []byte, nonEmpty bool, add []*candidate) ([]byte, error) {
	var out []byte
	switch trimmed := bytes.TrimRight(data, " \t\r\n"); {
	case len(bytes.TrimSpace(trimmed)) == 0 || string(bytes.TrimSpace(trimmed)) == "null":
		out = []byte("[")
		nonEmpty = false
	case trimmed[len(trimmed)-1] == ']':
		out = append(out, trimmed[:len(trimmed)-1]...)
	default:
		return nil, errors.New("not a JSON array")
	}
	for _, c := range add {
		if nonEmpty {
			out = append(out, ',')
		}
		out = append(out, c.entry...)
		nonEmpty = true
	}
	return append(out, ']'), nil
}

// writeAtomic replaces path with data: a temporary file beside it, synced, renamed over it,
// the directory synced. The file keeps its mode (c/storage's 0600 for a new one).
func writeAtomic(path string, data []byte) error {
	mode := os.FileMode(0o600)
	if fi, err := os.Stat(path); err == nil {
		mode = fi.Mode().Perm()
	}
	dir := filepath.Dir(path)
	f, err := os.CreateTemp(dir, tmpPrefix)
	if err != nil {
		return err
	}
	tmp := f.Name()
	defer os.Remove(tmp) // after a successful rename, it is gone already
	hook("temp-created")
	if err := f.Chmod(mode); err != nil {
		f.Close()
		return err
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		return err
	}
	hook("temp-written")
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	hook("temp-synced")
	if err := os.Rename(tmp, path); err != nil {
		return err
	}
	hook("renamed")
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}

// removeStaleTemps removes the temporary files a killed run of this package left.
func removeStaleTemps(dir string) {
	stale, _ := filepath.Glob(filepath.Join(dir, tmpPrefix+"*"))
	for _, p := range stale {
		_ = os.Remove(p)
	}
}

// readBounded reads path, refusing more than limit bytes.
func readBounded(path string, limit int64) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, limit+1))
	if err != nil {
		return nil, err
	}
	if int64(len(b)) > limit {
		return nil, fmt.Errorf("%s: larger than %d bytes", path, limit)
	}
	return b, nil
}

func truncate(s string) string {
	if len(s) > 80 {
		return s[:80] + "..."
	}
	return s
}

// hook is called at each step of a write; the tests kill the process there.
var hook = func(step string) {}
