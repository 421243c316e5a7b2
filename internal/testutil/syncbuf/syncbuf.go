// Package syncbuf is a buffer that a child process (its stdout or stderr) or a logger writes
// while the tests and benchmarks that started it read it.
package syncbuf

import (
	"bytes"
	"sync"
)

// Buffer is a bytes.Buffer safe for concurrent writers and readers.
type Buffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *Buffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

// Len returns how many bytes were written.
func (l *Buffer) Len() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Len()
}

// From returns what was written from offset off on.
func (l *Buffer) From(off int) string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return string(l.b.Bytes()[off:])
}

// String returns everything written.
func (l *Buffer) String() string { return l.From(0) }
