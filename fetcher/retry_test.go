package fetcher

import (
	"context"
	"errors"
	"net/http"
	"testing"
	"time"

	"github.com/layerstore/layerstore/internal/byterange"
)

func TestRetryTransient(t *testing.T) {
	data := testBlob(1 << 20)
	tests := []struct {
		name  string
		fault func(*testRegistry) func(http.ResponseWriter, *http.Request, int) bool
		multi bool
	}{
		{"503 twice", func(*testRegistry) func(http.ResponseWriter, *http.Request, int) bool {
			return failStatus(2, http.StatusServiceUnavailable)
		}, false},
		{"500 then 502", func(*testRegistry) func(http.ResponseWriter, *http.Request, int) bool {
			return func(w http.ResponseWriter, r *http.Request, n int) bool {
				switch n {
				case 1:
					w.WriteHeader(http.StatusInternalServerError)
				case 2:
					w.WriteHeader(http.StatusBadGateway)
				default:
					return false
				}
				return true
			}
		}, false},
		{"connection reset twice", func(*testRegistry) func(http.ResponseWriter, *http.Request, int) bool {
			return resetConn(2)
		}, false},
		{"truncated body twice", func(reg *testRegistry) func(http.ResponseWriter, *http.Request, int) bool {
			return truncateBody(2, reg.data)
		}, false},
		{"truncated multipart body twice", func(reg *testRegistry) func(http.ResponseWriter, *http.Request, int) bool {
			return truncateBody(2, reg.data)
		}, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			reg := newTestRegistry(t, data)
			reg.serveRanges = true
			reg.fault = tt.fault(reg)
			b, sleeps := newTestBlob(t, reg, Config{initialBackoff: time.Second, maxBackoff: 4 * time.Second})
			if tt.multi {
				checkFetch(t, b, data, near1, far1)
			} else {
				checkFetch(t, b, data, far1)
			}
			if got := reg.count(); got != 3 {
				t.Errorf("%d requests, want 3", got)
			}
			// Jittered exponential backoff: [d/2, d] with d = 1 s, then 2 s.
			ds := sleeps.delays()
			if len(ds) != 2 || ds[0] < 500*time.Millisecond || ds[0] > time.Second ||
				ds[1] < time.Second || ds[1] > 2*time.Second {
				t.Errorf("backoff delays = %v, want one in [0.5s, 1s] then one in [1s, 2s]", ds)
			}
			if st := b.Stats(); st.Retries != 2 {
				t.Errorf("Retries = %d, want 2", st.Retries)
			}
		})
	}
}

func TestRetryExhausted(t *testing.T) {
	data := testBlob(1000)
	reg := newTestRegistry(t, data)
	reg.fault = failStatus(99, http.StatusInternalServerError)
	b, sleeps := newTestBlob(t, reg, Config{initialBackoff: time.Second, maxBackoff: 2 * time.Second})
	_, err := b.ReadAt(t.Context(), make([]byte, 10), 0)
	var fe *Error
	if !errors.Is(err, ErrTransient) || !errors.As(err, &fe) || fe.StatusCode != 500 || fe.Attempts != 4 {
		t.Fatalf("error = %v, want an *Error wrapping ErrTransient with status 500 after 4 attempts", err)
	}
	if got := reg.count(); got != 4 {
		t.Errorf("%d requests, want 4", got)
	}
	ds := sleeps.delays()
	if len(ds) != 3 {
		t.Fatalf("slept %d times, want 3", len(ds))
	}
	for _, d := range ds {
		if d > 2*time.Second {
			t.Errorf("backoff %v exceeds the 2s cap", d)
		}
	}

	// WithMaxAttempts changes the count.
	reg2 := newTestRegistry(t, data)
	reg2.fault = resetConn(99)
	b2, _ := newTestBlob(t, reg2, Config{MaxAttempts: 2})
	if _, err := b2.ReadAt(t.Context(), make([]byte, 10), 0); !errors.Is(err, ErrTransient) {
		t.Fatalf("error = %v, want ErrTransient", err)
	}
	if got := reg2.count(); got != 2 {
		t.Errorf("%d requests with 2 attempts, want 2", got)
	}
}

func TestRetryAfter(t *testing.T) {
	data := testBlob(1000)
	now := time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC)
	tests := []struct {
		name   string
		status int
		value  string
		want   time.Duration
	}{
		{"429 seconds", http.StatusTooManyRequests, "7", 7 * time.Second},
		{"503 seconds", http.StatusServiceUnavailable, "3", 3 * time.Second},
		{"429 zero", http.StatusTooManyRequests, "0", 0},
		{"429 date", http.StatusTooManyRequests, now.Add(4 * time.Second).Format(http.TimeFormat), 4 * time.Second},
		{"429 past date", http.StatusTooManyRequests, now.Add(-time.Hour).Format(http.TimeFormat), 0},
		{"429 capped", http.StatusTooManyRequests, "3600", DefaultMaxBackoff},
		{"429 date capped", http.StatusTooManyRequests, now.Add(time.Hour).Format(http.TimeFormat), DefaultMaxBackoff},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			reg := newTestRegistry(t, data)
			reg.fault = failStatus(1, tt.status, "Retry-After", tt.value)
			b, sleeps := newTestBlob(t, reg, Config{now: func() time.Time { return now }})
			checkFetch(t, b, data, byterange.Range{Offset: 10, Length: 20})
			if ds := sleeps.delays(); len(ds) != 1 || ds[0] != tt.want {
				t.Errorf("slept %v, want [%v]", ds, tt.want)
			}
			if got := reg.count(); got != 2 {
				t.Errorf("%d requests, want 2", got)
			}
		})
	}
}

// TestRequestTimeout: a body that stalls is abandoned after the per-request timeout and the
// request is retried.
func TestRequestTimeout(t *testing.T) {
	data := testBlob(1 << 20)
	reg := newTestRegistry(t, data)
	reg.fault = hangBody(1, data)
	b, _ := newTestBlob(t, reg, Config{RequestTimeout: 500 * time.Millisecond})
	checkFetch(t, b, data, far1)
	if got := reg.count(); got != 2 {
		t.Errorf("%d requests, want 2", got)
	}
}

// TestCancelDuringBackoff: a caller giving up while waiting to retry gets its context's error.
func TestCancelDuringBackoff(t *testing.T) {
	data := testBlob(1000)
	reg := newTestRegistry(t, data)
	reg.fault = failStatus(99, http.StatusServiceUnavailable)
	ctx, cancel := context.WithCancel(t.Context())
	b, _ := newTestBlob(t, reg, Config{sleep: func(ctx context.Context, _ time.Duration) error {
		cancel()
		return ctx.Err()
	}})
	_, err := b.ReadAt(ctx, make([]byte, 10), 0)
	if !errors.Is(err, context.Canceled) || errors.Is(err, ErrTransient) {
		t.Fatalf("error = %v, want context.Canceled", err)
	}
	if got := reg.count(); got != 1 {
		t.Errorf("%d requests, want 1", got)
	}
}
