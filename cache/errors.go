package cache

import (
	"errors"
	"fmt"

	"github.com/layerstore/layerstore/chunked"
	"github.com/layerstore/layerstore/internal/byterange"
)

var (
	// ErrMissing reports a read of bytes the cache does not hold yet. Reads return it inside
	// a [*MissingError] that lists the missing ranges. It also reports a record that does
	// not exist (that error wraps [io/fs.ErrNotExist] too).
	ErrMissing = errors.New("cache: content not present")
	// ErrCorrupt reports a file whose assembled content does not hash to its digest, or a
	// record whose checksums fail. The cache drops such a file's content, or removes such a
	// record, before returning it.
	ErrCorrupt = errors.New("cache: content does not match its digest")
	// ErrClosed reports use of a closed [File] or [Cache].
	ErrClosed = errors.New("cache: closed")
	// ErrSizeMismatch reports an [Cache.Open] whose size differs from that of the stored
	// complete (or pinned) file with the same digest.
	ErrSizeMismatch = errors.New("cache: size differs from the stored file's")
	// ErrBadChunk reports a chunk that is empty or does not fit inside the file.
	ErrBadChunk = errors.New("cache: chunk does not fit the file")
	// ErrLocked reports a root directory already used by another [Cache] (in this process or
	// another one).
	ErrLocked = errors.New("cache: root directory in use")
	// ErrNoSpace reports a write refused because the cache's filesystem is full (or its
	// quota exhausted) even after evicting every file not in use that it could, or because
	// such a failure happened moments ago and writes are refused for a while. Nothing of
	// the write is recorded as present; the content can be fetched again later.
	ErrNoSpace = errors.New("cache: no space left on the cache's filesystem")
)

// MissingError lists the ranges a read needed that are not present. It unwraps to
// [ErrMissing].
type MissingError struct {
	File   chunked.Sum
	Ranges []byterange.Range // sorted, disjoint, within the file
}

func (e *MissingError) Error() string {
	if len(e.Ranges) == 0 {
		return fmt.Sprintf("%v: %v", e.File, ErrMissing)
	}
	return fmt.Sprintf("%v: %d byte(s) in %d range(s) from offset %d: %v",
		e.File, byterange.Set(e.Ranges).Bytes(), len(e.Ranges), e.Ranges[0].Offset, ErrMissing)
}

func (e *MissingError) Unwrap() error { return ErrMissing }
