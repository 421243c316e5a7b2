package e2e

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/remote"

	"github.com/layerstore/layerstore/internal/testutil/testlayer"
	"github.com/layerstore/layerstore/internal/testutil/testregistry"
)

// The loop image: busybox, and loopFiles files of loopSize random bytes, /f/f0 to /f/f199.
const (
	loopFiles = 200
	loopSize  = 48 << 10
)

// loopScript reads the loop image's files one after another, round and round, every 20 ms,
// appending "i n sha256" (or "i n ERR message") to /out/log for the i-th read, of /f/f<n>,
// until /out/stop exists. The first round reads files nobody read before; the next ones read
// files the cache has.
const loopScript = `i=0
while [ ! -e /out/stop ]; do
	n=$((i % 200))
	if h=$(/bin/busybox sha256sum /f/f$n 2>&1); then echo "$i $n ${h%% *}"; else echo "$i $n ERR $h"; fi >>/out/log
	i=$((i+1))
	/bin/busybox usleep 20000
done`

// pushLoop pushes the loop image to the registry and returns it with the sha256 of each file.
func (o *outage) pushLoop(t *testing.T, busybox string) (*image, []string) {
	t.Helper()
	base, err := baseLayer(busybox)
	if err != nil {
		t.Fatal(err)
	}
	es := []tarEntry{tarDir("f")}
	sums := make([]string, loopFiles)
	for i := range loopFiles {
		data := make([]byte, loopSize)
		rand.Read(data)
		sum := sha256.Sum256(data)
		sums[i] = hex.EncodeToString(sum[:])
		es = append(es, tarFile(fmt.Sprintf("f/f%d", i), data))
	}
	var ls []testregistry.LayerBlob
	for i, tr := range [][]byte{base, testlayer.Build(es)} {
		l, err := stargzLayer()(fmt.Sprintf("loop-layer%d", i), tr)
		if err != nil {
			t.Fatal(err)
		}
		ls = append(ls, l)
	}
	img, err := testregistry.Image(testregistry.Platform{OS: runtime.GOOS, Architecture: runtime.GOARCH, Layers: ls})
	if err != nil {
		t.Fatal(err)
	}
	ref := o.Host + "/outage/loop:v1"
	r, err := name.ParseReference(ref, name.Insecure)
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.Write(r, img, remote.WithContext(t.Context())); err != nil {
		t.Fatal(err)
	}
	out, err := describe(t.Context(), "loop", ref, nil)
	if err != nil {
		t.Fatal(err)
	}
	return out, sums
}

// nextBinary builds (once per run) a daemon binary of another version, for upgrades.
func (s *suite) nextBinary(t *testing.T) string {
	t.Helper()
	s.nextOnce.Do(func() {
		path := filepath.Join(s.dir, "next", "layerstore")
		out, err := run(t.Context(), nil, "go", "build", "-C", "..", "-ldflags", "-X main.version=e2e-next", "-o", path, "./cmd/layerstore")
		if err != nil {
			s.nextErr = fmt.Errorf("go build: %v\n%s", err, out)
		}
		s.next = path
	})
	if s.nextErr != nil {
		t.Fatal(s.nextErr)
	}
	return s.next
}

// logWatch follows a file that a container appends lines to, and records when each complete
// line appeared (polled every 2 ms).
type logWatch struct {
	path string
	stop chan struct{}
	done chan struct{}

	mu    sync.Mutex
	lines []string
	at    []time.Time
}

func watchLog(t *testing.T, path string) *logWatch {
	w := &logWatch{path: path, stop: make(chan struct{}), done: make(chan struct{})}
	go w.run()
	t.Cleanup(w.close)
	return w
}

func (w *logWatch) close() {
	select {
	case <-w.stop:
	default:
		close(w.stop)
	}
	<-w.done
}

func (w *logWatch) run() {
	defer close(w.done)
	var off int64
	var partial []byte
	tick := time.NewTicker(2 * time.Millisecond)
	defer tick.Stop()
	buf := make([]byte, 64<<10)
	for {
		select {
		case <-w.stop:
			return
		case <-tick.C:
		}
		f, err := os.Open(w.path)
		if err != nil {
			continue
		}
		n, _ := f.ReadAt(buf, off)
		f.Close()
		if n == 0 {
			continue
		}
		now := time.Now()
		off += int64(n)
		partial = append(partial, buf[:n]...)
		w.mu.Lock()
		for {
			i := bytes.IndexByte(partial, '\n')
			if i < 0 {
				break
			}
			w.lines = append(w.lines, string(partial[:i]))
			w.at = append(w.at, now)
			partial = partial[i+1:]
		}
		w.mu.Unlock()
	}
}

func (w *logWatch) count() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.lines)
}

// waitLines waits until n lines were written, failing after timeout.
func (w *logWatch) waitLines(t *testing.T, n int, timeout time.Duration) {
	t.Helper()
	for deadline := time.Now().Add(timeout); w.count() < n; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%d lines of the loop after %v, want %d:\n%s", w.count(), timeout, n, w.tail(10))
		}
	}
}

func (w *logWatch) tail(n int) string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return strings.Join(w.lines[max(0, len(w.lines)-n):], "\n")
}

// longestGap returns the longest time between two consecutive lines, and the index of the
// line that ended it.
func (w *logWatch) longestGap() (time.Duration, int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	var gap time.Duration
	end := 0
	for i := 1; i < len(w.at); i++ {
		if g := w.at[i].Sub(w.at[i-1]); g > gap {
			gap, end = g, i
		}
	}
	return gap, end
}

// check verifies every line: consecutive reads, each of the right file with its content's
// sha256, no error. It returns the files read for the first time at or after line from.
func (w *logWatch) check(t *testing.T, sums []string, from int) (firstAfter int) {
	t.Helper()
	w.mu.Lock()
	defer w.mu.Unlock()
	seen := map[int]bool{}
	for i, line := range w.lines {
		f := strings.Fields(line)
		if len(f) < 3 {
			t.Fatalf("line %d of the loop: %q", i, line)
		}
		k, err1 := strconv.Atoi(f[0])
		n, err2 := strconv.Atoi(f[1])
		if err1 != nil || err2 != nil || k != i || n != i%loopFiles {
			t.Fatalf("line %d of the loop: %q", i, line)
		}
		if f[2] != sums[n] {
			t.Errorf("read %d of /f/f%d in the container: %s", i, n, strings.Join(f[2:], " "))
		}
		if !seen[n] && i >= from {
			firstAfter++
		}
		seen[n] = true
	}
	return firstAfter
}

// TestContainerSurvivesRestart: with podman 4.3.1 and podman 5, a container reads the files of
// its lazily pulled image in a loop, some already in the cache, others never fetched, while the daemon is killed (kill -9),
// stopped (SIGTERM), upgraded to another binary, or re-executed in place (SIGUSR2), and
// started again by its service manager with the FUSE session it kept: every read of the loop
// succeeds with the right bytes, files never fetched before are fetched by the new process,
// and the longest pause of the loop is at most the restart's time plus one second.
func TestContainerSurvivesRestart(t *testing.T) {
	s := need(t)
	o := s.newOutage(t)
	img, sums := o.pushLoop(t, "/bin/busybox")
	next := s.nextBinary(t)
	for _, rt := range []struct{ name, bin string }{{"podman4", "podman"}, {"podman5", s.podman5}} {
		t.Run(rt.name, func(t *testing.T) { containerSurvivesRestart(t, s, o, img, sums, next, rt.bin) })
	}
}

func containerSurvivesRestart(t *testing.T, s *suite, o *outage, img *image, sums []string, next, bin string) {
	for _, tc := range []struct {
		name    string
		restart func(t *testing.T, d *daemon)
	}{
		{"kill", func(t *testing.T, d *daemon) { d.stop(syscall.SIGKILL); d.start(t) }},
		{"stop", func(t *testing.T, d *daemon) { d.stop(syscall.SIGTERM); d.start(t) }},
		{"upgrade", func(t *testing.T, d *daemon) { d.stop(syscall.SIGTERM); d.startBinary(t, next) }},
		{"reexec", func(t *testing.T, d *daemon) { d.reexec(t) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// No background fetch: what the loop has not read is not local.
			d := s.startDaemonWith(t, o.daemonConfig(t, "", "[prefetch]\nenabled = false\n"))
			p := s.newRuntime(t, bin, d.mnt, o.conf)
			p.must(t, "pull", img.ref)
			out := t.TempDir()
			p.must(t, "run", "-d", "--name", "loop", "--net=none", "-v", out+":/out", img.ref, "/bin/busybox", "sh", "-c", loopScript)
			t.Cleanup(func() {
				os.WriteFile(filepath.Join(out, "stop"), nil, 0o644)
				run(context.Background(), p.env, p.bin, "rm", "--force", "--time", "1", "loop")
			})
			w := watchLog(t, filepath.Join(out, "log"))
			w.waitLines(t, 40, time.Minute)

			start := time.Now()
			tc.restart(t, d)
			took := time.Since(start)
			at := w.count()
			w.waitLines(t, at+loopFiles, 3*time.Minute)
			if err := os.WriteFile(filepath.Join(out, "stop"), nil, 0o644); err != nil {
				t.Fatal(err)
			}
			p.must(t, "wait", "loop")
			w.close()

			fresh := w.check(t, sums, at)
			gap, end := w.longestGap()
			t.Logf("%s: restart took %v (%d reads before it); longest pause of the loop %v, ending at read %d; %d files read for the first time after it",
				tc.name, took.Round(time.Millisecond), at, gap.Round(time.Millisecond), end, fresh)
			if fresh == 0 {
				t.Errorf("every file was read before the restart: the test shows nothing about fetches after it")
			}
			if gap > took+time.Second {
				t.Errorf("the loop paused %v, more than the restart (%v) plus one second", gap, took)
			}
			if ns := d.manager.Names(); len(ns) == 0 {
				t.Errorf("nothing in the fd store after the restart")
			}
			// The files read for the first time were fetched by the process after the
			// restart (no background fetch), and it counts the runtime's uses of the layers
			// taken before it (from the session).
			st := d.status(t)
			users := int64(0)
			for _, l := range st.Layers {
				users += l.Users
			}
			t.Logf("%s: after the restart, %d bytes fetched on demand; the runtime's uses of the layers: %d", tc.name, st.Counters.OnDemandBytes, users)
			if st.Counters.OnDemandBytes < int64(fresh)*loopSize/2 { // a margin: reads fetch whole chunks, some fetched before
				t.Errorf("%d bytes fetched on demand after the restart, fewer than the %d files read for the first time", st.Counters.OnDemandBytes, fresh)
			}
			if users == 0 {
				t.Errorf("the daemon after the restart counts no use of the image's layers: %+v", st.Layers)
			}
			if !strings.Contains(d.log.String(), "resumed") {
				t.Errorf("the daemon did not say it resumed the session")
			}
		})
	}
}

// reexec sends SIGUSR2, on which the daemon re-executes its binary in place with its FUSE
// session, and waits for the new program's READY=1.
func (d *daemon) reexec(t *testing.T) {
	t.Helper()
	if err := d.cmd.Process.Signal(syscall.SIGUSR2); err != nil {
		t.Fatal(err)
	}
	if err := d.manager.WaitReady(60*time.Second, d.done); err != nil {
		t.Fatalf("after SIGUSR2: %v\n%s", err, d.log.String())
	}
}
