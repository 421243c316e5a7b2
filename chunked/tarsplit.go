package chunked

import (
	"archive/tar"
	"context"
	"errors"
	"fmt"
	"io"
	"reflect"

	"github.com/go-json-experiment/json/jsontext"
)

// Tar-split entry types (github.com/vbatts/tar-split/tar/storage).
const (
	TarSplitFile    = 1 // a file payload, known by name and size
	TarSplitSegment = 2 // raw tar bytes: headers, padding, end blocks
)

// maxSegment bounds one raw tar-split segment (headers with their PAX records and padding).
const maxSegment = 16 << 20

// maxTarSplitEntry bounds the JSON text of one tar-split entry: a segment of maxSegment bytes in
// base64, with room for the other members. The decoder holds a whole entry in memory.
const maxTarSplitEntry = maxSegment/3*4 + 1<<20

// TarSplitEntry is one line of a tar-split stream.
type TarSplitEntry struct {
	Type    int    `json:"type"`
	Name    string `json:"name"`
	NameRaw []byte `json:"name_raw"`
	Size    int64  `json:"size"`
	// Payload is the raw tar bytes of a segment (for a file, a CRC64 of its content).
	Payload  []byte `json:"payload"`
	Position int64  `json:"position"`
}

// rawTarSplitEntry is an entry as json.Unmarshal decodes it, with the members no field
// matched: the tests' reference for the entryDecoder's decodeTarSplit.
type rawTarSplitEntry struct {
	TarSplitEntry
	Unknown jsontext.Value `json:",embed"` // the members no field matched (see refuseCaseVariants)
}

// tarSplitNames are the entry's member names, in lower case.
var tarSplitNames = jsonNames(reflect.TypeFor[TarSplitEntry]())

// FileName returns the name of a file entry.
func (r *TarSplitEntry) FileName() string {
	if len(r.NameRaw) > 0 {
		return string(r.NameRaw)
	}
	return r.Name
}

// TarSplitReader reads the entries of an uncompressed tar-split stream, strictly: entries must
// be well-formed JSON objects with sequential positions, segments are bounded, and the stream is
// capped at [Limits].MaxTarSplitSize bytes.
type TarSplitReader struct {
	dec  *jsontext.Decoder
	lr   *io.LimitedReader
	rl   *tarSplitLimiter
	lim  Limits
	d    entryDecoder
	next int64
	rec  TarSplitEntry // its NameRaw and Payload buffers are reused
	size int64
}

// NewTarSplitReader reads entries from r.
func NewTarSplitReader(r io.Reader, limits Limits) *TarSplitReader {
	lim := limits.WithDefaults()
	lr := &io.LimitedReader{R: r, N: lim.MaxTarSplitSize + 1}
	rl := &tarSplitLimiter{r: lr}
	dec := jsontext.NewDecoder(rl)
	return &TarSplitReader{dec: dec, d: entryDecoder{dec: dec}, lr: lr, rl: rl, lim: lim}
}

// tarSplitLimiter lets the decoder read at most up to limit, so that one entry cannot make it
// buffer more than maxTarSplitEntry bytes.
type tarSplitLimiter struct {
	r           io.Reader
	read, limit int64
	over        bool
}

var errTarSplitEntryTooLong = errors.New("tar-split entry too long")

func (l *tarSplitLimiter) Read(p []byte) (int, error) {
	if l.read >= l.limit {
		l.over = true
		return 0, errTarSplitEntryTooLong
	}
	if int64(len(p)) > l.limit-l.read {
		p = p[:l.limit-l.read]
	}
	n, err := l.r.Read(p)
	l.read += int64(n)
	return n, err
}

// Next returns the next entry, valid until the following call, or io.EOF at the end.
func (t *TarSplitReader) Next() (*TarSplitEntry, error) {
	t.rl.limit = t.dec.InputOffset() + maxTarSplitEntry
	if t.dec.PeekKind() == 0 {
		if _, err := t.dec.ReadToken(); err == io.EOF {
			if t.lr.N <= 0 {
				return nil, limitf("tar-split exceeds %d bytes", t.lim.MaxTarSplitSize)
			}
			return nil, io.EOF
		}
	}
	// Members that differ from a defined one only by case are refused: tar-split's own
	// reader (encoding/json) would take "Payload" for "payload".
	if err := t.d.decodeTarSplit(&t.rec); err != nil {
		if t.lr.N <= 0 {
			return nil, limitf("tar-split exceeds %d bytes", t.lim.MaxTarSplitSize)
		}
		if t.rl.over {
			return nil, limitf("tar-split entry %d exceeds %d bytes", t.next, maxTarSplitEntry)
		}
		if errors.Is(err, ErrInvalid) {
			return nil, fmt.Errorf("tar-split entry %d: %w", t.next, err)
		}
		return nil, invalidf("tar-split entry %d: %v", t.next, err)
	}
	r := &t.rec
	switch {
	case r.Position != t.next:
		return nil, invalidf("tar-split entry %d has position %d", t.next, r.Position)
	case r.Type == TarSplitSegment && len(r.Payload) > maxSegment:
		return nil, limitf("tar-split segment %d of %d bytes", t.next, len(r.Payload))
	case r.Type == TarSplitFile && (r.Size < 0 || r.FileName() == ""):
		return nil, invalidf("tar-split file entry %d: bad name or size", t.next)
	case r.Type != TarSplitFile && r.Type != TarSplitSegment:
		return nil, invalidf("tar-split entry %d has type %d", t.next, r.Type)
	}
	t.next++
	if r.Type == TarSplitSegment {
		t.size += int64(len(r.Payload))
	} else {
		t.size += r.Size
	}
	return r, nil
}

// TarSize returns the size of the tar stream the entries read so far describe: once the
// stream is read to its end, the size of the layer's uncompressed tar.
func (t *TarSplitReader) TarSize() int64 { return t.size }

// IterateTarSplit walks a tar-split stream as the tar it describes, with every file payload
// read as zeros (and skipped without reading when possible). It calls onHeader for each tar
// header, numbered from 0, and onFile for each file entry, numbered from 0. In a well-formed
// tar-split, header k and file entry k describe the same entry. It stops with ctx's error
// soon after ctx is done.
//
// The entries are decoded (decompressed, read as JSON, their base64 decoded) ahead, on a
// goroutine of its own, while their tar headers are parsed and handed to onHeader and onFile
// on the caller's: on two processors a large comparison takes about a third less time
// (decodeAhead). The goroutine has ended when IterateTarSplit returns.
func IterateTarSplit(ctx context.Context, ts *TarSplitReader, onHeader func(k int, h *tar.Header) error, onFile func(k int, r *TarSplitEntry) error) error {
	a := decodeAhead(ts)
	defer a.stop()
	v := &virtualTar{ctx: ctx, recs: a, onFile: onFile}
	tr := tar.NewReader(v)
	for k := 0; ; k++ {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			if v.err != nil {
				return v.err
			}
			return invalidf("tar-split: tar header %d: %v", k, err)
		}
		if err := onHeader(k, h); err != nil {
			return err
		}
	}
	// Consume what follows the end blocks, so every file entry is seen, skipping payloads
	// without producing their zeros.
	for {
		v.seg, v.zeros = nil, 0
		if err := v.fill(); err != nil {
			if err == io.EOF {
				return nil
			}
			return err
		}
	}
}

// virtualTar is the tar stream a tar-split describes, with zero payloads.
type virtualTar struct {
	ctx    context.Context
	recs   *aheadReader
	nent   int // entries read
	onFile func(int, *TarSplitEntry) error
	files  int
	seg    []byte
	zeros  int64
	pos    int64
	err    error
}

func (v *virtualTar) fill() error {
	for len(v.seg) == 0 && v.zeros == 0 {
		if v.err != nil {
			return v.err
		}
		if v.nent%ctxCheckEvery == 0 {
			if v.err = v.ctx.Err(); v.err != nil {
				return v.err
			}
		}
		v.nent++
		r, err := v.recs.next()
		if err != nil {
			if err != io.EOF {
				v.err = err
			}
			return err
		}
		if r.Type == TarSplitSegment {
			v.seg = r.Payload
			continue
		}
		if err := v.onFile(v.files, r); err != nil {
			v.err = err
			return err
		}
		v.files++
		v.zeros = r.Size
	}
	return nil
}

func (v *virtualTar) Read(p []byte) (int, error) {
	if err := v.fill(); err != nil {
		return 0, err
	}
	var n int
	if len(v.seg) > 0 {
		n = copy(p, v.seg)
		v.seg = v.seg[n:]
	} else {
		n = int(min(int64(len(p)), v.zeros))
		clear(p[:n])
		v.zeros -= int64(n)
	}
	v.pos += int64(n)
	return n, nil
}

// Seek supports what archive/tar uses to skip payloads: relative forward seeks.
func (v *virtualTar) Seek(off int64, whence int) (int64, error) {
	if whence != io.SeekCurrent || off < 0 {
		return 0, errors.New("virtual tar: unsupported seek")
	}
	for off > 0 {
		if err := v.fill(); err != nil {
			return v.pos, err
		}
		var k int64
		if len(v.seg) > 0 {
			k = min(off, int64(len(v.seg)))
			v.seg = v.seg[k:]
		} else {
			k = min(off, v.zeros)
			v.zeros -= k
		}
		off -= k
		v.pos += k
	}
	return v.pos, nil
}

// Decoding ahead (IterateTarSplit): entries go from the decoding goroutine to the reader in
// batches of at most aheadEntries entries or aheadBytes of names and payloads (a larger entry
// alone), copied into the batch's buffer; aheadBatches batches exist, reused, so that the
// goroutine decodes at most that far ahead and the comparison holds at most aheadBatches x
// (aheadBytes + one entry) besides the TarSplitReader's own buffers.
const (
	aheadEntries = 256
	aheadBytes   = 1 << 20
	aheadBatches = 3
)

// tarSplitBatch is entries decoded ahead.
type tarSplitBatch struct {
	recs  []TarSplitEntry // once sealed, NameRaw and Payload point into buf
	spans [][4]int        // where each entry's NameRaw and Payload are in buf: start (-1: nil), length
	buf   []byte
	err   error // after recs: io.EOF at the end, or the reader's error
}

// add appends a copy of r.
func (b *tarSplitBatch) add(r *TarSplitEntry) {
	at := func(p []byte) int {
		if p == nil {
			return -1
		}
		b.buf = append(b.buf, p...)
		return len(b.buf) - len(p)
	}
	c := *r
	c.NameRaw, c.Payload = nil, nil
	b.recs = append(b.recs, c)
	b.spans = append(b.spans, [4]int{at(r.NameRaw), len(r.NameRaw), at(r.Payload), len(r.Payload)})
}

// seal points the entries' NameRaw and Payload into the buffer, which no longer grows.
func (b *tarSplitBatch) seal() {
	in := func(at, n int) []byte {
		if at < 0 {
			return nil
		}
		return b.buf[at : at+n : at+n]
	}
	for i, sp := range b.spans {
		b.recs[i].NameRaw, b.recs[i].Payload = in(sp[0], sp[1]), in(sp[2], sp[3])
	}
}

// aheadReader reads the entries a goroutine decodes ahead (decodeAhead).
type aheadReader struct {
	full, free chan *tarSplitBatch
	quit, done chan struct{}
	cur        *tarSplitBatch
	i          int
}

// decodeAhead starts decoding the entries of ts on a goroutine of its own.
func decodeAhead(ts *TarSplitReader) *aheadReader {
	a := &aheadReader{
		full: make(chan *tarSplitBatch, aheadBatches), free: make(chan *tarSplitBatch, aheadBatches),
		quit: make(chan struct{}), done: make(chan struct{}),
	}
	for range aheadBatches {
		a.free <- &tarSplitBatch{}
	}
	go a.decode(ts)
	return a
}

func (a *aheadReader) decode(ts *TarSplitReader) {
	defer close(a.done)
	for {
		var b *tarSplitBatch
		select {
		case b = <-a.free:
		case <-a.quit:
			return
		}
		b.recs, b.spans, b.buf, b.err = b.recs[:0], b.spans[:0], b.buf[:0], nil
		for len(b.recs) < aheadEntries && len(b.buf) < aheadBytes {
			r, err := ts.Next()
			if err != nil {
				b.err = err
				break
			}
			b.add(r)
		}
		b.seal()
		select {
		case a.full <- b:
		case <-a.quit:
			return
		}
		if b.err != nil {
			return
		}
	}
}

// next returns the next entry, valid until the following call, or the reader's error (io.EOF
// at the end).
func (a *aheadReader) next() (*TarSplitEntry, error) {
	for a.cur == nil || a.i >= len(a.cur.recs) {
		if a.cur != nil {
			if a.cur.err != nil {
				return nil, a.cur.err
			}
			a.free <- a.cur // never blocks: there are aheadBatches batches
		}
		a.cur, a.i = <-a.full, 0
	}
	a.i++
	return &a.cur.recs[a.i-1], nil
}

// stop ends the decoding goroutine and waits for it.
func (a *aheadReader) stop() {
	close(a.quit)
	<-a.done
}
