package layer

import (
	"context"
	"io"
	"path"
	"slices"
	"strings"
	"sync"

	"github.com/layerstore/layerstore/chunked"
	"github.com/layerstore/layerstore/internal/execdeps"
)

// Prediction of the files a program's loader asks for.
//
// A container's start is a chain of programs, and each program a chain of files: the kernel
// reads the executable's header, then its interpreter (the dynamic loader), which reads the
// executable's dynamic section and then opens each library it names, one after the other,
// each library's header and dynamic section before the next: a round trip each when cold. The
// names are all in the executable's dynamic section (DT_NEEDED), so once an executable is
// opened, the files its loader will ask for can be found and fetched at once, side by side,
// ahead of the loader, and the libraries' own, in turn (and glibc's /etc/ld.so.cache, which
// its loader reads first). A script names its interpreter on its first line ("#!"), which is
// predicted in turn. A startup profile (profile.go) knows the whole start but needs one start
// first; prediction needs nothing.
//
// The kernel's open of a file to execute it (Executing: an execve, or the interpreter of
// one) starts the prediction of that file, and so does the lookup of the layer holding the
// program the image's config names (start.go), before the runtime runs it. A program also
// loads libraries itself (dlopen: Python's extension modules and the libraries they name,
// plugins, a JVM's libjvm), which no exec shows: the loader opens the file, reads its start
// and maps it. So a runtime's read of the start of a file whose first bytes are an ELF
// shared object's header (execdeps.IsSharedObject; Served.ReadFile) starts its prediction
// too, unless its layer replays a startup profile (which holds what the start loaded, and
// nothing it read as data); a shared object read as data (a checksum, a copy) is predicted alike, which costs fetches of
// the image's own files, within the same bounds. Other files read (scripts, objects, archives)
// are not predicted. A predicted file of at most maxPredictWhole of content is fetched whole
// (fetchFile: the loader maps all of it, reads its header and then its dynamic section, near
// its end, and the program faults its pages in here and there), unless its layer replays a
// startup profile, which knows how much of it the start reads. The file's header, program
// headers, interpreter path (PT_INTERP), dynamic section (PT_DYNAMIC) and the strings it names
// (DT_NEEDED, DT_RUNPATH or DT_RPATH) are read beside it (package execdeps reads them), as a
// prediction reads (kind ahead: fetched, verified and cached as any chunk, never recorded in a
// profile nor counted as the workload's reads); each library is looked for as the loader looks (the run path with $ORIGIN,
// then the usual system directories for the file's machine: the ld.so.cache is fetched, not
// read), by path in the layer and in the other live layers resolved through one of its
// references (the rest of the image; a symlink is followed across them); each file found is
// predicted in turn, which fetches it (whole, or its header and dynamic section), and so brings
// it into the cache before the loader asks. What the loader faults in later comes through reads
// as before. Reads of the workload are never delayed: a prediction's fetches are shared with
// any read that wants the same chunks, and hold background work up no more than fetch-ahead
// does.
//
// Bounds (an ELF file is untrusted input): at most maxPredicted files per layer are predicted
// (each once), predictSlots predictions run at once per manager (each holding at most
// wholeBatches batches of wholeBatch of content fetched whole), a file's program headers,
// dynamic section, names and search directories are bounded (package execdeps), and so are the
// paths resolved (execdeps.MaxPath, maxLinkHops); a malformed file ends its prediction without
// error to anyone. A prediction names paths of the image's own layers and fetches their chunks of their
// own verified indexes: it serves nothing and changes only when chunks are fetched.
// Prediction is off when read-ahead is (options.readAhead zero).

// Bounds of prediction.
const (
	maxPredicted = 256 // files predicted per layer
	predictSlots = 4   // predictions running at once, per manager
	maxLinkHops  = 16  // symlinks followed to resolve a path

	maxPredictWhole = 64 << 20 // content of a predicted file fetched whole (fetchFile)
	wholeBatch      = 4 << 20  // content of one batch of a file fetched whole
	wholeBatches    = 4        // batches of a file fetched whole in flight at once (fetchFile)
)

// predict starts the prediction of file id (once per file, at most maxPredicted per layer),
// in the background, and reports whether it did. Cancelling guess stops what the prediction,
// and those of the files it names, have not started fetching yet; nil for none.
func (l *Served) predict(guess context.Context, id chunked.EntryID) bool {
	if !l.markPredicted(id) {
		return false
	}
	l.env.life.goTracked(func() {
		select {
		case l.env.predicting <- struct{}{}:
		case <-l.env.life.ctx.Done():
			return
		}
		defer func() { <-l.env.predicting }()
		ctx, cancel := l.env.life.bound(l.env.life.ctx, l.env.readTimeout)
		defer cancel()
		if guess != nil {
			defer context.AfterFunc(guess, cancel)()
		}
		var whole sync.WaitGroup
		if !l.replaysProfile() { // a profile knows how much of the file the start reads
			whole.Go(func() { l.fetchFile(ctx, id) })
		}
		// Beside the whole file, not after it: the reads of the header and the dynamic
		// section share the batches' fetches or fetch their chunks first, and the libraries
		// named there start while the rest of the file comes.
		for _, t := range l.predictFrom(ctx, id) {
			t.l.predict(guess, t.id)
		}
		whole.Wait()
	})
	return true
}

// fetchFile fetches, as a prediction, every chunk of file id that the cache lacks and
// nobody is fetching, when its content is at most maxPredictWhole: the loader maps the whole
// file, reads its header and its dynamic section (near its end) one after the other, and the
// program faults its pages in here and there, each a round trip, a decompression and a
// verification of its chunk, one after the other. The chunks go in batches of consecutive
// chunks of at most wholeBatch of content (one chunk when a chunk alone is larger),
// wholeBatches at once, in the file's order: each batch is verified and served as soon as its
// own bytes have come, side by side with the next one's transfer. Four at once, not fewer: a
// response on a connection that was idle starts in TCP's slow start, so one batch's request
// uses a fast link far below its rate, and four in flight started gcc faster than two at
// 1 Gbit/s, with no change at 100 Mbit/s, where the link is the bound
// (benchmarks/results/2026-11-29-readybench-wholebatches-ab).
func (l *Served) fetchFile(ctx context.Context, id chunked.EntryID) {
	e := l.idx.Meta(id)
	if l.v.Err() != nil || e.Type != chunked.TypeReg || e.Digest.IsZero() || e.Size > maxPredictWhole || l.env.cache.Has(e.Digest) {
		return // refused (checkTarSplit), not a file with content, too large, or local
	}
	var batches [][]chunkKey
	var content int64
	for i := range l.idx.NumChunks(id) {
		c, _ := l.idx.Chunk(id, i)
		if len(batches) == 0 || content+c.Size > wholeBatch {
			batches = append(batches, nil)
			content = 0
		}
		batches[len(batches)-1] = append(batches[len(batches)-1], chunkKey{id, i})
		content += c.Size
	}
	h, err := l.env.files.acquire(e.Digest, e.Size)
	if err != nil {
		h = nil
	} else {
		defer l.env.files.release(h)
	}
	parallel(wholeBatches, len(batches), func(b int) {
		if ctx.Err() != nil {
			return
		}
		l.fetchChunks(ctx, batches[b], want{kind: ahead, h: h})
	})
}

// replaysProfile reports whether the layer's background fetch replays a startup profile.
func (l *Served) replaysProfile() bool {
	l.prefetch.mu.Lock()
	defer l.prefetch.mu.Unlock()
	return l.prefetch.profileFiles > 0
}

// markPredicted marks file id as predicted, which also makes it mapped for its regions
// (fetchRegion); it reports false when it was already, when the layer has maxPredicted, or
// when prediction is off.
func (l *Served) markPredicted(id chunked.EntryID) bool {
	if l.env.readAhead <= 0 || l.env.predicting == nil {
		return false
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.predicted == nil {
		l.predicted = map[chunked.EntryID]bool{}
	}
	if l.predicted[id] || len(l.predicted) >= maxPredicted {
		return false
	}
	l.predicted[id] = true
	return true
}

// fileRef names a regular file of a layer.
type fileRef struct {
	l  *Served
	id chunked.EntryID
}

// predictFrom reads the ELF file id's loading information (reading its chunks as a
// prediction) and returns the files its loader will open: its interpreter and the libraries
// it names, where they are found.
func (l *Served) predictFrom(ctx context.Context, id chunked.EntryID) []fileRef {
	e := l.idx.Meta(id)
	if e.Type != chunked.TypeReg {
		return nil
	}
	r := &predictReader{ctx: ctx, l: l, id: id}
	layers := []*Served{l}
	if l.env.live != nil {
		layers = append(layers, l.env.live.siblings(l)...)
	}
	var out []fileRef
	add := func(p string) bool {
		if t, ok := resolvePath(layers, p); ok && !slices.Contains(out, t) {
			out = append(out, t)
			return true
		}
		return false
	}
	if interp, ok := execdeps.Shebang(r, e.Size); ok {
		add(interp) // a script: the kernel executes its interpreter
		return out
	}
	deps, err := execdeps.ReadELF(r, e.Size)
	if err != nil {
		l.env.log.Debug("no prediction", "layer", l.desc.Digest, "path", l.idx.Path(id), "err", err)
		return nil
	}
	if deps.Interp != "" {
		add(deps.Interp)
		add(execdeps.LDCache) // glibc's loader reads it before it opens any library
	}
	dirs := deps.SearchDirs(path.Dir("/" + l.idx.Path(id)))
	for _, name := range deps.Needed {
		if strings.Contains(name, "/") {
			add(name) // a path: the loader opens it as is (relative ones are not followed)
			continue
		}
		for _, d := range dirs {
			if add(path.Join(d, name)) {
				break
			}
		}
	}
	return out
}

// predictReader reads a file of a layer as a prediction does (io.ReaderAt).
type predictReader struct {
	ctx context.Context
	l   *Served
	id  chunked.EntryID
}

func (r *predictReader) ReadAt(p []byte, off int64) (int, error) {
	n, err := r.l.read(r.ctx, r.id, p, off, ahead)
	if err == nil && n < len(p) {
		err = io.EOF
	}
	return n, err
}

// resolvePath finds the regular file at absolute path p in the merged tree of layers (the
// first layer holding each component wins), following symlinks (at most maxLinkHops) as the
// kernel does, across layers.
func resolvePath(layers []*Served, p string) (fileRef, bool) {
	if len(p) > execdeps.MaxPath {
		return fileRef{}, false
	}
	p = strings.Trim(path.Clean("/"+p), "/")
	for hops := 0; hops <= maxLinkHops; hops++ {
		done, rest := "", p
		for {
			name, more, _ := strings.Cut(rest, "/")
			cand := path.Join(done, name)
			t, ok := lookupIn(layers, cand)
			if !ok {
				return fileRef{}, false
			}
			e := t.l.idx.Meta(t.id)
			if e.Type == chunked.TypeSymlink {
				target := e.LinkName
				if !path.IsAbs(target) {
					target = path.Join("/", done, target)
				}
				p = strings.Trim(path.Clean(target+"/"+more), "/")
				if len(p) > execdeps.MaxPath {
					return fileRef{}, false
				}
				break // again, from the root, one hop more
			}
			if more == "" {
				owner := e.Inode // a hardlink's content is its owner's
				if o := t.l.idx.Meta(owner); o.Type != chunked.TypeReg || o.Size == 0 || o.Digest.IsZero() {
					return fileRef{}, false
				}
				return fileRef{t.l, owner}, true
			}
			if e.Type != chunked.TypeDir {
				return fileRef{}, false
			}
			done, rest = cand, more
		}
	}
	return fileRef{}, false
}

// lookupIn returns the entry at path p of the first of layers that has one.
func lookupIn(layers []*Served, p string) (fileRef, bool) {
	for _, l := range layers {
		if id, ok := l.idx.LookupPath(p); ok && id != l.idx.Root() {
			return fileRef{l, id}, true
		}
	}
	return fileRef{}, false
}
