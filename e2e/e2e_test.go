package e2e

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/opencontainers/go-digest"

	"github.com/layerstore/layerstore/internal/testutil/dockerregistry"
	"github.com/layerstore/layerstore/internal/testutil/testregistry"
)

// references returns the listing of every reference image pulled normally by podman.
func (s *suite) references(t *testing.T) map[string]string {
	t.Helper()
	if s.refs != nil {
		return s.refs
	}
	p := s.newPodman(t, "")
	refs := map[string]string{}
	for _, n := range []string{imgGzip, imgWhiteoutGzip} {
		refs[n] = p.listing(t, s.images[n].ref)
		if !strings.Contains(refs[n], "bin/busybox ") {
			t.Fatalf("reference listing of %s without bin/busybox:\n%s", n, refs[n])
		}
	}
	if !strings.Contains(refs[imgGzip], "t/usr/bin/tool ") {
		t.Fatalf("reference listing without t/usr/bin/tool:\n%s", refs[imgGzip])
	}
	for _, want := range []string{"w/b ", "w/dir/z "} {
		if !strings.Contains(refs[imgWhiteoutGzip], want) {
			t.Fatalf("whiteout reference listing without %s:\n%s", want, refs[imgWhiteoutGzip])
		}
	}
	for _, gone := range []string{"w/a ", "w/dir/x ", "w/dir/sub"} {
		if strings.Contains(refs[imgWhiteoutGzip], gone) {
			t.Fatalf("whiteout reference listing still has %s:\n%s", gone, refs[imgWhiteoutGzip])
		}
	}
	s.refs = refs
	return refs
}

// TestLegacyPodman: podman 4.3.1 (lookup by blob digest) pulls, runs, saves, pushes and removes
// every lazy image through the store.
func TestLegacyPodman(t *testing.T) {
	s := need(t)
	refs := s.references(t)
	d := s.startDaemon(t)
	p := s.newPodman(t, d.mnt)
	for _, n := range lazyImages {
		t.Run(n, func(t *testing.T) {
			img := s.images[n]
			t.Cleanup(func() { p.try(t, "rmi", "--force", img.ref) }) // when a check below fails
			mark := s.open.Mark()
			out := p.must(t, "pull", img.ref)
			checkPull(t, img, s.open.BlobGets(mark), func(d digest.Digest) bool { return img.legacy[d] })
			if t.Failed() {
				t.Logf("podman pull:\n%s", out)
			}
			if got, want := fromStore(t, filepath.Join(p.dir, "graph")), count(img.legacy); got != want {
				t.Errorf("%d layers taken from the store, want %d", got, want)
			}
			for l := range served(img.legacy) {
				if u := d.users(t, l); u < 1 {
					t.Errorf("layer %s: %d users after the pull, want >= 1", l, u)
				}
			}
			sameListing(t, n, p.listing(t, img.ref), refs[img.ref0])

			archive := filepath.Join(t.TempDir(), "image.tar")
			// docker-archive cannot hold zstd layers in podman 4.3; oci-archive keeps them.
			d.waitComplete(t, img)
			mark = s.open.Mark()
			p.must(t, "save", "--format", "oci-archive", "-o", archive, img.ref)
			checkArchive(t, archive, img.diffIDs)
			logExport(t, "save", img, s.open.BlobGets(mark))
			pushed := s.open.Host + "/pushed/legacy-" + n + ":v1"
			mark = s.open.Mark()
			p.must(t, "push", img.ref, pushed)
			checkPushed(t, pushed, img)
			logExport(t, "push", img, s.open.BlobGets(mark))

			p.must(t, "rmi", img.ref)
			for l := range served(img.legacy) {
				if u := d.users(t, l); u != 0 {
					t.Errorf("layer %s: %d users after rmi, want 0", l, u)
				}
			}
		})
	}
}

// TestModernRuntime: current c/image and c/storage (lookup by TOC digest) pull every lazy image
// through the store and read it through their own overlay mount, save, push and remove it, all in
// one process.
func TestModernRuntime(t *testing.T) {
	s := need(t)
	d := s.startDaemon(t)
	ref := s.newHarness(t, "", testregistry.RegistriesConf(s.open.Host))
	refs := map[string]string{}
	for _, n := range []string{imgGzip, imgWhiteoutGzip} {
		r, err := ref.pull(t, s.images[n].ref, "--list", listScript, "--rmi")
		if err != nil {
			t.Fatal(err)
		}
		refs[n] = r.Listing
	}
	if legacy := s.references(t); legacy[imgGzip] != refs[imgGzip] || legacy[imgWhiteoutGzip] != refs[imgWhiteoutGzip] {
		t.Fatalf("the modern runtime's normal pull differs from podman's:\n%s\n---\n%s", refs[imgGzip], legacy[imgGzip])
	}
	h := s.newHarness(t, d.mnt, testregistry.RegistriesConf(s.open.Host))
	for _, n := range lazyImages {
		t.Run(n, func(t *testing.T) {
			img := s.images[n]
			mark := s.open.Mark()
			pushed := s.open.Host + "/pushed/modern-" + n + ":v1"
			archive := filepath.Join(t.TempDir(), "image.tar")
			args := []string{"--list", listScript, "--save", archive, "--push", pushed, "--rmi"}
			r, err := h.pull(t, img.ref, args...)
			if err != nil && strings.Contains(err.Error(), "printed nothing") {
				// Seen once under CI load, not reproduced since: an empty listing through
				// c/storage's mount. Reported with what the mount showed, then retried once.
				t.Logf("RETRY after an empty listing: %v", err)
				mark = s.open.Mark()
				r, err = h.pull(t, img.ref, args...)
			}
			if err != nil {
				t.Fatal(err)
			}
			checkPull(t, img, s.open.BlobGets(mark), func(d digest.Digest) bool { return img.modern[d] })
			checkAdditional(t, img, r)
			sameListing(t, n, r.Listing, refs[img.ref0])
			checkArchive(t, archive, img.diffIDs)
			checkPushed(t, pushed, img)
			if !r.Removed {
				t.Error("image not removed")
			}
			for l := range served(img.modern) {
				if u := d.users(t, l); u > 0 {
					t.Errorf("layer %s: %d users after the image was removed, want 0", l, u)
				}
			}
		})
	}
}

// served yields the layers a runtime takes from the store.
func served(m map[digest.Digest]bool) func(func(digest.Digest) bool) {
	return func(yield func(digest.Digest) bool) {
		for d, ok := range m {
			if ok && !yield(d) {
				return
			}
		}
	}
}

func count(m map[digest.Digest]bool) int {
	n := 0
	for range served(m) {
		n++
	}
	return n
}

// checkAdditional checks that exactly the layers looked up by TOC digest came from the store.
func checkAdditional(t *testing.T, img *image, r pullResult) {
	t.Helper()
	if len(r.Layers) != len(img.layers) {
		t.Fatalf("%d layers, want %d", len(r.Layers), len(img.layers))
	}
	for i, l := range r.Layers {
		if want := img.modern[img.layers[i]]; l.Additional != want {
			t.Errorf("layer %d (%s): taken from the store %v, want %v", i, img.layers[i], l.Additional, want)
		}
	}
}

// checkPushed checks that the image pushed to ref has the original's layers (DiffIDs).
func checkPushed(t *testing.T, ref string, img *image) {
	t.Helper()
	got, err := describe(t.Context(), "pushed", ref, nil)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Join(digests(got.diffIDs), " ") != strings.Join(digests(img.diffIDs), " ") {
		t.Errorf("pushed DiffIDs %v, want %v", got.diffIDs, img.diffIDs)
	}
}

func digests(ds []digest.Digest) []string {
	var s []string
	for _, d := range ds {
		s = append(s, d.String())
	}
	return s
}

// TestLegacyRestart: images pulled through the store run again after the daemon is restarted,
// after a clean stop and after SIGKILL, the next daemon resuming the session the service
// manager kept; and after a SIGKILL with the session lost (a dead mount, which the new daemon
// clears).
func TestLegacyRestart(t *testing.T) {
	s := need(t)
	refs := s.references(t)
	d := s.startDaemon(t)
	p := s.newPodman(t, d.mnt)
	img := s.images[imgEStargz]
	p.must(t, "pull", img.ref)
	sameListing(t, "before the restart", p.listing(t, img.ref), refs[imgGzip])
	for _, sig := range []syscall.Signal{syscall.SIGTERM, syscall.SIGKILL} {
		d.stop(sig)
		d.start(t)
		sameListing(t, "after "+sig.String(), p.listing(t, img.ref), refs[imgGzip])
	}
	if n := strings.Count(d.log.String(), "resumed the FUSE session of the previous process"); n != 2 {
		t.Errorf("%d sessions resumed, want 2", n)
	}
	d.stop(syscall.SIGKILL)
	d.manager.Close() // the session lost: the connection ends
	if _, err := os.Stat(filepath.Join(d.mnt, "x")); !errors.Is(err, syscall.ENOTCONN) {
		t.Fatalf("after SIGKILL with the session lost: %v, want ENOTCONN from the dead mount", err)
	}
	d.manager = nil
	d.start(t)
	sameListing(t, "after a SIGKILL with the session lost", p.listing(t, img.ref), refs[imgGzip])
}

// TestFallbackWithoutDaemon: with the daemon stopped and its mount gone, lazy images are pulled
// normally and run.
func TestFallbackWithoutDaemon(t *testing.T) {
	s := need(t)
	refs := s.references(t)
	d := s.startDaemon(t)
	d.stop(syscall.SIGTERM)
	img := s.images[imgEStargz]
	for _, rt := range []struct{ name, bin string }{{"podman4", "podman"}, {"podman5", s.podman5}} {
		t.Run(rt.name, func(t *testing.T) {
			p := s.newRuntime(t, rt.bin, d.mnt, testregistry.RegistriesConf(s.open.Host, s.private.Host))
			mark := s.open.Mark()
			p.must(t, "pull", img.ref)
			checkPull(t, img, s.open.BlobGets(mark), func(digest.Digest) bool { return false })
			if n := fromStore(t, filepath.Join(p.dir, "graph")); n != 0 {
				t.Errorf("%d layers taken from a store that is not running", n)
			}
			sameListing(t, "fallback", p.listing(t, img.ref), refs[imgGzip])
		})
	}
}

// copyImage copies img to repoTag on the registry dst.
func copyImage(ctx context.Context, dst *dockerregistry.Registry, repoTag string, auth authn.Authenticator, img *image) (*image, error) {
	src, err := name.ParseReference(img.ref, name.Insecure)
	if err != nil {
		return nil, err
	}
	i, err := remote.Image(src, remote.WithContext(ctx))
	if err != nil {
		return nil, err
	}
	ref := dst.Host + "/" + repoTag
	dstRef, err := name.ParseReference(ref, name.Insecure)
	if err != nil {
		return nil, err
	}
	if err := remote.Write(dstRef, i, remote.WithContext(ctx), remote.WithAuth(auth)); err != nil {
		return nil, err
	}
	out, err := describe(ctx, repoTag, ref, auth)
	if err != nil {
		return nil, err
	}
	out.ref0 = imgGzip
	return out, nil
}

// TestPrivateRegistry: a registry with htpasswd auth, credentials reaching the daemon from an
// auth.json it reads or from the auth helper, and wrong or missing credentials.
func TestPrivateRegistry(t *testing.T) {
	s := need(t)
	refs := s.references(t)
	img := s.privImg
	isLazy := func(d digest.Digest) bool { return img.legacy[d] }
	never := func(digest.Digest) bool { return false }

	t.Run("legacy/auth.json", func(t *testing.T) {
		d := s.startDaemon(t, "REGISTRY_AUTH_FILE="+s.goodAuth)
		p := s.newPodman(t, d.mnt, "REGISTRY_AUTH_FILE="+s.goodAuth)
		mark := s.private.Mark()
		p.must(t, "pull", img.ref)
		checkPull(t, img, s.private.BlobGets(mark), isLazy)
		sameListing(t, "private", p.listing(t, img.ref), refs[imgGzip])
	})

	// Top-level keys come before the first table.
	helperConf := "additional-layer-store-auth-helper = \"layerstore-auth-helper\"\n" + testregistry.RegistriesConf(s.private.Host)
	t.Run("modern/auth-helper", func(t *testing.T) {
		d := s.startDaemon(t) // no credentials of its own
		h := s.newHarness(t, d.mnt, helperConf, "REGISTRY_AUTH_FILE="+s.goodAuth,
			"PATH="+s.bin+":"+os.Getenv("PATH"), "LAYERSTORE_CONTROL_SOCKET="+d.socket)
		mark := s.private.Mark()
		r, err := h.pull(t, img.ref, "--list", listScript, "--rmi")
		if err != nil {
			t.Fatal(err)
		}
		checkPull(t, img, s.private.BlobGets(mark), isLazy)
		checkAdditional(t, img, r)
		sameListing(t, "private", r.Listing, refs[imgGzip])
		if !strings.Contains(d.log.String(), "credentials received from the auth helper") {
			t.Error("the daemon did not log the helper's credentials")
		}
	})

	t.Run("podman5/auth-helper", func(t *testing.T) {
		// The podman 5 CLI hands the credentials of its pull to the daemon through the helper.
		d := s.startDaemon(t) // no credentials of its own
		p := s.newRuntime(t, s.podman5, d.mnt, helperConf, "REGISTRY_AUTH_FILE="+s.goodAuth,
			"PATH="+s.bin+":"+os.Getenv("PATH"), "LAYERSTORE_CONTROL_SOCKET="+d.socket)
		mark := s.private.Mark()
		out, stderr, err := p.runScript(t, img.ref, listScript)
		if err != nil {
			t.Fatalf("podman run: %v\n%s", err, stderr)
		}
		checkPull(t, img, s.private.BlobGets(mark), func(d digest.Digest) bool { return img.modern[d] })
		sameListing(t, "private", out, refs[imgGzip])
		if !strings.Contains(d.log.String(), "credentials received from the auth helper") {
			t.Error("the daemon did not log the helper's credentials")
		}
	})

	t.Run("modern/no-helper", func(t *testing.T) {
		// The same without the helper: the daemon cannot authenticate, the runtime pulls normally.
		d := s.startDaemon(t)
		h := s.newHarness(t, d.mnt, testregistry.RegistriesConf(s.private.Host), "REGISTRY_AUTH_FILE="+s.goodAuth)
		mark := s.private.Mark()
		r, err := h.pull(t, img.ref, "--list", listScript, "--rmi")
		if err != nil {
			t.Fatal(err)
		}
		checkPull(t, img, s.private.BlobGets(mark), never)
		sameListing(t, "private", r.Listing, refs[imgGzip])
	})

	t.Run("legacy/daemon-wrong-password", func(t *testing.T) {
		d := s.startDaemon(t, "REGISTRY_AUTH_FILE="+s.badAuth)
		// The lookup answers with an error at once, not after a timeout.
		done := make(chan error, 1)
		go func() {
			_, err := os.Stat(filepath.Join(d.layerDir(img.ref, img.layers[1]), "diff"))
			done <- err
		}()
		select {
		case err := <-done:
			if err == nil {
				t.Fatal("the layer resolved with a wrong password")
			}
		case <-time.After(20 * time.Second):
			t.Fatal("the lookup with a wrong password hangs")
		}
		p := s.newPodman(t, d.mnt, "REGISTRY_AUTH_FILE="+s.goodAuth)
		mark := s.private.Mark()
		p.must(t, "pull", img.ref)
		checkPull(t, img, s.private.BlobGets(mark), never)
		sameListing(t, "private", p.listing(t, img.ref), refs[imgGzip])
	})

	t.Run("legacy/no-credentials", func(t *testing.T) {
		d := s.startDaemon(t)
		p := s.newPodman(t, d.mnt)
		out, err := p.try(t, "pull", img.ref)
		if err == nil {
			t.Fatalf("pull without credentials succeeded:\n%s", out)
		}
		if !strings.Contains(strings.ToLower(out), "unauthorized") && !strings.Contains(strings.ToLower(out), "authentication required") {
			t.Errorf("pull without credentials: no auth error:\n%s", out)
		}
	})
}

// logExport logs the blob GETs an export (podman save or push) sent for the layers the store
// serves: what reading their blob files cost.
func logExport(t *testing.T, what string, img *image, gets map[digest.Digest]dockerregistry.Gets) {
	t.Helper()
	for l := range served(img.legacy) {
		g := gets[l]
		t.Logf("%s: layer %.19s: %d requests (%d whole), %d bytes", what, l, g.Full+g.Ranged, g.Full, g.Bytes)
	}
}

// TestPodman5 runs every lazy image with the podman 5 CLI (lookups by TOC digest): pulled and
// run in one command (`podman run IMAGE`, as the README advises for podman 5: the known
// upstream issue makes a later command pull again), no full GET of a layer the store serves,
// plain layers pulled normally, the layers c/storage took from the store exactly those looked
// up by TOC digest, the container sees the reference content, and the daemon counts the
// runtime's use of each layer (which `podman rmi` does not drop: see below).
func TestPodman5(t *testing.T) {
	s := need(t)
	refs := s.references(t)
	d := s.startDaemon(t)
	for _, n := range lazyImages {
		t.Run(n, func(t *testing.T) {
			img := s.images[n]
			p := s.newRuntime(t, s.podman5, d.mnt, testregistry.RegistriesConf(s.open.Host, s.private.Host))
			mark := s.open.Mark()
			out, stderr, err := p.runScript(t, img.ref, listScript)
			if err != nil {
				t.Fatalf("podman run %s: %v\n%s", img.ref, err, stderr)
			}
			checkPull(t, img, s.open.BlobGets(mark), func(d digest.Digest) bool { return img.modern[d] })
			if got, want := fromStore(t, filepath.Join(p.dir, "graph")), count(img.modern); got != want {
				t.Errorf("%d layers taken from the store, want %d", got, want)
			}
			sameListing(t, n, out, refs[img.ref0])
			for l := range served(img.modern) {
				if u := d.users(t, l); u < 1 {
					t.Errorf("layer %s: %d users after the run, want >= 1", l, u)
				}
			}
			// podman 5 removes the image but never drops its uses of the layers it took from
			// the store (it did not record them: docs/upstream-cstorage.md; this daemon does not record them for it), so the
			// daemon keeps counting them; the harness, in one process, does drop them.
			p.must(t, "rmi", img.ref)
			var users []int64
			for l := range served(img.modern) {
				users = append(users, d.users(t, l))
			}
			t.Logf("users of the layers after podman rmi: %v", users)
		})
	}
}
