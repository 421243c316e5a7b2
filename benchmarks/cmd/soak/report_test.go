package main

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestClassify(t *testing.T) {
	h := func(c string) string { return strings.Repeat(c, 64) }
	ref := h("a") + "  ./d00/f000\n" + h("b") + "  ./d01/f001\n"
	fail := errors.New("exit status 123")
	for _, c := range []struct {
		out     string
		err     error
		outcome string
		wrong   int
	}{
		{ref, nil, "ok", 0},
		{h("a") + "  ./d00/f000\n", fail, "failed", 0},                            // a read failed: fewer lines, podman failed
		{"", fail, "failed", 0},                                                   // nothing printed
		{h("a") + "  ./d00/f000\n", nil, "wrong", 1},                              // exit 0 with a line missing
		{h("a") + "  ./d00/f000\n" + h("c") + "  ./d01/f001\n", fail, "wrong", 1}, // a wrong hash, even in a failed run
		{ref + "garbage\n", nil, "wrong", 1},
	} {
		got, wrong := classify(c.out, ref, c.err)
		if got != c.outcome || len(wrong) != c.wrong {
			t.Errorf("classify(%q, %v) = %s, %q; want %s with %d wrong lines", c.out, c.err, got, wrong, c.outcome, c.wrong)
		}
	}
}

func TestDaemonLog(t *testing.T) {
	p := filepath.Join(t.TempDir(), "daemon.log")
	log := `time=2026-11-27T01:49:37.716Z level=INFO msg="mounted layer store"
time=2026-11-27T01:49:37.716Z level=WARN msg="resolving image failed" ref=r err="bad response: unexpected EOF"
time=2026-11-27T01:49:38.000Z level=ERROR msg=oops
layerstore keep: /x/bin/layerstore ended (signal: killed): starting it again with 2 kept descriptors
panic: something
`
	if err := os.WriteFile(p, []byte(log), 0o644); err != nil {
		t.Fatal(err)
	}
	ls := daemonLog([]string{p}, "/x/bin/layerstore")
	var got []string
	for _, l := range ls {
		got = append(got, l.Level+" "+l.Msg)
	}
	want := []string{"WARN resolving image failed", "ERROR oops", "keep layerstore ended (signal: killed): starting it again with N kept descriptors", "PANIC panic: something"}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("lines:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if ls[0].At.IsZero() {
		t.Error("no time parsed")
	}
}
