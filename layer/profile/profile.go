// Package profile owns startup profiles: their format (a repository's profile, the paths its
// layers' starts read, in order), their bounds and checks (a profile read back from the cache
// or imported is untrusted), their merge (a layer's new recording with its older ones), their
// persistence as records of the cache (Store) and their export and import as lines of JSON.
// It neither records nor replays: package layer records a layer's reads and chooses what its
// background fetch replays.
//
// Profiles are plain values; a Store is safe for concurrent use.
package profile

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/opencontainers/go-digest"
)

// Bounds of a profile.
const (
	// MaxFiles and MaxContent end a recording early: at most this many files, and the files
	// recorded hold at most this many bytes of content.
	MaxFiles   = 4096
	MaxContent = 256 << 20
	// MaxPath: a longer path is not recorded (and refused in a profile read back).
	MaxPath = 4096
	// MaxLayerPathBytes bounds the path bytes of one layer's profile (the rest of a recording
	// is dropped), maxRepoPathBytes those of a repository's (its oldest layers' profiles are
	// dropped), MaxLayers the layers a repository's profile holds.
	MaxLayerPathBytes = 256 << 10
	maxRepoPathBytes  = 1 << 20
	MaxLayers         = 32
	// maxRecord bounds a repository profile's encoding (the record's meta, and a line of an
	// export): JSON escapes may make it larger than its path bytes.
	maxRecord = 2 << 20
	// maxRepositories bounds the repositories with a profile in the cache: beyond it, the
	// profile least recently written or replayed by this process goes.
	maxRepositories = 1024
	// maxRepository bounds a repository's name.
	maxRepository = 1024
)

// Version is the version of the profiles this package writes and reads (records and exports).
const Version = 1

// recordPrefix begins the names of the profiles' records.
const recordPrefix = "profile-"

// Repo is the profile of a repository: for each of its layers recorded (the most recent
// first), the files first read after its first use, in the order of their first read.
type Repo struct {
	Version    int          `json:"version"`
	Repository string       `json:"repository"`
	Layers     []LayerReads `json:"layers"`
}

// LayerReads is the profile of one layer: its blob digest, when it was recorded, and the paths of
// the files read, in order; Ends, when present, holds for each file how much of it was read:
// the end of its furthest read (0: the whole file, as for a file the kernel reads by itself
// through passthrough). A replay fetches the chunks of each file that start before its end: a
// program that reads the first pages of a large library does not have it fetched whole.
type LayerReads struct {
	Layer    digest.Digest `json:"layer"`
	Recorded time.Time     `json:"recorded"`
	Files    []string      `json:"files"`
	Ends     []int64       `json:"ends,omitempty"`
}

// End returns how much of file i was read (0: the whole file).
func (pl *LayerReads) End(i int) int64 {
	if i < len(pl.Ends) {
		return pl.Ends[i]
	}
	return 0
}

// RecordName is the name of a repository's profile record in the cache.
func RecordName(repo string) string {
	s := sha256.Sum256([]byte(repo))
	return recordPrefix + hex.EncodeToString(s[:])
}

// Check refuses a profile that this package would not have written: profiles are read back
// from the cache and imported from files, and both are untrusted.
func (p *Repo) Check() error {
	switch {
	case p.Version != Version:
		return fmt.Errorf("profile version %d, want %d", p.Version, Version)
	case p.Repository == "" || len(p.Repository) > maxRepository || !printable(p.Repository):
		return fmt.Errorf("profile: invalid repository %q", truncate(p.Repository, 80))
	case len(p.Layers) > MaxLayers:
		return fmt.Errorf("profile of %s: %d layers, at most %d", p.Repository, len(p.Layers), MaxLayers)
	}
	total := 0
	seen := map[digest.Digest]bool{}
	for i := range p.Layers {
		l := &p.Layers[i]
		if err := l.Layer.Validate(); err != nil {
			return fmt.Errorf("profile of %s: layer %d: %w", p.Repository, i, err)
		}
		if seen[l.Layer] {
			return fmt.Errorf("profile of %s: layer %s twice", p.Repository, l.Layer)
		}
		seen[l.Layer] = true
		n, err := l.check()
		if err != nil {
			return fmt.Errorf("profile of %s: layer %s: %w", p.Repository, l.Layer, err)
		}
		total += n
	}
	if total > maxRepoPathBytes {
		return fmt.Errorf("profile of %s: %d bytes of paths, at most %d", p.Repository, total, maxRepoPathBytes)
	}
	return nil
}

// check checks a layer's files and ends, and returns its path bytes.
func (pl *LayerReads) check() (int, error) {
	if len(pl.Files) == 0 || len(pl.Files) > MaxFiles {
		return 0, fmt.Errorf("%d files, want 1 to %d", len(pl.Files), MaxFiles)
	}
	if len(pl.Ends) != 0 && len(pl.Ends) != len(pl.Files) {
		return 0, fmt.Errorf("%d ends for %d files", len(pl.Ends), len(pl.Files))
	}
	for _, e := range pl.Ends {
		if e < 0 {
			return 0, fmt.Errorf("negative end %d", e)
		}
	}
	n := 0
	for _, f := range pl.Files {
		if f == "" || len(f) > MaxPath || strings.IndexByte(f, 0) >= 0 {
			return 0, fmt.Errorf("invalid path %q", truncate(f, 80))
		}
		n += len(f)
	}
	if n > MaxLayerPathBytes {
		return 0, fmt.Errorf("%d bytes of paths, at most %d", n, MaxLayerPathBytes)
	}
	return n, nil
}

func printable(s string) bool {
	if !utf8.ValidString(s) {
		return false
	}
	for _, r := range s {
		if r < 0x20 || r == 0x7f {
			return false
		}
	}
	return true
}

func truncate(s string, n int) string {
	if len(s) > n {
		return s[:n] + "..."
	}
	return s
}

// merge adds layers to p: a layer's newer profile comes first, followed by the files of its
// older ones that it lacks (a later recording may miss files the kernel had cached, and never
// loses what an earlier one learned), within the bounds of one layer's profile; the most
// recent layers first; the oldest dropped beyond the bounds (layers, path bytes, encoded
// size). It returns p's encoding.
func (p *Repo) merge(layers []LayerReads) ([]byte, error) {
	all := append(slices.Clone(layers), p.Layers...)
	slices.SortStableFunc(all, func(a, b LayerReads) int { return b.Recorded.Compare(a.Recorded) })
	var byLayer []LayerReads
	at := map[digest.Digest]int{}
	for _, l := range all {
		i, ok := at[l.Layer]
		if !ok {
			at[l.Layer] = len(byLayer)
			byLayer = append(byLayer, LayerReads{Layer: l.Layer, Recorded: l.Recorded})
			i = len(byLayer) - 1
		}
		byLayer[i].Union(&l)
	}
	var kept []LayerReads
	total := 0
	for _, l := range byLayer {
		n := pathBytes(l.Files)
		if len(l.Files) == 0 || len(kept) == MaxLayers || total+n > maxRepoPathBytes {
			continue
		}
		kept = append(kept, l)
		total += n
	}
	p.Layers = kept
	for {
		b, err := json.Marshal(p)
		if err != nil {
			return nil, err
		}
		if len(b) <= maxRecord || len(p.Layers) <= 1 {
			return b, nil
		}
		p.Layers = p.Layers[:len(p.Layers)-1]
	}
}

// Union adds to pl the files of more it lacks, after its own, within the bounds of one layer's
// profile (files, path bytes); a file in both keeps the larger of its ends (0, the whole file,
// the largest).
func (pl *LayerReads) Union(more *LayerReads) {
	files := slices.Clone(pl.Files)
	ends := make([]int64, len(files))
	have := make(map[string]int, len(files))
	n := 0
	for i, f := range files {
		have[f] = i
		ends[i] = pl.End(i)
		n += len(f)
	}
	for j, f := range more.Files {
		e := more.End(j)
		if i, ok := have[f]; ok {
			if ends[i] != 0 && (e == 0 || e > ends[i]) {
				ends[i] = e
			}
			continue
		}
		if len(files) == MaxFiles || n+len(f) > MaxLayerPathBytes {
			continue
		}
		have[f] = len(files)
		n += len(f)
		files = append(files, f)
		ends = append(ends, e)
	}
	pl.Files, pl.Ends = files, SparseEnds(ends)
}

// SparseEnds returns ends, or nil when every file is whole (no end).
func SparseEnds(ends []int64) []int64 {
	if slices.ContainsFunc(ends, func(e int64) bool { return e != 0 }) {
		return ends
	}
	return nil
}

func pathBytes(files []string) int {
	n := 0
	for _, f := range files {
		n += len(f)
	}
	return n
}
