package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"go.podman.io/image/v5/copy"
	"go.podman.io/image/v5/docker"
	"go.podman.io/image/v5/docker/archive"
	"go.podman.io/image/v5/docker/reference"
	istorage "go.podman.io/image/v5/storage"
	"go.podman.io/image/v5/types"
	"go.podman.io/storage"
)

// pullResult is the JSON printed by "harness pull".
type pullResult struct {
	ImageID        string        `json:"imageID"`
	ManifestDigest string        `json:"manifestDigest"`
	PullSeconds    float64       `json:"pullSeconds"`
	Layers         []layerReport `json:"layers"` // bottom to top
	Listing        *string       `json:"listing,omitempty"`
	Saved          string        `json:"saved,omitempty"`
	Pushed         string        `json:"pushed,omitempty"` // manifest digest
	PushedLayers   []string      `json:"pushedLayers,omitempty"`
	Removed        bool          `json:"removed,omitempty"`
}

// layerReport describes one c/storage layer of the pulled image.
type layerReport struct {
	ID                 string `json:"id"`
	CompressedDigest   string `json:"compressedDigest"`
	UncompressedDigest string `json:"uncompressedDigest"`
	TOCDigest          string `json:"tocDigest"`
	// Additional is true when c/storage took the layer from an additional layer store
	// (it marks those with <graphroot>/overlay/<id>/additionallayer).
	Additional bool `json:"additional"`
}

// pullFlags are the actions "harness pull" performs after the pull, in this order.
type pullFlags struct {
	pause string
	list  string
	save  string
	push  string
	rmi   bool
}

func runPull(ctx context.Context, args []string) (any, error) {
	var common commonFlags
	var pf pullFlags
	fs := newFlagSet("pull", &common)
	fs.StringVar(&pf.pause, "pause", "", "after the pull, create this file and wait until it is removed before the other steps")
	fs.StringVar(&pf.list, "list", "", "run this busybox sh script in the read-only mounted image; its stdout becomes \"listing\"")
	fs.StringVar(&pf.save, "save", "", "save the pulled image as a docker-archive at this path")
	fs.StringVar(&pf.push, "push", "", "push the pulled image to this registry reference (no docker:// prefix)")
	fs.BoolVar(&pf.rmi, "rmi", false, "delete the image and its layers at the end")
	pos, err := parseArgs(fs, args)
	if err != nil {
		return nil, err
	}
	if len(pos) != 1 {
		return nil, fmt.Errorf("%w: pull needs exactly one REF", errUsage)
	}
	named, err := parseNamed(pos[0])
	if err != nil {
		return nil, err
	}
	var pushRef types.ImageReference
	if pf.push != "" {
		pushNamed, err := parseNamed(pf.push)
		if err != nil {
			return nil, fmt.Errorf("--push: %w", err)
		}
		if pushRef, err = docker.NewReference(pushNamed); err != nil {
			return nil, fmt.Errorf("--push: %w", err)
		}
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

	opts, err := storage.DefaultStoreOptions()
	if err != nil {
		return nil, fmt.Errorf("reading storage configuration: %w", err)
	}
	store, err := storage.GetStore(opts)
	if err != nil {
		return nil, fmt.Errorf("opening store: %w", err)
	}
	istorage.Transport.SetStore(store)
	p := &puller{rc: rc, store: store, named: named, flags: pf, pushRef: pushRef}
	res, err := p.run(ctx)
	if _, serr := store.Shutdown(false); serr != nil {
		err = errors.Join(err, fmt.Errorf("shutting down store: %w", serr))
	}
	return res, err
}

// parseNamed parses a registry reference the way podman does: docker.io defaults, :latest
// when there is neither tag nor digest, and the digest wins over a tag when both are given.
// A docker:// prefix is accepted.
func parseNamed(s string) (reference.Named, error) {
	named, err := reference.ParseNormalizedNamed(strings.TrimPrefix(s, "docker://"))
	if err != nil {
		return nil, fmt.Errorf("parsing reference %q: %w", s, err)
	}
	if c, ok := named.(reference.Canonical); ok {
		return reference.WithDigest(reference.TrimNamed(named), c.Digest())
	}
	return reference.TagNameOnly(named), nil
}

// puller performs one pull and the actions that follow it on one open store.
type puller struct {
	rc      *runContext
	store   storage.Store
	named   reference.Named
	flags   pullFlags
	pushRef types.ImageReference // nil without --push
}

func (p *puller) run(ctx context.Context) (*pullResult, error) {
	src, err := docker.NewReference(p.named)
	if err != nil {
		return nil, fmt.Errorf("source reference: %w", err)
	}
	dst, err := istorage.Transport.NewStoreReference(p.store, p.named, "")
	if err != nil {
		return nil, fmt.Errorf("storage reference: %w", err)
	}
	start := time.Now()
	m, err := p.rc.copyImage(ctx, dst, src, &copy.Options{})
	if err != nil {
		return nil, err
	}
	res := &pullResult{PullSeconds: time.Since(start).Seconds()}
	if res.ManifestDigest, _, err = manifestDigests(m); err != nil {
		return nil, err
	}
	// From here on, use the image by ID: the tag could move under us.
	local, img, err := istorage.ResolveReference(dst)
	if err != nil {
		return nil, fmt.Errorf("resolving pulled image: %w", err)
	}
	res.ImageID = img.ID
	res.Layers, err = p.layers(img.TopLayer)
	if err == nil && p.flags.pause != "" {
		err = pause(ctx, "--pause", p.flags.pause)
	}
	if err == nil {
		err = p.use(ctx, res, img.ID, local)
	}
	// --rmi cleans up even when a step above failed.
	if p.flags.rmi {
		if _, derr := p.store.DeleteImage(img.ID, true); derr != nil {
			err = errors.Join(err, fmt.Errorf("deleting image %s: %w", img.ID, derr))
		} else {
			res.Removed = true
		}
	}
	if err != nil {
		return nil, err
	}
	return res, nil
}

// use runs the --list, --save and --push steps on the pulled image, in that order.
func (p *puller) use(ctx context.Context, res *pullResult, imageID string, local types.ImageReference) error {
	if p.flags.list != "" {
		out, err := p.list(ctx, imageID, p.flags.list)
		if err != nil {
			return err
		}
		res.Listing = &out
	}
	if p.flags.save != "" {
		if err := p.save(ctx, local, p.flags.save); err != nil {
			return err
		}
		res.Saved = p.flags.save
	}
	if p.pushRef != nil {
		var err error
		if res.Pushed, res.PushedLayers, err = p.push(ctx, local, p.pushRef); err != nil {
			return err
		}
	}
	return nil
}

// layers reports the layer chain ending at top, bottom layer first.
func (p *puller) layers(top string) ([]layerReport, error) {
	var out []layerReport
	for id := top; id != ""; {
		l, err := p.store.Layer(id)
		if err != nil {
			return nil, fmt.Errorf("reading layer %s: %w", id, err)
		}
		marker := filepath.Join(p.store.GraphRoot(), p.store.GraphDriverName(), l.ID, "additionallayer")
		_, statErr := os.Lstat(marker)
		if statErr != nil && !errors.Is(statErr, os.ErrNotExist) {
			return nil, fmt.Errorf("checking layer %s: %w", l.ID, statErr)
		}
		out = append(out, layerReport{
			ID:                 l.ID,
			CompressedDigest:   l.CompressedDigest.String(),
			UncompressedDigest: l.UncompressedDigest.String(),
			TOCDigest:          l.TOCDigest.String(),
			Additional:         statErr == nil,
		})
		id = l.Parent
	}
	slices.Reverse(out)
	return out, nil
}

// list mounts the image read-only, runs script with the image's busybox sh chrooted into
// it, and returns the script's stdout.
func (p *puller) list(ctx context.Context, imageID, script string) (out string, retErr error) {
	mnt, err := p.store.MountImage(imageID, nil, "")
	if err != nil {
		return "", fmt.Errorf("mounting image %s: %w", imageID, err)
	}
	defer func() {
		if _, err := p.store.UnmountImage(imageID, true); err != nil {
			retErr = errors.Join(retErr, fmt.Errorf("unmounting image %s: %w", imageID, err))
		}
	}()
	return runChrooted(ctx, mnt, script)
}

// runChrooted runs script with the busybox sh of the root file system at mnt, chrooted into
// it, and returns the script's stdout, which must not be empty.
func runChrooted(ctx context.Context, mnt, script string) (string, error) {
	var stdout, stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, "chroot", mnt, "/bin/busybox", "sh", "-c", script)
	cmd.Env = []string{"PATH=/bin:/sbin:/usr/bin:/usr/sbin", "HOME=/"}
	cmd.Dir = "/"
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("running --list script in %s: %w: %s", mnt, err, strings.TrimSpace(stderr.String()))
	}
	if stdout.Len() == 0 {
		// Say what the mount showed, so that an empty listing can be told from a failed one.
		var names []string
		entries, derr := os.ReadDir(mnt)
		for _, e := range entries {
			names = append(names, e.Name())
		}
		return "", fmt.Errorf("--list script printed nothing (stderr: %q); the mount %s has %v (%v)", strings.TrimSpace(stderr.String()), mnt, names, derr)
	}
	return stdout.String(), nil
}

// push copies the image to dst with the compression c/image chooses, and returns the
// pushed manifest's digest and layer digests. It uses a blob-info cache of its own: with
// the pull's cache, c/image would mount the pulled blobs from the source repository
// (same registry) instead of uploading them, and never read the layers from the store.
func (p *puller) push(ctx context.Context, local, dst types.ImageReference) (string, []string, error) {
	sys, err := p.rc.systemContext(pushCache)
	if err != nil {
		return "", nil, err
	}
	m, err := p.rc.copyImage(ctx, dst, local, &copy.Options{SourceCtx: sys, DestinationCtx: sys})
	if err != nil {
		return "", nil, err
	}
	return manifestDigests(m)
}

// save writes the image as a docker-archive, which reads every layer blob from the store.
func (p *puller) save(ctx context.Context, local types.ImageReference, path string) error {
	var tagged reference.NamedTagged // docker-archive cannot name a digest reference
	if t, ok := p.named.(reference.NamedTagged); ok {
		tagged = t
	}
	dst, err := archive.NewReference(path, tagged)
	if err != nil {
		return fmt.Errorf("--save: %w", err)
	}
	_, err = p.rc.copyImage(ctx, dst, local, &copy.Options{})
	return err
}

// pause creates path and returns once it is gone, or ctx is done: the caller can change the
// world (restart the store, stop the registry) between a pull and the use of the image by the
// same process, which knows the layers it took from an additional layer store (without the
// daemon's records another process would not: docs/upstream-cstorage.md), or kill the process while it
// holds a container mounted (run --hold). flag names the option in errors.
func pause(ctx context.Context, flag, path string) error {
	if err := os.WriteFile(path, nil, 0o644); err != nil {
		return fmt.Errorf("%s: %w", flag, err)
	}
	for {
		if _, err := os.Lstat(path); errors.Is(err, os.ErrNotExist) {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s: %s still there: %w", flag, path, ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
}
