package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/sirupsen/logrus"
	"go.podman.io/storage/pkg/reexec"
)

// errUsage marks errors in the command line; they exit with status 2.
var errUsage = errors.New("usage")

func main() {
	// c/storage re-executes this binary for some of its work (overlay mounts with long
	// option strings, chrooted layer extraction): those children must not run main.
	if reexec.Init() {
		return
	}
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// run executes one subcommand and returns the process exit status.
func run(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	var result any
	var err error
	switch args[0] {
	case "convert":
		result, err = runConvert(ctx, args[1:])
	case "pull":
		result, err = runPull(ctx, args[1:])
	case "compress":
		result, err = runCompress(ctx, args[1:])
	case "crio-start":
		result, err = runCRIOStart(ctx, args[1:])
	case "crio-repair":
		result, err = runCRIORepair(ctx, args[1:])
	case "crio-stop":
		result, err = runCRIOStop(ctx, args[1:])
	case "images":
		result, err = runImages(ctx, args[1:])
	case "run":
		result, err = runRun(ctx, args[1:])
	case "rmi":
		result, err = runRmi(ctx, args[1:])
	case "help", "-h", "--help":
		fmt.Fprint(stdout, usage)
		return 0
	default:
		err = fmt.Errorf("%w: unknown subcommand %q", errUsage, args[0])
	}
	// A failure that comes with a result prints the result too: what was found before it.
	var f *failure
	if errors.As(err, &f) {
		result = f.result
	}
	switch {
	case errors.Is(err, flag.ErrHelp):
		return 0
	case errors.Is(err, errUsage):
		fmt.Fprintf(stderr, "harness: %v\n\n%s", err, usage)
		return 2
	case err != nil && f == nil:
		fmt.Fprintf(stderr, "harness: %v\n", err)
		return 1
	}
	enc := json.NewEncoder(stdout)
	enc.SetIndent("", "  ")
	if werr := enc.Encode(result); werr != nil {
		fmt.Fprintf(stderr, "harness: writing result: %v\n", werr)
		return 1
	}
	if err != nil {
		fmt.Fprintf(stderr, "harness: %v\n", err)
		return 1
	}
	return 0
}

// failure is an error that comes with a result: run prints the result as JSON on stdout, the
// error on stderr, and exits with status 1.
type failure struct {
	result any
	err    error
}

func (f *failure) Error() string { return f.err.Error() }
func (f *failure) Unwrap() error { return f.err }

// failWith returns err with result attached, or nil when err is nil.
func failWith(result any, err error) error {
	if err == nil {
		return nil
	}
	return &failure{result: result, err: err}
}

const usage = `usage:
  harness convert [--compress gzip|zstd|zstd:chunked] [--all] [--dest-tls-verify=false] SRC DST
  harness pull REF [--pause FILE] [--list SCRIPT] [--save PATH] [--push DSTREF] [--rmi]
  harness compress BLOBFILE < TAR     (zstd:chunked with c/storage's compressor; prints the annotations)
CRI-O's storage steps, each in a new process as after a restart:
  harness crio-start [--clean-shutdown-file FILE]
  harness crio-repair
  harness crio-stop [--clean-shutdown-file FILE]
  harness images [--pinned PATTERN]... [IMAGE...]
  harness run IMAGE --list SCRIPT [--name NAME] [--hold FILE]
  harness rmi IMAGE
common flags: --timeout DURATION (default 2m), --debug
configuration: CONTAINERS_STORAGE_CONF, CONTAINERS_REGISTRIES_CONF, REGISTRY_AUTH_FILE
`

// commonFlags are accepted by every subcommand.
type commonFlags struct {
	timeout time.Duration
	debug   bool
}

func (c *commonFlags) register(fs *flag.FlagSet) {
	fs.DurationVar(&c.timeout, "timeout", 2*time.Minute, "upper bound for the whole run")
	fs.BoolVar(&c.debug, "debug", false, "log c/image and c/storage debug messages to stderr")
}

// apply configures logging and returns ctx bounded by the timeout.
func (c *commonFlags) apply(ctx context.Context) (context.Context, context.CancelFunc, error) {
	if c.timeout <= 0 {
		return nil, nil, fmt.Errorf("%w: --timeout must be greater than zero", errUsage)
	}
	logrus.SetOutput(os.Stderr)
	if c.debug {
		logrus.SetLevel(logrus.DebugLevel)
	}
	ctx, cancel := context.WithTimeout(ctx, c.timeout)
	return ctx, cancel, nil
}

// newFlagSet returns a flag set that reports errors only through its return values.
func newFlagSet(name string, common *commonFlags) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	common.register(fs)
	return fs
}

// parseArgs parses flags placed before, between or after the positional arguments, which
// it returns. Everything after "--" is positional.
func parseArgs(fs *flag.FlagSet, args []string) ([]string, error) {
	var positional []string
	for {
		if err := fs.Parse(args); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				fmt.Fprint(os.Stdout, usage)
				fs.SetOutput(os.Stdout)
				fs.PrintDefaults()
				return nil, err
			}
			return nil, fmt.Errorf("%w: %w", errUsage, err)
		}
		rest := fs.Args()
		if consumed := len(args) - len(rest); consumed > 0 && args[consumed-1] == "--" {
			return append(positional, rest...), nil
		}
		if len(rest) == 0 {
			return positional, nil
		}
		positional = append(positional, rest[0])
		args = rest[1:]
	}
}
