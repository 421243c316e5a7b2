package chunked_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"regexp"
	"testing"

	"github.com/layerstore/layerstore/chunked"
	"github.com/layerstore/layerstore/internal/byterange"
	"github.com/layerstore/layerstore/internal/testutil/testlayer"
)

// TestParseGolden pins the compact form of a synthetic layer of 20,000 entries, whose
// multi-chunk files and entries span many of the builder's blocks, in both formats (the
// eStargz one finds its chunks' ends from the next offsets): a change to the builder that
// changes what an index holds changes these sums.
func TestParseGolden(t *testing.T) {
	js, end := testlayer.SyntheticTOC(20_000)
	// eStargz: no endOffset, and a chunkDigest on every file.
	stargz := regexp.MustCompile(`,"endOffset":\d+`).ReplaceAll(js, nil)
	stargz = regexp.MustCompile(`"digest":"(sha256:[0-9a-f]+)","offset":(\d+)}`).ReplaceAll(stargz, []byte(`"digest":"$1","offset":$2,"chunkDigest":"$1"}`))
	for _, tc := range []struct {
		format chunked.Format
		toc    []byte
		want   string
	}{
		{chunked.ZstdChunked, js, "610bb0f08f007013579c4c08593f804de5034337cf795f1c47b5b1c34729a3a9"},
		{chunked.EStargz, stargz, "ec434dd2fea020fc192292cc1fe84fa03f8e4a0c6bf5c81ea1b1d4a4aff9fe2b"},
	} {
		layout := &chunked.Layout{Format: tc.format, TOC: byterange.Range{Offset: end + 8, Length: 1}}
		x, err := chunked.Parse(context.Background(), layout, tc.toc, chunked.Limits{})
		if err != nil {
			t.Fatal(err)
		}
		sum := sha256.Sum256(x.Binary())
		if got := hex.EncodeToString(sum[:]); got != tc.want {
			t.Errorf("%v: compact form %s, want %s", tc.format, got, tc.want)
		}
	}
}
