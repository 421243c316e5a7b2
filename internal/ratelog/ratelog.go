// Package ratelog owns logging at a bounded rate: a failure that every request meets (a full
// disk, a registry down while a container walks its tree) logs one line per key per interval,
// and that line counts the occurrences not logged since the previous one ("repeated"), so
// that it neither floods the journal (whose own rate limit would then drop every line of the
// service, the important ones too) nor hides how often it happened.
//
// A Logger is safe for concurrent use; its lock is a leaf (taken under any other lock, none
// under it). Keys come from a fixed set (messages, operations): the memory a Logger holds is
// bounded by that set.
package ratelog

import (
	"context"
	"log/slog"
	"sync"
	"time"
)

// Logger logs a message at most once per interval per key.
type Logger struct {
	log   *slog.Logger
	every time.Duration

	mu   sync.Mutex
	last map[string]time.Time
	seen map[string]int64 // occurrences not logged since the last line
}

// New returns a Logger writing to log at most once per every per key.
func New(log *slog.Logger, every time.Duration) *Logger {
	return &Logger{log: log, every: every, last: map[string]time.Time{}, seen: map[string]int64{}}
}

// Log logs msg with args at level, unless a line of key was logged less than the interval
// before now, in which case it only counts it.
func (r *Logger) Log(now time.Time, key string, level slog.Level, msg string, args ...any) {
	r.mu.Lock()
	last, ok := r.last[key]
	if ok && now.Sub(last) < r.every {
		r.seen[key]++
		r.mu.Unlock()
		return
	}
	repeated := r.seen[key]
	r.last[key], r.seen[key] = now, 0
	r.mu.Unlock()
	if repeated > 0 {
		args = append(args, "repeated", repeated)
	}
	r.log.Log(context.Background(), level, msg, args...)
}

// Count counts an occurrence of key without logging it: the next line of key reports it.
func (r *Logger) Count(key string) {
	r.mu.Lock()
	r.seen[key]++
	r.mu.Unlock()
}
