package protocol

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"time"
)

// Client talks to a daemon's control socket.
type Client struct {
	hc *http.Client
}

// NewClient returns a client for the socket at path.
func NewClient(path string) *Client {
	tr := &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", path)
	}}
	return &Client{hc: &http.Client{Transport: tr, Timeout: 10 * time.Second}}
}

// Status fetches the daemon's status.
func (c *Client) Status(ctx context.Context) (Status, error) {
	var st Status
	resp, err := c.do(ctx, http.MethodGet, "/status", nil)
	if err != nil {
		return st, err
	}
	defer resp.Body.Close()
	return st, json.NewDecoder(resp.Body).Decode(&st)
}

// Metrics fetches the daemon's metrics text.
func (c *Client) Metrics(ctx context.Context) (string, error) {
	resp, err := c.do(ctx, http.MethodGet, "/metrics", nil)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return string(b), err
}

// Pin asks the daemon to pin an image and waits until its layers are local (or the pin
// failed); ctx bounds the wait, and cancelling it stops the fetch (the pin stays).
func (c *Client) Pin(ctx context.Context, req PinRequest) (Pin, error) {
	var p Pin
	body, err := json.Marshal(req)
	if err != nil {
		return p, err
	}
	resp, err := c.doLong(ctx, http.MethodPost, "/pin", bytes.NewReader(body))
	if err != nil {
		return p, err
	}
	defer resp.Body.Close()
	return p, json.NewDecoder(resp.Body).Decode(&p)
}

// Unpin asks the daemon to unpin an image.
func (c *Client) Unpin(ctx context.Context, req PinRequest) error {
	body, err := json.Marshal(req)
	if err != nil {
		return err
	}
	resp, err := c.do(ctx, http.MethodPost, "/unpin", bytes.NewReader(body))
	if err != nil {
		return err
	}
	resp.Body.Close()
	return nil
}

// PushCredentials hands the JSON c/image writes to the auth helper over to the daemon, as is.
// Its errors never quote body, which holds secrets.
func (c *Client) PushCredentials(ctx context.Context, body io.Reader) error {
	resp, err := c.do(ctx, http.MethodPost, "/credentials", body)
	if err != nil {
		return err
	}
	resp.Body.Close()
	return nil
}

func (c *Client) do(ctx context.Context, method, path string, body io.Reader) (*http.Response, error) {
	return c.send(ctx, c.hc, method, path, body)
}

// doLong sends without the client's timeout: ctx alone bounds the request (a pin fetches
// whole layers, an export or import of profiles reads or writes all of them).
func (c *Client) doLong(ctx context.Context, method, path string, body io.Reader) (*http.Response, error) {
	hc := *c.hc
	hc.Timeout = 0
	return c.send(ctx, &hc, method, path, body)
}

func (c *Client) send(ctx context.Context, hc *http.Client, method, path string, body io.Reader) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, method, "http://layerstore"+path, body)
	if err != nil {
		return nil, err
	}
	resp, err := hc.Do(req)
	if err != nil {
		return nil, fmt.Errorf("control socket: %w", err)
	}
	if resp.StatusCode/100 != 2 {
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		resp.Body.Close()
		return nil, fmt.Errorf("control socket %s: %s: %s", path, resp.Status, bytes.TrimSpace(msg))
	}
	return resp, nil
}

// ExportProfiles writes the daemon's startup profiles to w, as lines of JSON.
func (c *Client) ExportProfiles(ctx context.Context, w io.Writer) error {
	resp, err := c.doLong(ctx, http.MethodGet, "/profiles", nil)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	_, err = io.Copy(w, resp.Body)
	return err
}

// ImportProfiles hands profiles (as ExportProfiles wrote them) to the daemon, which merges
// them into its own.
func (c *Client) ImportProfiles(ctx context.Context, r io.Reader) (ProfileImport, error) {
	var imp ProfileImport
	resp, err := c.doLong(ctx, http.MethodPost, "/profiles", r)
	if err != nil {
		return imp, err
	}
	defer resp.Body.Close()
	return imp, json.NewDecoder(resp.Body).Decode(&imp)
}
