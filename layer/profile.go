package layer

import (
	"cmp"
	"errors"
	"io"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/layerstore/layerstore/cache"
	"github.com/layerstore/layerstore/chunked"
	"github.com/layerstore/layerstore/internal/control/protocol"
	"github.com/layerstore/layerstore/layer/profile"
)

// Startup profiles: what a layer's first users read first, learned by the daemon and replayed
// by the background fetch of a later cold start. See the package documentation (Startup
// profiles) for the design. Their format, bounds, persistence, merge, export and import are
// package profile's; the recording of a layer's reads and the choice of what its background
// fetch replays first are here.

// profileStore is where the repositories' startup profiles are kept: package profile's Store.
type profileStore interface {
	Get(repo string) *profile.Repo
	Add(repo string, layers ...profile.LayerReads) error
	Export(w io.Writer) (int, error)
	Import(r io.Reader) (protocol.ProfileImport, error)
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
func (l *Served) recordRead(id chunked.EntryID, end int64) {
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
		if e.Size <= 0 || n == 0 || n > profile.MaxPath {
			break
		}
		if r.bytes+n > profile.MaxLayerPathBytes {
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
func (l *Served) endRecording() {
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
	if len(files) == 0 || l.v.Err() != nil || l.env.life.ctx.Err() != nil {
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
	slot := profile.LayerReads{Layer: l.desc.Digest, Recorded: time.Now().UTC(), Files: paths, Ends: profile.SparseEnds(ends)}
	l.env.life.goTracked(func() {
		for _, repo := range repos {
			if err := l.env.profiles.Add(repo, slot); err != nil && !errors.Is(err, cache.ErrClosed) {
				l.env.log.Log(l.env.life.ctx, noSpaceLevel(err), "writing the startup profile failed", "repository", repo, "err", err)
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
func (l *Served) profileFiles() replayPlan {
	var ps []*profile.Repo
	for _, repo := range l.profileRepos() {
		if p := l.env.profiles.Get(repo); p != nil {
			ps = append(ps, p)
		}
	}
	var exact *profile.LayerReads
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
func (l *Served) profileRepos() []string {
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
func (l *Served) matchFiles(pl *profile.LayerReads) replayPlan {
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
		out.ends = append(out.ends, pl.End(i))
	}
	return out
}

// profileFirst moves the chunks of the profile's files to the front of keys (the background
// fetch's plan, in blob order), in the profile's order, those of each file that start before
// its end; it returns the new order and how many keys the profile took.
func (l *Served) profileFirst(keys []chunkKey, plan replayPlan) ([]chunkKey, int) {
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
func (l *Served) replayBatchLen(keys []chunkKey) int {
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
func (l *Served) sortByOffset(keys []chunkKey) []chunkKey {
	out := slices.Clone(keys)
	slices.SortStableFunc(out, func(a, b chunkKey) int { return cmp.Compare(l.ref(a).Offset, l.ref(b).Offset) })
	return out
}

// ExportProfiles writes every repository's startup profile to w: a first line naming the
// format, then one line of JSON per repository (its layers' profiles: blob digest, time of
// the recording, paths in the order of their first read). It returns how many repositories
// it wrote.
func (m *Manager) ExportProfiles(w io.Writer) (int, error) { return m.profiles.Export(w) }

// ImportProfiles reads profiles as ExportProfiles writes them and merges each repository's into
// the one the cache holds (as recordings merge: a layer's more recent profile first, the files
// of its older one it lacks after; the bounds drop the oldest). The input is untrusted: a line
// is read only up to the bound of a profile's encoding and checked as a profile read from the
// cache is, and the first invalid line ends the import with an error that names it (the
// repositories on the lines before it are imported). A profile names only paths: it orders
// the background fetch of a layer's own files and never adds content. Times in the future are
// taken as now.
func (m *Manager) ImportProfiles(r io.Reader) (protocol.ProfileImport, error) {
	return m.profiles.Import(r)
}
