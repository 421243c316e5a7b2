package layer

import (
	"context"
	"path"
	"slices"
	"strings"
	"sync/atomic"

	"github.com/opencontainers/go-digest"

	"github.com/layerstore/layerstore/chunked"
	"github.com/layerstore/layerstore/fetcher"
	"github.com/layerstore/layerstore/internal/execdeps"
)

// Prediction of the image's program.
//
// A runtime looks an image's layers up a fraction of a second or more before it runs the
// container (the pull ends, the container is created, its user is looked up), and the program
// it runs is mostly the one the image's config names (fetcher.Start): its executable, its
// loader and libraries are the first files the start reads, each a round trip or more when
// cold. So once the image's layers are known, the program is predicted as an exec of it would
// be (predict.go: fetched whole, with the files its loader will open), in that gap, not after
// the exec.
//
// The program is looked for as the runtime's exec looks (a path, or a name in each absolute
// directory of the config's PATH, or the runtimes' default PATH) in the merged tree of the
// manifest's lazily servable layers, top first, once every one of them is live (so that the
// file found is the one the tree shows), and predicted only once the runtime has looked its
// layer up: a runtime holding that layer itself reads its own copy, and nothing is fetched.
// An execution of a file the prediction did not name before the program itself runs, in any
// layer of the image (the runtime ran another command), ends the prediction: what it has not
// started fetching is not fetched. Not when the image's repository has a startup
// profile (profile.go), which knows the start better, and how much of each file it reads.
// The image's /etc/passwd and /etc/group, which the runtime reads to set the container's user
// before it runs anything, are fetched whole at the same time (whether the program was found
// or not, at most 1 MiB each, and, as the rest, not when the repository has a profile).
// Once per resolution of a reference through the registry (a start from the cache's records
// needs none); at most maxStarts images wait for their layers at once. A config naming
// another program than the one run costs at most the fetch of that file and its libraries
// until the first execution, bounded as any prediction (maxPredictWhole, maxPredicted), of
// the image's own layers, verified.

// imageStart is an image whose program is to be predicted.
type imageStart struct {
	manifest digest.Digest
	start    fetcher.Start
	layers   []digest.Digest // the blob digests of its lazily servable layers, bottom to top
}

// maxStarts bounds the images whose program waits for their layers.
const maxStarts = 256

// userFiles are what a runtime reads of an image to set its container's user and groups;
// one larger than maxUserFile is not fetched ahead (the runtime's own reads fetch it).
var userFiles = []string{"/etc/passwd", "/etc/group"}

const maxUserFile = 1 << 20

// defaultPath is the PATH runtimes give a container whose config sets none.
const defaultPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// noteStart remembers the program of the image ref resolved to, when key (the layer a
// runtime looked up) is in its manifest for this platform, for predictStart.
func (m *Manager) noteStart(ref string, img *fetcher.Image, key digest.Digest) {
	if m.env.readAhead <= 0 || img.Start.Program == "" {
		return
	}
	if d, _ := findIn(&img.Manifest, key); d == nil {
		return
	}
	s := &imageStart{manifest: img.Manifest.Digest, start: img.Start}
	for _, d := range img.Manifest.Layers {
		if _, err := chunked.Classify(d.Descriptor); err == nil {
			s.layers = append(s.layers, d.Digest)
		}
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if old := m.starts[ref]; old != nil && old.manifest == s.manifest {
		return
	}
	if len(m.starts) >= maxStarts {
		clear(m.starts) // images whose layers never all came: their prediction is dropped
	}
	m.starts[ref] = s
}

// predictStart predicts the program of the image ref resolved to (noteStart), once, when all
// its lazily servable layers are live and the runtime has looked up the one holding it.
func (m *Manager) predictStart(ref string) {
	m.mu.Lock()
	s := m.starts[ref]
	if s == nil {
		m.mu.Unlock()
		return
	}
	var live []*Served
	for _, l := range m.live.all() {
		if slices.Contains(s.layers, l.desc.Digest) {
			live = append(live, l)
		}
	}
	m.mu.Unlock()
	layers := make([]*Served, 0, len(s.layers))
	for _, d := range slices.Backward(s.layers) {
		i := slices.IndexFunc(live, func(l *Served) bool {
			return l.desc.Digest == d && slices.Contains(l.references(), ref)
		})
		if i < 0 {
			return // not live yet: a later lookup tries again
		}
		layers = append(layers, live[i])
	}
	t, found := findProgram(layers, s.start)
	if found && !t.l.looked.Load() {
		return // the runtime may hold that layer itself: its lookup tries again
	}
	m.mu.Lock()
	if m.starts[ref] != s {
		m.mu.Unlock()
		return // another lookup took it
	}
	delete(m.starts, ref)
	m.mu.Unlock()
	if m.env.profiles.Get(repository(ref)) != nil {
		// The repository's startup profile knows the start, the runtime's reads included,
		// and how much of each file it reads: its replay fetches them (profile.go).
		m.opts.log.Debug("the image's start is its profile's", "ref", ref)
		return
	}
	// The runtime reads the image's user database to set the container's user (podman,
	// CRI-O), before it runs anything: fetched whole, after the program's prediction has
	// started, beside the predictions rather than in one of their slots (two small files
	// would otherwise hold the program's libraries up while their requests wait behind the
	// program's on a slow link).
	defer fetchUserFiles(layers)
	if !found {
		m.opts.log.Debug("the image's program is not in its lazily served layers", "ref", ref, "program", s.start.Program)
		return
	}
	m.opts.log.Debug("predicting the image's program", "ref", ref, "layer", t.l.desc.Digest, "path", t.l.idx.Path(t.id))
	// Not below the manager's context: a guess nobody ends is only garbage (each prediction
	// stops watching it when it ends), and the manager's close ends predictions itself.
	ctx, stop := context.WithCancel(context.Background())
	g := &startGuess{program: t, stop: stop}
	for _, l := range layers {
		l.startGuess.Store(g)
	}
	t.l.predict(ctx, t.id)
}

// fetchUserFiles fetches the userFiles of the merged tree of layers (top first) whole, in the
// background, as a prediction's fetches go.
func fetchUserFiles(layers []*Served) {
	for _, p := range userFiles {
		if f, ok := resolvePath(layers, p); ok && f.l.idx.Meta(f.id).Size <= maxUserFile {
			f.l.env.life.goTracked(func() {
				ctx, cancel := f.l.env.life.bound(f.l.env.life.ctx, f.l.env.readTimeout)
				defer cancel()
				f.l.fetchFile(ctx, f.id)
			})
		}
	}
}

// startGuess is the prediction of an image's program, shared by the image's layers.
type startGuess struct {
	program   fileRef
	stop      context.CancelFunc // ends the prediction's fetches not started yet
	confirmed atomic.Bool        // the program was executed
}

// executing settles the guess at the execution of file f, which fresh says no prediction
// had named: the program itself confirms it (the files its loader opens next, the
// interpreter first, may not be named yet); a fresh program before it ends it (the runtime
// ran another command). Once confirmed, nothing ends it: the program's chain of libraries
// completes whatever runs next.
func (g *startGuess) executing(f fileRef, fresh bool) {
	switch {
	case f == g.program:
		g.confirmed.Store(true)
	case fresh && !g.confirmed.Load():
		g.stop()
	}
}

// findProgram looks for the program of start in the merged tree of layers (top first) as an
// exec does: a path as is (a relative one depends on the working directory: not looked for),
// a name in each absolute directory of its PATH (defaultPath when it sets none), the first
// executable regular file found.
func findProgram(layers []*Served, start fetcher.Start) (fileRef, bool) {
	prog := start.Program
	if strings.Contains(prog, "/") {
		if !path.IsAbs(prog) {
			return fileRef{}, false
		}
		t, ok := resolvePath(layers, prog)
		return t, ok && executable(t)
	}
	p := start.Path
	if p == "" {
		p = defaultPath
	}
	dirs := strings.Split(p, ":")
	for _, d := range dirs[:min(len(dirs), execdeps.MaxSearchDirs)] {
		if !path.IsAbs(d) {
			continue
		}
		if t, ok := resolvePath(layers, path.Join(d, prog)); ok && executable(t) {
			return t, true
		}
	}
	return fileRef{}, false
}

func executable(t fileRef) bool { return t.l.idx.Meta(t.id).Mode&0o111 != 0 }
