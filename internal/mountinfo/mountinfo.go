// Package mountinfo reads what /proc/self/mountinfo escapes. It holds no state and is safe
// for concurrent use.
package mountinfo

import (
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
