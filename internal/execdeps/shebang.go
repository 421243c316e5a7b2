package execdeps

import (
	"bytes"
	"io"
	"path"
	"strings"
)

// maxShebang is how much of a script's first line the kernel reads (BINPRM_BUF_SIZE).
const maxShebang = 256

// Shebang returns the interpreter a script of size bytes names on its first line
// ("#!/bin/sh -e": /bin/sh), as the kernel reads it: within its first maxShebang bytes. It
// reports false for a file that is not a script, or names no absolute path.
func Shebang(r io.ReaderAt, size int64) (string, bool) {
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
