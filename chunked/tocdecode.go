package chunked

import (
	"bytes"
	"encoding/base64"
	"errors"
	"fmt"
	"math"
	"strings"
	"unsafe"

	"github.com/go-json-experiment/json/jsontext"
)

// entryDecoder reads the elements of a TOC's "entries" array into rawEntry values as
// json.Unmarshal would (see decodeEntry), without its reflection: a TOC of a million entries
// spends most of its parse there otherwise.
type entryDecoder struct {
	dec       *jsontext.Decoder
	scratch   []byte              // unquoted strings that held escapes
	lastMTime string              // the last modtime read: most entries share theirs
	unknown   map[string]struct{} // the names of the unknown members of the object being read
	// strs, when set, holds the bytes of the names and digests read (see putBatchStr).
	strs *[]byte
}

// tocJSON are the options of a TOC's JSON decoder. jsontext's check of duplicate member
// names is off: it costs a set of names per object, where the entryDecoder checks the
// entries' members with a bit per defined key (and a set only for others), their xattrs
// with the map it fills, and the values it skips whole with Value.IsValid; the TOC's own
// members are checked by the builder.
var tocJSON = jsontext.AllowDuplicateNames(true)

// errDuplicate reports a member name an object holds twice.
func errDuplicate(name []byte) error {
	return fmt.Errorf("duplicate object member name %q", name)
}

// The defined keys of a TOC entry, as bits of the set of those an entry has.
const (
	keyName = iota
	keyType
	keySize
	keyModTime
	keyAccessTime
	keyChangeTime
	keyLinkName
	keyMode
	keyUID
	keyGID
	keyDevMajor
	keyDevMinor
	keyXattrs
	keyDigest
	keyOffset
	keyEndOffset
	keyInnerOffset
	keyChunkOffset
	keyChunkSize
	keyChunkDigest
	keyChunkType
	keyUserName
	keyGroupName
	keyUnknown = -1
)

// entryKey returns the defined key name is, or keyUnknown.
func entryKey(name []byte) int {
	switch string(name) {
	case "name":
		return keyName
	case "type":
		return keyType
	case "size":
		return keySize
	case "modtime":
		return keyModTime
	case "accesstime":
		return keyAccessTime
	case "changetime":
		return keyChangeTime
	case "linkName":
		return keyLinkName
	case "mode":
		return keyMode
	case "uid":
		return keyUID
	case "gid":
		return keyGID
	case "devMajor":
		return keyDevMajor
	case "devMinor":
		return keyDevMinor
	case "xattrs":
		return keyXattrs
	case "digest":
		return keyDigest
	case "offset":
		return keyOffset
	case "endOffset":
		return keyEndOffset
	case "innerOffset":
		return keyInnerOffset
	case "chunkOffset":
		return keyChunkOffset
	case "chunkSize":
		return keyChunkSize
	case "chunkDigest":
		return keyChunkDigest
	case "chunkType":
		return keyChunkType
	case "userName":
		return keyUserName
	case "groupName":
		return keyGroupName
	}
	return keyUnknown
}

// decodeEntry reads one JSON object into r, which it zeroes first. Members are matched to
// rawEntry's fields by exact name; a member whose name differs from a defined key only by
// case is refused (see checkKeys), and other unknown members are skipped. Values are read as
// json.Unmarshal reads them into the fields' types: null is the zero value, a string field
// takes a string, an integer field a number without fraction or exponent that fits an
// int64, and xattrs an object of strings (or nulls). The decoder refuses duplicate names
// (itself: see tocJSON), invalid UTF-8 and malformed JSON.
func (d *entryDecoder) decodeEntry(r *rawEntry) error {
	*r = rawEntry{}
	if tok, err := d.dec.ReadToken(); err != nil {
		return err
	} else if tok.Kind() != '{' {
		return fmt.Errorf("got %v, want an object", tok.Kind())
	}
	var seen uint32 // the defined keys read
	unknown := 0    // the unknown members read, in d.unknown
	for d.dec.PeekKind() == '"' {
		name, err := d.name()
		if err != nil {
			return err
		}
		k := entryKey(name)
		if k != keyUnknown {
			if seen&(1<<k) != 0 {
				return errDuplicate(name)
			}
			seen |= 1 << k
		}
		switch k {
		case keyUnknown:
			if unknown == 0 {
				clear(d.unknown)
			}
			unknown++
			err = d.unknownMember(name, knownKeys)
		case keyXattrs:
			err = d.xattrs(&r.Xattrs)
		default:
			err = d.member(r, k)
		}
		if err != nil {
			return err
		}
	}
	return d.endObject()
}

// member reads the value of defined key k, other than xattrs, into its field of r.
func (d *entryDecoder) member(r *rawEntry, k int) error {
	if p := r.intField(k); p != nil {
		return d.int(p)
	}
	b, _, err := d.stringValue()
	if err == nil {
		d.setStr(r, k, b)
	}
	return err
}

// intField returns the field of r that key k sets if it is an integer's, nil otherwise.
func (r *rawEntry) intField(k int) *int64 {
	switch k {
	case keySize:
		return &r.Size
	case keyMode:
		return &r.Mode
	case keyUID:
		return &r.UID
	case keyGID:
		return &r.GID
	case keyDevMajor:
		return &r.DevMajor
	case keyDevMinor:
		return &r.DevMinor
	case keyOffset:
		return &r.Offset
	case keyEndOffset:
		return &r.EndOffset
	case keyInnerOffset:
		return &r.InnerOffset
	case keyChunkOffset:
		return &r.ChunkOffset
	case keyChunkSize:
		return &r.ChunkSize
	}
	return nil
}

// setStr sets the field of r that key k sets, a string's, to b (nil for a JSON null): as
// both readers of an entry, the decoder and the scanner's fastEntry, set it. A name, a digest
// and a link's target are kept in d.strs (putBatchStr); the types and the modification time,
// which repeat, are not allocated again.
func (d *entryDecoder) setStr(r *rawEntry, k int, b []byte) {
	switch k {
	case keyName:
		d.putBatchStr(&r.Name, b, "")
	case keyDigest:
		d.putBatchStr(&r.Digest, b, "")
	case keyChunkDigest:
		d.putBatchStr(&r.ChunkDigest, b, r.Digest) // a single chunk's digest is the file's
	case keyType:
		r.Type = typeString(b)
	case keyModTime:
		r.ModTime = sameString(b, &d.lastMTime)
	case keyAccessTime:
		r.AccessTime = string(b)
	case keyChangeTime:
		r.ChangeTime = string(b)
	case keyLinkName:
		d.putBatchStr(&r.LinkName, b, "")
	case keyChunkType:
		r.ChunkType = string(b)
	case keyUserName:
		r.UserName = string(b)
	case keyGroupName:
		r.GroupName = string(b)
	}
}

// unknownMember refuses a name read before in the object (d.unknown, cleared by the caller
// at the object's first unknown member), then skips the value (skipUnknown).
func (d *entryDecoder) unknownMember(name []byte, known map[string]bool) error {
	if d.unknown == nil {
		d.unknown = map[string]struct{}{}
	}
	if _, dup := d.unknown[string(name)]; dup {
		return errDuplicate(name)
	}
	d.unknown[string(name)] = struct{}{}
	return d.skipUnknown(name, known)
}

// name reads an object member's name, unquoted. It is valid until the next read.
func (d *entryDecoder) name() ([]byte, error) {
	v, err := d.dec.ReadValue()
	if err != nil {
		return nil, err
	}
	return d.unquote(v)
}

// unquote returns the content of the JSON string v (valid: the decoder checked it). It is
// valid until the next read.
func (d *entryDecoder) unquote(v jsontext.Value) ([]byte, error) {
	inner := v[1 : len(v)-1]
	if bytes.IndexByte(inner, '\\') < 0 {
		return inner, nil
	}
	var err error
	d.scratch, err = jsontext.AppendUnquote(d.scratch[:0], v)
	return d.scratch, err
}

// stringValue reads a string or null ("", false).
func (d *entryDecoder) stringValue() ([]byte, bool, error) {
	v, err := d.dec.ReadValue()
	if err != nil {
		return nil, false, err
	}
	switch v.Kind() {
	case 'n':
		return nil, false, nil
	case '"':
		b, err := d.unquote(v)
		return b, true, err
	default:
		return nil, false, fmt.Errorf("cannot unmarshal JSON %v into a string", v.Kind())
	}
}

func (d *entryDecoder) str(dst *string) error {
	b, _, err := d.stringValue()
	if err == nil {
		*dst = string(b)
	}
	return err
}

// sameString returns b as a string: *last when equal, a new one (then also in *last) otherwise.
func sameString(b []byte, last *string) string {
	if string(b) != *last {
		*last = string(b)
	}
	return *last
}

// digestLen is the length of a digest as a TOC writes it ("sha256:" and 64 hex digits).
const digestLen = len("sha256:") + 64

// putBatchStr sets *dst to b, a name, a digest or a link's target, which the builder copies
// or decodes at once and never keeps: with d.strs set, the string is stored there, not
// allocated (a name and 80 bytes of digests a file of the TOC, garbage once read, which the
// collector's pace let a large parse's peak hold: BenchmarkParsePeak 446 -> 407 MiB for the
// digests); same (read before it) is reused when equal. Such a string is valid until *d.strs is reused: the
// decoding goroutine sets it to the batch's own, which the builder hands back after it has
// read the batch's entries.
func (d *entryDecoder) putBatchStr(dst *string, b []byte, same string) {
	switch {
	case string(b) == same:
		*dst = same
	case d.strs == nil || len(b) == 0:
		*dst = string(b)
	default:
		at := len(*d.strs)
		*d.strs = append(*d.strs, b...)
		// A grown array stays alive as long as the strings in the old one.
		*dst = unsafe.String(&(*d.strs)[at], len(b))
	}
}

// typeString returns b as a string, without allocating for the types the formats define.
func typeString(b []byte) string {
	switch string(b) {
	case "reg":
		return "reg"
	case "chunk":
		return "chunk"
	case "dir":
		return "dir"
	case "symlink":
		return "symlink"
	case "hardlink":
		return "hardlink"
	}
	return string(b)
}

var errIntSyntax = errors.New("cannot unmarshal a JSON number with a fraction or an exponent into an integer")
var errIntRange = errors.New("JSON number out of the range of an int64")

// int reads an integer or null (0).
func (d *entryDecoder) int(dst *int64) error {
	v, err := d.dec.ReadValue()
	if err != nil {
		return err
	}
	switch v.Kind() {
	case 'n':
		*dst = 0
		return nil
	case '0':
	default:
		return fmt.Errorf("cannot unmarshal JSON %v into an integer", v.Kind())
	}
	digits := v
	neg := digits[0] == '-'
	if neg {
		digits = digits[1:]
	}
	var n uint64
	for _, c := range digits {
		if c < '0' || c > '9' {
			return errIntSyntax
		}
		if n > (math.MaxUint64-9)/10 {
			return errIntRange
		}
		n = n*10 + uint64(c-'0')
	}
	switch {
	case neg && n > 1<<63, !neg && n > math.MaxInt64:
		return errIntRange
	case neg:
		*dst = int64(-n)
	default:
		*dst = int64(n)
	}
	return nil
}

// xattrs reads an object of strings, or null (nil).
func (d *entryDecoder) xattrs(dst *map[string]string) error {
	switch d.dec.PeekKind() {
	case 'n':
		_, err := d.dec.ReadToken()
		*dst = nil
		return err
	case '{':
	default:
		v, err := d.dec.ReadValue()
		if err != nil {
			return err
		}
		return fmt.Errorf("cannot unmarshal JSON %v into xattrs", v.Kind())
	}
	if _, err := d.dec.ReadToken(); err != nil {
		return err
	}
	m := map[string]string{}
	for d.dec.PeekKind() == '"' {
		k, err := d.name()
		if err != nil {
			return err
		}
		if _, dup := m[string(k)]; dup {
			return errDuplicate(k)
		}
		key := string(k)
		b, _, err := d.stringValue()
		if err != nil {
			return err
		}
		m[key] = string(b)
	}
	if err := d.endObject(); err != nil {
		return err
	}
	*dst = m
	return nil
}

// decodeTarSplit reads one tar-split entry into r as json.Unmarshal reads it into a
// rawTarSplitRecord, with the refusal of case variants (see decodeEntry): name_raw and payload
// are base64 (standard, padded, strict), decoded into the reused buffers r holds.
func (d *entryDecoder) decodeTarSplit(r *TarSplitEntry) error {
	nameRaw, payload := r.NameRaw[:0], r.Payload[:0]
	*r = TarSplitEntry{}
	if tok, err := d.dec.ReadToken(); err != nil {
		return err
	} else if tok.Kind() != '{' {
		return fmt.Errorf("got %v, want an object", tok.Kind())
	}
	for d.dec.PeekKind() == '"' {
		name, err := d.name()
		if err != nil {
			return err
		}
		switch string(name) {
		case "type":
			var v int64
			if err = d.int(&v); err == nil && int64(int(v)) != v {
				err = errIntRange
			}
			r.Type = int(v)
		case "name":
			err = d.str(&r.Name)
		case "name_raw":
			err = d.base64(&r.NameRaw, nameRaw)
		case "size":
			err = d.int(&r.Size)
		case "payload":
			err = d.base64(&r.Payload, payload)
		case "position":
			err = d.int(&r.Position)
		default:
			err = d.skipUnknown(name, tarSplitNames)
		}
		if err != nil {
			return err
		}
	}
	return d.endObject()
}

// base64 reads a base64 string (into buf) or null (nil).
func (d *entryDecoder) base64(dst *[]byte, buf []byte) error {
	s, ok, err := d.stringValue()
	if err != nil || !ok {
		*dst = nil
		return err
	}
	b, err := base64.StdEncoding.AppendDecode(buf[:0], s)
	if err != nil {
		return err
	}
	if len(s) != base64.StdEncoding.EncodedLen(len(b)) {
		return errors.New("base64 with characters outside its alphabet")
	}
	if b == nil {
		b = []byte{}
	}
	*dst = b
	return nil
}

// skipUnknown skips the value of a key the format does not define, and refuses a key that
// differs from a defined one only by case (json.Unmarshal would take it for that key).
func (d *entryDecoder) skipUnknown(name []byte, known map[string]bool) error {
	if known[strings.ToLower(string(name))] {
		return invalidf("key %q differs from a defined key only by case", name)
	}
	return skipValue(d.dec)
}

// skipValue skips the next value of dec, refusing duplicate names in it (a decoder made with
// tocJSON does not).
func skipValue(dec *jsontext.Decoder) error {
	v, err := dec.ReadValue()
	if err != nil {
		return err
	}
	if (v.Kind() == '{' || v.Kind() == '[') && !v.IsValid() {
		return errors.New("duplicate object member name in a skipped value")
	}
	return nil
}

// endObject reads the end of the object whose members were read.
func (d *entryDecoder) endObject() error {
	if tok, err := d.dec.ReadToken(); err != nil {
		return err
	} else if tok.Kind() != '}' {
		return fmt.Errorf("got %v, want the end of an object", tok.Kind())
	}
	return nil
}
