package profile

import (
	"encoding/json"
	"errors"
	"log/slog"
	"slices"
	"strings"
	"sync"

	"github.com/layerstore/layerstore/cache"
)

// Store keeps the repositories' profiles in the cache: one record per repository
// (RecordName), beside the layer records, written atomically and checksummed by the cache,
// evicted with them, and checked when read. At most maxRepositories repositories keep one.
// Safe for concurrent use; its lock is a leaf, held across the read and write of a record so
// that updates of one repository do not lose each other's.
type Store struct {
	cache *cache.Cache
	log   *slog.Logger

	mu    sync.Mutex
	names map[string]uint64 // the profile records, with when this process last wrote or used them
	seq   uint64
	known bool // names lists the cache's records
}

// NewStore returns the store of the profiles in c.
func NewStore(c *cache.Cache, log *slog.Logger) *Store {
	return &Store{cache: c, log: log, names: map[string]uint64{}}
}

// listLocked learns the profile records present in the cache, once.
func (s *Store) listLocked() {
	if s.known {
		return
	}
	names, err := s.cache.Records()
	if err != nil {
		return
	}
	s.known = true
	for _, n := range names {
		if strings.HasPrefix(n, recordPrefix) {
			if _, ok := s.names[n]; !ok {
				s.names[n] = 0
			}
		}
	}
}

// Get returns the profile of repo; nil when there is none, or it is unusable (then removed).
func (s *Store) Get(repo string) *Repo {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.getLocked(repo, true)
}

func (s *Store) getLocked(repo string, use bool) *Repo {
	name := RecordName(repo)
	raw, err := s.cache.RecordMeta(name)
	if err != nil {
		if !errors.Is(err, cache.ErrMissing) && !errors.Is(err, cache.ErrClosed) {
			s.log.Warn("startup profile unreadable: dropped", "repository", repo, "err", err)
			_ = s.cache.RemoveRecord(name)
		}
		delete(s.names, name)
		return nil
	}
	var p Repo
	err = json.Unmarshal(raw, &p)
	if err == nil {
		err = p.Check()
	}
	if err == nil && p.Repository != repo {
		err = errors.New("profile of another repository")
	}
	if err != nil {
		s.log.Warn("startup profile dropped", "repository", repo, "err", err)
		_ = s.cache.RemoveRecord(name)
		delete(s.names, name)
		return nil
	}
	if use {
		s.seq++
		s.names[name] = s.seq
	}
	return &p
}

// Add merges layers into the profile of repo and writes it.
func (s *Store) Add(repo string, layers ...LayerReads) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.listLocked()
	p := s.getLocked(repo, false)
	if p == nil {
		p = &Repo{Version: Version, Repository: repo}
	}
	b, err := p.merge(layers)
	if err != nil {
		return err
	}
	if err := p.Check(); err != nil {
		return err // not reached: what merge keeps is within the bounds
	}
	name := RecordName(repo)
	if err := s.cache.PutRecord(name, b); err != nil {
		return err
	}
	s.seq++
	s.names[name] = s.seq
	for len(s.names) > maxRepositories {
		oldest := ""
		for n, q := range s.names {
			if n != name && (oldest == "" || q < s.names[oldest] || q == s.names[oldest] && n < oldest) {
				oldest = n
			}
		}
		_ = s.cache.RemoveRecord(oldest)
		delete(s.names, oldest)
	}
	return nil
}

// all returns the names of every profile record.
func (s *Store) all() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.known = false
	s.listLocked()
	names := make([]string, 0, len(s.names))
	for n := range s.names {
		names = append(names, n)
	}
	slices.Sort(names)
	return names
}

// readName returns the profile of record name, checked; nil when unusable.
func (s *Store) readName(name string) *Repo {
	raw, err := s.cache.RecordMeta(name)
	if err != nil {
		return nil
	}
	var p Repo
	if json.Unmarshal(raw, &p) != nil || p.Check() != nil || RecordName(p.Repository) != name {
		return nil
	}
	return &p
}
