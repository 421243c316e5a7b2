package chunked

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"
	"math"
	"path"
	"reflect"
	"slices"
	"strings"
	"time"

	"github.com/go-json-experiment/json"
	"github.com/go-json-experiment/json/jsontext"
)

const (
	whiteoutPrefix = ".wh."
	opaqueMarker   = ".wh..wh..opq"
	// reservedPrefix starts names overlay reserves (".wh..wh.plnk" and the like).
	reservedPrefix   = ".wh..wh."
	prefetchLandmark = ".prefetch.landmark"
	noPrefetchMark   = ".no.prefetch.landmark"
)

// artefacts are root-level entries that formats add and the tree hides.
var artefacts = map[string]bool{"stargz.index.json": true, prefetchLandmark: true, noPrefetchMark: true}

// rawEntry is one element of a TOC's "entries" array: the union of the eStargz and
// zstd:chunked entry fields. Keys match exactly; unknown keys are ignored, but those that
// differ from a defined key only by case ("Digest", "MODE") are refused: c/storage matches
// keys case-insensitively, so such a TOC could read differently there. The entryDecoder
// fills it as json.Unmarshal would (tests check that it does).
type rawEntry struct {
	Name        string            `json:"name"`
	Type        string            `json:"type"`
	Size        int64             `json:"size"`
	ModTime     string            `json:"modtime"`
	AccessTime  string            `json:"accesstime"`
	ChangeTime  string            `json:"changetime"`
	LinkName    string            `json:"linkName"`
	Mode        int64             `json:"mode"`
	UID         int64             `json:"uid"`
	GID         int64             `json:"gid"`
	DevMajor    int64             `json:"devMajor"`
	DevMinor    int64             `json:"devMinor"`
	Xattrs      map[string]string `json:"xattrs"`
	Digest      string            `json:"digest"`
	Offset      int64             `json:"offset"`
	EndOffset   int64             `json:"endOffset"`
	InnerOffset int64             `json:"innerOffset"`
	ChunkOffset int64             `json:"chunkOffset"`
	ChunkSize   int64             `json:"chunkSize"`
	ChunkDigest string            `json:"chunkDigest"`
	ChunkType   string            `json:"chunkType"`
	// UserName and GroupName (eStargz) are not used, but matched here, so that the common
	// case has no unknown members to check.
	UserName  string `json:"userName"`
	GroupName string `json:"groupName"`
	// Unknown holds members no field matched, when json.Unmarshal fills the entry (the
	// tests' reference for the entryDecoder).
	Unknown jsontext.Value `json:",embed"`
}

// knownKeys are the entry keys the formats define, in lower case.
var knownKeys = jsonNames(reflect.TypeFor[rawEntry]())

// jsonNames returns the JSON member names of struct type t's fields, in lower case.
func jsonNames(t reflect.Type) map[string]bool {
	m := map[string]bool{}
	for i := range t.NumField() {
		if name, _, _ := strings.Cut(t.Field(i).Tag.Get("json"), ","); name != "" {
			m[strings.ToLower(name)] = true
		}
	}
	return m
}

// refuseCaseVariants refuses the members of unknown (a JSON object of the members no field
// matched) whose names differ from one of known (lower case) only by case. Readers built on
// encoding/json match names case-insensitively, so such a member could read differently there.
func refuseCaseVariants(unknown jsontext.Value, known map[string]bool) error {
	if len(unknown) == 0 {
		return nil
	}
	var members map[string]jsontext.Value
	if err := json.Unmarshal(unknown, &members); err != nil {
		return invalidf("%v", err)
	}
	for k := range members {
		if known[strings.ToLower(k)] {
			return invalidf("key %q differs from a defined key only by case", k)
		}
	}
	return nil
}

// Parse builds the index of a layer from its TOC JSON (as returned by [ExtractTOC]). layout
// gives the format and where file data ends; limits bound what is accepted. Parsing stops
// with ctx's error soon after ctx is done.
func Parse(ctx context.Context, layout *Layout, tocJSON []byte, limits Limits) (*Index, error) {
	lim := limits.WithDefaults()
	if int64(len(tocJSON)) > lim.MaxTOCSize {
		return nil, limitf("TOC of %d bytes exceeds %d", len(tocJSON), lim.MaxTOCSize)
	}
	// A bytes.Buffer is parsed in place, without copying into the decoder's own buffer.
	return parse(ctx, layout, bytes.NewBuffer(tocJSON), len(tocJSON), lim)
}

// ParseCompressed is [ExtractTOC] then [Parse] on the compressed TOC raw, in one pass: the
// JSON is parsed as it is decompressed (on another goroutine), never held whole. It suits
// formats whose TOC digest covers the compressed bytes (zstd:chunked), which can be checked
// before; for the eStargz family, whose digest covers the JSON, see [ParseHashed].
// Errors are those of ExtractTOC and Parse.
func ParseCompressed(ctx context.Context, l *Layout, raw []byte, limits Limits) (*Index, error) {
	x, _, err := ParseHashed(ctx, l, raw, limits, nil)
	return x, err
}

// ParseHashed is [ParseCompressed] that also writes every byte of the TOC JSON to h (when
// not nil), for formats whose TOC digest covers the JSON (the eStargz family): the JSON is
// decompressed and hashed on one goroutine while it is parsed on another, and never held
// whole. The caller must check h's sum before it uses the index. hashed reports whether
// the whole JSON went into h: always with an index, and with an error of the parse (the
// rest of the TOC is then still decompressed into h, within the limits, so that the caller
// can tell a TOC that is not the one its digest names from an invalid one); not with an
// error of the decompression, of a limit or of ctx.
func ParseHashed(ctx context.Context, l *Layout, raw []byte, limits Limits, h hash.Hash) (x *Index, hashed bool, err error) {
	lim := limits.WithDefaults()
	if int64(len(raw)) > lim.MaxTOCSize {
		return nil, false, limitf("compressed TOC of %d bytes exceeds %d", len(raw), lim.MaxTOCSize)
	}
	if l.Format == EStargz {
		m, err := openStargzTOC(raw, lim.MaxTOCSize)
		if err != nil {
			return nil, false, err
		}
		zr := newStargzStream(m, h)
		x, err := parse(ctx, l, zr, int(m.sizeHint()), lim)
		if err != nil && ctx.Err() == nil && !errors.Is(err, ErrLimit) {
			zr.drain()
		} else {
			zr.close()
		}
		if zr.err != nil {
			return nil, false, zr.err // what stopped the decompression, rather than the parse's view of it
		}
		return x, ctx.Err() == nil && !errors.Is(err, ErrLimit), err
	}
	zr, err := newTOCReader(l, raw, lim, 2)
	if err != nil {
		return nil, false, err
	}
	defer zr.close()
	size := len(raw) * 5 // TOC JSON compresses 5-10 times
	if h := tocSizeHint(l, raw, lim); h > 0 {
		size = int(h)
	}
	var r io.Reader = zr
	if h != nil {
		r = io.TeeReader(zr, h)
	}
	x, err = parse(ctx, l, r, size, lim)
	hashed = ctx.Err() == nil && !errors.Is(err, ErrLimit)
	if err != nil && h != nil && hashed {
		_, _ = io.Copy(io.Discard, r)
	}
	if zr.err != nil {
		return nil, false, zr.err // what stopped the decompression, rather than the parse's view of it
	}
	if err != nil {
		return nil, hashed, err
	}
	if err := zr.checkSize(); err != nil {
		return nil, false, err
	}
	return x, true, nil
}

// parse builds the index from the TOC JSON r yields, about size bytes.
func parse(ctx context.Context, layout *Layout, r io.Reader, size int, lim Limits) (*Index, error) {
	// Sized from the TOC's length (an entry takes 200 bytes or more of JSON), so that the
	// slices of a large TOC are not copied as they grow.
	guess := min(size/200+16, lim.MaxEntries)
	b := &builder{
		ctx: ctx,
		lim: lim,
		x: &wideIndex{
			format:      layout.Format,
			payloadEnd:  layout.PayloadEnd(),
			prefetchEnd: -1,
			entries:     make([]Entry, 0, guess),
			chunks:      make([]Chunk, 0, guess),
		},
		cur: -1,
	}
	if b.x.payloadEnd < 0 {
		return nil, invalidf("TOC offset %d leaves no room for data", layout.TOC.Offset)
	}
	if err := b.decode(r); err != nil {
		return nil, err
	}
	return b.finish()
}

type builder struct {
	ctx       context.Context
	lim       Limits
	x         *wideIndex
	raw       int   // TOC entries read so far (chunks included)
	cur       int   // index of the last non-chunk entry, -1 before the first
	curRaw    int   // its position in the TOC's entries array
	curEnd    int64 // its endOffset (zstd:chunked), 0 when absent
	version   int
	hasTimes  bool
	opaqueDir []string

	// The last modification time parsed: most entries of a TOC share theirs.
	lastMTime     string
	lastMTimeSec  int64
	lastMTimeNsec uint32
}

// ctxCheckEvery is how many entries the parse handles between two looks at its context.
const ctxCheckEvery = 1 << 12

// canceled returns the context's error on every ctxCheckEvery-th i.
func (b *builder) canceled(i int) error {
	if i%ctxCheckEvery != 0 {
		return nil
	}
	return b.ctx.Err()
}

func (b *builder) decode(r io.Reader) error {
	dec := jsontext.NewDecoder(r, tocJSON)
	if err := expect(dec, '{'); err != nil {
		return err
	}
	seen := map[string]bool{}
	for dec.PeekKind() == '"' {
		key, err := dec.ReadToken()
		if err != nil {
			return invalidf("TOC: %v", err)
		}
		if seen[key.String()] {
			return invalidf("TOC: %v", errDuplicate([]byte(key.String())))
		}
		seen[key.String()] = true
		switch key.String() {
		case "version":
			if err := json.UnmarshalDecode(dec, &b.version); err != nil {
				return invalidf("TOC version: %v", err)
			}
		case "tarSplitDigest":
			var s string
			if err := json.UnmarshalDecode(dec, &s); err != nil {
				return invalidf("TOC tarSplitDigest: %v", err)
			}
			if s != "" {
				if b.x.tarSplitDigest, err = parseSum(s); err != nil {
					return fmt.Errorf("TOC tarSplitDigest: %w", err)
				}
			}
		case "entries":
			if err := b.decodeEntries(dec); err != nil {
				return err
			}
		default:
			if err := skipValue(dec); err != nil {
				return invalidf("TOC: %v", err)
			}
		}
	}
	if err := expect(dec, '}'); err != nil {
		return err
	}
	if _, err := dec.ReadToken(); err != io.EOF {
		return invalidf("TOC: trailing data after the JSON object")
	}
	if b.version != 1 {
		return invalidf("TOC version %d is not 1", b.version)
	}
	return nil
}

func expect(dec *jsontext.Decoder, kind jsontext.Kind) error {
	tok, err := dec.ReadToken()
	if err != nil {
		return invalidf("TOC: %v", err)
	}
	if tok.Kind() != kind {
		return invalidf("TOC: got %v, want %v", tok.Kind(), kind)
	}
	return nil
}

// decodeBatch is how many TOC entries the decoding goroutine hands the builder at a time.
const decodeBatch = 256

// entryBatch is a run of TOC entries decoded in order. When err is set, decoding stopped
// after them: at the last of them, partly decoded, when failed; before another entry (the
// entry limit) otherwise.
type entryBatch struct {
	entries []rawEntry
	err     error
	failed  bool
}

// decodeEntries reads the entries array into the index: the JSON is decoded on a goroutine
// of its own while the builder adds the entries decoded before, so that a large TOC's
// decoding and indexing share the processors (its decompression runs on others). The
// builder's view is as if one goroutine did both: entries are added in order, and the first
// error, of either, is returned.
func (b *builder) decodeEntries(dec *jsontext.Decoder) error {
	if err := expect(dec, '['); err != nil {
		return err
	}
	full := make(chan *entryBatch, 2)
	free := make(chan *entryBatch, 4)
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		defer close(full) // after the decoder's last use: the builder reads on from there
		d := entryDecoder{dec: dec}
		n := 0
		for more := dec.PeekKind() == '{'; more; {
			var bt *entryBatch
			select {
			case bt = <-free:
				bt.entries, bt.err, bt.failed = bt.entries[:0], nil, false
			default:
				bt = &entryBatch{entries: make([]rawEntry, 0, decodeBatch)}
			}
			for more && len(bt.entries) < decodeBatch {
				if n >= b.lim.MaxEntries {
					bt.err = limitf("TOC has more than %d entries", b.lim.MaxEntries)
					break
				}
				bt.entries = append(bt.entries, rawEntry{})
				if err := d.decodeEntry(&bt.entries[len(bt.entries)-1]); err != nil {
					bt.err, bt.failed = err, true
					break
				}
				n++
				more = dec.PeekKind() == '{'
			}
			select {
			case full <- bt:
			case <-stop:
				return
			}
			if bt.err != nil {
				return
			}
		}
	}()
	defer func() {
		close(stop)
		<-done
	}()
	for bt := range full {
		for i := range bt.entries {
			r := &bt.entries[i]
			if err := b.canceled(b.raw); err != nil {
				return err
			}
			if bt.failed && i == len(bt.entries)-1 {
				if errors.Is(bt.err, ErrInvalid) {
					return &EntryError{Index: b.raw, Name: r.Name, Err: bt.err}
				}
				return &EntryError{Index: b.raw, Err: invalidf("%v", bt.err)}
			}
			var err error
			if r.Type == "chunk" {
				err = b.addChunk(r)
			} else {
				err = b.addEntry(r)
			}
			if err != nil {
				if _, ok := errors.AsType[*EntryError](err); ok {
					return err // names an earlier entry already
				}
				return &EntryError{Index: b.raw, Name: r.Name, Err: err}
			}
			b.raw++
		}
		if bt.err != nil {
			if err := b.canceled(b.raw); err != nil {
				return err
			}
			return bt.err // the entry limit
		}
		select {
		case free <- bt:
		default:
		}
	}
	return expect(dec, ']')
}

func (b *builder) addEntry(r *rawEntry) error {
	if err := b.closeFile(); err != nil {
		return err
	}
	typ, ok := typeOf(r.Type)
	if !ok {
		return invalidf("unknown type %q", r.Type)
	}
	name, err := cleanName(r.Name)
	if err != nil {
		return err
	}
	e := Entry{Name: name, Type: typ, Inode: EntryID(len(b.x.entries)), attr: EntryID(len(b.x.entries))}
	if r.Mode < 0 || r.Size < 0 {
		return invalidf("negative mode or size")
	}
	e.Mode = uint32(r.Mode & 0o7777)
	e.Size = r.Size
	if e.UID, err = u32("uid", r.UID); err != nil {
		return err
	}
	if e.GID, err = u32("gid", r.GID); err != nil {
		return err
	}
	if e.DevMajor, err = u32("devMajor", r.DevMajor); err != nil {
		return err
	}
	if e.DevMinor, err = u32("devMinor", r.DevMinor); err != nil {
		return err
	}
	if r.ModTime != "" && r.ModTime == b.lastMTime {
		e.ModTimeSec, e.ModTimeNsec = b.lastMTimeSec, b.lastMTimeNsec
	} else if r.ModTime != "" {
		t, err := parseTime(r.ModTime)
		if err != nil {
			return err
		}
		e.ModTimeSec, e.ModTimeNsec = t.Unix(), uint32(t.Nanosecond())
		b.lastMTime, b.lastMTimeSec, b.lastMTimeNsec = r.ModTime, e.ModTimeSec, e.ModTimeNsec
	}
	if err := b.addTimes(r); err != nil {
		return err
	}
	switch typ {
	case TypeSymlink:
		if r.LinkName == "" || len(r.LinkName) > maxNameLen || strings.IndexByte(r.LinkName, 0) >= 0 {
			return invalidf("bad symlink target %q", r.LinkName)
		}
		e.LinkName = r.LinkName
	case TypeHardlink:
		if e.LinkName, err = cleanName(r.LinkName); err != nil {
			return fmt.Errorf("hardlink target: %w", err)
		}
		if e.LinkName == "" {
			return invalidf("hardlink to the root")
		}
	}
	if r.Digest != "" {
		if e.Digest, err = parseSum(r.Digest); err != nil {
			return err
		}
	}
	if err := b.addXattrs(&e, r.Xattrs); err != nil {
		return err
	}
	b.cur, b.curRaw = len(b.x.entries), b.raw
	b.curEnd = 0
	e.chunk0 = uint32(len(b.x.chunks))
	b.x.entries = append(b.x.entries, e)

	if name == prefetchLandmark {
		if r.Offset < 0 || r.Offset > b.x.payloadEnd {
			return invalidf("prefetch landmark at offset %d outside the data (0-%d)", r.Offset, b.x.payloadEnd)
		}
		b.x.prefetchEnd = r.Offset
	}
	if typ != TypeReg || r.Size == 0 {
		return nil
	}
	if r.ChunkOffset != 0 {
		return invalidf("first chunk at file offset %d", r.ChunkOffset)
	}
	if b.x.format.Zstd() && !b.x.format.StargzTOC() {
		if r.EndOffset < 0 {
			return invalidf("negative endOffset")
		}
		b.curEnd = r.EndOffset
		if r.ChunkDigest == "" {
			// A single-chunk zstd:chunked file: its digest is the chunk's.
			if e.Digest.IsZero() {
				return invalidf("regular file without a digest")
			}
			return b.appendChunk(Chunk{Range: Range{Offset: r.Offset}, Size: r.Size, Digest: e.Digest})
		}
	}
	return b.chunkFrom(r)
}

// addChunk attaches a "chunk" entry to the regular file before it.
func (b *builder) addChunk(r *rawEntry) error {
	if b.cur < 0 || b.x.entries[b.cur].Type != TypeReg {
		return invalidf("chunk entry does not follow a regular file")
	}
	name, err := cleanName(r.Name)
	if err != nil {
		return err
	}
	if cur := &b.x.entries[b.cur]; name != cur.Name {
		return invalidf("chunk entry follows a different file %q", cur.Name)
	}
	if r.ChunkOffset <= 0 {
		return invalidf("chunk at file offset %d", r.ChunkOffset)
	}
	return b.chunkFrom(r)
}

func (b *builder) chunkFrom(r *rawEntry) error {
	file := &b.x.entries[b.cur]
	size := r.ChunkSize
	if size == 0 {
		size = file.Size - r.ChunkOffset
	}
	c := Chunk{Range: Range{Offset: r.Offset}, InnerOffset: r.InnerOffset, FileOffset: r.ChunkOffset, Size: size}
	switch r.ChunkType {
	case "":
	case "zeros":
		c.Zeros = true
	default:
		return invalidf("unknown chunkType %q", r.ChunkType)
	}
	if r.ChunkDigest == "" {
		return invalidf("chunk without a chunkDigest")
	}
	var err error
	if c.Digest, err = parseSum(r.ChunkDigest); err != nil {
		return err
	}
	return b.appendChunk(c)
}

func (b *builder) appendChunk(c Chunk) error {
	if c.Offset < 0 || c.Offset >= b.x.payloadEnd {
		return invalidf("chunk offset %d outside the data (0-%d)", c.Offset, b.x.payloadEnd)
	}
	if c.InnerOffset < 0 || c.Size <= 0 || c.FileOffset < 0 {
		return invalidf("chunk with negative or empty range")
	}
	if c.Size > b.lim.MaxChunkSize || c.InnerOffset > b.lim.MaxChunkSize-c.Size {
		return limitf("chunk of %d bytes (inner offset %d) exceeds %d", c.Size, c.InnerOffset, b.lim.MaxChunkSize)
	}
	if uint64(len(b.x.chunks)) >= math.MaxUint32 {
		return limitf("too many chunks")
	}
	b.x.chunks = append(b.x.chunks, c)
	b.x.entries[b.cur].nchunks++
	return nil
}

// closeFile checks that the chunks of the current file cover it exactly, and sets their
// compressed ends where the format records them.
func (b *builder) closeFile() error {
	if b.cur < 0 {
		return nil
	}
	e := &b.x.entries[b.cur]
	cs := b.x.chunks[e.chunk0 : e.chunk0+e.nchunks]
	var off int64
	for _, c := range cs {
		if c.FileOffset != off {
			return &EntryError{Index: b.curRaw, Name: e.Name, Err: invalidf("chunk at file offset %d, want %d", c.FileOffset, off)}
		}
		off += c.Size
	}
	if off != e.Size {
		return &EntryError{Index: b.curRaw, Name: e.Name, Err: invalidf("chunks cover %d of %d bytes", off, e.Size)}
	}
	if b.curEnd > 0 {
		for i := range cs {
			end := b.curEnd
			if i+1 < len(cs) {
				end = cs[i+1].Offset
			}
			if end == 0 {
				continue // as if not recorded: fillEnds finds it
			}
			if end <= cs[i].Offset {
				return &EntryError{Index: b.curRaw, Name: e.Name, Err: invalidf("chunk at blob offset %d ends at %d (data ends at %d)", cs[i].Offset, end, b.x.payloadEnd)}
			}
			cs[i].Length = end - cs[i].Offset
		}
	}
	b.cur = -1
	return nil
}

func (b *builder) addTimes(r *rawEntry) error {
	if r.AccessTime == "" && r.ChangeTime == "" && !b.hasTimes {
		return nil
	}
	if !b.hasTimes {
		b.hasTimes = true
		b.x.times = make([]extTimes, len(b.x.entries), cap(b.x.entries))
	}
	var t extTimes
	for _, f := range []struct {
		s   string
		dst *int64
	}{{r.AccessTime, &t.atime}, {r.ChangeTime, &t.ctime}} {
		if f.s == "" {
			continue
		}
		tm, err := parseTime(f.s)
		if err != nil {
			return err
		}
		// c/storage wrote zero times for a while; they mean "none".
		if !tm.IsZero() && tm.Unix() != 0 {
			*f.dst = tm.UnixNano()
		}
	}
	b.x.times = append(b.x.times, t)
	return nil
}

func (b *builder) addXattrs(e *Entry, xs map[string]string) error {
	if len(xs) == 0 {
		return nil
	}
	if len(xs) > math.MaxUint16 {
		return limitf("too many xattrs")
	}
	e.xattr0 = uint32(len(b.x.xattrs))
	total := 0
	for k, v := range xs {
		val, err := base64.StdEncoding.Strict().DecodeString(v)
		if err != nil {
			return invalidf("xattr %q: %v", k, err)
		}
		if k == "" || strings.IndexByte(k, 0) >= 0 {
			return invalidf("bad xattr name %q", k)
		}
		total += len(k) + len(val)
		if total > b.lim.MaxXattrBytes {
			return limitf("xattrs exceed %d bytes", b.lim.MaxXattrBytes)
		}
		b.x.xattrs = append(b.x.xattrs, Xattr{Name: k, Value: string(val)})
	}
	own := b.x.xattrs[e.xattr0:]
	slices.SortFunc(own, func(a, b Xattr) int { return strings.Compare(a.Name, b.Name) })
	e.nxattrs = uint16(len(own))
	return nil
}

// cleanName validates a TOC name and returns it cleaned and relative ("" for the root).
func cleanName(name string) (string, error) {
	switch {
	case name == "":
		return "", invalidf("empty name")
	case len(name) > maxNameLen:
		return "", limitf("name of %d bytes", len(name))
	case strings.IndexByte(name, 0) >= 0:
		return "", invalidf("name contains NUL")
	case name[0] == '/':
		return "", invalidf("absolute name")
	}
	tidy := true // as path.Clean leaves it, but for one trailing slash
	for part := range strings.SplitSeq(strings.TrimSuffix(name, "/"), "/") {
		switch part {
		case "..":
			return "", invalidf("name escapes the layer root")
		case "", ".":
			tidy = false
		}
	}
	if tidy {
		name = strings.TrimSuffix(name, "/")
	} else {
		name = path.Clean("/" + name)[1:]
	}
	if depth := strings.Count(name, "/") + 1; depth > maxDepth {
		return "", limitf("name of %d components exceeds %d", depth, maxDepth)
	}
	return name, nil
}

// typeOf returns the type an entry's type name names: typeNames without a map lookup per entry.
func typeOf(name string) (Type, bool) {
	switch name {
	case "reg":
		return TypeReg, true
	case "dir":
		return TypeDir, true
	case "symlink":
		return TypeSymlink, true
	case "hardlink":
		return TypeHardlink, true
	}
	t, ok := typeNames[name]
	return t, ok
}

func u32(what string, v int64) (uint32, error) {
	if v < 0 || v > math.MaxUint32 {
		return 0, invalidf("%s %d out of range", what, v)
	}
	return uint32(v), nil
}

func parseTime(s string) (time.Time, error) {
	t, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		return time.Time{}, invalidf("time %q: %v", s, err)
	}
	return t, nil
}

func parseSum(s string) (Sum, error) {
	var sum Sum
	hexPart, ok := strings.CutPrefix(s, "sha256:")
	if !ok || len(hexPart) != 64 {
		return sum, invalidf("digest %q is not a lowercase sha256 digest", s)
	}
	for i := range sum {
		hi, lo := lowerHex[hexPart[2*i]], lowerHex[hexPart[2*i+1]]
		if hi|lo > 0xf {
			if strings.ContainsAny(hexPart, "ABCDEF") {
				return Sum{}, invalidf("digest %q is not a lowercase sha256 digest", s)
			}
			_, err := hex.Decode(sum[:], []byte(hexPart))
			return Sum{}, invalidf("digest %q: %v", s, err)
		}
		sum[i] = hi<<4 | lo
	}
	return sum, nil
}

// lowerHex maps the lowercase hexadecimal digits to their values, every other byte to 0xff.
var lowerHex = func() (t [256]byte) {
	for i := range t {
		t[i] = 0xff
	}
	for i, c := range "0123456789abcdef" {
		t[c] = byte(i)
	}
	return t
}()

// finish links the entries into a tree: last entry wins per path, implicit directories,
// whiteouts and opaque markers, hardlinks, link counts, compressed ends, sorted children;
// then compacts the index.
func (b *builder) finish() (*Index, error) {
	if err := b.closeFile(); err != nil {
		return nil, err
	}
	x := b.x
	x.tocCount = len(x.entries)
	if x.times != nil {
		x.times = x.times[:len(x.entries)]
	}
	if err := b.fillEnds(); err != nil {
		return nil, err
	}
	paths := make(map[string]EntryID, len(x.entries))
	for id := range x.entries {
		if err := b.canceled(id); err != nil {
			return nil, err
		}
		e := &x.entries[id]
		key, err := b.classifyName(e)
		if err != nil {
			return nil, &EntryError{Index: -1, Name: e.Name, Err: err}
		}
		if e.Flags&FlagHidden != 0 {
			continue
		}
		// A hardlink links to what its target path holds at this point of the layer, as
		// extraction makes it: a later entry at that path replaces the path, not the link.
		if e.Type == TypeHardlink {
			if e.Inode, err = b.resolveLink(paths, e.LinkName); err != nil {
				return nil, &EntryError{Index: -1, Name: e.Name, Err: err}
			}
		}
		if old, ok := paths[key]; ok {
			x.entries[old].Flags |= FlagShadowed
		}
		paths[key] = EntryID(id)
	}
	// Implicit directories count against the entry limit with the TOC's entries (the root,
	// which every index has, does not).
	implicit := 0
	ensureDir := func(p string) error {
		for {
			if _, ok := paths[p]; ok {
				return nil
			}
			if p != "" {
				if b.raw+implicit >= b.lim.MaxEntries {
					return &EntryError{Index: -1, Name: p, Err: limitf(
						"the TOC's %d entries and the directories they imply exceed %d", b.raw, b.lim.MaxEntries)}
				}
				implicit++
			}
			id := EntryID(len(x.entries))
			x.entries = append(x.entries, Entry{Name: p, Type: TypeDir, Mode: 0o755, Inode: id, attr: id, Flags: FlagImplicit})
			paths[p] = id
			if p == "" {
				return nil
			}
			p = dirOf(p)
		}
	}
	if err := ensureDir(""); err != nil {
		return nil, err
	}
	lastDir := "" // ensured: entries of a directory mostly follow one another
	for id := range x.tocCount {
		if err := b.canceled(id); err != nil {
			return nil, err
		}
		if e := &x.entries[id]; e.Visible() && e.Name != "" {
			if d := dirOf(e.Name); d != lastDir {
				if err := ensureDir(d); err != nil {
					return nil, err
				}
				lastDir = d
			}
		}
	}
	for _, d := range b.opaqueDir {
		if err := ensureDir(d); err != nil {
			return nil, err
		}
		dir := &x.entries[paths[d]]
		if dir.Type != TypeDir {
			return nil, &EntryError{Index: -1, Name: d + "/" + opaqueMarker, Err: invalidf("opaque marker in a non-directory")}
		}
		dir.Flags |= FlagOpaque
	}
	x.root = paths[""]
	if x.entries[x.root].Type != TypeDir {
		return nil, &EntryError{Index: -1, Name: "/", Err: invalidf("root is not a directory")}
	}
	x.children = make([]EntryID, 0, len(paths)-1)
	lastDir, lastParent := "", x.root
	for id := range x.entries {
		if err := b.canceled(id); err != nil {
			return nil, err
		}
		e := &x.entries[id]
		if !e.Visible() {
			continue
		}
		e.Nlink = 1
		if e.Type == TypeDir {
			e.Nlink = 2
		}
		if EntryID(id) == x.root {
			e.Parent = x.root
			continue
		}
		if d := dirOf(e.Name); d != lastDir {
			lastDir, lastParent = d, paths[d]
		}
		e.Parent = lastParent
		if x.entries[e.Parent].Type != TypeDir {
			return nil, &EntryError{Index: -1, Name: e.Name, Err: invalidf("parent is not a directory")}
		}
		x.children = append(x.children, EntryID(id))
	}
	for _, id := range x.children {
		switch e := &x.entries[id]; e.Type {
		case TypeDir:
			x.entries[e.Parent].Nlink++
		case TypeHardlink:
			// The owner counts its visible names: itself unless a later entry replaced it.
			owner := &x.entries[e.Inode]
			owner.Nlink++
			// Extractors apply a hardlink's header to the inode it shares (c/storage chowns,
			// chmods and sets times through the new name), so the last header wins.
			if owner.Type != TypeSymlink {
				owner.attr = id
			}
		}
	}
	if err := b.ctx.Err(); err != nil {
		return nil, err
	}
	x.sortChildren()
	return x.compact(paths)
}

// sortChildren sorts the children by (Parent, BaseName): grouped by parent in one pass, then
// each directory's sorted by name (often sorted already, in TOC order).
func (x *wideIndex) sortChildren() {
	start := make([]uint32, len(x.entries)+1) // where each parent's children start
	for _, id := range x.children {
		start[x.entries[id].Parent+1]++
	}
	for i := 1; i < len(start); i++ {
		start[i] += start[i-1]
	}
	sorted := make([]EntryID, len(x.children))
	next := slices.Clone(start[:len(x.entries)])
	for _, id := range x.children {
		p := x.entries[id].Parent
		sorted[next[p]] = id
		next[p]++
	}
	byName := func(a, b EntryID) int { return strings.Compare(x.baseName(a), x.baseName(b)) }
	for p := range x.entries {
		if dir := sorted[start[p]:start[p+1]]; len(dir) > 1 && !slices.IsSortedFunc(dir, byName) {
			slices.SortFunc(dir, byName)
		}
	}
	x.children = sorted
}

// classifyName sets the whiteout and hidden flags of an entry and returns its path in the tree.
func (b *builder) classifyName(e *Entry) (string, error) {
	dir, base := path.Split(e.Name)
	switch {
	case e.Name == "":
		return "", nil
	case dir == "" && artefacts[base]:
		e.Flags |= FlagHidden
	case base == opaqueMarker:
		e.Flags |= FlagHidden
		b.opaqueDir = append(b.opaqueDir, strings.TrimSuffix(dir, "/"))
	case strings.HasPrefix(base, reservedPrefix):
		e.Flags |= FlagHidden
	case strings.HasPrefix(base, whiteoutPrefix):
		vis := base[len(whiteoutPrefix):]
		if vis == "" || vis == "." || vis == ".." {
			return "", invalidf("bad whiteout name")
		}
		if e.Type == TypeDir {
			return "", invalidf("whiteout is a directory")
		}
		e.Flags |= FlagWhiteout
		return dir + vis, nil
	}
	return e.Name, nil
}

// resolveLink returns the entry that owns the inode at path target, given paths, the entries
// before the hardlink by path. A hardlink there is resolved already.
func (b *builder) resolveLink(paths map[string]EntryID, target string) (EntryID, error) {
	id, ok := paths[target]
	if !ok {
		return 0, invalidf("hardlink target %q does not exist before the hardlink", target)
	}
	switch t := &b.x.entries[id]; {
	case t.Flags&FlagWhiteout != 0:
		return 0, invalidf("hardlink to the whiteout %q", target)
	case t.Type == TypeDir:
		return 0, invalidf("hardlink to the directory %q", target)
	default:
		return t.Inode, nil
	}
}

// fillEnds sets the compressed end of chunks whose format does not record it: the next
// larger chunk offset in the blob, or the end of the data; then caps every chunk's span at
// [MaxSpan].
func (b *builder) fillEnds() error {
	x := b.x
	var offs []int64 // sorted distinct chunk offsets, when some chunk needs them
	if slices.ContainsFunc(x.chunks, func(c Chunk) bool { return c.Length == 0 }) {
		offs = make([]int64, len(x.chunks))
		for i, c := range x.chunks {
			offs[i] = c.Offset
		}
		slices.Sort(offs)
		offs = slices.Compact(offs)
	}
	for i := range x.chunks {
		c := &x.chunks[i]
		end := c.End()
		if c.Length == 0 {
			end = x.payloadEnd
			if j, _ := slices.BinarySearch(offs, c.Offset+1); j < len(offs) {
				end = offs[j]
			}
		}
		if end <= c.Offset || end > x.payloadEnd {
			return invalidf("chunk at blob offset %d ends at %d (data ends at %d)", c.Offset, end, x.payloadEnd)
		}
		c.Length = min(end, c.Offset+MaxSpan(c.InnerOffset+c.Size)) - c.Offset
	}
	return nil
}

// ErrTOCNotFound reports an eStargz TOC member that does not hold stargz.index.json.
var ErrTOCNotFound = errors.New("stargz.index.json not found")
