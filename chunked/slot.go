package chunked

import (
	"runtime"

	"github.com/layerstore/layerstore/internal/byterange"
)

// ChunkSlots returns the size of the space [Index.ChunkSlot] numbers the chunks of the
// index in: a bit set of that many bits can mark any chunk.
func (x *Index) ChunkSlots() int { return len(x.chunks)/chunkSize + x.n }

// ChunkSlot returns a number in [0, ChunkSlots()) that names chunk i of regular file id: the
// same for every hardlink of the file (the chunks are its inode's), another for every other
// chunk of the index; -1 when the file has no chunk i. [Index.SlotRange] returns its bytes in the blob.
func (x *Index) ChunkSlot(id EntryID, i int) int {
	r, ok := x.rec(id)
	if !ok {
		return -1
	}
	inode := id
	if r.inode != id {
		inode = r.inode
		if r, ok = x.rec(inode); !ok {
			return -1
		}
	}
	defer runtime.KeepAlive(x)
	nTable := len(x.chunks) / chunkSize
	switch {
	case r.opt&optChunk != 0 && i == 0:
		return nTable + int(inode) // the one chunk, in the record: no slot in the table
	case r.opt&optChunks != 0 && i >= 0 && i < r.nchunks && r.chunk0+r.nchunks <= nTable:
		return r.chunk0 + i
	}
	return -1
}

// SlotRange returns the compressed bytes of the chunk [Index.ChunkSlot] named slot, and false
// when no chunk has that slot.
func (x *Index) SlotRange(slot int) (byterange.Range, bool) {
	defer runtime.KeepAlive(x)
	nTable := len(x.chunks) / chunkSize
	if slot < 0 || slot >= nTable+x.n {
		return byterange.Range{}, false
	}
	if slot >= nTable {
		id := EntryID(slot - nTable)
		r, ok := x.rec(id)
		if !ok || r.inode != id || r.opt&optChunk == 0 {
			return byterange.Range{}, false
		}
		return r.chunk.Range, true
	}
	f := fileChunks{n: 1, chunk0: slot}
	return x.chunk(&f, 0).Range, true
}
