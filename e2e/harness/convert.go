package main

import (
	"context"
	"fmt"

	"go.podman.io/image/v5/copy"
	"go.podman.io/image/v5/pkg/compression"
	istorage "go.podman.io/image/v5/storage"
	"go.podman.io/image/v5/transports/alltransports"
	"go.podman.io/image/v5/types"
)

// convertResult is the JSON printed by "harness convert".
type convertResult struct {
	// Digest is the digest of the manifest (or index, with --all) written to DST.
	Digest string `json:"digest"`
	// Layers are the layer digests of that manifest; absent for an index.
	Layers []string `json:"layers,omitempty"`
}

func runConvert(ctx context.Context, args []string) (any, error) {
	var common commonFlags
	fs := newFlagSet("convert", &common)
	compress := fs.String("compress", "zstd:chunked", "compression forced on every destination layer: gzip, zstd, zstd:chunked")
	all := fs.Bool("all", false, "copy every image of a multi-arch source, not only the one for this platform")
	srcTLSVerify := fs.Bool("src-tls-verify", true, "verify TLS of a docker:// source")
	dstTLSVerify := fs.Bool("dest-tls-verify", true, "verify TLS of a docker:// destination")
	pos, err := parseArgs(fs, args)
	if err != nil {
		return nil, err
	}
	if len(pos) != 2 {
		return nil, fmt.Errorf("%w: convert needs SRC and DST", errUsage)
	}
	algo, err := compression.AlgorithmByName(*compress)
	if err != nil {
		return nil, fmt.Errorf("%w: --compress: %w", errUsage, err)
	}
	src, err := alltransports.ParseImageName(pos[0])
	if err != nil {
		return nil, fmt.Errorf("parsing SRC %q: %w", pos[0], err)
	}
	dst, err := alltransports.ParseImageName(pos[1])
	if err != nil {
		return nil, fmt.Errorf("parsing DST %q: %w", pos[1], err)
	}
	ctx, cancel, err := common.apply(ctx)
	if err != nil {
		return nil, err
	}
	defer cancel()

	rc, err := newRunContext()
	if err != nil {
		return nil, err
	}
	defer rc.close()
	// A containers-storage: SRC or DST opens the default store lazily; shut it down.
	defer func() {
		if s := istorage.Transport.GetStoreIfSet(); s != nil {
			_, _ = s.Shutdown(false)
		}
	}()

	srcCtx, err := rc.systemContext(mainCache)
	if err != nil {
		return nil, err
	}
	dstCtx, err := rc.systemContext(mainCache)
	if err != nil {
		return nil, err
	}
	if !*srcTLSVerify {
		srcCtx.DockerInsecureSkipTLSVerify = types.OptionalBoolTrue
	}
	if !*dstTLSVerify {
		dstCtx.DockerInsecureSkipTLSVerify = types.OptionalBoolTrue
	}
	dstCtx.CompressionFormat = &algo
	opts := &copy.Options{
		SourceCtx:              srcCtx,
		DestinationCtx:         dstCtx,
		ForceCompressionFormat: true,
	}
	if *all {
		opts.ImageListSelection = copy.CopyAllImages
	}
	m, err := rc.copyImage(ctx, dst, src, opts)
	if err != nil {
		return nil, err
	}
	d, layers, err := manifestDigests(m)
	if err != nil {
		return nil, err
	}
	return convertResult{Digest: d, Layers: layers}, nil
}
