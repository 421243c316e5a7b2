package main

import (
	"context"
	"flag"
	"fmt"
	"io"

	"github.com/layerstore/layerstore/internal/control/protocol"
)

// runPin pins (or, with unpin, unpins) images through the daemon's control socket. A pin
// waits until every lazily served layer of the image is local, verified and kept out of the
// cache's eviction; an interrupted pin stays and is finished by pinning again.
func runPin(ctx context.Context, name string, args []string, stdout, stderr io.Writer) error {
	fl := flag.NewFlagSet(name, flag.ContinueOnError)
	fl.SetOutput(stderr)
	socket := fl.String("control-socket", "", "the daemon's control socket (default $"+protocol.SocketEnv+" or "+protocol.DefaultSocket+")")
	platform := fl.String("platform", "", "the platform of the image, os/arch[/variant] (default: the host's)")
	fl.Usage = func() {
		fmt.Fprintf(stderr, "usage: layerstore %s [--platform os/arch[/variant]] IMAGE...\n", name)
		fl.PrintDefaults()
	}
	if err := fl.Parse(args); err != nil || fl.NArg() == 0 {
		fl.Usage()
		return errUsage
	}
	c := protocol.NewClient(or(*socket, protocol.SocketPath()))
	for _, ref := range fl.Args() {
		req := protocol.PinRequest{Ref: ref, Platform: *platform}
		if name == "unpin" {
			if err := c.Unpin(ctx, req); err != nil {
				return err
			}
			fmt.Fprintf(stdout, "unpinned %s\n", ref)
			continue
		}
		p, err := c.Pin(ctx, req)
		if err != nil {
			return err
		}
		fmt.Fprintf(stdout, "pinned %s: %d layers served by the store, %s of %s local", ref, len(p.Layers),
			humanBytes(p.Present), humanBytes(p.Bytes))
		if p.Normal > 0 {
			fmt.Fprintf(stdout, "; %d layers pulled normally by the runtime", p.Normal)
		}
		fmt.Fprintln(stdout)
	}
	return nil
}
