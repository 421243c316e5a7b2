// Package mountinfo parses /proc/self/mountinfo. It holds no state and is safe
// for concurrent use.
package mountinfo

import (
	"bufio"
	"bytes"
	"strconv"
	"strings"
)

// Unescape undoes the octal escapes (\040 for a space, ...) of mountinfo fields.
func Unescape(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+4 <= len(s) {
			if v, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(v))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// Mount is what one line of a mountinfo file (proc(5)) says of a mount:
//
//	36 35 98:0 /mnt1 /mnt2 rw,noatime master:1 - ext3 /dev/root rw,errors=continue
type Mount struct {
	Point  string // the mount point, unescaped
	Dev    string // "major:minor" of the mounted filesystem
	FSType string
}

// Parse reads every mount of a mountinfo file's content, in its order; malformed lines are
// skipped.
func Parse(data []byte) ([]Mount, error) {
	var ms []Mount
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		sep := -1
		for i := 6; i < len(f); i++ {
			if f[i] == "-" {
				sep = i
				break
			}
		}
		if sep < 0 || sep+1 >= len(f) {
			continue
		}
		ms = append(ms, Mount{Point: Unescape(f[4]), Dev: f[2], FSType: f[sep+1]})
	}
	return ms, sc.Err()
}
