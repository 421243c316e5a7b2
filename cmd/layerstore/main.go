// Command layerstore is the layerstore daemon and its tools.
//
//	layerstore demo      build sample lazy-pullable layers, serve them on 127.0.0.1 and read
//	                     a few files through the verified lazy path, with figures
//	layerstore version   print the version
package main

import (
	"context"
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
  demo      build sample eStargz layers, serve them on 127.0.0.1 and read files lazily,
            verifying every chunk, with figures
  version   print the version
`

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return 2
	}
	switch args[0] {
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
