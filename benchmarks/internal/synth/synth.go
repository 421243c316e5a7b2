// Package synth makes the deterministic content of the benchmarks' generated files: text that
// compresses like sources and docs, binary that compresses like libraries, and random bytes
// that do not compress, like archives and model weights. The same seed always gives the same
// bytes. A Gen is not safe for concurrent use; Write makes its own.
package synth

import (
	"encoding/binary"
	"io"
	"math/rand/v2"
)

// Content kinds.
const (
	Text   = "text"   // words with a Zipf distribution: compresses about 3x, like sources and docs
	Binary = "binary" // blocks of code-like, text and random bytes: compresses about 2x, like libraries
	Random = "random" // incompressible, like archives, media or model weights
)

// Write streams size bytes of kind's content from seed to w.
func Write(w io.Writer, kind string, seed uint64, size int64) error {
	g := New(seed)
	buf := make([]byte, 1<<20)
	for left := size; left > 0; {
		n := min(left, int64(len(buf)))
		g.Fill(kind, buf[:n])
		if _, err := w.Write(buf[:n]); err != nil {
			return err
		}
		left -= n
	}
	return nil
}

// Gen makes deterministic content of each kind.
type Gen struct {
	rng   *rand.Rand
	cc    *rand.ChaCha8
	zipf  *rand.Zipf
	words [][]byte
}

var vocabulary = func() [][]byte {
	rng := rand.New(rand.NewPCG(42, 42))
	const letters = "etaoinshrdlcumwfgypbvkjxqz_"
	words := make([][]byte, 8192)
	for i := range words {
		w := make([]byte, 2+rng.IntN(9))
		for j := range w {
			w[j] = letters[min(rng.IntN(len(letters)), rng.IntN(len(letters)))]
		}
		words[i] = w
	}
	return words
}()

// New returns the generator of seed.
func New(seed uint64) *Gen {
	var key [32]byte
	binary.LittleEndian.PutUint64(key[:], seed)
	rng := rand.New(rand.NewPCG(seed, 3))
	return &Gen{rng: rng, cc: rand.NewChaCha8(key), zipf: rand.NewZipf(rng, 1.1, 4, uint64(len(vocabulary)-1)), words: vocabulary}
}

// Fill fills p with the next bytes of kind's content.
func (g *Gen) Fill(kind string, p []byte) {
	switch kind {
	case Random:
		_, _ = g.cc.Read(p)
	case Text:
		g.text(p)
	default:
		g.binary(p)
	}
}

// text fills p with lines of Zipf-distributed words.
func (g *Gen) text(p []byte) {
	i, col := 0, 0
	for i < len(p) {
		w := g.words[g.zipf.Uint64()]
		i += copy(p[i:], w)
		col += len(w)
		if i < len(p) {
			if col > 60+g.rng.IntN(20) {
				p[i], col = '\n', 0
			} else {
				p[i] = ' '
				col++
			}
			i++
		}
	}
}

// binary fills p with 256-byte blocks: random (40%), text (30%) and code-like (30%: a few
// opcodes and small operands, runs of zeros).
func (g *Gen) binary(p []byte) {
	for off := 0; off < len(p); off += 256 {
		b := p[off:min(off+256, len(p))]
		switch r := g.rng.IntN(10); {
		case r < 4:
			_, _ = g.cc.Read(b)
		case r < 7:
			g.text(b)
		default:
			for j := range b {
				switch g.rng.IntN(8) {
				case 0, 1, 2:
					b[j] = 0
				case 3:
					b[j] = byte(g.rng.IntN(256))
				default:
					b[j] = []byte{0x48, 0x89, 0x8b, 0xe8, 0xc3, 0x0f, 0xff, 0x24}[g.rng.IntN(8)]
				}
			}
		}
	}
}
