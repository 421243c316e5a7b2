// Command layerstore-auth-helper hands the registry credentials podman and CRI-O pull with to
// the layerstore daemon, so that the daemon can read layers of private repositories lazily.
//
// It is containers/image's additional layer store auth helper (containers/image 5.32 or
// later). It is installed beside `layerstore` in /usr/bin and enabled by one line at the top
// level of registries.conf (or of a drop-in in registries.conf.d):
//
//	additional-layer-store-auth-helper = "layerstore-auth-helper"
//
// On every pull from a docker:// source, containers/image runs it without arguments and
// writes to its stdin the credentials it pulled with, keyed by the whole image reference:
//
//	{"quay.io/team/app:v1": {"username": "u", "password": "p", "identityToken": ""}}
//
// The helper checks that this is such a JSON object and posts it to the daemon's control
// socket, where the daemon keeps the credentials for the repository (tag and digest dropped)
// for its credential-ttl. The socket is the one given with --control-socket, else
// $LAYERSTORE_CONTROL_SOCKET, else /run/layerstore/control.sock; it is root's only, so the
// helper serves rootful podman and CRI-O.
//
// It exits 0, printing nothing, once the daemon has the credentials; else it prints one line
// on stderr and exits 1, which containers/image reports as a warning without failing the
// pull. containers/image discards that line and warns only "exit status 1": to see why, run
// the helper by hand, e.g. `echo '{}' | layerstore-auth-helper`. Its input holds secrets: no
// message quotes it. The whole run is bounded by 5 seconds.
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"time"

	"github.com/layerstore/layerstore/internal/control/protocol"
)

// timeout bounds a whole run: reading stdin and handing the credentials over.
const timeout = 5 * time.Second

// maxInput bounds what is read from stdin; c/image writes one entry of a few hundred bytes.
const maxInput = 1 << 20

const usage = `usage: layerstore-auth-helper [--control-socket PATH] < CREDENTIALS.json

Hands the registry credentials containers/image writes on stdin to the layerstore daemon.
Enabled in registries.conf with:

  additional-layer-store-auth-helper = "layerstore-auth-helper"

flags:
`

func main() {
	os.Exit(run(context.Background(), os.Args[1:], os.Stdin, os.Stderr))
}

// run is the whole command; it returns the exit status.
func run(ctx context.Context, args []string, stdin io.Reader, stderr io.Writer) int {
	fl := flag.NewFlagSet("layerstore-auth-helper", flag.ContinueOnError)
	fl.SetOutput(stderr)
	fl.Usage = func() { fmt.Fprint(stderr, usage); fl.PrintDefaults() }
	socket := fl.String("control-socket", "", "the daemon's control socket (default $"+protocol.SocketEnv+" or "+protocol.DefaultSocket+")")
	if err := fl.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if fl.NArg() != 0 {
		fl.Usage()
		return 2
	}
	path := *socket
	if path == "" {
		path = protocol.SocketPath()
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	if err := handOver(ctx, path, stdin); err != nil {
		fmt.Fprintf(stderr, "layerstore-auth-helper: %v\n", err)
		return 1
	}
	return 0
}

// handOver reads the credentials from stdin, checks them and posts them to the daemon at
// socket. Its errors never quote the input.
func handOver(ctx context.Context, socket string, stdin io.Reader) error {
	body, err := readInput(ctx, stdin)
	if err != nil {
		return err
	}
	if err := check(body); err != nil {
		return err
	}
	err = protocol.NewClient(socket).PushCredentials(ctx, bytes.NewReader(body))
	var op *net.OpError
	switch {
	case err == nil:
		return nil
	case ctx.Err() != nil:
		return fmt.Errorf("the layerstore daemon at %s did not answer within %v", socket, timeout)
	case errors.As(err, &op) && op.Op == "dial":
		hint := ""
		if errors.Is(op.Err, os.ErrPermission) {
			hint = " (only root may use it)"
		}
		return fmt.Errorf("cannot reach the layerstore daemon at %s: %v%s", socket, op.Err, hint)
	default:
		return fmt.Errorf("the layerstore daemon at %s did not take the credentials: %w", socket, err)
	}
}

// readInput reads all of r, at most maxInput bytes, until ctx is done. A reader that never
// ends is left to the exit of the process.
func readInput(ctx context.Context, r io.Reader) ([]byte, error) {
	type result struct {
		b   []byte
		err error
	}
	done := make(chan result, 1) // buffered: the reader never blocks once ctx is done
	go func() {
		b, err := io.ReadAll(io.LimitReader(r, maxInput+1))
		done <- result{b, err}
	}()
	select {
	case <-ctx.Done():
		return nil, fmt.Errorf("no end of input on stdin within %v", timeout)
	case res := <-done:
		switch {
		case res.err != nil:
			return nil, fmt.Errorf("reading stdin: %w", res.err)
		case len(res.b) > maxInput:
			return nil, errors.New("stdin holds more than 1 MiB: not credentials from containers/image")
		}
		return res.b, nil
	}
}

// check makes sure body is one JSON object mapping image references to credentials, as
// containers/image writes it. The messages name offsets, never the input.
func check(body []byte) error {
	const want = `a JSON object {"REFERENCE": {"username": ..., "password": ..., "identityToken": ...}}`
	var creds map[string]protocol.Credential
	dec := json.NewDecoder(bytes.NewReader(body))
	err := dec.Decode(&creds)
	var syntax *json.SyntaxError
	switch {
	case errors.Is(err, io.EOF):
		return fmt.Errorf("stdin is empty; want %s", want)
	case errors.Is(err, io.ErrUnexpectedEOF):
		return fmt.Errorf("stdin ends inside a JSON value; want %s", want)
	case errors.As(err, &syntax):
		return fmt.Errorf("stdin is not valid JSON (at byte %d); want %s", syntax.Offset, want)
	case err != nil:
		// Type errors would name the field or key, and other errors may quote more.
		return fmt.Errorf("stdin is not %s", want)
	case creds == nil:
		return fmt.Errorf("stdin is null; want %s", want)
	}
	if end := dec.InputOffset(); !errors.Is(dec.Decode(new(json.RawMessage)), io.EOF) {
		return fmt.Errorf("stdin holds more than one JSON value (after byte %d); want %s", end, want)
	}
	if _, ok := creds[""]; ok {
		return errors.New("stdin holds credentials for an empty image reference")
	}
	return nil
}
