package testlayer

import (
	"archive/tar"
	"bytes"
	"io"
	"testing"
)

func TestTar(t *testing.T) {
	tr := tar.NewReader(bytes.NewReader(Tar()))
	n := 0
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		n++
		_ = h
	}
	if n < 30 {
		t.Fatal(n)
	}
	t.Log(n, len(Tar()))
}
