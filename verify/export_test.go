package verify

// HeadersCompared returns how many tar-split headers v has compared with its TOC.
func HeadersCompared(v *Verifier) int64 { return v.headers.Load() }

// SetUnresidentEvery sets how many entries the comparison reads between two calls of the
// Config.Unresident function, until the test ends.
func SetUnresidentEvery(t interface{ Cleanup(func()) }, n int) {
	old := unresidentEvery
	unresidentEvery = n
	t.Cleanup(func() { unresidentEvery = old })
}

// SetStreamPiece sets the size of the pieces in which a TOC is read as it is parsed, until
// the test ends.
func SetStreamPiece(t interface{ Cleanup(func()) }, n int64) {
	old := streamPiece
	streamPiece = n
	t.Cleanup(func() { streamPiece = old })
}
