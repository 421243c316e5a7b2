package control

import (
	"bytes"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/layerstore/layerstore/internal/control/protocol"
)

// fakeProfiles is a status source that exports a fixed text and keeps what it imports.
type fakeProfiles struct {
	fakeStatus
	export   string
	imported *bytes.Buffer
}

func (f fakeProfiles) ExportProfiles(w io.Writer) (int, error) {
	_, err := io.WriteString(w, f.export)
	return 1, err
}

func (f fakeProfiles) ImportProfiles(r io.Reader) (protocol.ProfileImport, error) {
	if _, err := f.imported.ReadFrom(r); err != nil {
		return protocol.ProfileImport{}, err
	}
	if strings.Contains(f.imported.String(), "bad") {
		return protocol.ProfileImport{Repositories: 1}, errors.New("profiles: line 3: invalid JSON")
	}
	return protocol.ProfileImport{Repositories: 2, Layers: 3}, nil
}

// TestProfilesEndpoints: GET /profiles streams the export, POST /profiles hands the body to
// the import and answers its counts, or its error.
func TestProfilesEndpoints(t *testing.T) {
	src := fakeProfiles{export: "{\"format\":\"layerstore-profiles\",\"version\":1}\n", imported: &bytes.Buffer{}}
	path := filepath.Join(t.TempDir(), "control.sock")
	ln, err := Listen(path)
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: Handler(src, fakeSink{}, time.Hour, slog.New(slog.DiscardHandler))}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	c := protocol.NewClient(path)

	var out bytes.Buffer
	if err := c.ExportProfiles(t.Context(), &out); err != nil || out.String() != src.export {
		t.Fatalf("export %q, %v", out.String(), err)
	}
	imp, err := c.ImportProfiles(t.Context(), strings.NewReader("some profiles"))
	if err != nil || imp.Repositories != 2 || imp.Layers != 3 || src.imported.String() != "some profiles" {
		t.Fatalf("import %+v, %v, body %q", imp, err, src.imported.String())
	}
	src.imported.Reset()
	if _, err := c.ImportProfiles(t.Context(), strings.NewReader("bad")); err == nil || !strings.Contains(err.Error(), "line 3: invalid JSON") {
		t.Fatalf("import of a bad file: %v", err)
	}

	// A status source without profiles has no such endpoints.
	c = serveTest(t, protocol.Status{}, fakeSink{}, io.Discard)
	if err := c.ExportProfiles(t.Context(), io.Discard); err == nil {
		t.Error("export from a source without profiles")
	}
}
