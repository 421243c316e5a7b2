// Command layerstore is the layerstore daemon and its tools.
//
//	layerstore serve [flags] MOUNTPOINT   serve the additional layer store (the daemon)
//	layerstore keep [--] layerstore serve ...  restart a crashed daemon with its FUSE session (no systemd)
//	layerstore status [--json]            show what the daemon serves
//	layerstore pin [--platform P] IMAGE...  keep images' layers local, verified, across restarts
//	layerstore unpin [--platform P] IMAGE...
//	layerstore profiles export|import FILE  share the startup profiles the daemon learned
//	layerstore doctor [--json] [flags]    check the node's setup end to end
//	layerstore dependents [--json] [--remove]  images that need the store; remove them
//	layerstore demo                       a self-contained demonstration with figures
//	layerstore version                    print the version
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
)

// version is set at build time with -ldflags "-X main.version=...".
var version = "dev"

const usage = `usage: layerstore COMMAND

commands:
  serve     serve the additional layer store at MOUNTPOINT (the daemon; see serve -h)
  keep      run "layerstore serve ..." as systemd runs the unit, where there is no systemd:
            a crashed daemon is restarted with its FUSE session (see keep -h)
  status    show the layers the daemon serves, its cache and counters (--json for scripts)
  pin       fetch and verify every lazily served layer of IMAGE... and keep them local,
            out of the cache's eviction and across restarts, with no registry needed
  unpin     let the layers of IMAGE... be evicted again
  profiles  export FILE: write the startup profiles the daemon learned (what containers read
            first, per repository) to FILE; import FILE: merge such a file into the daemon's
  doctor    check this node's setup end to end and say what to fix (see doctor -h)
  dependents  list the runtime's images whose layers come from the store, and with --remove
            remove them (podman rmi, crictl rmi): do this before turning the store off
  demo      build sample eStargz layers, serve them on 127.0.0.1 and read files lazily,
            verifying every chunk, with figures
  version   print the version
`

func main() {
	ctx, stop := notifyStop()
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// notifyStop makes SIGTERM and SIGINT stop the command: the first cancels ctx, and each later
// one is sent on the channel stopNow(ctx) returns, which serve takes as the order to stop at
// once. One subscription receives them all, in order: with two (signal.NotifyContext beside a
// channel of serve's own), the first signal could reach serve's channel after ctx was
// cancelled, and be taken for a second.
func notifyStop() (context.Context, func()) {
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGTERM, os.Interrupt)
	again := make(chan os.Signal, 1)
	ctx, cancel := context.WithCancel(context.WithValue(context.Background(), stopNowKey{}, (<-chan os.Signal)(again)))
	done := make(chan struct{})
	go func() {
		select {
		case <-sigs:
			cancel()
		case <-done:
			return
		}
		for {
			select {
			case sig := <-sigs:
				select {
				case again <- sig:
				default: // one unread is enough
				}
			case <-done:
				return
			}
		}
	}()
	return ctx, func() { signal.Stop(sigs); close(done); cancel() }
}

type stopNowKey struct{}

// stopNow returns the channel of the signals that follow the one that cancelled ctx (see
// notifyStop), or nil (never ready) when ctx did not come from notifyStop.
func stopNow(ctx context.Context) <-chan os.Signal {
	ch, _ := ctx.Value(stopNowKey{}).(<-chan os.Signal)
	return ch
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return 2
	}
	switch args[0] {
	case "serve":
		if err := runServe(ctx, args[1:], stderr); err != nil {
			if errors.Is(err, errUsage) {
				return 2
			}
			fmt.Fprintf(stderr, "layerstore serve: %v\n", err)
			return 1
		}
	case "keep":
		return runKeep(args[1:], stderr)
	case "status":
		if err := runStatus(ctx, args[1:], stdout, stderr); err != nil {
			if errors.Is(err, errUsage) {
				return 2
			}
			fmt.Fprintf(stderr, "layerstore status: %v\n", err)
			return 1
		}
	case "pin", "unpin":
		if err := runPin(ctx, args[0], args[1:], stdout, stderr); err != nil {
			if errors.Is(err, errUsage) {
				return 2
			}
			fmt.Fprintf(stderr, "layerstore %s: %v\n", args[0], err)
			return 1
		}
	case "profiles":
		if err := runProfiles(ctx, args[1:], stdout, stderr); err != nil {
			if errors.Is(err, errUsage) {
				return 2
			}
			fmt.Fprintf(stderr, "layerstore profiles: %v\n", err)
			return 1
		}
	case "doctor":
		return runDoctor(ctx, args[1:], stdout, stderr)
	case "dependents":
		return runDependents(ctx, args[1:], stdout, stderr)
	case "demo":
		if err := runDemo(ctx, stdout); err != nil {
			fmt.Fprintf(stderr, "layerstore demo: %v\n", err)
			return 1
		}
	case "version":
		fmt.Fprintln(stdout, "layerstore", version)
	case "help", "-h", "--help":
		fmt.Fprint(stdout, usage)
	default:
		fmt.Fprintf(stderr, "layerstore: unknown command %q\n\n%s", args[0], usage)
		return 2
	}
	return 0
}
