package fetcher

import (
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"time"
)

// Sentinel errors. Errors returned by a [Blob], a [Resolver] or a [Client] wrap one of them
// (test with errors.Is).
var (
	// ErrNotFound: the registry does not have the blob or manifest (404), or an index has
	// no manifest for the platform.
	ErrNotFound = errors.New("not found")
	// ErrUnauthorized: the registry, its token server or storage refused the credentials (401,
	// 403), or looking the credentials up failed (a malformed auth file).
	ErrUnauthorized = errors.New("unauthorized")
	// ErrTransient: a failure worth retrying (connection trouble, timeout, truncated body, 408,
	// 429, 5xx) that persisted through every attempt.
	ErrTransient = errors.New("transient failure")
	// ErrBadResponse: the server broke the protocol, e.g. a Content-Range other than the one
	// asked for, a malformed multipart body, or a size other than the blob's; or its TLS
	// certificate was refused.
	ErrBadResponse = errors.New("bad response")
	// ErrRangeUnsupported: the server refused a single-range request (400 or 416).
	ErrRangeUnsupported = errors.New("range request refused")
	// ErrInvalidRange: the caller asked for a range outside the blob.
	ErrInvalidRange = errors.New("invalid range")
	// ErrBlocked: registries.conf blocks the registry (blocked = true); nothing was sent to it.
	ErrBlocked = errors.New("registry blocked")
)

// Error is a failed blob request. URL never carries a query string or credentials.
type Error struct {
	URL        string // scheme://host/path of the request that failed
	StatusCode int    // HTTP status, 0 when no response was received
	Attempts   int    // how many attempts were made, when retries were exhausted
	Err        error  // wraps one of the package sentinels

	retryAfter    time.Duration // the server's Retry-After, when hasRetryAfter
	hasRetryAfter bool
}

func (e *Error) Error() string {
	var b strings.Builder
	b.WriteString("fetcher: GET ")
	b.WriteString(e.URL)
	if e.StatusCode != 0 {
		fmt.Fprintf(&b, ": status %d %s", e.StatusCode, http.StatusText(e.StatusCode))
	}
	b.WriteString(": ")
	b.WriteString(e.Err.Error())
	if e.Attempts > 1 {
		fmt.Fprintf(&b, " (after %d attempts)", e.Attempts)
	}
	return b.String()
}

func (e *Error) Unwrap() error { return e.Err }

// redact returns u without its query string, fragment and user information.
func redact(u *url.URL) string {
	c := *u
	c.User = nil
	c.RawQuery = ""
	c.ForceQuery = false
	c.Fragment = ""
	c.RawFragment = ""
	return c.String()
}

// scrubbed hides the secrets of a URL (query string, password) from the text of an error that
// came from below (a RoundTripper may quote the URL it was given).
type scrubbed struct {
	err     error
	secrets []string
}

func scrub(err error, u *url.URL) error {
	var secrets []string
	if u.RawQuery != "" {
		secrets = append(secrets, u.RawQuery)
	}
	if p, ok := u.User.Password(); ok && p != "" {
		secrets = append(secrets, p)
	}
	if len(secrets) == 0 {
		return err
	}
	return &scrubbed{err: err, secrets: secrets}
}

func (s *scrubbed) Error() string {
	msg := s.err.Error()
	for _, sec := range s.secrets {
		msg = strings.ReplaceAll(msg, sec, "REDACTED")
	}
	return msg
}

func (s *scrubbed) Unwrap() error { return s.err }
