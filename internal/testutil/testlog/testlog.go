// Package testlog gives tests a slog.Handler that keeps what was logged, so that they can
// count warnings and look for lines.
package testlog

import (
	"context"
	"log/slog"
	"sync"
)

// Handler keeps every record as one line ("LEVEL message key=value ...") and counts those at
// or above Warn. The zero value is ready; it is safe for concurrent use.
type Handler struct {
	mu    sync.Mutex
	warns int
	lines []string
}

func (h *Handler) Enabled(context.Context, slog.Level) bool { return true }

func (h *Handler) Handle(_ context.Context, r slog.Record) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if r.Level >= slog.LevelWarn {
		h.warns++
	}
	line := r.Level.String() + " " + r.Message
	r.Attrs(func(a slog.Attr) bool { line += " " + a.String(); return true })
	h.lines = append(h.lines, line)
	return nil
}

func (h *Handler) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h *Handler) WithGroup(string) slog.Handler      { return h }

// Count returns the number of warnings (and errors) and every line so far.
func (h *Handler) Count() (warns int, lines []string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.warns, append([]string(nil), h.lines...)
}
