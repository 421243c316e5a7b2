package layer

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"runtime"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/opencontainers/go-digest"

	"github.com/layerstore/layerstore/cache"
	"github.com/layerstore/layerstore/chunked"
	"github.com/layerstore/layerstore/fetcher"
	"github.com/layerstore/layerstore/verify"
)

// recordVersion is the version of the records this package writes; a record of another
// version is removed and its layer resolved through the registry again.
const recordVersion = 1

// maxRecordRefs bounds the references a record remembers (for status); repositories, which
// authorize lookups, are all kept.
const maxRecordRefs = 16

// recordMeta is a layer record's meta: what the manifest said of the layer, what its
// verification established, and the repositories it was resolved through. The record's data
// holds the verified index (chunked.Index.Binary), then the tar-split while it is
// needed.
type recordMeta struct {
	Version      int                `json:"version"`
	Descriptor   fetcher.ImageLayer `json:"descriptor"`
	Verified     verify.Saved       `json:"verified"`
	Repositories []string           `json:"repositories"`
	Refs         []string           `json:"refs"`
	Entries      int                `json:"entries"`
	IndexSize    int64              `json:"indexSize"`
	TarSplitSize int64              `json:"tarSplitSize"`
	Written      time.Time          `json:"written"`
}

// identity is the identity of the recorded layer, as the lookup that resolved it computed it:
// from the manifest's descriptor (not from the layout the footer completed) and the DiffID.
func (r *recordMeta) identity() (identity, error) {
	layout, err := chunked.Classify(r.Descriptor.Descriptor)
	if err != nil {
		return identity{}, fmt.Errorf("record: %w", err)
	}
	return identity{layout: *layout, diffID: r.Descriptor.DiffID}, nil
}

// check refuses a meta that does not describe a layer this package could have written under
// name.
func (r *recordMeta) check(name string) error {
	switch {
	case r.Version != recordVersion:
		return fmt.Errorf("record version %d, want %d", r.Version, recordVersion)
	case r.Descriptor.Digest != r.Verified.Layout.BlobDigest || r.Descriptor.Size != r.Verified.Layout.BlobSize:
		return errors.New("record: descriptor and layout name different blobs")
	case r.Descriptor.DiffID != r.Verified.DiffID:
		return errors.New("record: descriptor and verification name different DiffIDs")
	case len(r.Repositories) == 0:
		return errors.New("record: no repository")
	case r.IndexSize <= 0 || r.TarSplitSize < 0:
		return errors.New("record: bad sizes")
	}
	id, err := r.identity()
	if err != nil {
		return err
	}
	if recordName(id) != name {
		return errors.New("record: its name is not its layer's")
	}
	return nil
}

// layerRecordPrefix begins the names of layer records; pins' records begin with "pin-".
const layerRecordPrefix = "layer-"

// recordName is the name of the record of a layer identity: the sha256 of what the identity
// holds, so that two manifests describing a blob differently never share a record.
func recordName(id identity) string {
	b, err := json.Marshal(struct {
		Layout chunked.Layout
		DiffID digest.Digest
	}{id.layout, id.diffID})
	if err != nil {
		panic(err) // strings and integers always marshal
	}
	s := sha256.Sum256(b)
	return layerRecordPrefix + hex.EncodeToString(s[:])
}

// records is the manager's view of the layer records in its cache: which record answers
// which lookup key. Safe for concurrent use; its lock is a leaf.
type records struct {
	cache  *cache.Cache
	limits chunked.Limits

	mu    sync.Mutex
	byKey map[digest.Digest][]storedRecord // TOC digest and blob digest → records
}

type storedRecord struct {
	name string
	meta *recordMeta
}

// loadRecords indexes the records present in c, removing those it cannot use.
func loadRecords(c *cache.Cache, limits chunked.Limits, log *slog.Logger) *records {
	rs := &records{cache: c, limits: limits, byKey: map[digest.Digest][]storedRecord{}}
	names, err := c.Records()
	if err != nil {
		log.Warn("listing the layer records failed: layers are resolved through the registry", "err", err)
		return rs
	}
	for _, name := range names {
		if !strings.HasPrefix(name, layerRecordPrefix) {
			continue // a pin's record (pin.go)
		}
		raw, err := c.RecordMeta(name)
		var meta recordMeta
		if err == nil {
			err = json.Unmarshal(raw, &meta)
		}
		if err == nil {
			err = meta.check(name)
		}
		if err != nil {
			log.Warn("layer record dropped: its layer will be resolved through the registry", "record", name, "err", err)
			_ = c.RemoveRecord(name)
			continue
		}
		rs.index(name, &meta)
	}
	return rs
}

func (rs *records) index(name string, meta *recordMeta) {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	for _, k := range []digest.Digest{meta.Descriptor.Digest, tocKey(meta.Descriptor.Annotations)} {
		if k == "" {
			continue
		}
		list := slices.DeleteFunc(rs.byKey[k], func(s storedRecord) bool { return s.name == name })
		rs.byKey[k] = append(list, storedRecord{name, meta})
	}
}

func (rs *records) forget(name string) {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	for k, list := range rs.byKey {
		list = slices.DeleteFunc(list, func(s storedRecord) bool { return s.name == name })
		if len(list) == 0 {
			delete(rs.byKey, k)
		} else {
			rs.byKey[k] = list
		}
	}
}

// remove deletes a record: its layer was refused.
func (rs *records) remove(name string) {
	rs.forget(name)
	_ = rs.cache.RemoveRecord(name)
}

// find returns the record that answers a lookup of key through repo: one resolved through
// that repository (a record never lets a lookup skip the registry's authorization), and only
// one layer identity (two manifests of one repository describing one key differently are
// left to the registry to tell apart).
func (rs *records) find(key digest.Digest, repo string) (storedRecord, bool) {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	var found storedRecord
	for _, s := range rs.byKey[key] {
		if !slices.Contains(s.meta.Repositories, repo) {
			continue
		}
		if found.meta != nil && found.name != s.name {
			return storedRecord{}, false
		}
		found = s
	}
	return found, found.meta != nil
}

// save writes the record of a verified layer, replacing any previous one: the layer's
// descriptor, what verification established, its repositories and references, its index
// and, until the DiffID is proven, its tar-split.
func (rs *records) save(desc fetcher.ImageLayer, v *verify.Verifier, repos, refs []string) (string, error) {
	name, meta, raw, data, err := encodeRecord(desc, v, repos, refs)
	if err != nil {
		return "", err
	}
	err = rs.cache.PutRecord(name, raw, data...)
	runtime.KeepAlive(v.Index())
	if err != nil {
		return "", err
	}
	rs.index(name, meta)
	return name, nil
}

// write is save for a layer about to be served: it returns the layer restored from the new
// record (its index mapped from the record's file) as soon as the record's bytes are written.
// The record is stored in the background (see cache.WriteRecord), by a function the caller
// runs (on a tracked goroutine), which indexes it once stored.
func (rs *records) write(desc fetcher.ImageLayer, v *verify.Verifier, repos, refs []string) (*verify.Verifier, *cache.Record, func() error, error) {
	name, meta, raw, data, err := encodeRecord(desc, v, repos, refs)
	if err != nil {
		return nil, nil, nil, err
	}
	rec, stored, err := rs.cache.WriteRecord(name, raw, data...)
	runtime.KeepAlive(v.Index())
	if err != nil {
		return nil, nil, nil, err
	}
	store := func() error {
		if err := <-stored; err != nil {
			return err
		}
		rs.index(name, meta)
		return nil
	}
	_, rv, err := rs.restore(name, rec, v.Index())
	if err != nil {
		rec.Close()
		return nil, nil, func() error {
			if store() == nil {
				rs.remove(name)
			}
			return nil
		}, fmt.Errorf("layer record %s: %w", name, err)
	}
	runtime.AddCleanup(rv.Index(), func(r *cache.Record) { r.Close() }, rec)
	return rv, rec, store, nil
}

// encodeRecord returns the name, meta (decoded and encoded) and data (in parts) of a verified
// layer's record.
func encodeRecord(desc fetcher.ImageLayer, v *verify.Verifier, repos, refs []string) (string, *recordMeta, []byte, [][]byte, error) {
	saved := v.Save()
	idx := v.Index()
	data := idx.Binary() // written from where it is: the caller keeps idx alive
	indexSize := int64(len(data))
	slices.Sort(repos)
	if len(refs) > maxRecordRefs {
		refs = refs[len(refs)-maxRecordRefs:]
	}
	meta := &recordMeta{
		Version: recordVersion, Descriptor: desc, Verified: saved,
		Repositories: repos, Refs: refs, Entries: idx.Len(),
		IndexSize: indexSize, TarSplitSize: int64(len(saved.TarSplit)), Written: time.Now().UTC(),
	}
	meta.Verified.TarSplit = nil // in the record's data, never kept with the meta
	raw, err := json.Marshal(meta)
	if err != nil {
		return "", nil, nil, nil, err
	}
	id, err := meta.identity()
	if err != nil {
		return "", nil, nil, nil, err
	}
	// The index and the tar-split are written from where v keeps them (a restored layer's are
	// mapped with its index: the caller keeps v's index alive until the record is written).
	return recordName(id), meta, raw, [][]byte{data, saved.TarSplit}, nil
}

// open maps a record and restores its verified layer. The index is used in place, from the
// mapping, which is released once nothing references the index any more.
func (rs *records) open(name string) (*recordMeta, *verify.Verifier, *cache.Record, error) {
	rec, err := rs.cache.OpenRecord(name)
	if err != nil {
		rs.forget(name)
		return nil, nil, nil, err
	}
	meta, v, err := rs.restore(name, rec, nil)
	if err != nil {
		rec.Close()
		rs.remove(name)
		return nil, nil, nil, fmt.Errorf("layer record %s: %w", name, err)
	}
	runtime.AddCleanup(v.Index(), func(r *cache.Record) { r.Close() }, rec)
	return meta, v, rec, nil
}

// restore restores the verified layer of a record. written, when not nil, is the index the
// record was just written from: the record's copy is only compared with it, not checked
// again as the index of a record found on disk is.
func (rs *records) restore(name string, rec *cache.Record, written *chunked.Index) (*recordMeta, *verify.Verifier, error) {
	var meta recordMeta
	if err := json.Unmarshal(rec.Meta(), &meta); err != nil {
		return nil, nil, err
	}
	if err := meta.check(name); err != nil {
		return nil, nil, err
	}
	data := rec.Data()
	if meta.IndexSize > int64(len(data)) || meta.TarSplitSize > int64(len(data))-meta.IndexSize {
		return nil, nil, fmt.Errorf("record: %d bytes of data, %d + %d expected", len(data), meta.IndexSize, meta.TarSplitSize)
	}
	var idx *chunked.Index
	var err error
	if written != nil {
		// The pages compared are let go of as the comparison goes: the whole mapping would
		// be resident beside the index on the heap.
		idx, err = written.Moved(data[:meta.IndexSize], func([]byte) { _ = rec.Unresident() })
	} else {
		idx, err = chunked.LoadIndex(data[:meta.IndexSize], rs.limits)
	}
	if err != nil {
		return nil, nil, err
	}
	s := meta.Verified
	if meta.TarSplitSize > 0 {
		s.TarSplit = data[meta.IndexSize : meta.IndexSize+meta.TarSplitSize] // used in place, mapped as long as the index
	}
	v, err := verify.Restore(s, idx, verify.Config{Limits: rs.limits, Unresident: func() { _ = rec.Unresident() }})
	if err != nil {
		return nil, nil, err
	}
	// The check (or comparison) read the whole index through the mapping: only what
	// lookups and reads use from now on need be resident.
	_ = rec.Unresident() // advice: nothing is lost when it fails
	return &meta, v, nil
}
