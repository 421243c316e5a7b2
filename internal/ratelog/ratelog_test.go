package ratelog

import (
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/layerstore/layerstore/internal/testutil/testlog"
)

// TestLogBounded: one line per key per interval; the next line counts the occurrences in
// between, counted ones included; keys are independent.
func TestLogBounded(t *testing.T) {
	var h testlog.Handler
	r := New(slog.New(&h), 30*time.Second)
	now := time.Unix(1e9, 0)
	for i := range 100 {
		r.Log(now.Add(time.Duration(i)*time.Millisecond), "a", slog.LevelWarn, "failing", "i", i)
	}
	r.Count("a")
	r.Log(now, "b", slog.LevelWarn, "other")
	if warns, lines := h.Count(); warns != 2 {
		t.Fatalf("%d lines, want 2: %q", warns, lines)
	}
	r.Log(now.Add(30*time.Second), "a", slog.LevelWarn, "failing")
	warns, lines := h.Count()
	if warns != 3 || !strings.Contains(lines[2], "repeated=100") {
		t.Errorf("%d lines, the last %q, want 3 and repeated=100", warns, lines[len(lines)-1])
	}
}
