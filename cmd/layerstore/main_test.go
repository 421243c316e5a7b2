package main

import (
	"bytes"
	"strings"
	"testing"

	"github.com/layerstore/layerstore/internal/testfuse"
)

func TestDemo(t *testing.T) {
	testfuse.Require(t)
	var out, errb bytes.Buffer
	if code := run(t.Context(), []string{"demo"}, &out, &errb); code != 0 {
		t.Fatalf("demo exited %d: %s", code, errb.String())
	}
	s := out.String()
	for _, want := range []string{"estargz-prioritized", "zstd:chunked", "chunks-verified", "diffid-verified", "ENOENT", "input/output error", "all local in"} {
		if !strings.Contains(s, want) {
			t.Errorf("demo output lacks %q:\n%s", want, s)
		}
	}
}

func TestUnknownCommand(t *testing.T) {
	var out, errb bytes.Buffer
	if code := run(t.Context(), []string{"bogus"}, &out, &errb); code != 2 || !strings.Contains(errb.String(), "unknown command") {
		t.Fatalf("code %d, stderr %q", code, errb.String())
	}
}
