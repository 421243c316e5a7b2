package layer

import (
	"bufio"
	"bytes"
	"cmp"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/opencontainers/go-digest"

	"github.com/layerstore/layerstore/cache"
	"github.com/layerstore/layerstore/chunked"
)

// Startup profiles: what a layer's first users read first, learned by the daemon and replayed
// by the background fetch of a later cold start. See the package documentation (Startup
// profiles) for the design; the bounds are here.

// Bounds of a profile.
const (
	// maxProfileFiles and maxProfileContent end a recording early: at most this many files,
	// and the files recorded hold at most this many bytes of content.
	maxProfileFiles   = 4096
	maxProfileContent = 256 << 20
	// maxProfilePath: a longer path is not recorded (and refused in a profile read back).
	maxProfilePath = 4096
	// maxProfileSlotBytes bounds the path bytes of one layer's profile (the rest of a
	// recording is dropped), maxProfileRepoBytes those of a repository's (its oldest layers'
	// profiles are dropped), maxProfileLayers the layers a repository's profile holds.
	maxProfileSlotBytes = 256 << 10
	maxProfileRepoBytes = 1 << 20
	maxProfileLayers    = 32
	// maxProfileRecord bounds a repository profile's encoding (the record's meta, and a line
	// of an export): JSON escapes may make it larger than its path bytes.
	maxProfileRecord = 2 << 20
	// maxProfileRepositories bounds the repositories with a profile in the cache: beyond it,
	// the profile least recently written or replayed by this process goes.
	maxProfileRepositories = 1024
	// maxProfileRepository bounds a repository's name.
	maxProfileRepository = 1024
)

// profileVersion is the version of the profiles this package writes and reads (records and
// exports).
const profileVersion = 1

// profileRecordPrefix begins the names of the profiles' records.
const profileRecordPrefix = "profile-"

// profileExportFormat names an export's first line.
const profileExportFormat = "layerstore-profiles"

// repoProfile is the profile of a repository: for each of its layers recorded (the most
// recent first), the files first read after its first use, in the order of their first read.
type repoProfile struct {
	Version    int            `json:"version"`
	Repository string         `json:"repository"`
	Layers     []profileLayer `json:"layers"`
}

// profileLayer is the profile of one layer: its blob digest, when it was recorded, and the
// paths of the files read, in order; Ends, when present, holds for each file how much of it was
// read: the end of its furthest read (0: the whole file, as for a file the kernel reads by
// itself through passthrough). A replay fetches the chunks of each file that start before its
// end: a program that reads the first pages of a large library does not have it fetched whole.
type profileLayer struct {
	Layer    digest.Digest `json:"layer"`
	Recorded time.Time     `json:"recorded"`
	Files    []string      `json:"files"`
	Ends     []int64       `json:"ends,omitempty"`
}

// end returns how much of file i was read (0: the whole file).
func (pl *profileLayer) end(i int) int64 {
	if i < len(pl.Ends) {
		return pl.Ends[i]
	}
	return 0
}

// profileName is the name of a repository's profile record.
func profileName(repo string) string {
	s := sha256.Sum256([]byte(repo))
	return profileRecordPrefix + hex.EncodeToString(s[:])
}

// check refuses a profile that this package would not have written: profiles are read back
// from the cache and imported from files, and both are untrusted.
func (p *repoProfile) check() error {
	switch {
	case p.Version != profileVersion:
		return fmt.Errorf("profile version %d, want %d", p.Version, profileVersion)
	case p.Repository == "" || len(p.Repository) > maxProfileRepository || !printable(p.Repository):
		return fmt.Errorf("profile: invalid repository %q", truncate(p.Repository, 80))
	case len(p.Layers) > maxProfileLayers:
		return fmt.Errorf("profile of %s: %d layers, at most %d", p.Repository, len(p.Layers), maxProfileLayers)
	}
	total := 0
	seen := map[digest.Digest]bool{}
	for i, l := range p.Layers {
		if err := l.Layer.Validate(); err != nil {
			return fmt.Errorf("profile of %s: layer %d: %w", p.Repository, i, err)
		}
		if seen[l.Layer] {
			return fmt.Errorf("profile of %s: layer %s twice", p.Repository, l.Layer)
		}
		seen[l.Layer] = true
		if len(l.Files) == 0 || len(l.Files) > maxProfileFiles {
			return fmt.Errorf("profile of %s: layer %s: %d files, want 1 to %d", p.Repository, l.Layer, len(l.Files), maxProfileFiles)
		}
		if len(l.Ends) != 0 && len(l.Ends) != len(l.Files) {
			return fmt.Errorf("profile of %s: layer %s: %d ends for %d files", p.Repository, l.Layer, len(l.Ends), len(l.Files))
		}
		for _, e := range l.Ends {
			if e < 0 {
				return fmt.Errorf("profile of %s: layer %s: negative end %d", p.Repository, l.Layer, e)
			}
		}
		n := 0
		for _, f := range l.Files {
			if f == "" || len(f) > maxProfilePath || strings.IndexByte(f, 0) >= 0 {
				return fmt.Errorf("profile of %s: layer %s: invalid path %q", p.Repository, l.Layer, truncate(f, 80))
			}
			n += len(f)
		}
		if n > maxProfileSlotBytes {
			return fmt.Errorf("profile of %s: layer %s: %d bytes of paths, at most %d", p.Repository, l.Layer, n, maxProfileSlotBytes)
		}
		total += n
	}
	if total > maxProfileRepoBytes {
		return fmt.Errorf("profile of %s: %d bytes of paths, at most %d", p.Repository, total, maxProfileRepoBytes)
	}
	return nil
}

func printable(s string) bool {
	if !utf8.ValidString(s) {
		return false
	}
	for _, r := range s {
		if r < 0x20 || r == 0x7f {
			return false
		}
	}
	return true
}

func truncate(s string, n int) string {
	if len(s) > n {
		return s[:n] + "..."
	}
	return s
}

// merge adds layers to p: a layer's newer profile comes first, followed by the files of its
// older ones that it lacks (a later recording may miss files the kernel had cached, and never
// loses what an earlier one learned), within the bounds of one layer's profile; the most
// recent layers first; the oldest dropped beyond the bounds (layers, path bytes, encoded
// size). It returns p's encoding.
func (p *repoProfile) merge(layers []profileLayer) ([]byte, error) {
	all := append(slices.Clone(layers), p.Layers...)
	slices.SortStableFunc(all, func(a, b profileLayer) int { return b.Recorded.Compare(a.Recorded) })
	var byLayer []profileLayer
	at := map[digest.Digest]int{}
	for _, l := range all {
		i, ok := at[l.Layer]
		if !ok {
			at[l.Layer] = len(byLayer)
			byLayer = append(byLayer, profileLayer{Layer: l.Layer, Recorded: l.Recorded})
			i = len(byLayer) - 1
		}
		byLayer[i].union(&l)
	}
	var kept []profileLayer
	total := 0
	for _, l := range byLayer {
		n := pathBytes(l.Files)
		if len(l.Files) == 0 || len(kept) == maxProfileLayers || total+n > maxProfileRepoBytes {
			continue
		}
		kept = append(kept, l)
		total += n
	}
	p.Layers = kept
	for {
		b, err := json.Marshal(p)
		if err != nil {
			return nil, err
		}
		if len(b) <= maxProfileRecord || len(p.Layers) <= 1 {
			return b, nil
		}
		p.Layers = p.Layers[:len(p.Layers)-1]
	}
}

// union adds to pl the files of more it lacks, after its own, within the bounds of one layer's
// profile (files, path bytes); a file in both keeps the larger of its ends (0, the whole file,
// the largest).
func (pl *profileLayer) union(more *profileLayer) {
	files := slices.Clone(pl.Files)
	ends := make([]int64, len(files))
	have := make(map[string]int, len(files))
	n := 0
	for i, f := range files {
		have[f] = i
		ends[i] = pl.end(i)
		n += len(f)
	}
	for j, f := range more.Files {
		e := more.end(j)
		if i, ok := have[f]; ok {
			if ends[i] != 0 && (e == 0 || e > ends[i]) {
				ends[i] = e
			}
			continue
		}
		if len(files) == maxProfileFiles || n+len(f) > maxProfileSlotBytes {
			continue
		}
		have[f] = len(files)
		n += len(f)
		files = append(files, f)
		ends = append(ends, e)
	}
	pl.Files, pl.Ends = files, sparseEnds(ends)
}

// sparseEnds returns ends, or nil when every file is whole (no end).
func sparseEnds(ends []int64) []int64 {
	if slices.ContainsFunc(ends, func(e int64) bool { return e != 0 }) {
		return ends
	}
	return nil
}

func pathBytes(files []string) int {
	n := 0
	for _, f := range files {
		n += len(f)
	}
	return n
}

// profiles is the manager's store of repository profiles: one record per repository in the
// cache (profileName), beside the layer records, written atomically and checksummed by the
// cache, and checked when read. Safe for concurrent use; its lock is a leaf, held across the
// read and write of a record so that updates of one repository do not lose each other's.
type profiles struct {
	cache *cache.Cache
	log   *slog.Logger

	mu    sync.Mutex
	names map[string]uint64 // the profile records, with when this process last wrote or used them
	seq   uint64
	known bool // names lists the cache's records
}

func newProfiles(c *cache.Cache, log *slog.Logger) *profiles {
	return &profiles{cache: c, log: log, names: map[string]uint64{}}
}

// listLocked learns the profile records present in the cache, once.
func (ps *profiles) listLocked() {
	if ps.known {
		return
	}
	names, err := ps.cache.Records()
	if err != nil {
		return
	}
	ps.known = true
	for _, n := range names {
		if strings.HasPrefix(n, profileRecordPrefix) {
			if _, ok := ps.names[n]; !ok {
				ps.names[n] = 0
			}
		}
	}
}

// get returns the profile of repo; nil when there is none, or it is unusable (removed).
func (ps *profiles) get(repo string) *repoProfile {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	return ps.getLocked(repo, true)
}

func (ps *profiles) getLocked(repo string, use bool) *repoProfile {
	name := profileName(repo)
	raw, err := ps.cache.RecordMeta(name)
	if err != nil {
		if !errors.Is(err, cache.ErrMissing) && !errors.Is(err, cache.ErrClosed) {
			ps.log.Warn("startup profile unreadable: dropped", "repository", repo, "err", err)
			_ = ps.cache.RemoveRecord(name)
		}
		delete(ps.names, name)
		return nil
	}
	var p repoProfile
	err = json.Unmarshal(raw, &p)
	if err == nil {
		err = p.check()
	}
	if err == nil && p.Repository != repo {
		err = errors.New("profile of another repository")
	}
	if err != nil {
		ps.log.Warn("startup profile dropped", "repository", repo, "err", err)
		_ = ps.cache.RemoveRecord(name)
		delete(ps.names, name)
		return nil
	}
	if use {
		ps.seq++
		ps.names[name] = ps.seq
	}
	return &p
}

// add merges layers into the profile of repo and writes it.
func (ps *profiles) add(repo string, layers ...profileLayer) error {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	ps.listLocked()
	p := ps.getLocked(repo, false)
	if p == nil {
		p = &repoProfile{Version: profileVersion, Repository: repo}
	}
	b, err := p.merge(layers)
	if err != nil {
		return err
	}
	if err := p.check(); err != nil {
		return err // not reached: what merge keeps is within the bounds
	}
	name := profileName(repo)
	if err := ps.cache.PutRecord(name, b); err != nil {
		return err
	}
	ps.seq++
	ps.names[name] = ps.seq
	for len(ps.names) > maxProfileRepositories {
		oldest := ""
		for n, s := range ps.names {
			if n != name && (oldest == "" || s < ps.names[oldest] || s == ps.names[oldest] && n < oldest) {
				oldest = n
			}
		}
		_ = ps.cache.RemoveRecord(oldest)
		delete(ps.names, oldest)
	}
	return nil
}

// all returns the names of every profile record.
func (ps *profiles) all() []string {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	ps.known = false
	ps.listLocked()
	names := make([]string, 0, len(ps.names))
	for n := range ps.names {
		names = append(names, n)
	}
	slices.Sort(names)
	return names
}

// readName returns the profile of record name, checked; nil when unusable.
func (ps *profiles) readName(name string) *repoProfile {
	raw, err := ps.cache.RecordMeta(name)
	if err != nil {
		return nil
	}
	var p repoProfile
	if json.Unmarshal(raw, &p) != nil || p.check() != nil || profileName(p.Repository) != name {
		return nil
	}
	return &p
}

// recording is a layer's recording of its startup profile: from its first read on, for the
// window (options.profileWindow) or until the bounds, the files read, in the order of their first
// read. Once it ends (done), a read costs one atomic load and nothing more.
type recording struct {
	done atomic.Bool

	mu      sync.Mutex
	started bool
	timer   *time.Timer
	seen    map[chunked.EntryID]int // index in files
	files   []chunked.EntryID
	ends    []int64 // of files: the end of the furthest read
	content int64
	bytes   int // path bytes
	saved   atomic.Int64
}

// recordRead notes a read of regular file id that ends at end (a passthrough open: the file's
// size), while the layer records.
func (l *Layer) recordRead(id chunked.EntryID, end int64) {
	r := &l.recording
	if r.done.Load() {
		return
	}
	full := false
	r.mu.Lock()
	switch {
	case r.done.Load():
	case !r.started && l.env.profileWindow <= 0:
		r.done.Store(true)
	default:
		if !r.started {
			r.started = true
			r.seen = map[chunked.EntryID]int{}
			r.timer = time.AfterFunc(l.env.profileWindow, l.endRecording)
		}
		if i, ok := r.seen[id]; ok {
			if i >= 0 && end > r.ends[i] {
				r.ends[i] = end
			}
			break
		}
		r.seen[id] = -1 // not recorded, unless below
		e := l.idx.Meta(id)
		n := len(l.idx.Path(id))
		if e.Size <= 0 || n == 0 || n > maxProfilePath {
			break
		}
		if r.bytes+n > maxProfileSlotBytes {
			full = true // the paths' bound: ends the recording, as the others do
			break
		}
		r.seen[id] = len(r.files)
		r.files = append(r.files, id)
		r.ends = append(r.ends, end)
		r.content += e.Size
		r.bytes += n
		full = len(r.files) >= l.env.profileMaxFiles || r.content >= l.env.profileMaxContent
	}
	r.mu.Unlock()
	if full {
		l.endRecording()
	}
}

// endRecording ends the layer's recording and writes what it recorded, if anything, to the
// profile of each repository the layer was resolved through.
func (l *Layer) endRecording() {
	r := &l.recording
	r.mu.Lock()
	if r.done.Load() {
		r.mu.Unlock()
		return
	}
	r.done.Store(true)
	if r.timer != nil {
		r.timer.Stop()
	}
	files, ends := r.files, r.ends
	r.files, r.ends, r.seen = nil, nil, nil
	r.mu.Unlock()
	if len(files) == 0 || l.v.Err() != nil || l.env.work.ctx.Err() != nil {
		return
	}
	paths := make([]string, len(files))
	for i, id := range files {
		paths[i] = l.idx.Path(id)
		if ends[i] >= l.idx.Meta(id).Size {
			ends[i] = 0 // read to its end: the whole file
		}
	}
	l.mu.Lock()
	repos := make([]string, 0, len(l.repos))
	for repo := range l.repos {
		repos = append(repos, repo)
	}
	l.mu.Unlock()
	slices.Sort(repos)
	slot := profileLayer{Layer: l.desc.Digest, Recorded: time.Now().UTC(), Files: paths, Ends: sparseEnds(ends)}
	l.env.work.goTracked(func() {
		for _, repo := range repos {
			if err := l.env.profiles.add(repo, slot); err != nil && !errors.Is(err, cache.ErrClosed) {
				l.env.log.Log(l.env.work.ctx, noSpaceLevel(err), "writing the startup profile failed", "repository", repo, "err", err)
				return
			}
		}
		r.saved.Store(int64(len(paths)))
		l.env.log.Debug("startup profile recorded", "layer", l.desc.Digest, "files", len(paths))
	})
}

// replayPlan is what a layer's background fetch replays first.
type replayPlan struct {
	files []chunked.EntryID // in the profile's order, each an inode owner with content
	ends  []int64           // of files: the chunks starting before it are replayed (0: all)
	same  bool              // recorded from this very layer (else another of the repository)
}

// profileFiles chooses the profile the layer's background fetch replays first, among those of
// its repositories: the one recorded from this layer if any (the most recent), else the layer
// profile of which the most paths name regular files with content in this layer (a new
// version of the image: the same paths, new content). Paths this layer does not have are
// ignored; nothing but this layer's own files is ever named. The repositories looked at (those
// of the most recent references first) and the paths looked up are bounded, so that a base
// layer shared by many repositories costs a bounded time to start.
func (l *Layer) profileFiles() replayPlan {
	var ps []*repoProfile
	for _, repo := range l.profileRepos() {
		if p := l.env.profiles.get(repo); p != nil {
			ps = append(ps, p)
		}
	}
	var exact *profileLayer
	for _, p := range ps {
		for i, pl := range p.Layers {
			if pl.Layer == l.desc.Digest && (exact == nil || pl.Recorded.After(exact.Recorded)) {
				exact = &p.Layers[i]
			}
		}
	}
	if exact != nil {
		if plan := l.matchFiles(exact); len(plan.files) > 0 {
			plan.same = true
			return plan
		}
	}
	var best replayPlan
	var bestTime time.Time
	budget := maxProfileLookups
	for _, p := range ps {
		for _, pl := range p.Layers {
			if pl.Layer == l.desc.Digest || len(pl.Files) > budget {
				continue
			}
			budget -= len(pl.Files)
			plan := l.matchFiles(&pl)
			if len(plan.files) > len(best.files) || len(plan.files) > 0 && len(plan.files) == len(best.files) && pl.Recorded.After(bestTime) {
				best, bestTime = plan, pl.Recorded
			}
		}
	}
	return best
}

// Bounds of the choice of a profile: the repositories whose profiles are read, and the paths
// looked up in the layer's index among other layers' profiles.
const (
	maxProfileRepoLookups = 16
	maxProfileLookups     = 1 << 16
)

// profileRepos returns the layer's repositories whose profiles a replay looks at: those of its
// most recent references first, then the others in order, at most maxProfileRepoLookups.
func (l *Layer) profileRepos() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []string
	seen := map[string]bool{}
	for i := len(l.refs) - 1; i >= 0; i-- {
		if r := repository(l.refs[i]); l.repos[r] && !seen[r] {
			seen[r] = true
			out = append(out, r)
		}
	}
	var rest []string
	for r := range l.repos {
		if !seen[r] {
			rest = append(rest, r)
		}
	}
	slices.Sort(rest)
	out = append(out, rest...)
	if len(out) > maxProfileRepoLookups {
		out = out[:maxProfileRepoLookups]
	}
	return out
}

// matchFiles returns the regular files with content of the layer that pl's paths name, in
// order, each once, with their ends.
func (l *Layer) matchFiles(pl *profileLayer) replayPlan {
	var out replayPlan
	seen := map[chunked.EntryID]bool{}
	for i, p := range pl.Files {
		id, ok := l.idx.LookupPath(p)
		if !ok {
			continue
		}
		owner := l.idx.Entry(id).Inode
		e := l.idx.Meta(owner)
		if e.Type != chunked.TypeReg || e.Size == 0 || e.Digest.IsZero() || seen[owner] {
			continue
		}
		seen[owner] = true
		out.files = append(out.files, owner)
		out.ends = append(out.ends, pl.end(i))
	}
	return out
}

// profileFirst moves the chunks of the profile's files to the front of keys (the background
// fetch's plan, in blob order), in the profile's order, those of each file that start before
// its end; it returns the new order and how many keys the profile took.
func (l *Layer) profileFirst(keys []chunkKey, plan replayPlan) ([]chunkKey, int) {
	if len(plan.files) == 0 {
		return keys, 0
	}
	byDigest := map[chunked.Sum][]int{} // the plan's keys of each content
	for i, k := range keys {
		d := l.idx.Meta(k.file).Digest
		byDigest[d] = append(byDigest[d], i)
	}
	taken := make([]bool, len(keys))
	out := make([]chunkKey, 0, len(keys))
	for j, id := range plan.files {
		d := l.idx.Meta(id).Digest
		end := int64(0)
		if j < len(plan.ends) {
			end = plan.ends[j]
		}
		for _, i := range byDigest[d] {
			if end > 0 && l.ref(keys[i]).FileOffset >= end {
				continue
			}
			if !taken[i] {
				taken[i] = true
				out = append(out, keys[i])
			}
		}
	}
	n := len(out)
	for i, k := range keys {
		if !taken[i] {
			out = append(out, k)
		}
	}
	return out, n
}

// replayBatchLen returns how many of keys (profile chunks, in the profile's order) make one
// background request: within the span of a request fetched at once (urgentSpan) in compressed bytes and maxBatchContent in
// content. The batch is then fetched in blob order, coalesced as any background batch.
func (l *Layer) replayBatchLen(keys []chunkKey) int {
	length, content := l.ref(keys[0]).Length, l.ref(keys[0]).Size
	limit := l.link.urgentSpan(l.env.batch)
	n := 1
	for n < len(keys) {
		c := l.ref(keys[n])
		if length+c.Length > limit || content+c.Size > maxBatchContent {
			break
		}
		length += c.Length
		content += c.Size
		n++
	}
	return n
}

// sortByOffset returns keys in blob order (a copy).
func (l *Layer) sortByOffset(keys []chunkKey) []chunkKey {
	out := slices.Clone(keys)
	slices.SortStableFunc(out, func(a, b chunkKey) int { return cmp.Compare(l.ref(a).Offset, l.ref(b).Offset) })
	return out
}

// ProfileImport says what an import of profiles did.
type ProfileImport struct {
	Repositories int `json:"repositories"`
	Layers       int `json:"layers"`
}

// exportHeader is the first line of an export.
type exportHeader struct {
	Format  string `json:"format"`
	Version int    `json:"version"`
}

// ExportProfiles writes every repository's startup profile to w: a first line naming the
// format, then one line of JSON per repository (its layers' profiles: blob digest, time of
// the recording, paths in the order of their first read). It returns how many repositories
// it wrote.
func (m *Manager) ExportProfiles(w io.Writer) (int, error) {
	bw := bufio.NewWriter(w)
	enc := json.NewEncoder(bw)
	if err := enc.Encode(exportHeader{profileExportFormat, profileVersion}); err != nil {
		return 0, err
	}
	n := 0
	for _, name := range m.profiles.all() {
		p := m.profiles.readName(name)
		if p == nil {
			continue
		}
		if err := enc.Encode(p); err != nil {
			return n, err
		}
		n++
	}
	return n, bw.Flush()
}

// maxProfileLine bounds a line of an import: one repository's profile, as written.
const maxProfileLine = maxProfileRecord + 1

// ImportProfiles reads profiles as ExportProfiles writes them and merges each repository's into
// the one the cache holds (as recordings merge: a layer's more recent profile first, the files
// of its older one it lacks after; the bounds drop the oldest). The input is untrusted: a line
// is read only up to the bound of a profile's encoding and checked as a profile read from the
// cache is, and the first invalid line ends the import with an error that names it (the
// repositories on the lines before it are imported). A profile names only paths: it orders
// the background fetch of a layer's own files and never adds content. Times in the future are
// taken as now.
func (m *Manager) ImportProfiles(r io.Reader) (ProfileImport, error) {
	var out ProfileImport
	br := bufio.NewReaderSize(r, 64<<10)
	now := time.Now().UTC()
	for line := 1; ; line++ {
		b, err := readLine(br, maxProfileLine)
		if errors.Is(err, io.EOF) && len(b) == 0 {
			if line == 1 {
				return out, errors.New("profiles: empty input")
			}
			return out, nil
		}
		if err != nil && !errors.Is(err, io.EOF) {
			return out, fmt.Errorf("profiles: line %d: %w", line, err)
		}
		if len(bytes.TrimSpace(b)) == 0 {
			continue
		}
		if line == 1 {
			var h exportHeader
			if json.Unmarshal(b, &h) != nil || h.Format != profileExportFormat {
				return out, fmt.Errorf("profiles: line 1: not an export of layerstore profiles (want {\"format\":%q,...})", profileExportFormat)
			}
			if h.Version != profileVersion {
				return out, fmt.Errorf("profiles: version %d, this daemon reads version %d", h.Version, profileVersion)
			}
			continue
		}
		var p repoProfile
		dec := json.NewDecoder(bytes.NewReader(b))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&p); err != nil {
			return out, fmt.Errorf("profiles: line %d: invalid JSON: %w", line, err)
		}
		if err := p.check(); err != nil {
			return out, fmt.Errorf("profiles: line %d: %w", line, err)
		}
		for i := range p.Layers {
			if p.Layers[i].Recorded.After(now) {
				p.Layers[i].Recorded = now
			}
		}
		if err := m.profiles.add(p.Repository, p.Layers...); err != nil {
			return out, fmt.Errorf("profiles: line %d: storing the profile of %s: %w", line, p.Repository, err)
		}
		out.Repositories++
		out.Layers += len(p.Layers)
	}
}

// readLine reads a line of at most limit bytes (without its newline); a longer one is an
// error, read no further than the limit.
func readLine(br *bufio.Reader, limit int) ([]byte, error) {
	var line []byte
	for {
		frag, err := br.ReadSlice('\n')
		if len(line)+len(frag) > limit+1 {
			return nil, fmt.Errorf("a line of more than %d bytes", limit)
		}
		line = append(line, frag...)
		switch {
		case err == nil:
			return line[:len(line)-1], nil
		case errors.Is(err, bufio.ErrBufferFull):
			continue
		default:
			return line, err
		}
	}
}
