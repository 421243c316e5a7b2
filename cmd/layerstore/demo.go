package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"text/tabwriter"
	"time"

	"github.com/containerd/stargz-snapshotter/estargz"
	"github.com/layerstore/layerstore/internal/testlayer"
	"github.com/layerstore/layerstore/verify"
)

// demoFiles are what the demo's "workload" reads.
var demoFiles = []string{"etc/hostname", "usr/bin/tool", "usr/share/doc/deep/er/README"}

// runDemo builds sample lazy-pullable layers, serves them from a local HTTP server that
// answers range requests, and reads a few files through the verified lazy path, printing how
// much of each blob had to be fetched. Nothing leaves 127.0.0.1.
func runDemo(ctx context.Context, out io.Writer) error {
	tarBlob := testlayer.Tar()
	fmt.Fprintf(out, "sample layer: %d entries, %d bytes uncompressed\n\n", len(testlayer.Entries()), len(tarBlob))
	var layers []testlayer.Fixture
	for _, v := range []struct {
		name string
		opts []estargz.Option
	}{
		{"estargz", nil},
		{"estargz-prioritized", []estargz.Option{estargz.WithPrioritizedFiles(demoFiles)}},
	} {
		f, err := testlayer.BuildEStargz(v.name, tarBlob, v.opts...)
		if err != nil {
			return err
		}
		layers = append(layers, f)
	}
	srv, err := newBlobServer()
	if err != nil {
		return err
	}
	defer srv.Close()

	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "layer\tformat\tblob bytes\tentries\topen (TOC)\tread 3 files\trequests\tfetched\tof blob\tguarantee\t")
	for _, f := range layers {
		srv.put(f.Name, f.Blob)
		src := srv.source(f.Name)
		start := time.Now()
		l, err := verify.Open(ctx, f.Desc, f.DiffID, src)
		if err != nil {
			return err
		}
		opened := time.Since(start)
		for _, p := range demoFiles {
			if _, err := readFile(ctx, l, src, p); err != nil {
				return err
			}
		}
		fetched := src.bytes.Load()
		fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%s\t%s\t%d\t%d\t%.1f%%\t%s\t\n", f.Name, l.Layout().Format, len(f.Blob),
			l.Index().Len(), opened.Round(time.Microsecond), time.Since(start).Round(time.Microsecond),
			src.requests.Load(), fetched, 100*float64(fetched)/float64(len(f.Blob)), l.Guarantee())
	}
	tw.Flush()

	// A registry serving a corrupted chunk: the read is refused, nothing is returned.
	f := layers[0]
	l, err := verify.Open(ctx, f.Desc, f.DiffID, srv.source(f.Name))
	if err != nil {
		return err
	}
	id, _ := l.Index().LookupPath("usr/bin/tool")
	bad := bytes.Clone(f.Blob)
	c := l.Index().Chunks(id)[0]
	bad[c.Offset+(c.End-c.Offset)/2] ^= 0xff
	srv.put("tampered", bad)
	_, err = readFile(ctx, l, srv.source("tampered"), "usr/bin/tool")
	if err == nil {
		return errors.New("a tampered chunk was served")
	}
	fmt.Fprintf(out, "\ntampered blob, read of usr/bin/tool refused:\n  %v\n", err)
	return nil
}

func readFile(ctx context.Context, l *verify.Layer, src verify.Source, p string) ([]byte, error) {
	x := l.Index()
	id, ok := x.LookupPath(p)
	if !ok {
		return nil, fmt.Errorf("%s: not in the layer", p)
	}
	var buf bytes.Buffer
	for i := range x.Chunks(id) {
		c, err := l.ReadChunk(ctx, src, id, i)
		if err != nil {
			return nil, err
		}
		buf.Write(c.Bytes())
	}
	return buf.Bytes(), nil
}

// blobServer serves blobs over HTTP with range support, on 127.0.0.1.
type blobServer struct {
	srv   *http.Server
	url   string
	blobs atomic.Pointer[map[string][]byte]
}

func newBlobServer() (*blobServer, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	s := &blobServer{url: "http://" + ln.Addr().String()}
	s.blobs.Store(&map[string][]byte{})
	s.srv = &http.Server{ReadHeaderTimeout: 5 * time.Second, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, ok := (*s.blobs.Load())[strings.TrimPrefix(r.URL.Path, "/")]
		if !ok {
			http.NotFound(w, r)
			return
		}
		http.ServeContent(w, r, "", time.Time{}, bytes.NewReader(b))
	})}
	go s.srv.Serve(ln) //nolint:errcheck // ends with Close
	return s, nil
}

func (s *blobServer) put(name string, b []byte) {
	m := map[string][]byte{name: b}
	for k, v := range *s.blobs.Load() {
		if k != name {
			m[k] = v
		}
	}
	s.blobs.Store(&m)
}

func (s *blobServer) Close() error { return s.srv.Close() }

func (s *blobServer) source(name string) *rangeSource {
	return &rangeSource{url: s.url + "/" + name}
}

// rangeSource reads a blob with one HTTP range request per call, counting requests and bytes.
type rangeSource struct {
	url      string
	requests atomic.Int64
	bytes    atomic.Int64
}

var _ verify.Source = (*rangeSource)(nil)

func (s *rangeSource) ReadAt(ctx context.Context, p []byte, off int64) (int, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, s.url, nil)
	if err != nil {
		return 0, err
	}
	req.Header.Set("Range", fmt.Sprintf("bytes=%d-%d", off, off+int64(len(p))-1))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusPartialContent {
		return 0, fmt.Errorf("%s: range request answered %s", s.url, resp.Status)
	}
	n, err := io.ReadFull(resp.Body, p)
	s.requests.Add(1)
	s.bytes.Add(int64(n))
	return n, err
}
