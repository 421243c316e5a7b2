package main

import (
	"context"

	"github.com/opencontainers/go-digest"

	storefs "github.com/layerstore/layerstore/fs"
	"github.com/layerstore/layerstore/layer"
)

// managerStore is the manager as the namespace's store: package layer does not know of
// package storefs (nor links FUSE), whose interfaces its types satisfy; this is where the two
// meet.
type managerStore struct{ *layer.Manager }

var (
	_ storefs.Store   = managerStore{}
	_ storefs.Layer   = (*layer.Served)(nil)
	_ storefs.Refuser = (*layer.Served)(nil)
)

func (s managerStore) Lookup(ctx context.Context, ref string, key digest.Digest) (storefs.Layer, error) {
	l, err := s.Manager.Lookup(ctx, ref, key)
	if err != nil {
		return nil, err // not a nil *layer.Layer in a non-nil storefs.Layer
	}
	return l, nil
}
