package testlayer

import (
	"fmt"
	"math/rand/v2"
	"strconv"
)

// SyntheticTOC returns the JSON of a zstd:chunked-style TOC with n entries, shaped like a
// distribution root filesystem: directories of 40 entries, mostly small regular files with
// one chunk, every 20th file with three chunks, every 10th entry a symlink. All data offsets
// lie below the returned payload end.
func SyntheticTOC(n int) (js []byte, payloadEnd int64) {
	b := make([]byte, 0, n*230)
	b = append(b, `{"version":1,"entries":[`...)
	const sum = "sha256:9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"
	var off int64 = 512
	dir := ""
	for i := range n {
		if i > 0 {
			b = append(b, ',')
		}
		if i%40 == 0 {
			dir = fmt.Sprintf("usr/lib/pkg%06d", i/40)
			b = append(b, `{"type":"dir","name":"`...)
			b = append(b, dir...)
			b = append(b, `/","mode":493,"modtime":"2024-03-01T12:00:00Z"}`...)
			continue
		}
		name := dir + "/file" + strconv.Itoa(i) + ".so"
		switch {
		case i%10 == 0:
			b = append(b, `{"type":"symlink","name":"`...)
			b = append(b, name...)
			b = append(b, `","linkName":"../lib/target.so","mode":511,"modtime":"2024-03-01T12:00:00Z"}`...)
		case i%20 == 1:
			b = append(b, `{"type":"reg","name":"`...)
			b = append(b, name...)
			b = fmt.Appendf(b, `","mode":420,"size":196608,"modtime":"2024-03-01T12:00:00Z","digest":"%s","offset":%d,"endOffset":%d,"chunkSize":65536,"chunkDigest":"%s"}`, sum, off, off+3*20000, sum)
			for c := int64(1); c < 3; c++ {
				b = append(b, `,{"type":"chunk","name":"`...)
				b = append(b, name...)
				b = fmt.Appendf(b, `","offset":%d,"chunkOffset":%d,"chunkSize":65536,"chunkDigest":"%s"}`, off+c*20000, c*65536, sum)
			}
			off += 3*20000 + 100
		default:
			b = append(b, `{"type":"reg","name":"`...)
			b = append(b, name...)
			b = fmt.Appendf(b, `","mode":420,"size":4096,"modtime":"2024-03-01T12:00:00Z","digest":"%s","offset":%d,"endOffset":%d}`, sum, off, off+1500)
			off += 1600
		}
	}
	b = append(b, `]}`...)
	return b, off + 1
}

// RandomBytes returns n bytes of random, incompressible content drawn from seed: a chunk's
// compressed size is then its size.
func RandomBytes(n int, seed uint64) []byte {
	rng := rand.New(rand.NewPCG(seed, seed+1))
	data := make([]byte, n)
	for i := range data {
		data[i] = byte(rng.Uint32())
	}
	return data
}
