package verify

// HeadersCompared returns how many tar-split headers l has compared with its TOC.
func HeadersCompared(l *Verifier) int64 { return l.headers.Load() }
