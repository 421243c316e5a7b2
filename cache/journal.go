package cache

import (
	"encoding/binary"
	"errors"
	"hash/crc32"

	"github.com/layerstore/layerstore/internal/byterange"
)

// The journal of a partial file ("<hex>.ranges") is a header followed by records, each
// naming a range whose bytes were written and fsynced to the data file before the record was
// appended:
//
//	header: "LSCJRNL1" | file size (uint64 LE) | CRC-32C of the previous 16 bytes (uint32 LE)
//	record: offset (uint64 LE) | length (uint64 LE) | CRC-32C of the previous 16 bytes
//
// A crash can leave a torn last record; a record whose CRC fails or whose range is outside
// the file ends the journal: it and everything after it are ignored.
const (
	journalMagic = "LSCJRNL1"
	journalRec   = 20
)

var (
	crcTable = crc32.MakeTable(crc32.Castagnoli)

	// errBadJournal reports a journal whose header is unusable: the whole partial file is
	// treated as missing.
	errBadJournal = errors.New("bad journal header")
)

func journalHeader(size int64) []byte {
	b := make([]byte, 0, journalRec)
	b = append(b, journalMagic...)
	b = binary.LittleEndian.AppendUint64(b, uint64(size))
	return binary.LittleEndian.AppendUint32(b, crc32.Checksum(b, crcTable))
}

func appendRecord(b []byte, r byterange.Range) []byte {
	start := len(b)
	b = binary.LittleEndian.AppendUint64(b, uint64(r.Offset))
	b = binary.LittleEndian.AppendUint64(b, uint64(r.Length))
	return binary.LittleEndian.AppendUint32(b, crc32.Checksum(b[start:], crcTable))
}

// parseJournal decodes a journal. It returns the file size, the recorded ranges and the
// length of the valid prefix of b (shorter than b when the tail is torn or damaged).
func parseJournal(b []byte) (size int64, set byterange.Set, good int, err error) {
	if len(b) < journalRec || string(b[:8]) != journalMagic ||
		crc32.Checksum(b[:16], crcTable) != binary.LittleEndian.Uint32(b[16:20]) {
		return 0, nil, 0, errBadJournal
	}
	u := binary.LittleEndian.Uint64(b[8:16])
	if u > 1<<62 {
		return 0, nil, 0, errBadJournal
	}
	size = int64(u)
	good = journalRec
	for rec := b[good:]; len(rec) >= journalRec; rec = rec[journalRec:] {
		if crc32.Checksum(rec[:16], crcTable) != binary.LittleEndian.Uint32(rec[16:20]) {
			break
		}
		off, n := binary.LittleEndian.Uint64(rec[:8]), binary.LittleEndian.Uint64(rec[8:16])
		if n == 0 || off > uint64(size) || n > uint64(size)-off {
			break
		}
		set = set.Add(byterange.Range{Offset: int64(off), Length: int64(n)})
		good += journalRec
	}
	return size, set, good, nil
}
