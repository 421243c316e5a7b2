package storefs

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	iofs "io/fs"
	"log/slog"
	"strings"
	"syscall"
	"testing"

	"github.com/layerstore/layerstore/internal/ratelog"
)

func TestErrno(t *testing.T) {
	for _, c := range []struct {
		err    error
		want   syscall.Errno
		logged bool
	}{
		{nil, 0, false},
		{iofs.ErrNotExist, syscall.ENOENT, false},
		{fmt.Errorf("layer x: %w", fmt.Errorf("manifest: %w", iofs.ErrNotExist)), syscall.ENOENT, false},
		{syscall.ENOENT, syscall.ENOENT, false},
		{fmt.Errorf("read: %w", context.Canceled), syscall.EINTR, false},
		{fmt.Errorf("resolve: %w", context.DeadlineExceeded), syscall.EIO, true},
		{errors.New("registry said 500"), syscall.EIO, true},
		{fmt.Errorf("chunk: %w", syscall.EACCES), syscall.EIO, true},
	} {
		var buf bytes.Buffer
		log := ratelog.New(slog.New(slog.NewTextHandler(&buf, nil)), eioEvery)
		if got := errno(log, c.err, "lookup", "key", "sha256:abc"); got != c.want {
			t.Errorf("errno(%v) = %v, want %v", c.err, got, c.want)
		}
		lines := strings.Count(buf.String(), "\n")
		switch {
		case c.logged && (lines != 1 || !strings.Contains(buf.String(), "level=WARN") ||
			!strings.Contains(buf.String(), c.err.Error()) || !strings.Contains(buf.String(), "sha256:abc")):
			t.Errorf("errno(%v) logged %q, want one warning with the error and the args", c.err, buf.String())
		case !c.logged && lines != 0:
			t.Errorf("errno(%v) logged %q, want nothing", c.err, buf.String())
		}
	}
}

// TestErrnoBounded: a failure every request meets (a registry down while a container walks
// its tree) logs one line per operation per eioEvery, not one per answer.
func TestErrnoBounded(t *testing.T) {
	var buf bytes.Buffer
	log := ratelog.New(slog.New(slog.NewTextHandler(&buf, nil)), eioEvery)
	for i := range 1000 {
		errno(log, errors.New("registry down"), "read", "off", i)
	}
	errno(log, errors.New("registry down"), "lookup")
	if lines := strings.Count(buf.String(), "\n"); lines != 2 {
		t.Errorf("%d lines for 1000 failed reads and a failed lookup, want 2:\n%s", lines, buf.String())
	}
}

func TestDecodeRef(t *testing.T) {
	for _, ref := range []string{
		"docker.io/library/busybox:latest",
		"127.0.0.1:5000/test:modern-zstdchunked",
		"quay.io/x/y@sha256:" + strings.Repeat("0", 64),
		"registry.example:5000/a/b/c:tag@sha256:" + strings.Repeat("a", 64),
		"localhost/app",
	} {
		got, ok := decodeRef(refDirName(ref))
		if !ok || got != ref {
			t.Errorf("decodeRef(b64 %q) = %q, %v", ref, got, ok)
		}
	}
	for _, name := range []string{
		"",
		"%%%",
		refDirName("docker.io/library/busybox:latest") + "=",
		strings.TrimRight(refDirName("docker.io/x"), "="),
		refDirName("UPPER/case"),
		refDirName("https://docker.io/x"),
		refDirName("a b"),
		refDirName("x@sha256:short"),
	} {
		if ref, ok := decodeRef(name); ok {
			t.Errorf("decodeRef(%q) = %q, want rejected", name, ref)
		}
	}
}

func TestParseKey(t *testing.T) {
	hex := strings.Repeat("0f", 32)
	if k, ok := parseKey("sha256:" + hex); !ok || k.String() != "sha256:"+hex {
		t.Errorf("parseKey(valid) = %q, %v", k, ok)
	}
	for _, name := range []string{"", hex, "sha256:", "sha256:" + hex[:62], "sha256:" + strings.ToUpper(hex),
		"sha512:" + hex + hex, "sha384:" + hex + hex[:32], "md5:" + hex[:32], "sha256:" + hex + "\n"} {
		if k, ok := parseKey(name); ok {
			t.Errorf("parseKey(%q) = %q, want rejected", name, k)
		}
	}
}
