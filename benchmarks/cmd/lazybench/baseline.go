package main

import (
	"archive/tar"
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"hash"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/klauspost/compress/gzip"
	"golang.org/x/sys/unix"
)

// The baseline is the physical limit of a background fetch: one plain GET of the whole blob,
// decompressed and untarred as it streams in. It runs in a child process (this program,
// re-executed with the hidden "baseline" command), as the daemon does, so that the registry
// (in the harness) competes with it for the CPUs in the same way.

// baselineResult is what the child reports.
type baselineResult struct {
	Seconds  float64 `json:"seconds"`
	BlobSize int64   `json:"blobBytes"`
	TarBytes int64   `json:"tarBytes"`
	Files    int     `json:"files"`
	// Set by the parent.
	CPU float64 `json:"cpuSeconds"`
}

// runBaselineChild is the child's main: GET url, gunzip (klauspost/compress, the library the
// daemon's verifier uses), read the tar; with dir set, write every regular file under dir and
// syncfs at the end (what a full pull does); with hash set, take the sha256 of every regular
// file's content (what verifying it costs at least); otherwise discard the content.
func runBaselineChild(args []string) error {
	fl := flag.NewFlagSet("baseline", flag.ContinueOnError)
	url := fl.String("url", "", "blob URL")
	dir := fl.String("dir", "", "untar into this directory (default: discard)")
	hashFiles := fl.Bool("hash", false, "hash every regular file's content (sha256)")
	if err := fl.Parse(args); err != nil {
		return err
	}
	start := time.Now()
	resp, err := http.Get(*url)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: %s", *url, resp.Status)
	}
	cr := &countReader{r: resp.Body}
	zr, err := gzip.NewReader(bufio.NewReaderSize(cr, 1<<20))
	if err != nil {
		return err
	}
	res := baselineResult{}
	tr := tar.NewReader(zr)
	buf := make([]byte, 1<<20)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return err
		}
		if h.Typeflag != tar.TypeReg {
			continue
		}
		res.Files++
		var w io.Writer = io.Discard
		var f *os.File
		var sum hash.Hash
		if *hashFiles {
			sum = sha256.New()
			w = sum
		}
		if *dir != "" {
			p := filepath.Join(*dir, filepath.FromSlash(h.Name))
			if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
				return err
			}
			if f, err = os.Create(p); err != nil {
				return err
			}
			w = f
		}
		n, err := io.CopyBuffer(w, tr, buf)
		if sum != nil {
			sum.Sum(nil)
		}
		res.TarBytes += n
		if f != nil {
			if cerr := f.Close(); err == nil {
				err = cerr
			}
		}
		if err != nil {
			return err
		}
	}
	// The rest of the stream (the TOC entry of eStargz, the footer).
	n, err := io.CopyBuffer(io.Discard, zr, buf)
	res.TarBytes += n
	if err != nil {
		return err
	}
	if _, err := io.Copy(io.Discard, cr); err != nil {
		return err
	}
	if *dir != "" {
		d, err := os.Open(*dir)
		if err != nil {
			return err
		}
		err = unix.Syncfs(int(d.Fd()))
		d.Close()
		if err != nil {
			return err
		}
	}
	res.Seconds = time.Since(start).Seconds()
	res.BlobSize = cr.n
	return json.NewEncoder(os.Stdout).Encode(res)
}

type countReader struct {
	r io.Reader
	n int64
}

func (c *countReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += int64(n)
	return n, err
}

// runBaseline runs the child once (hash: hashing every file, see runBaselineChild) and adds
// its CPU time.
func runBaseline(ctx context.Context, url, dir string, hash bool) (baselineResult, error) {
	self, err := os.Executable()
	if err != nil {
		return baselineResult{}, err
	}
	args := []string{"baseline", "-url", url}
	if dir != "" {
		args = append(args, "-dir", dir)
	}
	if hash {
		args = append(args, "-hash")
	}
	cmd := exec.CommandContext(ctx, self, args...)
	var out, errb strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		return baselineResult{}, fmt.Errorf("baseline: %w: %s", err, errb.String())
	}
	var res baselineResult
	if err := json.Unmarshal([]byte(out.String()), &res); err != nil {
		return res, fmt.Errorf("baseline output %q: %w", out.String(), err)
	}
	ru := cmd.ProcessState.SysUsage().(*syscall.Rusage)
	res.CPU = tv(ru.Utime) + tv(ru.Stime)
	return res, nil
}

func tv(t syscall.Timeval) float64 { return float64(t.Sec) + float64(t.Usec)/1e6 }
