package chunked

import (
	"errors"
	"fmt"
)

var (
	// ErrNotLazy reports a layer that cannot be served lazily (wrong media type, no TOC
	// annotation, conflicting annotations). The runtime should pull it normally.
	ErrNotLazy = errors.New("layer is not lazily pullable")
	// ErrInvalid reports malformed input: a footer, annotation, TOC or tar-split that breaks
	// the format's rules.
	ErrInvalid = errors.New("invalid layer")
	// ErrLimit reports input that exceeds a configured bound (see [Limits]).
	ErrLimit = errors.New("layer exceeds a limit")
)

// EntryError locates an error at one TOC entry.
type EntryError struct {
	Index int    // position of the entry in the TOC's "entries" array
	Name  string // the entry's name as written in the TOC
	Err   error
}

func (e *EntryError) Error() string {
	if e.Index < 0 {
		return fmt.Sprintf("TOC entry %q: %v", e.Name, e.Err)
	}
	return fmt.Sprintf("TOC entry %d %q: %v", e.Index, e.Name, e.Err)
}

func (e *EntryError) Unwrap() error { return e.Err }

func invalidf(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrInvalid}, args...)...)
}

func limitf(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrLimit}, args...)...)
}

// ErrTOCNotFound reports an eStargz TOC member that does not hold stargz.index.json.
var ErrTOCNotFound = errors.New("stargz.index.json not found")
