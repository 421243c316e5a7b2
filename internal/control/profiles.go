package control

import (
	"encoding/json"
	"io"
	"log/slog"
	"net/http"

	"github.com/layerstore/layerstore/internal/control/protocol"
)

// ProfileSource exports and imports startup profiles: the layer manager. A StatusSource that
// implements it gets GET and POST /profiles.
type ProfileSource interface {
	ExportProfiles(w io.Writer) (int, error)
	ImportProfiles(r io.Reader) (protocol.ProfileImport, error)
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
