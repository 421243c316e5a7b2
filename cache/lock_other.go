//go:build !unix

package cache

import "os"

// lockRoot only creates the lock file: there is no advisory locking on this platform.
func lockRoot(path string) (*os.File, error) {
	return os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
}
