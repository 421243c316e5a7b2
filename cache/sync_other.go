//go:build !linux

package cache

import "os"

// syncFS makes durable what was written to the files and directories named: without
// syncfs(2), one fsync each.
func syncFS(_ string, paths []string) error {
	for _, p := range paths {
		f, err := os.Open(p)
		if err != nil {
			return err
		}
		err = f.Sync()
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return err
		}
	}
	return nil
}
