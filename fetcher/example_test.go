package fetcher_test

import (
	"bytes"
	"context"
	"fmt"
	"log"
	"net/http"
	"net/http/httptest"
	"strings"
	"time"

	"github.com/layerstore/layerstore/fetcher"
	"github.com/layerstore/layerstore/internal/byterange"
)

// A Blob reads ranges of one blob with HTTP range requests. Here the registry is a test
// server that serves a 200 KiB blob; the daemon gets its Blobs from Client.Blob, with a
// transport that authenticates to the registry.
func ExampleBlob_Fetch() {
	blob := bytes.Repeat([]byte("."), 200<<10)
	copy(blob[0:], "hello")
	copy(blob[150_000:], "world")
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.ServeContent(w, r, "", time.Time{}, bytes.NewReader(blob)) // answers Range requests
	}))
	defer srv.Close()

	blobURL := srv.URL + "/v2/app/blobs/sha256:" + strings.Repeat("0", 64)
	b, err := fetcher.New(srv.Client().Transport, blobURL, int64(len(blob)))
	if err != nil {
		log.Fatal(err)
	}
	// The two ranges are too far apart to be merged into one span, so the Blob asks for both
	// in one multi-range request. The bytes are not verified: that is package verify's job.
	ranges := []byterange.Range{{Offset: 0, Length: 5}, {Offset: 150_000, Length: 5}}
	got, err := b.Fetch(context.Background(), ranges)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("%s %s\n", got[0], got[1])
	fmt.Println("requests:", b.Stats().Requests)
	// Output:
	// hello world
	// requests: 1
}
