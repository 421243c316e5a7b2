package readahead

import (
	"bytes"
	"errors"
	"io"
	"sync/atomic"
	"testing"
	"testing/iotest"
	"time"
)

// counting yields n blocks of size bytes (block i holds byte i), then err (io.EOF for the
// end), counting its fills.
func counting(n, size int, err error, fills *atomic.Int32) Fill {
	i := 0
	return func(b []byte) ([]byte, error) {
		fills.Add(1)
		if i == n {
			return nil, err
		}
		if b == nil {
			b = make([]byte, size)
		}
		for k := range b {
			b[k] = byte(i)
		}
		i++
		return b, nil
	}
}

func want(n, size int) []byte {
	var w []byte
	for i := range n {
		w = append(w, bytes.Repeat([]byte{byte(i)}, size)...)
	}
	return w
}

// TestReader: what the fills yield is read in order, whatever the reads' sizes; a failure
// comes after the bytes before it; the filling is at most its blocks ahead of the reader;
// Close stops it and calls cancel, Drain reads it to its end.
func TestReader(t *testing.T) {
	var fills atomic.Int32
	r := New(2, counting(10, 1000, io.EOF, &fills), nil)
	if err := iotest.TestReader(r, want(10, 1000)); err != nil {
		t.Fatal(err)
	}
	if err := r.Close(); err != nil {
		t.Errorf("Close at the end = %v", err)
	}

	broken := errors.New("broken")
	r = New(3, counting(4, 100, broken, &fills), nil)
	got, err := io.ReadAll(r)
	if !errors.Is(err, broken) || !bytes.Equal(got, want(4, 100)) {
		t.Errorf("a failing stream: %d bytes, %v; want 400 then the failure", len(got), err)
	}
	if err := r.Close(); !errors.Is(err, broken) {
		t.Errorf("Close after a failure = %v", err)
	}

	// Nobody reads: the filling stops, its blocks full.
	fills.Store(0)
	canceled := false
	block := make(chan struct{})
	r = New(2, func(b []byte) ([]byte, error) {
		if fills.Add(1) > 2 {
			<-block // until canceled
			return nil, errors.New("canceled")
		}
		return []byte{1}, nil
	}, func() { canceled = true; close(block) })
	// The third fill waits for a free block (one read), then for block.
	if _, err := r.Read(make([]byte, 1)); err != nil {
		t.Fatal(err)
	}
	for fills.Load() < 3 {
		time.Sleep(time.Millisecond)
	}
	if err := r.Close(); err != nil || !canceled {
		t.Errorf("Close while filling = %v (cancel called: %v), want nil, called", err, canceled)
	}

	fills.Store(0)
	r = New(2, counting(50, 10, io.EOF, &fills), nil)
	if err := r.Drain(); err != nil || fills.Load() != 51 {
		t.Errorf("Drain = %v after %d fills, want nil after 51", err, fills.Load())
	}
}

// TestReaderAhead: the filling runs at most its blocks ahead of the reader.
func TestReaderAhead(t *testing.T) {
	var fills atomic.Int32
	r := New(3, counting(100, 10, io.EOF, &fills), nil)
	defer r.Close()
	if _, err := io.ReadFull(r, make([]byte, 10)); err != nil {
		t.Fatal(err)
	}
	// One block read: three ahead at most, the fourth waiting to hand its block over.
	time.Sleep(20 * time.Millisecond)
	if n := fills.Load(); n > 5 {
		t.Fatalf("%d fills with one block read, want at most 5", n)
	}
}
