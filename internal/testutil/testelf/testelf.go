// Package testelf builds small synthetic ELF files for tests: what a program's loader reads
// (header, program headers, interpreter, dynamic section and its strings), padded with random
// content. It holds no state and is safe for concurrent use.
package testelf

import (
	"debug/elf"
	"encoding/binary"

	"github.com/layerstore/layerstore/internal/testutil/testlayer"
)

// Spec describes a synthetic ELF64 little-endian x86-64 file (File).
type Spec struct {
	Interp  string
	Needed  []string
	Runpath string
	Pad     int      // random bytes between the string table and the dynamic section
	Zeros   int      // zero bytes after them
	Static  bool     // no dynamic section
	Type    elf.Type // ET_DYN when zero
}

// File builds the file of s: header, program headers (PT_LOAD of the whole file at address
// 0, PT_INTERP when s has an interpreter, PT_DYNAMIC), the interpreter path, the dynamic
// string table, s.Pad bytes of random content drawn from seed and s.Zeros of zeros, then the
// dynamic section.
func File(seed uint64, s Spec) []byte {
	le := binary.LittleEndian
	nph := 1
	if s.Interp != "" {
		nph++
	}
	if !s.Static {
		nph++
	}
	body := 64 + 56*nph
	interpOff := body
	if s.Interp != "" {
		body += len(s.Interp) + 1
	}
	strOff := body
	strtab := []byte{0}
	var names []uint64
	for _, n := range s.Needed {
		names = append(names, uint64(len(strtab)))
		strtab = append(append(strtab, n...), 0)
	}
	runOff := uint64(len(strtab))
	if s.Runpath != "" {
		strtab = append(append(strtab, s.Runpath...), 0)
	}
	body += len(strtab)
	pad := append(testlayer.RandomBytes(s.Pad, seed), make([]byte, s.Zeros)...)
	body += len(pad)
	dynOff := body
	var dyn []byte
	entry := func(tag elf.DynTag, v uint64) { dyn = le.AppendUint64(le.AppendUint64(dyn, uint64(tag)), v) }
	if !s.Static {
		for _, o := range names {
			entry(elf.DT_NEEDED, o)
		}
		if s.Runpath != "" {
			entry(elf.DT_RUNPATH, runOff)
		}
		entry(elf.DT_STRTAB, uint64(strOff))
		entry(elf.DT_STRSZ, uint64(len(strtab)))
		entry(elf.DT_NULL, 0)
	}
	size := body + len(dyn)

	b := make([]byte, 64, size)
	copy(b, elf.ELFMAG)
	b[elf.EI_CLASS], b[elf.EI_DATA], b[elf.EI_VERSION] = byte(elf.ELFCLASS64), byte(elf.ELFDATA2LSB), 1
	typ := s.Type
	if typ == 0 {
		typ = elf.ET_DYN
	}
	le.PutUint16(b[16:], uint16(typ))
	le.PutUint16(b[18:], uint16(elf.EM_X86_64))
	le.PutUint32(b[20:], 1)
	le.PutUint64(b[32:], 64) // e_phoff
	le.PutUint16(b[52:], 64) // e_ehsize
	le.PutUint16(b[54:], 56) // e_phentsize
	le.PutUint16(b[56:], uint16(nph))
	phdr := func(typ elf.ProgType, off, n int) {
		p := make([]byte, 56)
		le.PutUint32(p, uint32(typ))
		le.PutUint32(p[4:], uint32(elf.PF_R))
		le.PutUint64(p[8:], uint64(off))
		le.PutUint64(p[16:], uint64(off))
		le.PutUint64(p[24:], uint64(off))
		le.PutUint64(p[32:], uint64(n))
		le.PutUint64(p[40:], uint64(n))
		le.PutUint64(p[48:], 1)
		b = append(b, p...)
	}
	if s.Interp != "" {
		phdr(elf.PT_INTERP, interpOff, len(s.Interp)+1)
	}
	phdr(elf.PT_LOAD, 0, size)
	if !s.Static {
		phdr(elf.PT_DYNAMIC, dynOff, len(dyn))
	}
	if s.Interp != "" {
		b = append(append(b, s.Interp...), 0)
	}
	b = append(b, strtab...)
	b = append(b, pad...)
	return append(b, dyn...)
}
