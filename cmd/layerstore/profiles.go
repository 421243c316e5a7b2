package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/layerstore/layerstore/internal/control/protocol"
)

// runProfiles exports the daemon's startup profiles to a file, or imports a file of them, so
// that a fleet of nodes can share what each learned.
func runProfiles(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fl := flag.NewFlagSet("profiles", flag.ContinueOnError)
	fl.SetOutput(stderr)
	socket := fl.String("control-socket", "", "the daemon's control socket (default $"+protocol.SocketEnv+" or "+protocol.DefaultSocket+")")
	fl.Usage = func() {
		fmt.Fprintln(stderr, "usage: layerstore profiles export FILE   write the daemon's startup profiles to FILE (- for stdout)")
		fmt.Fprintln(stderr, "       layerstore profiles import FILE   merge the startup profiles of FILE (- for stdin) into the daemon's")
		fl.PrintDefaults()
	}
	if err := fl.Parse(args); err != nil || fl.NArg() != 2 || (fl.Arg(0) != "export" && fl.Arg(0) != "import") {
		fl.Usage()
		return errUsage
	}
	c := protocol.NewClient(or(*socket, protocol.SocketPath()))
	file := fl.Arg(1)
	if fl.Arg(0) == "import" {
		in := io.Reader(os.Stdin)
		if file != "-" {
			f, err := os.Open(file)
			if err != nil {
				return err
			}
			defer f.Close()
			in = f
		}
		imp, err := c.ImportProfiles(ctx, in)
		if err != nil {
			return err
		}
		fmt.Fprintf(stdout, "imported the startup profiles of %d repositories (%d layers)\n", imp.Repositories, imp.Layers)
		return nil
	}
	if file == "-" {
		return c.ExportProfiles(ctx, stdout)
	}
	// Written to a temporary file renamed into place: FILE is the whole export or untouched.
	tmp, err := os.CreateTemp(filepath.Dir(file), "."+filepath.Base(file)+".*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if err := c.ExportProfiles(ctx, tmp); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), file)
}
