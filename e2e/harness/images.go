package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strings"

	"github.com/opencontainers/go-digest"
	"go.podman.io/image/v5/docker/reference"
	istorage "go.podman.io/image/v5/storage"
	"go.podman.io/image/v5/types"
	"go.podman.io/storage"
)

// This file holds CRI-O's image service as it reads the store (internal/storage/image.go in
// CRI-O): ListImages and ImageStatus, which crictl images and inspecti call, and RemoveImage
// (server/image_remove.go), which crictl rmi calls.

// imageStatus is what CRI-O's image service reports of one image (its ImageResult), plus the
// layer chain and the error that made the image fail, if any.
type imageStatus struct {
	ID          string   `json:"id"`
	Names       []string `json:"names"`
	RepoTags    []string `json:"repoTags"`
	RepoDigests []string `json:"repoDigests"`
	Digest      string   `json:"digest,omitempty"`
	TopLayer    string   `json:"topLayer"`
	// Layers is the chain from the top layer down, as far as the store knows it.
	Layers []string `json:"layers"`
	// Size is CRI-O's size: img.Size() of c/image's storage image (data items, signatures and
	// the uncompressed size of each layer that records one); null where that fails.
	Size   *uint64 `json:"size"`
	User   string  `json:"user"`
	Pinned bool    `json:"pinned"`
	Error  string  `json:"error,omitempty"`
}

// imagesResult is the JSON printed by "harness images".
type imagesResult struct {
	Libraries libraries     `json:"libraries"`
	Images    []imageStatus `json:"images"`
}

// pinnedFlags collects --pinned patterns.
type pinnedFlags []string

func (p *pinnedFlags) String() string     { return strings.Join(*p, ",") }
func (p *pinnedFlags) Set(s string) error { *p = append(*p, s); return nil }

// pinnedMatcher reports whether an image name matches one of CRI-O's pinned_images patterns:
// "*word*" matches names containing word, "prefix*" names starting with prefix (both
// ignoring case), anything else the whole name (ignoring case).
func pinnedMatcher(patterns []string) func(string) bool {
	var res []*regexp.Regexp
	for _, p := range patterns {
		switch {
		case len(p) >= 2 && strings.HasPrefix(p, "*") && strings.HasSuffix(p, "*"):
			res = append(res, regexp.MustCompile("(?i)"+regexp.QuoteMeta(p[1:len(p)-1])))
		case strings.HasSuffix(p, "*"):
			res = append(res, regexp.MustCompile("(?i)"+regexp.QuoteMeta(p[:len(p)-1])+".*"))
		default:
			res = append(res, regexp.MustCompile("(?i)^"+regexp.QuoteMeta(p)+"$"))
		}
	}
	return func(name string) bool {
		return slices.ContainsFunc(res, func(re *regexp.Regexp) bool { return re.MatchString(name) })
	}
}

func runImages(ctx context.Context, args []string) (any, error) {
	var common commonFlags
	var pinned pinnedFlags
	fs := newFlagSet("images", &common)
	fs.Var(&pinned, "pinned", "a pinned_images pattern of CRI-O (repeatable): matching images report \"pinned\"")
	pos, err := parseArgs(fs, args)
	if err != nil {
		return nil, err
	}
	ctx, cancel, err := common.apply(ctx)
	if err != nil {
		return nil, err
	}
	defer cancel()
	res := &imagesResult{Libraries: builtWith(), Images: []imageStatus{}}
	isPinned := pinnedMatcher(pinned)
	err = withCRIOStore(ctx, func(store storage.Store) error {
		var failed []string
		add := func(st imageStatus) {
			res.Images = append(res.Images, st)
			if st.Error != "" {
				failed = append(failed, fmt.Sprintf("image %s: %s", st.ID, st.Error))
			}
		}
		if len(pos) == 0 {
			// ListImages: every image of the store.
			var images []storage.Image
			if err := bounded(ctx, "listing images", func() error {
				var err error
				images, err = store.Images()
				return err
			}); err != nil {
				return fmt.Errorf("listing images: %w", err)
			}
			for i := range images {
				st, err := statusOf(ctx, store, &images[i], isPinned)
				if err != nil {
					return err
				}
				add(st)
			}
		} else {
			// ImageStatus: the images named on the command line.
			for _, arg := range pos {
				img, err := resolveImage(ctx, store, arg)
				if err != nil {
					add(imageStatus{ID: arg, Error: err.Error()})
					continue
				}
				st, err := statusOf(ctx, store, img, isPinned)
				if err != nil {
					return err
				}
				add(st)
			}
		}
		if len(failed) > 0 {
			// CRI-O's ListImages fails as a whole when one image fails (crictl images then
			// lists nothing), ImageStatus fails for that image.
			return fmt.Errorf("%d of %d images fail as CRI-O reads them: %s", len(failed), len(res.Images), strings.Join(failed, "; "))
		}
		return nil
	})
	return res, failWith(res, err)
}

// resolveImage finds the image named by arg: an image ID, or a reference (docker.io defaults,
// :latest), as CRI-O resolves one through c/image's storage transport.
func resolveImage(ctx context.Context, store storage.Store, arg string) (*storage.Image, error) {
	var img *storage.Image
	err := bounded(ctx, "resolving "+arg, func() error {
		var ref types.ImageReference
		var err error
		if id := strings.TrimPrefix(arg, "sha256:"); idRE.MatchString(id) {
			ref, err = istorage.Transport.NewStoreReference(store, nil, id)
		} else {
			var named reference.Named
			if named, err = parseNamed(arg); err != nil {
				return err
			}
			ref, err = istorage.Transport.NewStoreReference(store, named, "")
		}
		if err != nil {
			return err
		}
		_, img, err = istorage.ResolveReference(ref)
		return err
	})
	return img, err
}

// statusOf builds CRI-O's ImageResult of img (buildImageCacheItem, then buildImageResult).
// What fails for this image is reported in its Error; the error returned is the harness's own
// (the --timeout).
func statusOf(ctx context.Context, store storage.Store, img *storage.Image, isPinned func(string) bool) (imageStatus, error) {
	st := imageStatus{ID: img.ID, Names: img.Names, TopLayer: img.TopLayer, Layers: []string{}, RepoTags: []string{}, RepoDigests: []string{}}
	if st.Names == nil {
		st.Names = []string{}
	}
	err := bounded(ctx, "reading image "+img.ID, func() error {
		for id := img.TopLayer; id != ""; {
			l, err := store.Layer(id)
			if err != nil {
				break // the error CRI-O sees comes below
			}
			st.Layers = append(st.Layers, l.ID)
			id = l.Parent
		}
		size, user, err := imageCacheItem(ctx, store, img.ID)
		st.Size, st.User = size, user
		if err != nil {
			st.Error = err.Error()
			return nil
		}
		tags, repoDigests, dgst, err := repoNames(store, img)
		if err != nil {
			st.Error = err.Error()
			return nil
		}
		st.RepoTags, st.RepoDigests, st.Digest = tags, repoDigests, dgst
		st.Pinned = slices.ContainsFunc(img.Names, isPinned)
		return nil
	})
	return st, err
}

// imageCacheItem does what CRI-O's buildImageCacheItem reads of an image, by ID: the image
// (ref.NewImage, which computes the size and fails where a layer is not known), its OCI
// config, its inspection and its manifest. CRI-O takes the size from img.Size() and reports
// none if that fails.
func imageCacheItem(ctx context.Context, store storage.Store, id string) (size *uint64, user string, err error) {
	ref, err := istorage.Transport.NewStoreReference(store, nil, id)
	if err != nil {
		return nil, "", err
	}
	sys := &types.SystemContext{}
	img, err := ref.NewImage(ctx, sys)
	if err != nil {
		return nil, "", err
	}
	defer img.Close()
	config, err := img.OCIConfig(ctx)
	if err != nil {
		return nil, "", err
	}
	if n, err := img.Size(); err == nil && n >= 0 {
		u := uint64(n)
		size = &u
	}
	if _, err := img.Inspect(ctx); err != nil {
		return size, "", fmt.Errorf("inspecting image: %w", err)
	}
	src, err := ref.NewImageSource(ctx, sys)
	if err != nil {
		return size, "", err
	}
	defer src.Close()
	if _, _, err := src.GetManifest(ctx, nil); err != nil {
		return size, "", err
	}
	return size, config.Config.User, nil
}

// repoNames returns the image's tags and digested references, and its digest, the way
// CRI-O's buildImageResult makes them: every repository of a name combined with every digest
// of the image, sorted.
func repoNames(store storage.Store, img *storage.Image) (tags, repoDigests []string, imageDigest string, err error) {
	var repos []reference.Named
	known := map[string]bool{}
	for _, n := range img.Names {
		named, err := reference.ParseNormalizedNamed(n)
		if err != nil {
			return nil, nil, "", fmt.Errorf("invalid name %q in image %q: %w", n, img.ID, err)
		}
		switch r := named.(type) {
		case reference.Canonical:
			known[r.String()] = true
			repoDigests = append(repoDigests, r.String())
		case reference.NamedTagged:
			tags = append(tags, r.String())
		default:
			return nil, nil, "", fmt.Errorf("invalid name %q in image %q: neither a tag nor a digest", n, img.ID)
		}
		repos = append(repos, reference.TrimNamed(named))
	}
	d := img.Digest
	if d == "" {
		if d, err = store.ImageBigDataDigest(img.ID, storage.ImageDigestBigDataKey); err != nil || d == "" {
			slices.Sort(tags)
			slices.Sort(repoDigests)
			return orEmpty(tags), orEmpty(repoDigests), "", nil
		}
	}
	digests := []digest.Digest{d}
	for _, other := range img.Digests {
		if other != d {
			digests = append(digests, other)
		}
	}
	for _, repo := range repos {
		for _, dg := range digests {
			if r, err := reference.WithDigest(repo, dg); err == nil && !known[r.String()] {
				known[r.String()] = true
				repoDigests = append(repoDigests, r.String())
			}
		}
	}
	slices.Sort(tags)
	slices.Sort(repoDigests)
	return orEmpty(tags), orEmpty(repoDigests), d.String(), nil
}

func orEmpty(s []string) []string {
	if s == nil {
		return []string{}
	}
	return s
}

// rmiResult is the JSON printed by "harness rmi".
type rmiResult struct {
	Libraries libraries `json:"libraries"`
	ImageID   string    `json:"imageID,omitempty"`
	// Untagged: the name was removed from an image that keeps other names (CRI-O's
	// UntagImage); Deleted: the image was deleted with its layers.
	Untagged bool         `json:"untagged,omitempty"`
	Deleted  bool         `json:"deleted"`
	Removed  removedItems `json:"removed"`
}

// runRmi removes an image as CRI-O's RemoveImage does: an ID is deleted (the image and the
// layers no other image or container uses); a name is looked up with ImageStatus first, then
// untagged, or the image deleted when it was its last name. Where ImageStatus fails, CRI-O
// logs it, removes nothing and answers success: the harness fails instead.
func runRmi(ctx context.Context, args []string) (any, error) {
	var common commonFlags
	fs := newFlagSet("rmi", &common)
	pos, err := parseArgs(fs, args)
	if err != nil {
		return nil, err
	}
	if len(pos) != 1 {
		return nil, fmt.Errorf("%w: rmi needs exactly one IMAGE (a name or an ID)", errUsage)
	}
	ctx, cancel, err := common.apply(ctx)
	if err != nil {
		return nil, err
	}
	defer cancel()
	arg := pos[0]
	res := &rmiResult{Libraries: builtWith()}
	err = withCRIOStore(ctx, func(store storage.Store) error {
		before, err := contents(ctx, store)
		if err != nil {
			return err
		}
		img, err := resolveImage(ctx, store, arg)
		if err != nil {
			return fmt.Errorf("resolving %s: %w", arg, err)
		}
		res.ImageID = img.ID
		id := strings.TrimPrefix(arg, "sha256:")
		byName := !idRE.MatchString(id)
		if byName {
			// ImageStatusByName, whose failure CRI-O skips over.
			if _, _, err := imageCacheItem(ctx, store, img.ID); err != nil {
				return fmt.Errorf("image status of %s failed (CRI-O's RemoveImage would log this and answer success without removing anything): %w", arg, err)
			}
		}
		err = bounded(ctx, "removing "+arg, func() error {
			if byName {
				named, err := parseNamed(arg)
				if err != nil {
					return err
				}
				if slices.ContainsFunc(img.Names, func(n string) bool { return n != named.String() }) {
					res.Untagged = true
					return store.RemoveNames(img.ID, []string{named.String()})
				}
			}
			// DeleteImage: ref.DeleteImage, i.e. store.DeleteImage(id, true).
			ref, err := istorage.Transport.NewStoreReference(store, nil, img.ID)
			if err != nil {
				return err
			}
			if err := ref.DeleteImage(ctx, &types.SystemContext{}); err != nil {
				return err
			}
			res.Deleted = true
			return nil
		})
		if err != nil {
			return fmt.Errorf("removing %s: %w", arg, err)
		}
		after, err := contents(ctx, store)
		if err != nil {
			return err
		}
		res.Removed = removedBetween(before, after)
		return nil
	})
	return res, failWith(res, err)
}

// jsonUnmarshal is json.Unmarshal of a string.
func jsonUnmarshal(s string, v any) error {
	if s == "" {
		return errors.New("empty")
	}
	return json.Unmarshal([]byte(s), v)
}
