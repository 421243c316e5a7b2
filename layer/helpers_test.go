package layer

import (
	"bytes"
	"compress/gzip"
	"context"
	"net/http"
	"runtime"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/opencontainers/go-digest"

	"github.com/layerstore/layerstore/cache"
	"github.com/layerstore/layerstore/fetcher"
	"github.com/layerstore/layerstore/internal/testlayer"
	"github.com/layerstore/layerstore/internal/testregistry"
)

// plainRegistry reads an unauthenticated registry on 127.0.0.1.
type plainRegistry struct{ r *fetcher.Resolver }

func (p plainRegistry) Resolve(ctx context.Context, ref string) (*fetcher.Image, error) {
	return p.r.Resolve(ctx, ref)
}

func (p plainRegistry) Platforms(ctx context.Context, img *fetcher.Image) ([]*fetcher.Manifest, error) {
	return p.r.Platforms(ctx, img)
}

func (p plainRegistry) Blob(_ context.Context, img *fetcher.Image, l *fetcher.Layer) (*fetcher.Blob, error) {
	ref, err := name.ParseReference(img.Ref)
	if err != nil {
		return nil, err
	}
	repo := ref.Context()
	return fetcher.New(http.DefaultTransport, "http://"+repo.RegistryStr()+"/v2/"+repo.RepositoryStr()+"/blobs/"+l.Digest.String(), l.Size,
		fetcher.WithBackoff(time.Millisecond, 10*time.Millisecond))
}

type env struct {
	t        *testing.T
	reg      *testregistry.Registry
	cache    *cache.Cache
	fixtures []testlayer.Fixture
}

func newEnv(t *testing.T) *env {
	t.Helper()
	reg, err := testregistry.Start()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { reg.Close() })
	c, err := cache.New(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	fs, err := testlayer.Fixtures()
	if err != nil {
		t.Fatal(err)
	}
	return &env{t: t, reg: reg, cache: c, fixtures: fs}
}

func (e *env) manager(opts ...Option) *Manager {
	e.t.Helper()
	r, err := fetcher.NewResolver(http.DefaultTransport)
	if err != nil {
		e.t.Fatal(err)
	}
	m, err := New(plainRegistry{r}, e.cache, opts...)
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() { m.Close() })
	return m
}

func fixtureLayer(f testlayer.Fixture) testregistry.Layer {
	return testregistry.Layer{Blob: f.Blob, MediaType: f.Desc.MediaType, Annotations: f.Desc.Annotations, DiffID: f.DiffID}
}

// gzipLayer is a plain gzip layer of the reference tar.
func gzipLayer(t *testing.T) testregistry.Layer {
	var b bytes.Buffer
	zw := gzip.NewWriter(&b)
	tarBlob := testlayer.Tar()
	zw.Write(tarBlob)
	zw.Close()
	return testregistry.Layer{Blob: b.Bytes(), MediaType: "application/vnd.oci.image.layer.v1.tar+gzip", DiffID: digest.FromBytes(tarBlob)}
}

func (e *env) push(repoTag string, layers ...testregistry.Layer) string {
	e.t.Helper()
	if _, err := e.reg.Push(e.t.Context(), repoTag, layers); err != nil {
		e.t.Fatal(err)
	}
	return e.reg.Host + "/" + repoTag
}

func hostArch() string { return runtime.GOARCH }
