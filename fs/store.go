package storefs

import (
	"context"
	"os"

	"github.com/opencontainers/go-digest"

	"github.com/layerstore/layerstore/chunked"
)

// Store is what the filesystem serves. The layer package implements it; fs only translates
// FUSE calls into these calls and their errors into errnos (see errno.go).
//
// Errors wrapping io/fs.ErrNotExist mean "not served here" and answer ENOENT: the runtime then
// pulls the layer normally. Every other error answers EIO. Implementations bound the time a
// lookup may take themselves; fs passes the request's context.
type Store interface {
	// Lookup returns the layer whose key (TOC digest or compressed blob digest) is key in the
	// image ref (c/image's normalized reference string, e.g. "127.0.0.1:5000/app:v1").
	Lookup(ctx context.Context, ref string, key digest.Digest) (Layer, error)
	// Use records one user of the layer (the runtime created <ref>/<key>/use).
	Use(ref string, key digest.Digest)
	// Release drops one user of the layer (the runtime removed the <ref>/<key> directory).
	// Releasing a layer with no users, or one the store does not track, does nothing.
	Release(ref string, key digest.Digest)
}

// Layer is one resolved, verified layer. Its methods are safe for concurrent use.
type Layer interface {
	// Index is the layer's verified index: the diff tree is built from it.
	Index() *chunked.Index
	// Info returns the content of the layer's info file as seen through key: the JSON
	// c/storage decodes into its Layer for the lookup generation key implies.
	Info(key digest.Digest) []byte
	// ReadFile reads verified content of the regular file id (an inode owner) at off. It
	// fills p up to the end of the file; a short count means the end of the file.
	ReadFile(ctx context.Context, id chunked.EntryID, p []byte, off int64) (int, error)
	// Backing returns an open read-only file holding the whole verified content of regular
	// file id, when it is complete locally, for FUSE passthrough; nil otherwise. The caller
	// closes it.
	Backing(id chunked.EntryID) *os.File
	// Executing tells the layer that the kernel opened regular file id to execute it (an
	// execve of the file, or of a program whose interpreter it is): a hint, which returns
	// at once.
	Executing(id chunked.EntryID)
	// BlobSize is the size of the compressed layer blob.
	BlobSize() int64
	// ReadBlob reads the raw compressed blob (served as the blob file for export). It fills
	// p up to the end of the blob.
	ReadBlob(ctx context.Context, p []byte, off int64) (int, error)
}

// Refuser is implemented by layers that the Store may refuse after handing them out (the layer
// package refuses a zstd:chunked layer whose tar-split contradicts its TOC, after a modern
// lookup was answered). Refused returns the refusal, nil while the layer is served; once it
// is set the namespace answers nothing of the layer any more (its tree's lookups, attributes,
// listings, symlinks, xattrs, info, blob, opens and reads fail with EIO).
//
// Refusal returns a channel closed once Refused is set (nil for a layer that is never
// refused): the namespace then drops what the kernel cached of the layer's directory and tree
// (entries, attributes, pages), so that the next access asks the daemon and fails too. What it
// cannot revoke: files already open with passthrough, and names the tree lacks that the kernel
// cached as absent.
type Refuser interface {
	Refused() error
	Refusal() <-chan struct{}
}
