package chunked

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"unicode/utf8"

	"github.com/go-json-experiment/json"
	"github.com/go-json-experiment/json/jsontext"
)

// tocScanner reads a TOC's JSON. Entries of the common shape (the defined members, once
// each, with strings free of escapes and integers without fraction or exponent) are read by
// hand from its buffer, without a tokenizer's state machine or the allocation of a token
// per member: the JSON decoder was most of a large TOC's parse. Anything else, an entry of
// another shape and every value of the TOC's own members, is cut out whole (see valueEnd)
// and read by the JSON decoder, so that the scanner accepts what the decoder accepts and no
// more (FuzzTOCScan checks both against json.Unmarshal).
type tocScanner struct {
	r   io.Reader
	buf []byte // buf[off:] is read and not yet consumed
	off int
	eof bool // r is at its end: buf holds the rest
	err error
	// n is how many bytes were consumed before buf[0], for the errors' offsets.
	n int64
	// d reads entries of other shapes; its decoder is reset onto each.
	d entryDecoder
	// first is set until the entries array's first element is read.
	first bool
	// minBuf is the size of the first read buffer, which grows to hold a value whole.
	minBuf int
	stats  scanStats
}

// scanStats counts a tocScanner's work, for the tests: that it is linear in the JSON.
type scanStats struct {
	slow    int   // entries read by the decoder
	tries   int   // reads of entries by fastEntry
	scanned int64 // bytes scanned for a value's end
}

func newTOCScanner(r io.Reader) *tocScanner {
	s := &tocScanner{r: r, minBuf: 256 << 10}
	if b, ok := r.(*bytes.Buffer); ok {
		s.buf, s.eof = b.Bytes(), true // read in place
	}
	s.d.dec = jsontext.NewDecoder(bytes.NewReader(nil), tocJSON)
	return s
}

// more reads more of r into buf, keeping buf[off:]. It reports whether any was read:
// not at the end of r, or after a read error (kept in err).
func (s *tocScanner) more() bool {
	for !s.eof {
		if s.off > 0 {
			s.n += int64(s.off)
			s.buf = s.buf[:copy(s.buf, s.buf[s.off:])]
			s.off = 0
		}
		if free := cap(s.buf) - len(s.buf); free == 0 || free < cap(s.buf)/2 {
			// Doubled when less than half is free: a value longer than the buffer costs
			// reads, and copies, of a size that grows with it.
			b := make([]byte, len(s.buf), max(s.minBuf, 2*cap(s.buf)))
			s.buf = b[:copy(b, s.buf)]
		}
		n, err := s.r.Read(s.buf[len(s.buf):cap(s.buf)])
		s.buf = s.buf[:len(s.buf)+n]
		if err != nil {
			s.eof = true
			if err != io.EOF {
				s.err = err
			}
		}
		if n > 0 {
			return true
		}
	}
	return false
}

// errorf returns an error of the JSON at offset off of buf.
func (s *tocScanner) errorf(off int, format string, a ...any) error {
	if s.err != nil {
		return s.err
	}
	return fmt.Errorf("at offset %d: %s", s.n+int64(off), fmt.Sprintf(format, a...))
}

// errEOF is the error of a TOC that ends inside a value.
func (s *tocScanner) errEOF() error {
	if s.err != nil {
		return s.err
	}
	return fmt.Errorf("at offset %d: %w", s.n+int64(len(s.buf)), io.ErrUnexpectedEOF)
}

// end is what peek returns at the end of the JSON.
const end = -1

// peek skips whitespace and returns the next byte, or end.
func (s *tocScanner) peek() int {
	for {
		s.off = skipSpace(s.buf, s.off)
		if s.off < len(s.buf) {
			return int(s.buf[s.off])
		}
		if !s.more() {
			return end
		}
	}
}

func skipSpace(b []byte, i int) int {
	for i < len(b) && (b[i] == ' ' || b[i] == '\n' || b[i] == '\t' || b[i] == '\r') {
		i++
	}
	return i
}

// expect consumes the byte c, next after whitespace.
func (s *tocScanner) expect(c byte) error {
	switch got := s.peek(); {
	case got == int(c):
		s.off++
		return nil
	case got == end:
		return s.errEOF()
	default:
		return s.errorf(s.off, "got %q, want %q", rune(got), c)
	}
}

// value returns the next value's bytes, whole, after whitespace: valid until the next read.
// Its validity is not checked; a value it cuts out of invalid JSON is invalid too.
func (s *tocScanner) value() ([]byte, error) {
	if s.peek() == end {
		return nil, s.errEOF()
	}
	var st valueState
	for {
		from := st.i
		n, ok := valueEnd(s.buf[s.off:], &st)
		s.stats.scanned += int64(max(n, st.i) - from)
		if ok {
			v := s.buf[s.off : s.off+n]
			s.off += n
			return v, nil
		}
		if !s.more() {
			return nil, s.errEOF()
		}
	}
}

// valueState is where valueEnd stopped in a value: it resumes there when more of it is read,
// so that a value that arrives in many reads is scanned once.
type valueState struct {
	i      int // the next byte to scan
	depth  int // of brackets
	str    bool
	scalar bool
}

// valueEnd returns the length of the JSON value b starts with, and whether b holds its end;
// if not, st is where to resume once b holds more. It matches the brackets outside strings,
// and ends a number or literal at a byte that cannot be in one. For valid JSON, this is the
// value's end: the value's validity is checked by the decoder that reads its bytes.
func valueEnd(b []byte, st *valueState) (int, bool) {
	i := st.i
	for i < len(b) {
		switch {
		case st.str:
			j := bytes.IndexAny(b[i:], "\"\\")
			if j < 0 {
				i = len(b)
				continue
			}
			if i += j; b[i] == '\\' {
				if i+1 == len(b) {
					st.i = i // resume at the backslash
					return 0, false
				}
				i += 2
				continue
			}
			st.str = false
			i++
			if st.depth == 0 {
				return i, true
			}
			continue
		case st.scalar:
			switch b[i] {
			case ' ', '\t', '\n', '\r', ',', ':', '"', '{', '}', '[', ']':
				return i, true
			}
			i++
			continue
		}
		switch b[i] {
		case '"':
			st.str = true
		case '{', '[':
			st.depth++
		case '}', ']':
			if st.depth--; st.depth <= 0 {
				return i + 1, true
			}
		default:
			if st.depth == 0 {
				st.scalar = true
				continue // the number or literal starts at i
			}
		}
		i++
	}
	st.i = i
	return 0, false
}

// tocTop holds what the TOC's own members (those other than its entries) say.
type tocTop struct {
	version        int
	tarSplitDigest string
}

// scan reads the TOC object into top, calling entries to read its entries array (after its
// "["). It refuses a member named twice, and bytes after the object.
func (s *tocScanner) scan(top *tocTop, entries func() error) error {
	if err := s.expect('{'); err != nil {
		return invalidf("TOC: %v", err)
	}
	seen := map[string]bool{}
	if s.peek() == '}' {
		s.off++
	} else {
		for {
			kv, err := s.value()
			if err != nil {
				return invalidf("TOC: %v", err)
			}
			var key string
			if len(kv) == 0 || kv[0] != '"' {
				return invalidf("TOC: %v", s.errorf(s.off-len(kv), "got %q, want a member name", kv))
			}
			if err := json.Unmarshal(kv, &key); err != nil {
				return invalidf("TOC: %v", err)
			}
			if seen[key] {
				return invalidf("TOC: %v", errDuplicate([]byte(key)))
			}
			seen[key] = true
			if err := s.expect(':'); err != nil {
				return invalidf("TOC: %v", err)
			}
			if key == "entries" {
				if err := s.expect('['); err != nil {
					return invalidf("TOC entries: %v", err)
				}
				s.first = true
				if err := entries(); err != nil {
					return err
				}
			} else if err := s.member(key, top); err != nil {
				return err
			}
			if s.peek() == '}' {
				s.off++
				break
			}
			if err := s.expect(','); err != nil {
				return invalidf("TOC: %v", err)
			}
		}
	}
	if s.peek() != end || s.err != nil {
		if s.err != nil {
			return s.err
		}
		return invalidf("TOC: trailing data after the JSON object")
	}
	return nil
}

// member reads the value of the TOC's member key (not its entries) into top.
func (s *tocScanner) member(key string, top *tocTop) error {
	v, err := s.value()
	if err != nil {
		return invalidf("TOC: %v", err)
	}
	switch key {
	case "version":
		if err := json.Unmarshal(v, &top.version); err != nil {
			return invalidf("TOC version: %v", err)
		}
	case "tarSplitDigest":
		if err := json.Unmarshal(v, &top.tarSplitDigest); err != nil {
			return invalidf("TOC tarSplitDigest: %v", err)
		}
	default:
		var skipped jsontext.Value // checked as a whole, for duplicate names too
		if err := json.Unmarshal(v, &skipped); err != nil {
			return invalidf("TOC: %v", err)
		}
	}
	return nil
}

// next consumes what precedes the entries array's next element, and reports whether there
// is one. At the array's end, it consumes its "]".
func (s *tocScanner) next() (bool, error) {
	c := s.peek()
	switch {
	case c == ']':
		s.off++
		return false, nil
	case s.first:
		s.first = false
	case c == ',':
		s.off++
		c = s.peek()
	case c == end:
		return false, s.errEOF()
	default:
		return false, s.errorf(s.off, "got %q after an entry, want ',' or ']'", rune(c))
	}
	switch c {
	case '{':
		return true, nil
	case end:
		return false, s.errEOF()
	}
	return false, s.errorf(s.off, "got %q, want an entry object", rune(c))
}

// entry reads the entries array's next element (see next) into r, with the strings
// putBatchStr stores in strs.
func (s *tocScanner) entry(r *rawEntry, strs *[]byte) error {
	s.d.strs = strs
	at := len(*strs)
	// An entry the buffer does not hold whole is read again once more is read, twice at
	// most: one longer than a few reads is read by the decoder, its end found in one scan.
	for tries := 0; tries < 3; tries++ {
		s.stats.tries++
		n, st := s.d.fastEntry(s.buf[s.off:], r, s.eof)
		if st == fastOK {
			s.off += n
			return nil
		}
		*strs = (*strs)[:at]
		if st == fastSlow || !s.more() {
			break
		}
	}
	v, err := s.value()
	if err != nil {
		return err
	}
	s.stats.slow++
	s.d.dec.Reset(bytes.NewReader(v), tocJSON)
	if err := s.d.decodeEntry(r); err != nil {
		return err
	}
	if _, err := s.d.dec.ReadToken(); err != io.EOF {
		return errors.New("an entry ends before its value's end") // cannot happen: valueEnd found its end
	}
	return nil
}

// How fastEntry ends: with the entry read, with the buffer short of its end, or with a
// shape it does not read.
const (
	fastOK = iota
	fastShort
	fastSlow
)

// fastEntry reads the entry object b starts with into r, if it has the common shape: only
// defined members other than xattrs, each once, with names and string values free of
// escapes and control bytes, and integers of at most 18 digits without fraction or exponent
// (and no nulls). It returns the entry's length. It reads as decodeEntry would (the caller
// reads any other shape with it); eof says that no more bytes follow b.
func (d *entryDecoder) fastEntry(b []byte, r *rawEntry, eof bool) (int, int) {
	*r = rawEntry{}
	short := fastShort
	if eof {
		short = fastSlow // the decoder reports where it ends
	}
	i := skipSpace(b, 1)
	if i < len(b) && b[i] == '}' {
		return i + 1, fastOK
	}
	var seen uint32
	for {
		if i >= len(b) {
			return 0, short
		}
		if b[i] != '"' {
			return 0, fastSlow
		}
		j := bytes.IndexByte(b[i+1:], '"')
		if j < 0 {
			return 0, short
		}
		k := entryKey(b[i+1 : i+1+j]) // a name with an escape or a control byte matches none
		if k == keyUnknown || k == keyXattrs || seen&(1<<k) != 0 {
			return 0, fastSlow
		}
		seen |= 1 << k
		i = skipSpace(b, i+j+2)
		if i >= len(b) {
			return 0, short
		}
		if b[i] != ':' {
			return 0, fastSlow
		}
		i = skipSpace(b, i+1)
		if i >= len(b) {
			return 0, short
		}
		var st int
		if p := r.intField(k); p != nil {
			var v int64
			if i, v, st = fastInt(b, i); st == fastOK {
				*p = v
			}
		} else {
			var v []byte
			if i, v, st = fastString(b, i); st == fastOK {
				d.setStr(r, k, v)
			}
		}
		if st != fastOK {
			if st == fastShort {
				return 0, short
			}
			return 0, st
		}
		i = skipSpace(b, i)
		if i >= len(b) {
			return 0, short
		}
		switch b[i] {
		case ',':
			i = skipSpace(b, i+1)
		case '}':
			return i + 1, fastOK
		default:
			return 0, fastSlow
		}
	}
}

// plainByte marks the bytes a string fastString reads may hold as they are: not the
// quote, the backslash or a control byte. Bytes from 0x80 are marked 2: the string is
// then checked to be UTF-8.
var plainByte = func() (t [256]byte) {
	for c := 0x20; c < 0x80; c++ {
		t[c] = 1
	}
	t['"'], t['\\'] = 0, 0
	for c := 0x80; c < 0x100; c++ {
		t[c] = 2
	}
	return t
}()

// fastString reads the JSON string at b[i] if it holds no escape and no control byte, and
// is valid UTF-8. It returns the index after it and its content.
func fastString(b []byte, i int) (int, []byte, int) {
	if b[i] != '"' {
		return 0, nil, fastSlow
	}
	start := i + 1
	var wide byte
	for i = start; i < len(b); i++ {
		t := plainByte[b[i]]
		if t == 0 {
			if b[i] != '"' {
				return 0, nil, fastSlow
			}
			v := b[start:i]
			if wide > 1 && !utf8.Valid(v) {
				return 0, nil, fastSlow
			}
			return i + 1, v, fastOK
		}
		wide |= t
	}
	return 0, nil, fastShort
}

// fastInt reads the JSON integer at b[i] of at most 18 digits, without fraction or
// exponent. It returns the index after it and its value.
func fastInt(b []byte, i int) (int, int64, int) {
	neg := b[i] == '-'
	if neg {
		i++
	}
	start := i
	var n int64
	for ; i < len(b) && b[i] >= '0' && b[i] <= '9'; i++ {
		n = n*10 + int64(b[i]-'0')
	}
	switch {
	case i >= len(b):
		return 0, 0, fastShort
	case i == start, i-start > 18, b[start] == '0' && i-start > 1, b[i] == '.', b[i] == 'e', b[i] == 'E':
		return 0, 0, fastSlow
	case neg:
		n = -n
	}
	return i, n, fastOK
}
