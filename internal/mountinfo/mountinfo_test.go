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

func TestParse(t *testing.T) {
	data := []byte(`36 35 98:0 /mnt1 /mnt2 rw,noatime master:1 - ext3 /dev/root rw,errors=continue
50 1 0:52 / /tmp/a\040b rw - fuse.layerstore layerstore rw
short line
60 1 0:53 / /x rw shared:2 -
`)
	ms, err := Parse(data)
	if err != nil {
		t.Fatal(err)
	}
	want := []Mount{{"/mnt2", "98:0", "ext3"}, {"/tmp/a b", "0:52", "fuse.layerstore"}}
	if len(ms) != len(want) || ms[0] != want[0] || ms[1] != want[1] {
		t.Errorf("Parse: %+v, want %+v", ms, want)
	}
}
