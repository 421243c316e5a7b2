package fdstore

import (
	"fmt"
	"os"
	"testing"
	"time"
)

// TestKeeper: what a process stores is handed over under its name, one per name, in the
// environment systemd uses, and goes when removed or when it hangs up.
func TestKeeper(t *testing.T) {
	m, err := NewKeeper(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	t.Setenv("NOTIFY_SOCKET", m.Path())
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	for range 2 {
		if err := Store("pipe", w); err != nil {
			t.Fatal(err)
		}
	}
	if err := Store("other", r); err != nil {
		t.Fatal(err)
	}
	waitNames := func(want ...string) {
		t.Helper()
		for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(5 * time.Millisecond) {
			got := m.Names()
			if len(got) == len(want) {
				ok := true
				for i := range got {
					ok = ok && got[i] == want[i]
				}
				if ok {
					return
				}
			}
			if time.Now().After(deadline) {
				t.Fatalf("stored %q, want %q", got, want)
			}
		}
	}
	waitNames("pipe", "other")
	cmd, err := m.Command([]string{"/bin/sh", "-c", `echo "$LISTEN_PID $$ $LISTEN_FDS $LISTEN_FDNAMES $NOTIFY_SOCKET"; exec 3>&- 4>&- || exit 1`}, []string{"LISTEN_FDS=9"})
	if err != nil {
		t.Fatal(err)
	}
	out, err := cmd.Output()
	CloseExtra(cmd)
	if want := fmt.Sprintf("%d %d 2 pipe:other %s\n", cmd.Process.Pid, cmd.Process.Pid, m.Path()); err != nil || string(out) != want {
		t.Fatalf("the next process got %q (%v), want %q", out, err, want)
	}
	if err := Remove("other"); err != nil {
		t.Fatal(err)
	}
	waitNames("pipe")
	// The write end hangs up once the read end is closed everywhere: no longer handed over.
	w.Close()
	r.Close()
	if got := m.Stored(); len(got) != 0 {
		t.Errorf("a pipe that hung up was handed over: %v", got)
	}
}
