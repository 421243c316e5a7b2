package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"strings"
	"syscall"
	"time"

	storefs "github.com/layerstore/layerstore/fs"
	"github.com/layerstore/layerstore/internal/fdstore"
)

const keepUsage = `usage: layerstore keep [--] COMMAND [ARG...]

Run COMMAND, normally "layerstore serve ...", the way systemd runs the shipped unit, on nodes
without systemd: keep the FUSE session the daemon stores (sd_notify FDSTORE=1) and, when the
daemon crashes, start it again at once with that session (LISTEN_FDS), so that running
containers wait for it instead of failing. A clean exit of COMMAND (SIGTERM, SIGINT) ends keep
too, and the session with it, as a stop of the unit does: the store's mount, which the daemon
leaves for a successor when it is in use, is then detached. SIGTERM, SIGINT, SIGHUP and SIGUSR2
are passed to COMMAND. At most 5 starts in 10 seconds: a daemon that keeps crashing is left
stopped, and keep exits 1.
`

// Restart limits of keep, systemd's defaults (StartLimitBurst=, StartLimitIntervalSec=) and the
// unit's RestartSec=.
const (
	keepBurst    = 5
	keepInterval = 10 * time.Second
	keepDelay    = 100 * time.Millisecond
)

// runKeep runs argv under a Keeper until it exits cleanly or is told to stop, and returns its
// exit code.
func runKeep(args []string, stderr io.Writer) int {
	if len(args) > 0 && args[0] == "--" {
		args = args[1:]
	}
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" {
		fmt.Fprint(stderr, keepUsage)
		return 2
	}
	dir, err := os.MkdirTemp("", "layerstore-keep-") // 0700: only this user can notify
	if err != nil {
		fmt.Fprintf(stderr, "layerstore keep: %v\n", err)
		return 1
	}
	defer os.RemoveAll(dir)
	k, err := fdstore.NewKeeper(dir)
	if err != nil {
		fmt.Fprintf(stderr, "layerstore keep: %v\n", err)
		return 1
	}
	// At the end, as the unit's ExecStopPost= does: the session closed (the kernel ends the
	// connection), a mount the daemon left for a successor is detached.
	defer func() {
		k.Close()
		if mnt, ok := strings.CutPrefix(k.Status(), servingStatus); ok {
			if err := storefs.ClearDeadMount(mnt); err != nil {
				fmt.Fprintf(stderr, "layerstore keep: %v\n", err)
			}
		}
	}()
	sigs := make(chan os.Signal, 8)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP, syscall.SIGUSR2)
	defer signal.Stop(sigs)

	var starts []time.Time
	stopping := false
	for {
		now := time.Now()
		for len(starts) > 0 && now.Sub(starts[0]) > keepInterval {
			starts = starts[1:]
		}
		if len(starts) >= keepBurst {
			fmt.Fprintf(stderr, "layerstore keep: %s started %d times in %v: giving up\n", args[0], keepBurst, keepInterval)
			return 1
		}
		starts = append(starts, now)
		cmd, err := k.Command(args, nil)
		if err != nil {
			fmt.Fprintf(stderr, "layerstore keep: %v\n", err)
			return 1
		}
		cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, stderr
		err = cmd.Start()
		fdstore.CloseExtra(cmd)
		if err != nil {
			fmt.Fprintf(stderr, "layerstore keep: %v\n", err)
			return 1
		}
		// keep only waits from now on: what its start touched goes, its heap and its mappings of
		// the binary, so that the daemon can reclaim the pages they share (see unmapStartCode).
		releaseStartMemory()
		_, _ = unmapStartCode()
		exited := make(chan error, 1)
		go func() { exited <- cmd.Wait() }()
		var werr error
	wait:
		for {
			select {
			case sig := <-sigs:
				if sig == syscall.SIGTERM || sig == syscall.SIGINT {
					stopping = true
				}
				_ = cmd.Process.Signal(sig)
			case werr = <-exited:
				break wait
			}
		}
		var exit *exec.ExitError
		switch {
		case werr == nil:
			return 0
		case stopping && errors.As(werr, &exit) && exit.Exited():
			return exit.ExitCode()
		case stopping:
			return 1
		}
		fmt.Fprintf(stderr, "layerstore keep: %s ended (%v): starting it again with %d kept descriptors\n", args[0], werr, len(k.Stored()))
		time.Sleep(keepDelay)
	}
}
