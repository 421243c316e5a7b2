package fdstore

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// The test binary is also the process the tests start, as systemd or Exec would: with
// FDSTORE_TEST_CHILD set, TestMain runs child instead of the tests.
const childEnv = "FDSTORE_TEST_CHILD"

func TestMain(m *testing.M) {
	if mode := os.Getenv(childEnv); mode != "" {
		os.Exit(child(mode))
	}
	os.Exit(m.Run())
}

// report is what a child saw, printed as JSON on its stdout.
type report struct {
	Pid     int
	Err     string
	Names   []string
	Fds     []int
	Ids     []fileID
	Cloexec []bool
	Env     []string // LISTEN_* variables left in the environment
}

type fileID struct{ Dev, Ino uint64 }

func idOf(fd int) (fileID, error) {
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return fileID{}, err
	}
	return fileID{uint64(st.Dev), st.Ino}, nil
}

// child runs in a started process. "listen": Listen and report. "exec": open the file named
// by FDSTORE_TEST_FILE after a few others, and Exec the test binary (os.Args[0]) again in mode
// "listen", passing it as "data" (the pid stays: the report shows it); if Exec fails, report
// its error.
func child(mode string) int {
	switch mode {
	case "listen":
		r := report{Pid: os.Getpid()}
		files, err := Listen()
		if err != nil {
			r.Err = err.Error()
		}
		for _, f := range files {
			fd, _ := rawFd(f.File)
			id, _ := idOf(fd)
			flags, _ := unix.FcntlInt(uintptr(fd), unix.F_GETFD, 0)
			r.Names = append(r.Names, f.Name)
			r.Fds = append(r.Fds, fd)
			r.Ids = append(r.Ids, id)
			r.Cloexec = append(r.Cloexec, flags&unix.FD_CLOEXEC != 0)
		}
		for _, kv := range os.Environ() {
			if strings.HasPrefix(kv, "LISTEN_") || strings.HasPrefix(kv, "FDSTORE_FDNUMS") {
				r.Env = append(r.Env, kv)
			}
		}
		json.NewEncoder(os.Stdout).Encode(r)
		return 0
	case "exec":
		for range 5 {
			if _, err := os.Open(os.DevNull); err != nil {
				fmt.Fprintln(os.Stderr, err)
				return 1
			}
		}
		f, err := os.Open(os.Getenv("FDSTORE_TEST_FILE"))
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		// execve keeps duplicates (and the child reads the first): replace the mode.
		env := slices.DeleteFunc(os.Environ(), func(kv string) bool { return strings.HasPrefix(kv, childEnv+"=") })
		env = append(env, childEnv+"=listen")
		err = Exec(os.Args[0], os.Args[:1], env, []Named{{"data", f}})
		json.NewEncoder(os.Stdout).Encode(report{Pid: os.Getpid(), Err: err.Error()})
		return 0
	}
	return 2
}

// runChild runs cmd (the test binary or a wrapper of it) and decodes its report.
func runChild(t *testing.T, cmd *exec.Cmd) (report, int) {
	t.Helper()
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("child: %v: %s", err, errb.Bytes())
		}
	case <-time.After(30 * time.Second):
		cmd.Process.Kill()
		t.Fatal("child did not finish in 30 s")
	}
	var r report
	if err := json.Unmarshal(out.Bytes(), &r); err != nil {
		t.Fatalf("child's report %q: %v (stderr %s)", out.Bytes(), err, errb.Bytes())
	}
	return r, cmd.Process.Pid
}

// notifySocket is the service manager's end: a unixgram socket at NOTIFY_SOCKET.
func notifySocket(t *testing.T, path string) *net.UnixConn {
	t.Helper()
	ln, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: path, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	t.Setenv("NOTIFY_SOCKET", path)
	return ln
}

// receive reads one datagram with its SCM_RIGHTS descriptors, as systemd does.
func receive(t *testing.T, ln *net.UnixConn) (string, []*os.File) {
	t.Helper()
	ln.SetReadDeadline(time.Now().Add(10 * time.Second))
	buf, oob := make([]byte, 4096), make([]byte, unix.CmsgSpace(4*MaxFiles))
	n, oobn, flags, _, err := ln.ReadMsgUnix(buf, oob)
	if err != nil {
		t.Fatal(err)
	}
	if flags&(unix.MSG_TRUNC|unix.MSG_CTRUNC) != 0 {
		t.Fatalf("truncated datagram (flags %#x)", flags)
	}
	msgs, err := unix.ParseSocketControlMessage(oob[:oobn])
	if err != nil {
		t.Fatal(err)
	}
	var files []*os.File
	for _, m := range msgs {
		fds, err := unix.ParseUnixRights(&m)
		if err != nil {
			t.Fatal(err)
		}
		for _, fd := range fds {
			f := os.NewFile(uintptr(fd), "received")
			t.Cleanup(func() { f.Close() })
			files = append(files, f)
		}
	}
	return string(buf[:n]), files
}

func mustID(t *testing.T, f *os.File) fileID {
	t.Helper()
	fd, err := rawFd(f)
	if err != nil {
		t.Fatal(err)
	}
	id, err := idOf(fd)
	if err != nil {
		t.Fatal(err)
	}
	return id
}

// shim starts the test binary the way systemd starts a service: the descriptors at 3 on, and
// LISTEN_PID set to the pid of the process that runs the program, known only after the fork
// (systemd sets it in the child; here a shell sets it to its own pid and execs, keeping it).
func shim(t *testing.T, env []string, files ...*os.File) *exec.Cmd {
	t.Helper()
	cmd := exec.Command("/bin/sh", "-c", `LISTEN_PID=$$; export LISTEN_PID; exec "$0" "$@"`, os.Args[0])
	cmd.Env = append(os.Environ(), env...)
	cmd.ExtraFiles = files
	return cmd
}

// TestStoreThenStart plays the service manager: it receives FDSTORE=1 with the descriptors of
// a plain file and of a pipe over the notify socket (a path, then an abstract socket), checks
// they are the same files, and starts the next process with them as systemd does.
func TestStoreThenStart(t *testing.T) {
	plain := filepath.Join(t.TempDir(), "state")
	if err := os.WriteFile(plain, []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	pf, err := os.Open(plain)
	if err != nil {
		t.Fatal(err)
	}
	defer pf.Close()
	pr, pw, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer pr.Close()
	defer pw.Close()

	for _, sock := range []string{
		filepath.Join(t.TempDir(), "notify"),
		"@fdstore-test-" + strconv.Itoa(os.Getpid()),
	} {
		ln := notifySocket(t, sock)
		if err := Store("state", pf); err != nil {
			t.Fatalf("%s: %v", sock, err)
		}
		if err := Store("fuse", pr); err != nil {
			t.Fatalf("%s: %v", sock, err)
		}
		var got []*os.File
		for _, want := range []struct {
			msg string
			id  fileID
		}{{"FDSTORE=1\nFDNAME=state", mustID(t, pf)}, {"FDSTORE=1\nFDNAME=fuse", mustID(t, pr)}} {
			msg, files := receive(t, ln)
			if msg != want.msg || len(files) != 1 {
				t.Fatalf("%s: received %q with %d descriptors, want %q with 1", sock, msg, len(files), want.msg)
			}
			if id := mustID(t, files[0]); id != want.id {
				t.Errorf("%s: received descriptor is %+v, want the stored file %+v", sock, id, want.id)
			}
			got = append(got, files[0])
		}
		if err := Remove("fuse"); err != nil {
			t.Fatal(err)
		}
		if msg, files := receive(t, ln); msg != "FDSTOREREMOVE=1\nFDNAME=fuse" || len(files) != 0 {
			t.Errorf("%s: Remove sent %q with %d descriptors", sock, msg, len(files))
		}

		// The next start: the stored descriptors at 3 and 4, named, LISTEN_PID the child's.
		r, pid := runChild(t, shim(t, []string{childEnv + "=listen", "LISTEN_FDS=2", "LISTEN_FDNAMES=state:fuse"}, got...))
		if r.Err != "" {
			t.Fatalf("child: %s", r.Err)
		}
		if r.Pid != pid {
			t.Errorf("child ran as %d, started as %d (the shim must exec)", r.Pid, pid)
		}
		if !slices.Equal(r.Names, []string{"state", "fuse"}) || !slices.Equal(r.Fds, []int{3, 4}) {
			t.Errorf("child got names %q at %v, want state, fuse at 3, 4", r.Names, r.Fds)
		}
		if !slices.Equal(r.Ids, []fileID{mustID(t, pf), mustID(t, pr)}) {
			t.Errorf("child's descriptors are %+v, want the stored files", r.Ids)
		}
		if !slices.Equal(r.Cloexec, []bool{true, true}) {
			t.Errorf("close-on-exec after Listen: %v", r.Cloexec)
		}
		if len(r.Env) != 0 {
			t.Errorf("LISTEN_* left for children: %q", r.Env)
		}
	}
}

// TestStoreWithoutManager: no NOTIFY_SOCKET, no store; bad names refused before sending.
func TestStoreWithoutManager(t *testing.T) {
	t.Setenv("NOTIFY_SOCKET", "")
	if err := Store("fuse", os.Stdin); err != ErrNoManager {
		t.Errorf("Store without NOTIFY_SOCKET: %v, want ErrNoManager", err)
	}
	notifySocket(t, filepath.Join(t.TempDir(), "notify"))
	for _, name := range []string{"", "a:b", "a\nFDSTOREREMOVE=1", strings.Repeat("x", 256)} {
		if err := Store(name, os.Stdin); err == nil {
			t.Errorf("Store(%q) accepted", name)
		}
	}
	t.Setenv("NOTIFY_SOCKET", "vsock:2:1234")
	if err := Store("fuse", os.Stdin); err == nil || !strings.Contains(err.Error(), "NOTIFY_SOCKET") {
		t.Errorf("unsupported NOTIFY_SOCKET: %v", err)
	}
}

// TestListenOtherProcess: LISTEN_PID naming another process (inherited variables) gives no
// descriptor, leaves descriptor 3 as it was, and the variables are gone.
func TestListenOtherProcess(t *testing.T) {
	f, err := os.Open(os.DevNull)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), childEnv+"=listen", "LISTEN_PID=1", "LISTEN_FDS=1", "LISTEN_FDNAMES=fuse")
	cmd.ExtraFiles = []*os.File{f}
	r, _ := runChild(t, cmd)
	if r.Err != "" || len(r.Names) != 0 || len(r.Env) != 0 {
		t.Errorf("with another process's LISTEN_PID: err %q, files %q, env %q; want nothing", r.Err, r.Names, r.Env)
	}
}

// TestListenBadInput: malformed variables are clear errors, never a panic, and no descriptor
// is taken. The checks run in this process: every case fails before touching descriptor 3.
func TestListenBadInput(t *testing.T) {
	pid := strconv.Itoa(os.Getpid())
	for _, c := range []struct {
		env  [][2]string
		want string
	}{
		{[][2]string{{"LISTEN_PID", "abc"}, {"LISTEN_FDS", "1"}}, "not a process id"},
		{[][2]string{{"LISTEN_PID", "-4"}, {"LISTEN_FDS", "1"}}, "not a process id"},
		{[][2]string{{"LISTEN_PID", pid}, {"LISTEN_FDS", "one"}}, "LISTEN_FDS=\"one\""},
		{[][2]string{{"LISTEN_PID", pid}, {"LISTEN_FDS", "-1"}}, "LISTEN_FDS=\"-1\""},
		{[][2]string{{"LISTEN_PID", pid}, {"LISTEN_FDS", "99999999999999999999"}}, "LISTEN_FDS"},
		{[][2]string{{"LISTEN_PID", pid}, {"LISTEN_FDS", "65"}}, "from 0 to 64"},
		{[][2]string{{"LISTEN_PID", pid}, {"LISTEN_FDS", "1"}, {"LISTEN_FDNAMES", "a:b"}}, "names 2 descriptors"},
		{[][2]string{{"LISTEN_PID", pid}, {"LISTEN_FDS", "2"}, {"LISTEN_FDNAMES", "a"}}, "names 1 descriptors"},
		{[][2]string{{"LISTEN_PID", pid}, {"LISTEN_FDS", "1"}, {"LISTEN_FDNAMES", ""}}, "names 0 descriptors"},
		{[][2]string{{"LISTEN_PID", pid}, {"LISTEN_FDS", "64"}}, "descriptor"}, // 3..66 are not all open here
	} {
		for _, kv := range c.env {
			t.Setenv(kv[0], kv[1])
		}
		files, err := Listen()
		if err == nil || !strings.Contains(err.Error(), c.want) || len(files) != 0 {
			t.Errorf("%v: %d files, %v; want an error with %q", c.env, len(files), err, c.want)
		}
		for _, k := range []string{"LISTEN_PID", "LISTEN_FDS", "LISTEN_FDNAMES"} {
			if v, ok := os.LookupEnv(k); ok {
				t.Errorf("%v: %s=%q left in the environment", c.env, k, v)
			}
			os.Unsetenv(k)
		}
	}
	// No variables: nothing, no error.
	if files, err := Listen(); err != nil || len(files) != 0 {
		t.Errorf("without LISTEN_PID: %d files, %v", len(files), err)
	}
}

// TestExec: a process replaces itself with the test binary, passing a file it opened: the
// new program runs with the same pid and takes the file, named, with Listen, as if systemd
// had started it; descriptors 3 and 4 (which the Go runtime of the old process holds) are
// left alone.
func TestExec(t *testing.T) {
	path := filepath.Join(t.TempDir(), "data")
	if err := os.WriteFile(path, []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), childEnv+"=exec", "FDSTORE_TEST_FILE="+path)
	r, pid := runChild(t, cmd)
	if r.Err != "" {
		t.Fatalf("child: %s", r.Err)
	}
	if r.Pid != pid {
		t.Errorf("after Exec the pid is %d, was %d", r.Pid, pid)
	}
	want := fileID{uint64(st.Dev), st.Ino}
	if !slices.Equal(r.Names, []string{"data"}) || !slices.Equal(r.Ids, []fileID{want}) {
		t.Errorf("after Exec: %q, %+v; want data, %+v", r.Names, r.Ids, want)
	}
	if !slices.Equal(r.Cloexec, []bool{true}) {
		t.Errorf("close-on-exec after Listen: %v", r.Cloexec)
	}
	if len(r.Env) != 0 {
		t.Errorf("variables left for children: %q", r.Env)
	}
}

// TestExecFailure: an execve that fails (no such program) returns its error, and the process
// goes on with no descriptor leaked for its children.
func TestExecFailure(t *testing.T) {
	f, err := os.Open(os.DevNull)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	before, _ := os.ReadDir("/proc/self/fd")
	err = Exec("/nonexistent/fdstore-test", []string{"x"}, os.Environ(), []Named{{"data", f}})
	if err == nil || !strings.Contains(err.Error(), "exec /nonexistent") {
		t.Errorf("Exec of a missing program: %v", err)
	}
	if after, _ := os.ReadDir("/proc/self/fd"); len(after) != len(before) {
		t.Errorf("descriptors before Exec %d, after its failure %d", len(before), len(after))
	}
	if err := Exec("/bin/true", nil, nil, []Named{{"a:b", f}}); err == nil {
		t.Error("Exec accepted a name with ':'")
	}
}

// TestListenNumbers: FDSTORE_FDNUMS, set by Exec, is checked like the rest.
func TestListenNumbers(t *testing.T) {
	pid := strconv.Itoa(os.Getpid())
	for _, c := range [][2]string{{"1", "2"}, {"2", "7:7"}, {"1", "x"}, {"1", "5:6"}, {"1", ""}} {
		t.Setenv("LISTEN_PID", pid)
		t.Setenv("LISTEN_FDS", c[0])
		t.Setenv("FDSTORE_FDNUMS", c[1])
		if files, err := Listen(); err == nil || len(files) != 0 {
			t.Errorf("LISTEN_FDS=%s FDSTORE_FDNUMS=%q: %d files, %v; want an error", c[0], c[1], len(files), err)
		}
		if _, ok := os.LookupEnv("FDSTORE_FDNUMS"); ok {
			t.Error("FDSTORE_FDNUMS left in the environment")
		}
	}
}
