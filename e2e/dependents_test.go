package e2e

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"

	"github.com/layerstore/layerstore/internal/testutil/testregistry"
)

// TestDependentsRemove: turning the store off the documented way with podman 4.3.1 and
// podman 5. After lazy pulls (and a plain image pulled normally), `layerstore dependents`
// lists the lazy images and not the plain one; `--remove` removes them through podman, except
// one a container still uses, which it names; run again once the container is gone it removes
// that one, and again it finds nothing and removes nothing; then the storage.conf line goes and the daemon
// stops: `podman images` and a run of every remaining image work, and every image the runtime
// lists can be inspected (no broken image left).
func TestDependentsRemove(t *testing.T) {
	s := need(t)
	refs := s.references(t)
	// Not the zstd:chunked images: their uncompressed layers, config and so image ID are the
	// plain image's, which would then be the same image, dependent too.
	lazy := []*image{s.images[imgEStargz], s.images[imgStargzZstd], s.images[imgMixed]}
	plain := s.images[imgGzip]
	for _, rt := range []struct{ name, bin string }{{"podman4", "podman"}, {"podman5", s.podman5}} {
		t.Run(rt.name, func(t *testing.T) {
			d := s.startDaemon(t)
			p := s.newRuntime(t, rt.bin, d.mnt, testregistry.RegistriesConf(s.open.Host, s.private.Host))
			// podman in $PATH is the runtime under test, for the command's podman rmi.
			bin := t.TempDir()
			if err := os.Symlink(podmanPath(t, rt.bin), filepath.Join(bin, "podman")); err != nil {
				t.Fatal(err)
			}
			env := append(slices.Clone(p.env), "PATH="+bin+":"+os.Getenv("PATH"))
			for _, img := range append(lazy, plain) {
				p.must(t, "pull", img.ref)
			}
			if fromStore(t, filepath.Join(p.dir, "graph")) == 0 {
				t.Fatal("no layer taken from the store: nothing to test")
			}

			rep, code := dependents(t, s, env)
			if code != 1 {
				t.Errorf("dependents: exit %d with dependent images, want 1", code)
			}
			for _, img := range lazy {
				if !rep.has(img.ref) {
					t.Errorf("%s not listed as dependent: %+v", img.ref, rep.Images)
				}
			}
			if rep.has(plain.ref) {
				t.Errorf("the plain image %s listed as dependent", plain.ref)
			}

			// A container of a lazy image keeps it: --remove says so and removes the others.
			p.must(t, "create", "--name", "keeper", "--net=none", lazy[0].ref, "/bin/busybox", "true")
			rep, code = dependents(t, s, env, "--remove")
			if code != 1 || len(rep.Images) != 1 || !rep.has(lazy[0].ref) || len(rep.Failed) != 1 || !strings.Contains(rep.Failed[0], "keeper") {
				t.Fatalf("dependents --remove with a container: exit %d, %+v", code, rep)
			}
			p.must(t, "rm", "keeper")
			rep, code = dependents(t, s, env, "--remove")
			t.Logf("--remove: removed %q, failed %q, left %d images, %d orphan layers", rep.Removed, rep.Failed, len(rep.Images), len(rep.Orphans))
			if code != 0 || len(rep.Images) != 0 || len(rep.Failed) != 0 {
				t.Fatalf("dependents --remove: exit %d, %+v", code, rep)
			}
			if rep, code = dependents(t, s, env, "--remove"); code != 0 || len(rep.Removed) != 0 || len(rep.Images) != 0 {
				t.Errorf("dependents --remove again: exit %d, %+v", code, rep)
			}

			// The store off: no storage.conf line, no daemon.
			if err := os.WriteFile(filepath.Join(p.dir, "storage.conf"), []byte(storageConf(p.dir, "")), 0o644); err != nil {
				t.Fatal(err)
			}
			d.stop(syscall.SIGTERM)
			unmount(d.mnt)
			out := p.must(t, "images", "--format", "{{.ID}} {{.Repository}}:{{.Tag}}")
			t.Logf("podman images with the store off:\n%s", out)
			lines := strings.Fields(strings.TrimSpace(out))
			if len(lines) == 0 {
				t.Fatal("no image left: the plain image should be")
			}
			for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
				id, name, _ := strings.Cut(l, " ")
				p.must(t, "image", "inspect", id)
				for _, img := range lazy {
					if strings.HasPrefix(img.ref, strings.TrimPrefix(name, "localhost/")) && name != "<none>:<none>" {
						t.Errorf("removed image %s still listed", img.ref)
					}
				}
				if name == plain.ref {
					sameListing(t, "plain image with the store off", p.listing(t, plain.ref), refs[plain.ref0])
				}
			}
			// A lazy image pulled again with the store off is pulled normally and runs.
			p.must(t, "pull", lazy[0].ref)
			sameListing(t, "lazy image pulled again with the store off", p.listing(t, lazy[0].ref), refs[lazy[0].ref0])
		})
	}
}

type dependentsOut struct {
	Images []struct {
		Names []string `json:"names"`
	} `json:"images"`
	Orphans []string `json:"orphanLayers"`
	Removed []string `json:"removed"`
	Failed  []string `json:"failed"`
}

func (r dependentsOut) has(ref string) bool {
	for _, img := range r.Images {
		for _, n := range img.Names {
			if n == ref {
				return true
			}
		}
	}
	return false
}

// dependents runs `layerstore dependents --json args...` with env and returns its report and
// exit code.
func dependents(t *testing.T, s *suite, env []string, args ...string) (dependentsOut, int) {
	t.Helper()
	stdout, stderr, err := output(t.Context(), env, false, filepath.Join(s.bin, "layerstore"), append([]string{"dependents", "--json"}, args...)...)
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatalf("layerstore dependents: %v\n%s", err, stderr)
	}
	var rep dependentsOut
	if err := json.Unmarshal([]byte(stdout), &rep); err != nil {
		t.Fatalf("layerstore dependents %q: %v\n%s\n%s", args, err, stdout, stderr)
	}
	return rep, code
}

// podmanPath returns the path of the podman binary bin names.
func podmanPath(t *testing.T, bin string) string {
	t.Helper()
	p, err := exec.LookPath(bin)
	if err != nil {
		t.Fatal(err)
	}
	p, err = filepath.Abs(p)
	if err != nil {
		t.Fatal(err)
	}
	return p
}
