package cache

import (
	"encoding/hex"
	"errors"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/layerstore/layerstore/chunked"
)

const (
	filesDir   = "files"
	partialDir = "partial"
	recordsDir = "records"
	pinsDir    = "pins"
	lockName   = "lock"
	journalExt = ".ranges"
	tmpExt     = ".tmp"
)

// completePath returns <root>/files/<2 hex>/<64 hex>.
func completePath(root string, s chunked.Sum) string {
	h := hex.EncodeToString(s[:])
	return filepath.Join(root, filesDir, h[:2], h)
}

// partialPath returns <root>/partial/<2 hex>/<64 hex>; the journal adds [journalExt].
func partialPath(root string, s chunked.Sum) string {
	h := hex.EncodeToString(s[:])
	return filepath.Join(root, partialDir, h[:2], h)
}

// parseName decodes a 64-hex file name.
func parseName(name string) (chunked.Sum, bool) {
	var s chunked.Sum
	if len(name) != 64 {
		return s, false
	}
	if _, err := hex.Decode(s[:], []byte(name)); err != nil || s.IsZero() {
		return s, false
	}
	return s, true
}

// syncDir fsyncs a directory so that entries created, renamed or removed in it are durable.
func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	err = d.Sync()
	if cerr := d.Close(); err == nil {
		err = cerr
	}
	return err
}

// ensureDir creates dir (one level) if needed and makes its entry durable.
func ensureDir(dir string) error {
	err := os.Mkdir(dir, 0o700)
	if errors.Is(err, fs.ErrExist) {
		return nil
	}
	if err != nil {
		return err
	}
	return syncDir(filepath.Dir(dir))
}

// removeIfExists removes a file, ignoring that it is already gone.
func removeIfExists(p string) error {
	if err := os.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	return nil
}
