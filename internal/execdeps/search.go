package execdeps

import (
	"debug/elf"
	"path"
	"slices"
	"strings"
)

// MaxSearchDirs bounds the directories a library (or a program, in a PATH) is looked for in.
const MaxSearchDirs = 24

// LDCache is glibc's cache of library paths, which its dynamic loader reads before it opens
// any library (a system without it, musl's, has no such file).
const LDCache = "/etc/ld.so.cache"

// SearchDirs returns the directories the loader looks for d's libraries in, in order: the run
// path ($ORIGIN, ${ORIGIN} as origin, the directory of the file; entries with other
// substitutions are skipped), then the system's directories for the file's machine and class
// (multiarch, then lib64 or lib, then /usr/local/lib). At most MaxSearchDirs.
func (d ELF) SearchDirs(origin string) []string {
	var dirs []string
	add := func(dir string) {
		if path.IsAbs(dir) && len(dirs) < MaxSearchDirs && !slices.Contains(dirs, path.Clean(dir)) {
			dirs = append(dirs, path.Clean(dir))
		}
	}
	for _, dir := range d.Runpath {
		dir = strings.ReplaceAll(strings.ReplaceAll(dir, "${ORIGIN}", origin), "$ORIGIN", origin)
		if !strings.Contains(dir, "$") {
			add(dir)
		}
	}
	if t := multiarch(d.Machine, d.Class); t != "" {
		add("/lib/" + t)
		add("/usr/lib/" + t)
	}
	if d.Class == elf.ELFCLASS64 {
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
