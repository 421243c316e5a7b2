// Package dockerregistry runs Debian's docker-registry (distribution 2.8) on 127.0.0.1 for the
// end-to-end tests and the benchmarks, and reads its access log: which blobs were downloaded
// in full (200) and which by range requests (206).
package dockerregistry

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"syscall"
	"time"

	"github.com/opencontainers/go-digest"

	"github.com/layerstore/layerstore/internal/testutil/syncbuf"
)

// Config says where a registry keeps its files.
type Config struct {
	DataDir  string // the filesystem driver's root directory: blobs and manifests
	ConfDir  string // where its config.yml is written
	Htpasswd string // an htpasswd file turning on basic auth; empty: no auth
}

// Registry is a running docker-registry.
type Registry struct {
	Host string // "127.0.0.1:PORT"

	dataDir string
	cmd     *exec.Cmd
	log     syncbuf.Buffer // access log (stdout)
	errs    syncbuf.Buffer // the registry's own log
	done    chan struct{}
}

// startTimeout bounds how long Start waits for the registry to answer.
const startTimeout = 30 * time.Second

// Start runs a registry on a free port of 127.0.0.1 and returns once it answers /v2/.
func Start(ctx context.Context, c Config) (*Registry, error) {
	if c.DataDir == "" || c.ConfDir == "" {
		return nil, errors.New("dockerregistry: DataDir and ConfDir are required")
	}
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	r := &Registry{Host: fmt.Sprintf("127.0.0.1:%d", port), dataDir: c.DataDir, done: make(chan struct{})}
	conf := fmt.Sprintf(`version: 0.1
log:
  level: warn
  accesslog:
    disabled: false
storage:
  filesystem:
    rootdirectory: %s
  delete:
    enabled: true
http:
  addr: %s
`, c.DataDir, r.Host)
	if c.Htpasswd != "" {
		conf += fmt.Sprintf("auth:\n  htpasswd:\n    realm: layerstore-test\n    path: %s\n", c.Htpasswd)
	}
	cfg := filepath.Join(c.ConfDir, "registry.yml")
	if err := os.WriteFile(cfg, []byte(conf), 0o644); err != nil {
		return nil, err
	}
	r.cmd = exec.Command("docker-registry", "serve", cfg)
	r.cmd.Stdout, r.cmd.Stderr = &r.log, &r.errs
	r.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true} // a ^C reaches it only through Stop
	if err := r.cmd.Start(); err != nil {
		return nil, err
	}
	go func() { r.cmd.Wait(); close(r.done) }()
	ctx, cancel := context.WithTimeout(ctx, startTimeout)
	defer cancel()
	for {
		if resp, err := http.Get("http://" + r.Host + "/v2/"); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK || resp.StatusCode == http.StatusUnauthorized {
				return r, nil
			}
		}
		select {
		case <-r.done:
			return nil, fmt.Errorf("docker-registry exited: %s", r.errs.String())
		case <-ctx.Done():
			r.Stop()
			return nil, fmt.Errorf("docker-registry not answering on %s: %w: %s", r.Host, ctx.Err(), r.errs.String())
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// Stop ends the registry by its PID: SIGTERM, then SIGKILL after 5 s.
func (r *Registry) Stop() {
	select {
	case <-r.done:
		return
	default:
	}
	_ = r.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-r.done:
	case <-time.After(5 * time.Second):
		_ = r.cmd.Process.Kill()
		<-r.done
	}
}

// Errors returns the registry's own log (its stderr).
func (r *Registry) Errors() string { return r.errs.String() }

// BlobPath is where the registry's filesystem driver keeps blob d.
func (r *Registry) BlobPath(d digest.Digest) string {
	e := d.Encoded()
	return filepath.Join(r.dataDir, "docker/registry/v2/blobs", d.Algorithm().String(), e[:2], e, "data")
}

// Mark is a position in the access log, for BlobGets.
func (r *Registry) Mark() int { return r.log.Len() }

// Gets counts a blob's GET requests.
type Gets struct {
	Full   int   // answered 200: the whole blob
	Ranged int   // answered 206
	Bytes  int64 // bytes sent
}

// accessLine matches a blob GET in the combined log format.
var accessLine = regexp.MustCompile(`"GET /v2/\S+/blobs/(sha256:[0-9a-f]{64}) HTTP/[0-9.]+" (\d{3}) (\d+|-)`)

// BlobGets returns the blob GETs logged since mark. A request is logged once it is answered.
func (r *Registry) BlobGets(mark int) map[digest.Digest]Gets {
	out := map[digest.Digest]Gets{}
	for _, m := range accessLine.FindAllStringSubmatch(r.log.From(mark), -1) {
		d := digest.Digest(m[1])
		g := out[d]
		switch m[2] {
		case "200":
			g.Full++
		case "206":
			g.Ranged++
		}
		n, _ := strconv.ParseInt(m[3], 10, 64)
		g.Bytes += n
		out[d] = g
	}
	return out
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}
