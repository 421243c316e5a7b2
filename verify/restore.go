package verify

import (
	"fmt"

	"github.com/layerstore/layerstore/chunked"
	digest "github.com/opencontainers/go-digest"
)

// Saved is what a [Verifier] has established about its layer besides its index, in a form a
// caller can keep (the layer manager's records) and hand back to [Restore] after a restart.
type Saved struct {
	Layout chunked.Layout `json:"layout"`
	DiffID digest.Digest  `json:"diffID"`
	// TarSize is the tar's size the tar-split describes once compared with the TOC
	// ([Verifier.CheckTarSplit]); -1 before.
	TarSize   int64     `json:"tarSize"`
	Guarantee Guarantee `json:"guarantee"`
	// TarSplit is the compressed tar-split, verified against the TOC; nil when the layer has
	// none, or the Verifier has not read it or released it ([Verifier.ReleaseTarSplit]). It is
	// needed only until the DiffID is proven.
	TarSplit []byte `json:"-"`
}

// Save returns what v has established, for [Restore].
func (v *Verifier) Save() Saved {
	// The guarantee first: DiffIDVerified is stored only after the tar's size, so a record
	// never says diffid-verified (and drops the tar-split) with the size still unknown.
	g := v.Guarantee()
	s := Saved{Layout: *v.layout, DiffID: v.diffID, TarSize: v.TarSize(), Guarantee: g}
	if p := v.tarSplit.Load(); p != nil && s.Guarantee < DiffIDVerified {
		s.TarSplit = *p
	}
	return s
}

// Restore returns the Verifier that s was saved from, with idx as its verified index,
// without reading anything. The caller vouches for s and idx: they must be what a Verifier
// returned by [Open] saved and indexed (the layer manager writes them to its own records,
// checksummed, only after Open). Restore checks that they are consistent with each other and
// with the limits, not that they are true.
//
// The Verifier uses s.TarSplit in place, as it uses idx (the layer manager maps both from
// its record): the caller keeps it unchanged and readable for as long as it keeps idx.
func Restore(s Saved, idx *chunked.Index, cfg Config) (*Verifier, error) {
	lim := cfg.Limits.WithDefaults()
	switch {
	case idx == nil:
		return nil, fmt.Errorf("%w: restoring a layer without an index", chunked.ErrInvalid)
	case idx.Format() != s.Layout.Format:
		return nil, fmt.Errorf("%w: restoring a %s layer with a %s index", chunked.ErrInvalid, s.Layout.Format, idx.Format())
	case s.Guarantee < ChunksVerified || s.Guarantee > DiffIDVerified:
		return nil, fmt.Errorf("%w: restoring a layer with guarantee %d", chunked.ErrInvalid, s.Guarantee)
	case s.DiffID.Validate() != nil || s.Layout.BlobDigest.Validate() != nil:
		return nil, fmt.Errorf("%w: restoring a layer without valid digests", chunked.ErrInvalid)
	case int64(len(s.TarSplit)) > lim.MaxTOCSize:
		return nil, fmt.Errorf("%w: restored tar-split of %d bytes exceeds %d", chunked.ErrLimit, len(s.TarSplit), lim.MaxTOCSize)
	}
	layout := s.Layout
	want, err := tarSplitDigest(&layout, idx, lim)
	if err != nil {
		return nil, err
	}
	v := &Verifier{layout: &layout, index: idx, diffID: s.DiffID, tarSplitDigest: want, limits: lim,
		comparing: make(chan struct{}, 1), unresident: cfg.Unresident}
	v.tarSize.Store(max(s.TarSize, -1))
	if s.TarSplit != nil && want != "" && s.Guarantee < DiffIDVerified {
		v.tarSplit.Store(&s.TarSplit)
	}
	// A tar size is known only from a comparison that succeeded: it is not run again.
	v.compared.Store(s.TarSize >= 0 && want != "")
	v.guarantee.Store(int32(s.Guarantee))
	return v, nil
}
