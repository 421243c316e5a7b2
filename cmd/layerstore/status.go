package main

import (
	"context"
	"encoding/json"
	"flag"
	"io"

	"github.com/layerstore/layerstore/internal/control"
	"github.com/layerstore/layerstore/internal/control/protocol"
)

func runStatus(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fl := flag.NewFlagSet("status", flag.ContinueOnError)
	fl.SetOutput(stderr)
	socket := fl.String("control-socket", "", "the daemon's control socket (default $"+protocol.SocketEnv+" or "+protocol.DefaultSocket+")")
	asJSON := fl.Bool("json", false, "print the status as JSON")
	if err := fl.Parse(args); err != nil || fl.NArg() != 0 {
		return errUsage
	}
	st, err := protocol.NewClient(or(*socket, protocol.SocketPath())).Status(ctx)
	if err != nil {
		return err
	}
	if *asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(st)
	}
	control.Render(stdout, st)
	return nil
}
