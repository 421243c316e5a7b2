// Package execdeps reads what executing a file asks for, from the file alone: a script's
// interpreter (its "#!" line), an ELF file's interpreter (PT_INTERP) and the libraries it
// names (DT_NEEDED) with its run path (DT_RUNPATH or DT_RPATH), and the directories the dynamic
// loader looks for those libraries in. It finds no files: the caller looks the names up where
// it serves them.
//
// Its input is untrusted: everything it reads is bounded (program headers, dynamic section,
// names, directories), and a malformed file is an error, never a panic. It holds no state and
// is safe for concurrent use.
package execdeps

import (
	"bytes"
	"debug/elf"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"strings"
)

// Bounds of what is read of a file.
const (
	MaxPath = 4096 // bytes of a path (PATH_MAX): an interpreter's longer one is not read

	maxPhdrs   = 256      // program headers read
	maxDynamic = 64 << 10 // bytes of a dynamic section read
	maxNeeded  = 64       // libraries a file names, taken
	maxName    = 256      // bytes of a library name or a run path entry
)

// ELF is what an ELF file asks of its loader.
type ELF struct {
	Machine elf.Machine
	Class   elf.Class
	Interp  string   // PT_INTERP, "" if none
	Needed  []string // DT_NEEDED, in order
	Runpath []string // DT_RUNPATH's entries, or DT_RPATH's when there is no DT_RUNPATH
}

// ErrNotELF is the error of ReadELF for a file that does not start as an ELF file.
var ErrNotELF = errors.New("not an ELF file")

// IsSharedObject reports whether p, the start of a file, is an ELF shared object's header
// (e_type ET_DYN: a library, or a position-independent executable).
func IsSharedObject(p []byte) bool {
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

// ReadELF reads the loading information of the ELF file r of size bytes: its header, program
// headers, interpreter and dynamic section, and the strings the dynamic section names.
// Everything it reads is bounded; a malformed file is an error.
func ReadELF(r io.ReaderAt, size int64) (ELF, error) {
	h, err := readHeader(r, size)
	if err != nil {
		return ELF{Machine: h.machine, Class: h.class}, err
	}
	d := ELF{Machine: h.machine, Class: h.class}
	loads, dynamic, err := h.readSegments(r, size, &d)
	if err != nil || dynamic.filesz == 0 {
		return d, err // an error, or static: nothing more to load
	}
	dyn, err := h.readDynamic(r, dynamic)
	if err != nil {
		return d, err
	}
	strs, ok := stringTable(loads, dyn.strtab, dyn.strsz)
	if !ok {
		if len(dyn.needed) == 0 {
			return d, nil
		}
		return d, fmt.Errorf("ELF string table at %#x is in no loaded segment", dyn.strtab)
	}
	for _, o := range dyn.needed {
		if s, ok := strs.name(r, o); ok {
			d.Needed = append(d.Needed, s)
		}
	}
	runpath := dyn.runpath
	if len(runpath) == 0 {
		runpath = dyn.rpath
	}
	for _, o := range runpath {
		if s, ok := strs.name(r, o); ok {
			d.Runpath = strings.Split(s, ":")
		}
	}
	return d, nil
}

// header is what an ELF header says of the file's encoding and program headers.
type header struct {
	bo      binary.ByteOrder
	class   elf.Class
	machine elf.Machine
	phoff   uint64
	phent   int64
	phnum   int64
}

// word reads an address-sized field (4 or 8 bytes, by the file's class).
func (h *header) word(b []byte) uint64 {
	if h.class == elf.ELFCLASS64 {
		return h.bo.Uint64(b)
	}
	return uint64(h.bo.Uint32(b))
}

// readHeader reads the identification and the header of the ELF file r of size bytes, and
// checks its program headers' place: the kernel loads only files whose program headers have
// the class's size. A header read but with program headers out of bounds is returned with its
// error (its machine and class were read).
func readHeader(r io.ReaderAt, size int64) (header, error) {
	var h header
	var id [elf.EI_NIDENT]byte
	if _, err := r.ReadAt(id[:], 0); err != nil {
		return h, ErrNotELF
	}
	if string(id[:4]) != elf.ELFMAG {
		return h, ErrNotELF
	}
	if h.bo = byteOrder(id[elf.EI_DATA]); h.bo == nil {
		return h, fmt.Errorf("ELF data encoding %d", id[elf.EI_DATA])
	}
	h.class = elf.Class(id[elf.EI_CLASS])
	// The header's fields read: where they are in each class.
	var hdrSize, phoffAt, phentAt, phnumAt int
	var phSize int64
	switch h.class {
	case elf.ELFCLASS64:
		hdrSize, phoffAt, phentAt, phnumAt, phSize = 64, 32, 54, 56, 56
	case elf.ELFCLASS32:
		hdrSize, phoffAt, phentAt, phnumAt, phSize = 52, 28, 42, 44, 32
	default:
		return h, fmt.Errorf("ELF class %d", id[elf.EI_CLASS])
	}
	hdr := make([]byte, hdrSize)
	if _, err := r.ReadAt(hdr, 0); err != nil {
		return h, fmt.Errorf("ELF header: %w", err)
	}
	h.machine = elf.Machine(h.bo.Uint16(hdr[18:]))
	h.phoff, h.phent, h.phnum = h.word(hdr[phoffAt:]), int64(h.bo.Uint16(hdr[phentAt:])), int64(h.bo.Uint16(hdr[phnumAt:]))
	if h.phnum == 0 || h.phnum > maxPhdrs || h.phent != phSize || h.phoff >= uint64(size) || int64(h.phoff)+h.phent*h.phnum > size {
		return h, fmt.Errorf("ELF program headers: %d of %d bytes at %d", h.phnum, h.phent, h.phoff)
	}
	return h, nil
}

// segment is a program header's part read: its type, where it is in the file and in memory.
type segment struct{ typ, off, vaddr, filesz uint64 }

// readSegments reads the program headers of a file of size bytes: it returns its loaded
// segments and its dynamic segment (filesz 0 for none), and sets d's interpreter.
func (h *header) readSegments(r io.ReaderAt, size int64, d *ELF) (loads []segment, dynamic segment, _ error) {
	phdrs := make([]byte, h.phent*h.phnum)
	if _, err := r.ReadAt(phdrs, int64(h.phoff)); err != nil {
		return nil, dynamic, fmt.Errorf("ELF program headers: %w", err)
	}
	for i := range h.phnum {
		p := phdrs[i*h.phent:]
		var s segment
		s.typ = uint64(h.bo.Uint32(p))
		if h.class == elf.ELFCLASS64 {
			s.off, s.vaddr, s.filesz = h.bo.Uint64(p[8:]), h.bo.Uint64(p[16:]), h.bo.Uint64(p[32:])
		} else {
			s.off, s.vaddr, s.filesz = uint64(h.bo.Uint32(p[4:])), uint64(h.bo.Uint32(p[8:])), uint64(h.bo.Uint32(p[16:]))
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
			if d.Interp == "" && s.filesz > 1 && s.filesz <= MaxPath {
				b := make([]byte, s.filesz)
				if _, err := r.ReadAt(b, int64(s.off)); err != nil {
					return loads, dynamic, fmt.Errorf("ELF interpreter: %w", err)
				}
				d.Interp = cString(b)
			}
		}
	}
	return loads, dynamic, nil
}

// dynamicEntries is what the dynamic section says of the libraries: offsets in its string
// table, and where the string table is (an address, and its size).
type dynamicEntries struct {
	strtab, strsz          uint64
	needed, runpath, rpath []uint64
}

// readDynamic reads the dynamic section (at most maxDynamic bytes of it), up to its DT_NULL.
func (h *header) readDynamic(r io.ReaderAt, dynamic segment) (dynamicEntries, error) {
	var e dynamicEntries
	dyn := make([]byte, min(dynamic.filesz, maxDynamic))
	if _, err := r.ReadAt(dyn, int64(dynamic.off)); err != nil {
		return e, fmt.Errorf("ELF dynamic section: %w", err)
	}
	wordSize := int64(h.class) * 4 // 4 or 8
	for i := int64(0); (i+2)*wordSize <= int64(len(dyn)); i += 2 {
		tag, val := elf.DynTag(h.word(dyn[i*wordSize:])), h.word(dyn[(i+1)*wordSize:])
		if tag == elf.DT_NULL {
			break
		}
		switch tag {
		case elf.DT_NEEDED:
			if len(e.needed) < maxNeeded {
				e.needed = append(e.needed, val)
			}
		case elf.DT_STRTAB:
			e.strtab = val
		case elf.DT_STRSZ:
			e.strsz = val
		case elf.DT_RUNPATH:
			e.runpath = append(e.runpath[:0], val)
		case elf.DT_RPATH:
			e.rpath = append(e.rpath[:0], val)
		}
	}
	return e, nil
}

// strTable is where the dynamic string table is in the file.
type strTable struct{ off, size uint64 }

// stringTable finds the string table at address strtab (DT_STRTAB is an address) in the
// segments mapped from the file, its size bounded by the segment's.
func stringTable(loads []segment, strtab, strsz uint64) (strTable, bool) {
	for _, s := range loads {
		if strtab >= s.vaddr && strtab-s.vaddr < s.filesz {
			return strTable{s.off + (strtab - s.vaddr), min(strsz, s.filesz-(strtab-s.vaddr))}, true
		}
	}
	return strTable{}, false
}

// name reads the string at offset o of the table: at most maxName bytes, NUL-terminated
// within them; false for an empty string, or one longer.
func (t strTable) name(r io.ReaderAt, o uint64) (string, bool) {
	if o >= t.size {
		return "", false
	}
	b := make([]byte, min(maxName, t.size-o))
	n, err := r.ReadAt(b, int64(t.off+o))
	if err != nil && n == 0 {
		return "", false
	}
	b = b[:n]
	if i := bytes.IndexByte(b, 0); i > 0 {
		return string(b[:i]), true
	}
	return "", false // empty, or longer than maxName
}

// cString returns b up to its first NUL.
func cString(b []byte) string {
	if i := bytes.IndexByte(b, 0); i >= 0 {
		b = b[:i]
	}
	return string(b)
}
