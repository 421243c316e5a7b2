// Package svcmanager lets tests play systemd's part for a daemon (tests must never start an
// init system): the daemon's notify socket, READY=1, and the file descriptor store handed to
// the next process, through fdstore.Keeper, the same code `layerstore keep` runs.
package svcmanager

import (
	"errors"
	"testing"
	"time"

	"github.com/layerstore/layerstore/internal/fdstore"
)

// Manager is the service manager of one daemon, across its restarts, for as long as the test
// runs; what it keeps is closed when the test ends.
type Manager struct {
	*fdstore.Keeper
}

// New listens on dir/notify.sock until the test ends.
func New(t *testing.T, dir string) *Manager {
	t.Helper()
	k, err := fdstore.NewKeeper(dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(k.Close)
	return &Manager{k}
}

var (
	ErrExited  = errors.New("the daemon exited before READY=1")
	ErrNoReady = errors.New("no READY=1 from the daemon")
)

// WaitReady waits for the next READY=1, or fails after timeout; exited, when closed first,
// means the daemon ended before it was ready.
func (m *Manager) WaitReady(timeout time.Duration, exited <-chan struct{}) error {
	select {
	case <-m.Ready():
		return nil
	case <-exited:
		return ErrExited
	case <-time.After(timeout):
		return ErrNoReady
	}
}
