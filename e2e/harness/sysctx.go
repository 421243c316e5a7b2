package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"go.podman.io/image/v5/copy"
	"go.podman.io/image/v5/manifest"
	"go.podman.io/image/v5/signature"
	"go.podman.io/image/v5/types"
)

// runContext holds what every copy of one run shares.
type runContext struct {
	policy    *signature.PolicyContext
	cacheRoot string // fresh blob-info caches live below, removed by close
	progress  io.Writer
}

// Names of the blob-info caches of a run, see systemContext.
const (
	mainCache = "main"
	pushCache = "push"
)

// newRunContext builds the accept-anything policy and a fresh directory for blob-info caches.
func newRunContext() (*runContext, error) {
	policy, err := signature.NewPolicyContext(&signature.Policy{
		Default: signature.PolicyRequirements{signature.NewPRInsecureAcceptAnything()},
	})
	if err != nil {
		return nil, fmt.Errorf("creating signature policy: %w", err)
	}
	dir, err := os.MkdirTemp("", "harness-blobinfocache-")
	if err != nil {
		_ = policy.Destroy()
		return nil, fmt.Errorf("creating blob-info cache dir: %w", err)
	}
	return &runContext{policy: policy, cacheRoot: dir, progress: os.Stderr}, nil
}

func (r *runContext) close() {
	_ = r.policy.Destroy()
	_ = os.RemoveAll(r.cacheRoot)
}

// systemContext returns a SystemContext configured the way podman configures one from
// its environment, using the blob-info cache named cache (created on first use, empty).
// REGISTRY_AUTH_FILE is podman's convention, applied here. registries.conf comes from
// CONTAINERS_REGISTRIES_CONF: c/image >= 5.42 reads it itself (and then reads no drop-in
// directory), older ones (CRI-O's 5.38) do not, their callers pass the path; so the path is
// passed here for both, with an empty drop-in directory, and both read that file alone.
func (r *runContext) systemContext(cache string) (*types.SystemContext, error) {
	dir := filepath.Join(r.cacheRoot, cache)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("creating blob-info cache dir: %w", err)
	}
	sys := &types.SystemContext{
		BlobInfoCacheDir: dir,
		AuthFilePath:     os.Getenv("REGISTRY_AUTH_FILE"),
	}
	if conf := os.Getenv("CONTAINERS_REGISTRIES_CONF"); conf != "" {
		dropIns := filepath.Join(r.cacheRoot, "registries.conf.d")
		if err := os.MkdirAll(dropIns, 0o700); err != nil {
			return nil, err
		}
		sys.SystemRegistriesConfPath, sys.SystemRegistriesConfDirPath = conf, dropIns
	}
	return sys, nil
}

// copyImage runs copy.Image with the progress going to stderr, and returns the manifest
// written to dst. Source and destination contexts not set in opts use the main cache.
func (r *runContext) copyImage(ctx context.Context, dst, src types.ImageReference, opts *copy.Options) ([]byte, error) {
	opts.ReportWriter = r.progress
	var err error
	if opts.SourceCtx == nil {
		if opts.SourceCtx, err = r.systemContext(mainCache); err != nil {
			return nil, err
		}
	}
	if opts.DestinationCtx == nil {
		if opts.DestinationCtx, err = r.systemContext(mainCache); err != nil {
			return nil, err
		}
	}
	m, err := copy.Image(ctx, r.policy, dst, src, opts)
	if err != nil {
		return nil, fmt.Errorf("copying %s to %s: %w", refString(src), refString(dst), err)
	}
	return m, nil
}

// manifestDigests returns the digest of a manifest and, for a single-image manifest, the
// digests of its layers (nil for a manifest list or index).
func manifestDigests(m []byte) (string, []string, error) {
	d, err := manifest.Digest(m)
	if err != nil {
		return "", nil, fmt.Errorf("computing manifest digest: %w", err)
	}
	mt := manifest.GuessMIMEType(m)
	if manifest.MIMETypeIsMultiImage(mt) {
		return d.String(), nil, nil
	}
	parsed, err := manifest.FromBlob(m, mt)
	if err != nil {
		return "", nil, fmt.Errorf("parsing manifest %s: %w", d, err)
	}
	var layers []string
	for _, l := range parsed.LayerInfos() {
		layers = append(layers, l.Digest.String())
	}
	return d.String(), layers, nil
}

// refString names a reference with its transport, as podman prints it.
func refString(ref types.ImageReference) string {
	return ref.Transport().Name() + ":" + ref.StringWithinTransport()
}
