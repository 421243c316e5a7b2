package e2e

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"sync"
	"time"

	"github.com/opencontainers/go-digest"
)

// registry is Debian's docker-registry (distribution 2.8) on 127.0.0.1, storing blobs in a
// temporary directory. Its access log (stdout) tells full blob downloads from range requests.
type registry struct {
	host string // "127.0.0.1:PORT"
	cmd  *exec.Cmd
	log  lockedBuffer // access log
	errs lockedBuffer // the registry's own log
	done chan struct{}
}

// startRegistry runs a registry in dir; a non-empty htpasswd file turns on basic auth.
func startRegistry(ctx context.Context, dir, htpasswd string) (*registry, error) {
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	r := &registry{host: fmt.Sprintf("127.0.0.1:%d", port), done: make(chan struct{})}
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
`, filepath.Join(dir, "data"), r.host)
	if htpasswd != "" {
		conf += fmt.Sprintf("auth:\n  htpasswd:\n    realm: layerstore-e2e\n    path: %s\n", htpasswd)
	}
	cfg := filepath.Join(dir, "config.yml")
	if err := os.WriteFile(cfg, []byte(conf), 0o644); err != nil {
		return nil, err
	}
	r.cmd = exec.Command("docker-registry", "serve", cfg)
	r.cmd.Stdout, r.cmd.Stderr = &r.log, &r.errs
	if err := r.cmd.Start(); err != nil {
		return nil, err
	}
	go func() { r.cmd.Wait(); close(r.done) }()
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	for {
		if resp, err := http.Get("http://" + r.host + "/v2/"); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK || resp.StatusCode == http.StatusUnauthorized {
				return r, nil
			}
		}
		select {
		case <-r.done:
			return nil, fmt.Errorf("docker-registry exited: %s", r.errs.String())
		case <-ctx.Done():
			r.stop()
			return nil, fmt.Errorf("docker-registry not answering on %s: %s", r.host, r.errs.String())
		case <-time.After(50 * time.Millisecond):
		}
	}
}

func (r *registry) stop() {
	r.cmd.Process.Kill()
	<-r.done
}

// mark is a position in the access log, for blobGets.
func (r *registry) mark() int { return r.log.Len() }

// gets counts a blob's GET requests.
type gets struct {
	Full   int   // answered 200: the whole blob
	Ranged int   // answered 206
	Bytes  int64 // bytes sent
}

// accessLine matches a blob GET in the combined log format.
var accessLine = regexp.MustCompile(`"GET /v2/\S+/blobs/(sha256:[0-9a-f]{64}) HTTP/[0-9.]+" (\d{3}) (\d+|-)`)

// blobGets returns the blob GETs logged since mark. A request is logged once it is answered.
func (r *registry) blobGets(mark int) map[digest.Digest]gets {
	out := map[digest.Digest]gets{}
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

// lockedBuffer is written by a process and read by the tests.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) Len() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Len()
}

func (l *lockedBuffer) From(off int) string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return string(l.b.Bytes()[off:])
}

func (l *lockedBuffer) String() string { return l.From(0) }
