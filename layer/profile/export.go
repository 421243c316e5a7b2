package profile

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/layerstore/layerstore/internal/control/protocol"
)

// exportFormat names an export's first line.
const exportFormat = "layerstore-profiles"

// exportHeader is the first line of an export.
type exportHeader struct {
	Format  string `json:"format"`
	Version int    `json:"version"`
}

// Export writes every repository's profile to w: a first line naming the format, then one
// line of JSON per repository (its layers' profiles: blob digest, time of the recording,
// paths in the order of their first read). It returns how many repositories it wrote.
func (s *Store) Export(w io.Writer) (int, error) {
	bw := bufio.NewWriter(w)
	enc := json.NewEncoder(bw)
	if err := enc.Encode(exportHeader{exportFormat, Version}); err != nil {
		return 0, err
	}
	n := 0
	for _, name := range s.all() {
		p := s.readName(name)
		if p == nil {
			continue
		}
		if err := enc.Encode(p); err != nil {
			return n, err
		}
		n++
	}
	return n, bw.Flush()
}

// MaxLine bounds a line of an import: one repository's profile, as written.
const MaxLine = maxRecord + 1

// Import reads profiles as Export writes them and merges each repository's into the one the
// cache holds (as recordings merge: a layer's more recent profile first, the files of its
// older one it lacks after; the bounds drop the oldest). The input is untrusted: a line is
// read only up to MaxLine and checked as a profile read from the cache is, and the first
// invalid line ends the import with an error that names it (the repositories on the lines
// before it are imported). Times in the future are taken as now.
func (s *Store) Import(r io.Reader) (protocol.ProfileImport, error) {
	var out protocol.ProfileImport
	br := bufio.NewReaderSize(r, 64<<10)
	now := time.Now().UTC()
	for line := 1; ; line++ {
		b, err := readLine(br, MaxLine)
		if errors.Is(err, io.EOF) && len(b) == 0 {
			if line == 1 {
				return out, errors.New("profiles: empty input")
			}
			return out, nil
		}
		if err != nil && !errors.Is(err, io.EOF) {
			return out, fmt.Errorf("profiles: line %d: %w", line, err)
		}
		if len(bytes.TrimSpace(b)) == 0 {
			continue
		}
		if line == 1 {
			if err := checkHeader(b); err != nil {
				return out, err
			}
			continue
		}
		p, err := decodeLine(b, now)
		if err != nil {
			return out, fmt.Errorf("profiles: line %d: %w", line, err)
		}
		if err := s.Add(p.Repository, p.Layers...); err != nil {
			return out, fmt.Errorf("profiles: line %d: storing the profile of %s: %w", line, p.Repository, err)
		}
		out.Repositories++
		out.Layers += len(p.Layers)
	}
}

// checkHeader checks an import's first line.
func checkHeader(b []byte) error {
	var h exportHeader
	if json.Unmarshal(b, &h) != nil || h.Format != exportFormat {
		return fmt.Errorf("profiles: line 1: not an export of layerstore profiles (want {\"format\":%q,...})", exportFormat)
	}
	if h.Version != Version {
		return fmt.Errorf("profiles: version %d, this daemon reads version %d", h.Version, Version)
	}
	return nil
}

// decodeLine decodes and checks a repository's profile, a line of an import; its times in the
// future become now.
func decodeLine(b []byte, now time.Time) (*Repo, error) {
	var p Repo
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&p); err != nil {
		return nil, fmt.Errorf("invalid JSON: %w", err)
	}
	if err := p.Check(); err != nil {
		return nil, err
	}
	for i := range p.Layers {
		if p.Layers[i].Recorded.After(now) {
			p.Layers[i].Recorded = now
		}
	}
	return &p, nil
}

// readLine reads a line of at most limit bytes (without its newline); a longer one is an
// error, read no further than the limit.
func readLine(br *bufio.Reader, limit int) ([]byte, error) {
	var line []byte
	for {
		frag, err := br.ReadSlice('\n')
		if len(line)+len(frag) > limit+1 {
			return nil, fmt.Errorf("a line of more than %d bytes", limit)
		}
		line = append(line, frag...)
		switch {
		case err == nil:
			return line[:len(line)-1], nil
		case errors.Is(err, bufio.ErrBufferFull):
			continue
		default:
			return line, err
		}
	}
}
