package verify

import (
	"errors"
	"fmt"

	"github.com/layerstore/layerstore/chunked"
	digest "github.com/opencontainers/go-digest"
)

var (
	// ErrDigestMismatch reports content whose digest differs from the one it is anchored to.
	ErrDigestMismatch = errors.New("digest mismatch")
	// ErrCorrupt reports compressed data that does not decompress to what the TOC says.
	ErrCorrupt = errors.New("corrupt compressed data")
	// ErrNoDiffIDProof reports a layer whose format cannot bind its TOC to the DiffID.
	ErrNoDiffIDProof = errors.New("format cannot prove the DiffID without the whole blob")
	// ErrUnproven reports a layer whose tar-split could not be read when its user could wait
	// no longer for the bytes that prove its TOC (Verifier.ReadTarSplit, final).
	ErrUnproven = errors.New("the tar-split that proves the TOC could not be read")
)

// LayerError says which layer an error is about.
type LayerError struct {
	Layer  digest.Digest
	Format chunked.Format
	Err    error
}

func (e *LayerError) Error() string {
	if e.Format == chunked.FormatUnknown {
		return fmt.Sprintf("layer %s: %v", e.Layer, e.Err)
	}
	return fmt.Sprintf("%s layer %s: %v", e.Format, e.Layer, e.Err)
}

func (e *LayerError) Unwrap() error { return e.Err }

// MismatchError details a digest mismatch.
type MismatchError struct {
	What      string // "TOC", "tar-split", "chunk 3 of usr/bin/tool", "DiffID"
	Want, Got digest.Digest
}

func (e *MismatchError) Error() string {
	return fmt.Sprintf("%s: %v: want %s, got %s", e.What, ErrDigestMismatch, e.Want, e.Got)
}

func (e *MismatchError) Unwrap() error { return ErrDigestMismatch }

func checkDigest(what string, want digest.Digest, data []byte) error {
	if got := digest.SHA256.FromBytes(data); got != want {
		return &MismatchError{What: what, Want: want, Got: got}
	}
	return nil
}
