package main

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
	"syscall"
	"time"

	"github.com/opencontainers/go-digest"
)

// registry is Debian's docker-registry (distribution 2.8) on 127.0.0.1, storing its blobs in
// the image cache so that a second run finds the images pushed. Its access log (stdout) tells
// full blob downloads (200) from range requests (206).
type registry struct {
	host    string // "127.0.0.1:PORT", the unshaped address (pushes)
	dataDir string
	cmd     *exec.Cmd
	log     lockedBuffer // access log
	errs    lockedBuffer // the registry's own log
	done    chan struct{}
}

func startRegistry(ctx context.Context, dataDir, confDir string) (*registry, error) {
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	r := &registry{host: fmt.Sprintf("127.0.0.1:%d", port), dataDir: dataDir, done: make(chan struct{})}
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
`, dataDir, r.host)
	cfg := filepath.Join(confDir, "registry.yml")
	if err := os.WriteFile(cfg, []byte(conf), 0o644); err != nil {
		return nil, err
	}
	r.cmd = exec.Command("docker-registry", "serve", cfg)
	r.cmd.Stdout, r.cmd.Stderr = &r.log, &r.errs
	r.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true} // a ^C reaches it only through stop
	if err := r.cmd.Start(); err != nil {
		return nil, err
	}
	go func() { r.cmd.Wait(); close(r.done) }()
	deadline := time.Now().Add(30 * time.Second)
	for {
		if resp, err := http.Get("http://" + r.host + "/v2/"); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return r, nil
			}
		}
		select {
		case <-r.done:
			return nil, fmt.Errorf("docker-registry exited: %s", r.errs.String())
		case <-ctx.Done():
			r.stop()
			return nil, ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			r.stop()
			return nil, fmt.Errorf("docker-registry not answering on %s: %s", r.host, r.errs.String())
		}
	}
}

// stop ends the registry by its PID: SIGTERM, SIGKILL after 5 s.
func (r *registry) stop() {
	select {
	case <-r.done:
		return
	default:
	}
	r.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-r.done:
	case <-time.After(5 * time.Second):
		r.cmd.Process.Kill()
		<-r.done
	}
}

// blobPath is where the registry's filesystem driver keeps blob d.
func (r *registry) blobPath(d digest.Digest) string {
	e := d.Encoded()
	return filepath.Join(r.dataDir, "docker/registry/v2/blobs", d.Algorithm().String(), e[:2], e, "data")
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

// lockedBuffer is written by a process and read by the benchmark.
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
