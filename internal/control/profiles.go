package control

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"

	"github.com/layerstore/layerstore/layer"
)

// ProfileSource exports and imports startup profiles: the layer manager. A StatusSource that
// implements it gets GET and POST /profiles.
type ProfileSource interface {
	ExportProfiles(w io.Writer) (int, error)
	ImportProfiles(r io.Reader) (layer.ProfileImport, error)
}

// maxProfileImport bounds what POST /profiles reads: the manager reads it one profile (line)
// at a time, each bounded, so this bounds the time an import takes, not its memory.
const maxProfileImport = 256 << 20

// profilesContentType is an export's: lines of JSON.
const profilesContentType = "application/x-ndjson"

func handleProfiles(mux *http.ServeMux, ps ProfileSource, log *slog.Logger) {
	mux.HandleFunc("GET /profiles", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", profilesContentType)
		if _, err := ps.ExportProfiles(w); err != nil {
			log.Warn("exporting startup profiles failed", "err", err)
		}
	})
	mux.HandleFunc("POST /profiles", func(w http.ResponseWriter, r *http.Request) {
		imp, err := ps.ImportProfiles(io.LimitReader(r.Body, maxProfileImport))
		if err != nil {
			log.Warn("importing startup profiles failed", "repositories", imp.Repositories, "err", err)
			http.Error(w, err.Error(), http.StatusUnprocessableEntity)
			return
		}
		log.Info("startup profiles imported", "repositories", imp.Repositories, "layers", imp.Layers)
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(imp)
	})
}

// ExportProfiles writes the daemon's startup profiles to w, as lines of JSON.
func (c *Client) ExportProfiles(ctx context.Context, w io.Writer) error {
	resp, err := c.doLongMethod(ctx, http.MethodGet, "/profiles", nil)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	_, err = io.Copy(w, resp.Body)
	return err
}

// ImportProfiles hands profiles (as ExportProfiles wrote them) to the daemon, which merges
// them into its own.
func (c *Client) ImportProfiles(ctx context.Context, r io.Reader) (layer.ProfileImport, error) {
	var imp layer.ProfileImport
	resp, err := c.doLongMethod(ctx, http.MethodPost, "/profiles", r)
	if err != nil {
		return imp, err
	}
	defer resp.Body.Close()
	return imp, json.NewDecoder(resp.Body).Decode(&imp)
}
