package chunked

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"hash"
	"io"
	"reflect"
	"runtime/debug"
	"strings"

	"github.com/go-json-experiment/json"
	"github.com/go-json-experiment/json/jsontext"
)

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
	return parse(ctx, layout, bytes.NewBuffer(tocJSON), lim, nil)
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
	return ParseStream(ctx, l, &consumed{b: raw}, int64(len(raw)), limits, h)
}

// ParseStream is [ParseHashed] on the compressed TOC of size bytes r yields, read as it is
// decompressed: the compressed TOC is never held whole either (tens of MB for a million
// entries), and its parse starts with its first bytes. r must yield size bytes and then
// io.EOF; what it yields past the TOC is refused. Its errors are the parse's, as
// decompression errors: the caller tells its own (a failed read of the registry) by what it
// wraps them in.
func ParseStream(ctx context.Context, l *Layout, r io.Reader, size int64, limits Limits, h hash.Hash) (x *Index, hashed bool, err error) {
	lim := limits.WithDefaults()
	if size > lim.MaxTOCSize {
		return nil, false, limitf("compressed TOC of %d bytes exceeds %d", size, lim.MaxTOCSize)
	}
	if l.Format == EStargz {
		m, err := openStargzTOC(r, size, lim.MaxTOCSize)
		if err != nil {
			return nil, false, err
		}
		zr := newStargzStream(m, h)
		x, err := parse(ctx, l, zr, lim, nil)
		var zerr error
		if err != nil && ctx.Err() == nil && !errors.Is(err, ErrLimit) {
			zerr = zr.Drain()
		} else {
			zerr = zr.Close()
		}
		if zerr != nil {
			return nil, false, zerr // what stopped the decompression, rather than the parse's view of it
		}
		return x, ctx.Err() == nil && !errors.Is(err, ErrLimit), err
	}
	zr, err := newTOCReader(l, r, lim)
	if err != nil {
		return nil, false, err
	}
	defer zr.release()
	var jr io.Reader = zr
	if h != nil {
		jr = io.TeeReader(zr, h)
	}
	x, err = parse(ctx, l, jr, lim, zr.release)
	hashed = ctx.Err() == nil && !errors.Is(err, ErrLimit)
	if err != nil && h != nil && hashed {
		_, _ = io.Copy(io.Discard, jr)
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

// parse builds the index from the TOC JSON r yields. read, when not nil, is called once r is
// read to its end, to let go of what reading it holds before the tree is built.
func parse(ctx context.Context, layout *Layout, r io.Reader, lim Limits, read func()) (*Index, error) {
	b := &builder{ctx: ctx, lim: lim, x: newWideIndex(layout), cur: -1}
	defer b.free()
	if b.x.payloadEnd < 0 {
		return nil, invalidf("TOC offset %d leaves no room for data", layout.TOC.Offset)
	}
	if err := b.decode(r); err != nil {
		return nil, err
	}
	if read != nil {
		read()
	}
	if b.raw >= releaseEntries {
		// What reading the TOC left (its pieces, the decompressor's buffers, the batches) is
		// garbage, up to the collector's target: handed back before the tree's steps add
		// their arrays to the wide form, where the parse's peak is.
		debug.FreeOSMemory()
	}
	return b.finish()
}

func (b *builder) decode(r io.Reader) error {
	s := newTOCScanner(r)
	var top tocTop
	if err := s.scan(&top, func() error { return b.decodeEntries(s) }); err != nil {
		return err
	}
	b.version = top.version
	if top.tarSplitDigest != "" {
		var err error
		if b.x.tarSplitDigest, err = parseSum(top.tarSplitDigest); err != nil {
			return fmt.Errorf("TOC tarSplitDigest: %w", err)
		}
	}
	if b.version != 1 {
		return invalidf("TOC version %d is not 1", b.version)
	}
	return nil
}

// releaseEntries is the TOC entries from which a parse hands the memory its reading left
// free back to the kernel before it builds the tree (a collection of the whole heap: a few
// ms, where the wide form of so many entries takes 30 MiB or more).
const releaseEntries = 1 << 18

// decodeBatch is how many TOC entries the decoding goroutine hands the builder at a time.
const decodeBatch = 256

// entryBatch is a run of TOC entries decoded in order. When err is set, decoding stopped
// after them: at the last of them, partly decoded, when failed; before another entry (the
// entry limit) otherwise.
type entryBatch struct {
	entries []rawEntry
	strs    []byte // the bytes of the entries' Name, Digest and ChunkDigest (entryDecoder.putBatchStr)
	err     error
	failed  bool
}

// decodeEntries reads the entries array into the index: the JSON is decoded on a goroutine
// of its own while the builder adds the entries decoded before, so that a large TOC's
// decoding and indexing share the processors (its decompression runs on others). The
// builder's view is as if one goroutine did both: entries are added in order, and the first
// error, of either, is returned.
func (b *builder) decodeEntries(s *tocScanner) error {
	full := make(chan *entryBatch, 2)
	free := make(chan *entryBatch, 4)
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		defer close(full) // after the scanner's last use: the builder reads on from there
		n := 0
		more, err := s.next()
		for more || err != nil {
			var bt *entryBatch
			select {
			case bt = <-free:
				bt.entries, bt.strs, bt.err, bt.failed = bt.entries[:0], bt.strs[:0], nil, false
			default:
				bt = &entryBatch{entries: make([]rawEntry, 0, decodeBatch), strs: make([]byte, 0, decodeBatch*(digestLen+64))}
			}
			for len(bt.entries) < decodeBatch {
				if err == nil && n >= b.lim.MaxEntries {
					bt.err = limitf("TOC has more than %d entries", b.lim.MaxEntries)
					break
				}
				bt.entries = append(bt.entries, rawEntry{})
				if err == nil {
					err = s.entry(&bt.entries[len(bt.entries)-1], &bt.strs)
				}
				if err != nil {
					bt.err, bt.failed = err, true
					break
				}
				n++
				if more, err = s.next(); !more && err == nil {
					break
				}
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
					return &EntryError{Index: b.raw, Name: strings.Clone(r.Name), Err: bt.err}
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
				return &EntryError{Index: b.raw, Name: strings.Clone(r.Name), Err: err} // r's bytes are the batch's
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
	return nil
}
