package mountinfo

import "testing"

func TestUnescape(t *testing.T) {
	for in, want := range map[string]string{
		`/plain`:                `/plain`,
		`/a\040b`:               `/a b`,
		`/tab\011nl\012bs\134x`: "/tab\tnl\nbs\\x",
		`/trailing\04`:          `/trailing\04`,
		`/bad\09x`:              `/bad\09x`,
	} {
		if got := Unescape(in); got != want {
			t.Errorf("Unescape(%q) = %q, want %q", in, got, want)
		}
	}
}
