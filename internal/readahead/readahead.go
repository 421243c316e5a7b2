// Package readahead owns reading a stream ahead of its reader, on a goroutine of its own, in
// blocks handed over through channels: the decompression of a TOC while it is parsed, the
// reads of a TOC from the registry while it is decompressed. The two goroutines meet once per
// block rather than once per read, and at most a fixed number of blocks are in memory.
//
// A [Reader] serves one goroutine (Read, Drain, Close); its filling runs on its own.
package readahead

import "io"

// A Fill fills a block: it returns b, or a block of its own when b is nil or not the size it
// wants, holding the bytes it read (none at the end), and an error: io.EOF once the stream
// has ended (with the last bytes or after them), or what stopped it.
type Fill func(b []byte) ([]byte, error)

// Reader reads what its Fill yields, blocks ahead of the reader.
type Reader struct {
	full   chan []byte   // blocks filled, in order; closed at the end or on an error
	free   chan []byte   // blocks read, for the filling to fill again
	stop   chan struct{} // closed by Close: the reader is gone
	cancel func()        // see New
	done   chan struct{} // closed when the goroutine has returned
	err    error         // what stopped the filling, but io.EOF; read once done

	blk, cur []byte // the block being read, and the rest of it
}

// New starts filling at most blocks blocks ahead of the reader with fill, on a goroutine of
// its own, which runs until the stream ends or fails, or Close. cancel, when not nil, is
// called by Close once the filling is told to stop, before Close waits for it: it ends a fill
// waiting on something (a read of the network, through a context it cancels).
func New(blocks int, fill Fill, cancel func()) *Reader {
	r := &Reader{
		cancel: cancel,
		full:   make(chan []byte, blocks),
		free:   make(chan []byte, blocks),
		stop:   make(chan struct{}),
		done:   make(chan struct{}),
	}
	for range blocks {
		r.free <- nil // allocated by the first fill of each: a short stream needs one
	}
	go func() {
		defer close(r.done)
		defer close(r.full)
		for {
			var b []byte
			select {
			case b = <-r.free:
			case <-r.stop:
				return
			}
			b, err := fill(b)
			if len(b) > 0 {
				select {
				case r.full <- b:
				case <-r.stop:
					return
				}
			}
			if err != nil {
				select {
				case <-r.stop: // the filling failed because Close stopped it
				default:
					if err != io.EOF {
						r.err = err
					}
				}
				return
			}
		}
	}()
	return r
}

// Read reads what the filling yielded, in order; at the end, io.EOF or what stopped it.
func (r *Reader) Read(p []byte) (int, error) {
	if len(r.cur) == 0 {
		b, ok := <-r.full
		if !ok {
			<-r.done
			if r.err != nil {
				return 0, r.err
			}
			return 0, io.EOF
		}
		r.blk, r.cur = b, b
	}
	n := copy(p, r.cur)
	r.cur = r.cur[n:]
	if len(r.cur) == 0 {
		r.free <- r.blk[:cap(r.blk)] // never blocks: at most blocks blocks go round
		r.blk = nil
	}
	return n, nil
}

// Drain lets the filling run to its end, discarding what it yields, and returns what stopped
// it (nil at the end of the stream).
func (r *Reader) Drain() error {
	for b := range r.full {
		r.free <- b[:cap(b)]
	}
	<-r.done
	return r.err
}

// Close stops the filling, if still running (see New's cancel), waits for its goroutine, and
// returns what had stopped it before (nil at the end of the stream, or when Close stopped
// it). Close is called once.
func (r *Reader) Close() error {
	close(r.stop)
	if r.cancel != nil {
		r.cancel()
	}
	<-r.done
	return r.err
}
