package chunked

// releaser lets go of the wide form's entries and chunks as compact writes their records
// (their blocks are mapped: see blockSlice), so that the compact form, which takes pages as
// it is written, takes the place of the wide form instead of adding to it.
type releaser struct {
	w *wideIndex
}

// written notes that the record of entry i, e, is written: e, the entries before it and the
// chunks up to e's last are no longer used. e is unusable after (its block may be unmapped).
func (r releaser) written(i int, e *wideEntry) {
	if r.w.keep {
		return
	}
	if e.nchunks > 0 && e.chunk0 != inPlace {
		r.w.chunks.drop(int(e.chunk0 + e.nchunks))
	}
	r.w.entries.drop(i + 1) // last: it may unmap e
}
