package cache

import (
	"os"

	"golang.org/x/sys/unix"
)

// syncFS makes durable what was written to the files and directories named, which lie on
// the filesystem holding root. On Linux that is one syncfs(2) of that filesystem instead of
// an fsync per file and directory.
func syncFS(root string, _ []string) error {
	d, err := os.Open(root)
	if err != nil {
		return err
	}
	err = unix.Syncfs(int(d.Fd()))
	if cerr := d.Close(); err == nil {
		err = cerr
	}
	return err
}
