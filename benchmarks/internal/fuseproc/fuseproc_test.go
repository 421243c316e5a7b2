package fuseproc

import (
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

func spec(t *testing.T, script string) Spec {
	dir := t.TempDir()
	return Spec{What: "store", Cmd: exec.Command("sh", "-c", script), Log: filepath.Join(dir, "log"),
		Mountpoint: dir, Stop: syscall.SIGTERM, Timeout: 300 * time.Millisecond}
}

func TestNeverMountedIsStoppedWithItsLog(t *testing.T) {
	s := spec(t, "echo starting; exec sleep 60")
	start := time.Now()
	_, err := Start(t.Context(), s)
	if err == nil || !strings.Contains(err.Error(), "store not ready after 300ms") || !strings.Contains(err.Error(), "starting") {
		t.Fatalf("err = %v", err)
	}
	if s.Cmd.ProcessState == nil {
		t.Fatal("the process still runs")
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("took %v", d)
	}
}

func TestExitBeforeMountFails(t *testing.T) {
	s := spec(t, "echo no such registry; exit 3")
	s.Timeout = time.Minute
	if _, err := Start(t.Context(), s); err == nil || !strings.Contains(err.Error(), "store exited: no such registry") {
		t.Fatalf("err = %v", err)
	}
}

func TestCPU(t *testing.T) {
	cmd := exec.Command("sh", "-c", "i=0; while [ $i -lt 20000 ]; do i=$((i+1)); done; exec sleep 60")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	time.Sleep(200 * time.Millisecond)
	if cpu, err := (&Proc{Cmd: cmd}).CPU(); err != nil || cpu < 0 || cpu > 60 {
		t.Fatalf("CPU = %v, %v", cpu, err)
	}
}

func TestMounted(t *testing.T) {
	if Mounted(t.TempDir()) {
		t.Fatal("a temporary directory is no FUSE mount")
	}
}
