package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	istorage "go.podman.io/image/v5/storage"
	"go.podman.io/image/v5/types"
	"go.podman.io/storage"
)

// runResult is the JSON printed by "harness run".
type runResult struct {
	Libraries   libraries `json:"libraries"`
	ImageID     string    `json:"imageID"`
	ContainerID string    `json:"containerID"`
	LayerID     string    `json:"layerID"` // the container's own layer
	MountPoint  string    `json:"mountPoint"`
	Listing     string    `json:"listing"`
	Removed     bool      `json:"removed"`
}

// runRun runs a script in a container of an image with CRI-O's storage steps
// (internal/storage/runtime.go in CRI-O): CreateContainer reads the image's config through
// c/image (ref.NewImage, which fails where a layer is not known) and creates a volatile
// container with CRI-O's metadata, names its layer NAME-layer; StartContainer mounts it;
// StopContainer unmounts it; RemoveContainer deletes it. The script runs between the mount
// and the unmount, with the image's /bin/busybox sh chrooted into the container's root.
func runRun(ctx context.Context, args []string) (any, error) {
	var common commonFlags
	fs := newFlagSet("run", &common)
	script := fs.String("list", "", "the busybox sh script to run in the container; its stdout becomes \"listing\" (required)")
	name := fs.String("name", "", "the container's name (default: harness-<random>)")
	hold := fs.String("hold", "", "once the script ran, create this file and wait, the container mounted, until it is removed (kill the harness then to leave the container behind as an unclean stop does)")
	pos, err := parseArgs(fs, args)
	if err != nil {
		return nil, err
	}
	if len(pos) != 1 {
		return nil, fmt.Errorf("%w: run needs exactly one IMAGE (a name or an ID)", errUsage)
	}
	if *script == "" {
		return nil, fmt.Errorf("%w: run needs --list SCRIPT", errUsage)
	}
	if *name == "" {
		b := make([]byte, 6)
		rand.Read(b)
		*name = "harness-" + hex.EncodeToString(b)
	}
	ctx, cancel, err := common.apply(ctx)
	if err != nil {
		return nil, err
	}
	defer cancel()
	res := &runResult{Libraries: builtWith()}
	err = withCRIOStore(ctx, func(store storage.Store) error {
		img, err := resolveImage(ctx, store, pos[0])
		if err != nil {
			return fmt.Errorf("resolving %s: %w", pos[0], err)
		}
		res.ImageID = img.ID
		return runContainer(ctx, store, img.ID, pos[0], *name, *script, *hold, res)
	})
	return res, failWith(res, err)
}

// runContainer creates, mounts, uses, unmounts and deletes one container of the image id.
func runContainer(ctx context.Context, store storage.Store, imageID, imageName, name, script, hold string, res *runResult) (retErr error) {
	// createContainerOrPodSandbox: the image's config, through c/image.
	if err := bounded(ctx, "reading the image's config", func() error {
		ref, err := istorage.Transport.NewStoreReference(store, nil, imageID)
		if err != nil {
			return err
		}
		img, err := ref.NewImage(ctx, &types.SystemContext{})
		if err != nil {
			return err
		}
		defer img.Close()
		_, err = img.OCIConfig(ctx)
		return err
	}); err != nil {
		return fmt.Errorf("reading image %s as CRI-O creates a container: %w", imageID, err)
	}
	// The harness's container is a pod's own (infra) container, as a sandbox is.
	id := randomID()
	md, err := json.Marshal(crioMetadata{PodName: name, PodID: id, ImageName: imageName, ImageID: imageID,
		ContainerName: name, MetadataName: name, CreatedAt: time.Now().Unix(), Pod: true})
	if err != nil {
		return err
	}
	var ctr *storage.Container
	if err := bounded(ctx, "creating the container", func() error {
		var err error
		ctr, err = store.CreateContainer(id, []string{name}, imageID, "", string(md), &storage.ContainerOptions{Volatile: true})
		return err
	}); err != nil {
		return fmt.Errorf("creating a container of %s: %w", imageID, err)
	}
	res.ContainerID, res.LayerID = ctr.ID, ctr.LayerID
	// From here on, a failure deletes the container, as CRI-O does; --hold killed leaves it.
	defer func() {
		if err := bounded(ctx, "deleting the container", func() error {
			if _, err := store.Unmount(ctr.ID, true); err != nil && !errors.Is(err, storage.ErrLayerUnknown) && !errors.Is(err, storage.ErrLayerNotMounted) {
				return err
			}
			return store.DeleteContainer(ctr.ID)
		}); err != nil {
			retErr = errors.Join(retErr, fmt.Errorf("deleting container %s: %w", ctr.ID, err))
			return
		}
		res.Removed = true
	}()
	if err := bounded(ctx, "naming the container's layer", func() error {
		return store.AddNames(ctr.LayerID, []string{name + "-layer"})
	}); err != nil {
		return fmt.Errorf("naming layer %s: %w", ctr.LayerID, err)
	}
	// StartContainer: the mount.
	if err := bounded(ctx, "mounting the container", func() error {
		var err error
		res.MountPoint, err = store.Mount(ctr.ID, "")
		return err
	}); err != nil {
		return fmt.Errorf("mounting container %s: %w", ctr.ID, err)
	}
	out, err := runChrooted(ctx, res.MountPoint, script)
	if err != nil {
		return err
	}
	res.Listing = out
	if hold != "" {
		if err := pause(ctx, "--hold", hold); err != nil {
			return err
		}
	}
	// StopContainer: the unmount; RemoveContainer: the deletion (deferred above).
	if err := bounded(ctx, "unmounting the container", func() error {
		_, err := store.Unmount(ctr.ID, true)
		return err
	}); err != nil {
		return fmt.Errorf("unmounting container %s: %w", ctr.ID, err)
	}
	return nil
}

// randomID returns a random 64-hex ID, as CRI-O makes container IDs.
func randomID() string {
	b := make([]byte, 32)
	rand.Read(b)
	return hex.EncodeToString(b)
}
