package layer

import (
	"bytes"
	"context"
	"debug/elf"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"path"
	"slices"
	"strings"
	"sync"

	"github.com/layerstore/layerstore/chunked"
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
// and maps it. So a runtime's read of the start of a file whose first bytes are an ELF shared
// object's header (isSharedObject; Layer.ReadFile) starts its prediction too, unless its layer
// replays a startup profile (which holds what the start loaded, and nothing it read as data);
// a shared object read as data (a checksum, a copy) is predicted alike, which costs fetches of
// the image's own files, within the same bounds. Other files read (scripts, objects, archives)
// are not predicted. A predicted file of at most maxPredictWhole of content is fetched whole
// (fetchFile: the loader maps all of it, reads its header and then its dynamic section, near
// its end, and the program faults its pages in here and there), unless its layer replays a
// startup profile, which knows how much of it the start reads. The file's header, program
// headers, interpreter path (PT_INTERP), dynamic section (PT_DYNAMIC) and the strings it names
// (DT_NEEDED, DT_RUNPATH or DT_RPATH) are read beside it, as a prediction reads (kind ahead:
// fetched, verified and cached as any chunk, never recorded in a profile nor counted as the
// workload's reads); each library is looked for as the loader looks (the run path with $ORIGIN,
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
// dynamic section, names and paths are bounded (maxPhdrs, maxDynamic, maxNeeded, maxName,
// maxSearchDirs, maxLinkHops), and a malformed file ends its prediction without error to
// anyone. A prediction names paths of the image's own layers and fetches their chunks of their
// own verified indexes: it serves nothing and changes only when chunks are fetched.
// Prediction is off when read-ahead is (options.readAhead zero).

// Bounds of prediction.
const (
	maxPredicted  = 256      // files predicted per layer
	predictSlots  = 4        // predictions running at once, per manager
	maxPhdrs      = 256      // program headers read
	maxDynamic    = 64 << 10 // bytes of a dynamic section read
	maxNeeded     = 64       // libraries a file names, taken
	maxName       = 256      // bytes of a library name or a run path entry
	maxSearchDirs = 24       // directories a library is looked for in
	maxLinkHops   = 16       // symlinks followed to resolve a path
	maxPathLen    = 4096     // bytes of a path resolved

	maxPredictWhole = 64 << 20 // content of a predicted file fetched whole (fetchFile)
	wholeBatch      = 4 << 20  // content of one batch of a file fetched whole
	wholeBatches    = 4        // batches of a file fetched whole in flight at once (fetchFile)
)

// predict starts the prediction of file id (once per file, at most maxPredicted per layer),
// in the background, and reports whether it did. Cancelling guess stops what the prediction,
// and those of the files it names, have not started fetching yet; nil for none.
func (l *Layer) predict(guess context.Context, id chunked.EntryID) bool {
	if !l.markPredicted(id) {
		return false
	}
	l.env.work.goTracked(func() {
		select {
		case l.env.predicting <- struct{}{}:
		case <-l.env.work.ctx.Done():
			return
		}
		defer func() { <-l.env.predicting }()
		ctx, cancel := l.env.work.bound(l.env.work.ctx, l.env.readTimeout)
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
// own bytes have come, side by side with the next one's transfer. Four at once, not fewer: one
// batch's request (1-2 MB compressed) took 40-60 ms at 1 Gbit/s, 300-400 Mbit/s (a response on
// a connection that was idle starts in TCP's slow start), and with four in flight instead of
// two gcc's cold start on zstd:chunked at 1 Gbit/s took 1.05 s instead of 1.17 (back to back;
// nothing changed beyond noise at 100 Mbit/s, where the link is the bound:
// benchmarks/results/2026-11-29-readybench-wholebatches-ab.md).
func (l *Layer) fetchFile(ctx context.Context, id chunked.EntryID) {
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
		_, mine := l.claimMissing(h, batches[b])
		l.run(ctx, mine, ahead)
	})
}

// replaysProfile reports whether the layer's background fetch replays a startup profile.
func (l *Layer) replaysProfile() bool {
	l.prefetch.mu.Lock()
	defer l.prefetch.mu.Unlock()
	return l.prefetch.profileFiles > 0
}

// markPredicted marks file id as predicted, which also makes it mapped for its regions
// (fetchRegion); it reports false when it was already, when the layer has maxPredicted, or
// when prediction is off.
func (l *Layer) markPredicted(id chunked.EntryID) bool {
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
	l  *Layer
	id chunked.EntryID
}

// predictFrom reads the ELF file id's loading information (reading its chunks as a
// prediction) and returns the files its loader will open: its interpreter and the libraries
// it names, where they are found.
func (l *Layer) predictFrom(ctx context.Context, id chunked.EntryID) []fileRef {
	e := l.idx.Meta(id)
	if e.Type != chunked.TypeReg {
		return nil
	}
	r := &predictReader{ctx: ctx, l: l, id: id}
	layers := []*Layer{l}
	if l.env.siblings != nil {
		layers = append(layers, l.env.siblings(l)...)
	}
	var out []fileRef
	add := func(p string) bool {
		if t, ok := resolvePath(layers, p); ok && !slices.Contains(out, t) {
			out = append(out, t)
			return true
		}
		return false
	}
	if interp, ok := readShebang(r, e.Size); ok {
		add(interp) // a script: the kernel executes its interpreter
		return out
	}
	deps, err := readELFDeps(r, e.Size)
	if err != nil {
		l.env.log.Debug("no prediction", "layer", l.desc.Digest, "path", l.idx.Path(id), "err", err)
		return nil
	}
	if deps.interp != "" {
		add(deps.interp)
		// glibc's loader reads its cache of library paths before it opens any library.
		add(ldCache)
	}
	dirs := searchDirs(deps, path.Dir("/"+l.idx.Path(id)))
	for _, name := range deps.needed {
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
	l   *Layer
	id  chunked.EntryID
}

func (r *predictReader) ReadAt(p []byte, off int64) (int, error) {
	n, err := r.l.read(r.ctx, r.id, p, off, ahead)
	if err == nil && n < len(p) {
		err = io.EOF
	}
	return n, err
}

// isSharedObject reports whether p, the start of a file, is an ELF shared object's header
// (e_type ET_DYN: a library, or a position-independent executable).
func isSharedObject(p []byte) bool {
	if len(p) < 18 || string(p[:4]) != elf.ELFMAG {
		return false
	}
	bo := byteOrder(p[elf.EI_DATA])
	return bo != nil && elf.Type(bo.Uint16(p[16:])) == elf.ET_DYN
}

// byteOrder is the byte order an ELF header's EI_DATA byte names, nil for none.
func byteOrder(data byte) binary.ByteOrder {
	switch elf.Data(data) {
	case elf.ELFDATA2LSB:
		return binary.LittleEndian
	case elf.ELFDATA2MSB:
		return binary.BigEndian
	}
	return nil
}

// ldCache is glibc's cache of library paths, which its dynamic loader reads first (a system
// without it, musl's, has no such file and nothing is predicted for it).
const ldCache = "/etc/ld.so.cache"

// readShebang returns the interpreter a script of size bytes names on its first line
// ("#!/bin/sh -e": /bin/sh), as the kernel reads it: within its first maxShebang bytes.
func readShebang(r io.ReaderAt, size int64) (string, bool) {
	buf := make([]byte, min(size, maxShebang))
	if len(buf) < 3 {
		return "", false
	}
	n, _ := r.ReadAt(buf, 0)
	if n < 3 || string(buf[:2]) != "#!" {
		return "", false
	}
	buf = buf[2:n]
	if i := bytes.IndexByte(buf, '\n'); i >= 0 {
		buf = buf[:i]
	}
	interp, _, _ := strings.Cut(strings.TrimLeft(string(buf), " \t"), " ")
	interp, _, _ = strings.Cut(interp, "\t")
	return interp, path.IsAbs(interp)
}

// maxShebang is how much of a script's first line the kernel reads (BINPRM_BUF_SIZE).
const maxShebang = 256

// elfDeps is what an ELF file asks of its loader.
type elfDeps struct {
	machine elf.Machine
	class   elf.Class
	interp  string   // PT_INTERP, "" if none
	needed  []string // DT_NEEDED, in order
	runpath []string // DT_RUNPATH's entries, or DT_RPATH's when there is no DT_RUNPATH
}

var errNotELF = errors.New("not an ELF file")

// readELFDeps reads the loading information of the ELF file r of size bytes: its header,
// program headers, interpreter and dynamic section, and the strings the dynamic section names.
// Everything it reads is bounded; a malformed file is an error.
func readELFDeps(r io.ReaderAt, size int64) (elfDeps, error) {
	var d elfDeps
	var id [elf.EI_NIDENT]byte
	if _, err := r.ReadAt(id[:], 0); err != nil {
		return d, errNotELF
	}
	if string(id[:4]) != elf.ELFMAG {
		return d, errNotELF
	}
	bo := byteOrder(id[elf.EI_DATA])
	if bo == nil {
		return d, fmt.Errorf("ELF data encoding %d", id[elf.EI_DATA])
	}
	d.class = elf.Class(id[elf.EI_CLASS])
	// The header's and program headers' fields read: where they are in each class.
	var (
		hdrSize, phoffAt, phentAt, phnumAt int
		phSize                             int64
		word                               func([]byte) uint64
	)
	switch d.class {
	case elf.ELFCLASS64:
		hdrSize, phoffAt, phentAt, phnumAt, phSize = 64, 32, 54, 56, 56
		word = bo.Uint64
	case elf.ELFCLASS32:
		hdrSize, phoffAt, phentAt, phnumAt, phSize = 52, 28, 42, 44, 32
		word = func(b []byte) uint64 { return uint64(bo.Uint32(b)) }
	default:
		return d, fmt.Errorf("ELF class %d", id[elf.EI_CLASS])
	}
	wordSize := int64(d.class) * 4 // 4 or 8
	hdr := make([]byte, hdrSize)
	if _, err := r.ReadAt(hdr, 0); err != nil {
		return d, fmt.Errorf("ELF header: %w", err)
	}
	d.machine = elf.Machine(bo.Uint16(hdr[18:]))
	phoff, phent, phnum := word(hdr[phoffAt:]), int64(bo.Uint16(hdr[phentAt:])), int64(bo.Uint16(hdr[phnumAt:]))
	// The kernel loads only files whose program headers have the class's size.
	if phnum == 0 || phnum > maxPhdrs || phent != phSize || phoff >= uint64(size) || int64(phoff)+phent*phnum > size {
		return d, fmt.Errorf("ELF program headers: %d of %d bytes at %d", phnum, phent, phoff)
	}
	phdrs := make([]byte, phent*phnum)
	if _, err := r.ReadAt(phdrs, int64(phoff)); err != nil {
		return d, fmt.Errorf("ELF program headers: %w", err)
	}
	type segment struct{ typ, off, vaddr, filesz uint64 }
	var loads []segment
	var dynamic segment
	for i := range phnum {
		p := phdrs[i*phent:]
		var s segment
		s.typ = uint64(bo.Uint32(p))
		if d.class == elf.ELFCLASS64 {
			s.off, s.vaddr, s.filesz = bo.Uint64(p[8:]), bo.Uint64(p[16:]), bo.Uint64(p[32:])
		} else {
			s.off, s.vaddr, s.filesz = uint64(bo.Uint32(p[4:])), uint64(bo.Uint32(p[8:])), uint64(bo.Uint32(p[16:]))
		}
		if s.off > uint64(size) || s.filesz > uint64(size)-s.off {
			continue // past the file's end: not a segment the loader could map
		}
		switch elf.ProgType(s.typ) {
		case elf.PT_LOAD:
			loads = append(loads, s)
		case elf.PT_DYNAMIC:
			dynamic = s
		case elf.PT_INTERP:
			if d.interp == "" && s.filesz > 1 && s.filesz <= maxPathLen {
				b := make([]byte, s.filesz)
				if _, err := r.ReadAt(b, int64(s.off)); err != nil {
					return d, fmt.Errorf("ELF interpreter: %w", err)
				}
				d.interp = cString(b)
			}
		}
	}
	if dynamic.filesz == 0 {
		return d, nil // static: nothing more to load
	}
	dyn := make([]byte, min(dynamic.filesz, maxDynamic))
	if _, err := r.ReadAt(dyn, int64(dynamic.off)); err != nil {
		return d, fmt.Errorf("ELF dynamic section: %w", err)
	}
	var strtab, strsz uint64
	var needed, runpath, rpath []uint64
	for i := int64(0); (i+2)*wordSize <= int64(len(dyn)); i += 2 {
		tag, val := elf.DynTag(word(dyn[i*wordSize:])), word(dyn[(i+1)*wordSize:])
		if tag == elf.DT_NULL {
			break
		}
		switch tag {
		case elf.DT_NEEDED:
			if len(needed) < maxNeeded {
				needed = append(needed, val)
			}
		case elf.DT_STRTAB:
			strtab = val
		case elf.DT_STRSZ:
			strsz = val
		case elf.DT_RUNPATH:
			runpath = append(runpath[:0], val)
		case elf.DT_RPATH:
			rpath = append(rpath[:0], val)
		}
	}
	// DT_STRTAB is an address: find it in the segments mapped from the file.
	stroff, ok := uint64(0), false
	for _, s := range loads {
		if strtab >= s.vaddr && strtab-s.vaddr < s.filesz {
			stroff, ok = s.off+(strtab-s.vaddr), true
			strsz = min(strsz, s.filesz-(strtab-s.vaddr))
			break
		}
	}
	if !ok {
		if len(needed) == 0 {
			return d, nil
		}
		return d, fmt.Errorf("ELF string table at %#x is in no loaded segment", strtab)
	}
	str := func(o uint64) (string, bool) {
		if o >= strsz {
			return "", false
		}
		b := make([]byte, min(maxName, strsz-o))
		n, err := r.ReadAt(b, int64(stroff+o))
		if err != nil && n == 0 {
			return "", false
		}
		b = b[:n]
		if i := bytes.IndexByte(b, 0); i > 0 {
			return string(b[:i]), true
		}
		return "", false // empty, or longer than maxName
	}
	for _, o := range needed {
		if s, ok := str(o); ok {
			d.needed = append(d.needed, s)
		}
	}
	if len(runpath) == 0 {
		runpath = rpath
	}
	for _, o := range runpath {
		if s, ok := str(o); ok {
			d.runpath = strings.Split(s, ":")
		}
	}
	return d, nil
}

// cString returns b up to its first NUL.
func cString(b []byte) string {
	if i := bytes.IndexByte(b, 0); i >= 0 {
		b = b[:i]
	}
	return string(b)
}

// searchDirs returns the directories the loader looks for deps' libraries in, in order: the
// run path ($ORIGIN, ${ORIGIN} as origin, the directory of the file; entries with other
// substitutions are skipped), then the system's directories for the file's machine and class
// (multiarch, then lib64 or lib, then /usr/local/lib). At most maxSearchDirs.
func searchDirs(deps elfDeps, origin string) []string {
	var dirs []string
	add := func(d string) {
		if path.IsAbs(d) && len(dirs) < maxSearchDirs && !slices.Contains(dirs, path.Clean(d)) {
			dirs = append(dirs, path.Clean(d))
		}
	}
	for _, d := range deps.runpath {
		d = strings.ReplaceAll(strings.ReplaceAll(d, "${ORIGIN}", origin), "$ORIGIN", origin)
		if !strings.Contains(d, "$") {
			add(d)
		}
	}
	if t := multiarch(deps.machine, deps.class); t != "" {
		add("/lib/" + t)
		add("/usr/lib/" + t)
	}
	if deps.class == elf.ELFCLASS64 {
		add("/lib64")
		add("/usr/lib64")
	}
	add("/lib")
	add("/usr/lib")
	add("/usr/local/lib")
	return dirs
}

// multiarch returns Debian's multiarch tuple of a machine and class, "" for others.
func multiarch(m elf.Machine, c elf.Class) string {
	switch {
	case m == elf.EM_X86_64 && c == elf.ELFCLASS64:
		return "x86_64-linux-gnu"
	case m == elf.EM_AARCH64:
		return "aarch64-linux-gnu"
	case m == elf.EM_386:
		return "i386-linux-gnu"
	case m == elf.EM_ARM:
		return "arm-linux-gnueabihf"
	case m == elf.EM_PPC64:
		return "powerpc64le-linux-gnu"
	case m == elf.EM_S390:
		return "s390x-linux-gnu"
	case m == elf.EM_RISCV:
		return "riscv64-linux-gnu"
	}
	return ""
}

// resolvePath finds the regular file at absolute path p in the merged tree of layers (the
// first layer holding each component wins), following symlinks (at most maxLinkHops) as the
// kernel does, across layers.
func resolvePath(layers []*Layer, p string) (fileRef, bool) {
	if len(p) > maxPathLen {
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
				if len(p) > maxPathLen {
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
func lookupIn(layers []*Layer, p string) (fileRef, bool) {
	for _, l := range layers {
		if id, ok := l.idx.LookupPath(p); ok && id != l.idx.Root() {
			return fileRef{l, id}, true
		}
	}
	return fileRef{}, false
}
