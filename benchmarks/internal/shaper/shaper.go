// Package shaper owns the benchmarks' emulated network link: a TCP proxy on loopback that puts
// a server (the registry) behind a link of limited bandwidth and real latency. The kernel of
// these machines has no sch_netem, so `tc qdisc ... netem` cannot do it.
//
// The model, for each direction (client to server, server to client) separately:
//
//   - One transmitter of Link.Rate bytes per second, shared by every connection through the
//     proxy. Bytes read from a sender queue behind everything already handed to the link in
//     that direction (first come, first served, in pieces of about 0.5 ms of the link), so concurrent
//     connections share the bandwidth.
//   - A delay line of Link.RTT/2: a chunk reaches the other side RTT/2 after the transmitter
//     finished sending it. Chunks in flight do not wait for each other, so a connection whose
//     window covers the bandwidth-delay product runs at the full rate, as on a real link; a
//     request and its response cost one RTT more than on loopback.
//   - A connection's first bytes from the client arrive no earlier than 1.5 RTT after it was
//     accepted: the TCP handshake a real link would cost before the request can leave.
//   - Each connection holds at most Link.Window() bytes in flight per direction (read from the
//     sender, not yet written to the receiver). Beyond that the proxy stops reading, and TCP
//     flow control on loopback pushes back on the sender, as a receive window does.
//
// End of stream (a FIN) travels the delay line behind the data and becomes a half-close on
// the other side; a reset or any other error closes both sides once the data before it is
// delivered.
//
// Timing: Go timers wake about 1 ms late on Linux (the netpoller waits in whole
// milliseconds), which would double a 0.5 ms one-way delay, and nanosleep would hold one of the
// process's Ps per sleeping goroutine (two Ps on two cores: the proxy stalls). Each writer
// therefore waits on a timerfd of its own, read through the netpoller: the kernel wakes it
// within about 0.1 ms, and the goroutine holds no P while it waits. A piece is never delivered
// before the model says. The proxy runs in the benchmark's process: its CPU (a copy of every
// byte) is shared with what is measured.
package shaper

import (
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
)

// Pieces the transmitter schedules at once are about half a millisecond of the link (so that
// concurrent connections interleave finely), between minChunk and maxChunk bytes: 16 KiB
// (1.3 ms) at 100 Mbit/s, 61 KiB at 1 Gbit/s. Fewer, larger pieces at high rates keep the
// proxy's own wake-ups and system calls from limiting the rate.
const (
	minChunk = 16 << 10
	maxChunk = 64 << 10
)

// Directions.
const (
	Up   = 0 // client to server
	Down = 1 // server to client
)

// Link is a network path: bandwidth and round-trip time.
type Link struct {
	Name string        // as written, e.g. "100mbit/10ms"
	Rate int64         // bytes per second in each direction; 0 means unlimited
	RTT  time.Duration // round-trip time; each direction delays by RTT/2
}

// Window is how many bytes a connection may have in flight per direction: twice the
// bandwidth-delay product, at least 512 KiB, at most 8 MiB.
func (l Link) Window() int {
	w := 2 * float64(l.Rate) * l.RTT.Seconds()
	return int(min(max(w, 512<<10), 8<<20))
}

// chunk is the largest piece the transmitter schedules at once on this link.
func (l Link) chunk() int {
	if l.Rate == 0 {
		return maxChunk
	}
	return int(min(max(l.Rate/2000, minChunk), maxChunk))
}

// String is the link's name, or its parameters when it has none.
func (l Link) String() string {
	if l.Name != "" {
		return l.Name
	}
	if l.Rate == 0 && l.RTT == 0 {
		return "unlimited"
	}
	return fmt.Sprintf("%dB/s/%v", l.Rate, l.RTT)
}

// ParseLink reads "RATE/RTT" such as "100mbit/10ms" or "1gbit/1ms" (rates in kbit, mbit or
// gbit per second, powers of ten as network rates are; the RTT in Go's duration syntax), or
// "unlimited".
func ParseLink(s string) (Link, error) {
	if s == "unlimited" {
		return Link{Name: s}, nil
	}
	rate, rtt, ok := strings.Cut(s, "/")
	if !ok {
		return Link{}, fmt.Errorf("link %q: want RATE/RTT, e.g. 100mbit/10ms", s)
	}
	l := Link{Name: s}
	var mult float64
	for _, u := range []struct {
		suffix string
		mult   float64
	}{{"kbit", 1e3}, {"mbit", 1e6}, {"gbit", 1e9}} {
		if n, ok := strings.CutSuffix(strings.ToLower(rate), u.suffix); ok {
			rate, mult = n, u.mult
			break
		}
	}
	v, err := strconv.ParseFloat(rate, 64)
	if mult == 0 || err != nil || v <= 0 {
		return Link{}, fmt.Errorf("link %q: rate wants a number and kbit, mbit or gbit", s)
	}
	l.Rate = int64(v * mult / 8)
	if l.RTT, err = time.ParseDuration(rtt); err != nil || l.RTT < 0 {
		return Link{}, fmt.Errorf("link %q: bad RTT: %v", s, err)
	}
	return l, nil
}

// Proxy forwards TCP connections to one upstream address through a shaped Link.
type Proxy struct {
	ln       net.Listener
	upstream string
	bytes    [2]atomic.Int64 // delivered, per direction
	wg       sync.WaitGroup  // the accept loop and every connection

	mu     sync.Mutex // guards what follows
	link   Link
	free   [2]time.Time // per direction, when the transmitter has sent all it was handed
	conns  map[*pair]struct{}
	closed bool
	idle   chan struct{} // closed when conns becomes empty; nil while it is
}

// Listen starts a proxy on addr (e.g. "127.0.0.1:0") to upstream, shaped by l.
func Listen(addr, upstream string, l Link) (*Proxy, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	p := &Proxy{ln: ln, upstream: upstream, link: l, conns: map[*pair]struct{}{}}
	p.wg.Add(1)
	go p.accept()
	return p, nil
}

// Addr is the address clients connect to.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// Link returns the current link.
func (p *Proxy) Link() Link {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.link
}

// SetLink changes the link for bytes read from now on; connections keep the window of the
// link they were accepted on. The transmitters start idle.
func (p *Proxy) SetLink(l Link) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.link = l
	p.free = [2]time.Time{}
}

// Bytes returns the bytes delivered so far in each direction.
func (p *Proxy) Bytes() (up, down int64) { return p.bytes[Up].Load(), p.bytes[Down].Load() }

// Conns is the number of open connections.
func (p *Proxy) Conns() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.conns)
}

// WaitIdle waits until no connection is open, at most timeout; it reports whether none is.
func (p *Proxy) WaitIdle(timeout time.Duration) bool {
	p.mu.Lock()
	if len(p.conns) == 0 {
		p.mu.Unlock()
		return true
	}
	if p.idle == nil {
		p.idle = make(chan struct{})
	}
	idle := p.idle
	p.mu.Unlock()
	select {
	case <-idle:
		return true
	case <-time.After(timeout):
		return false
	}
}

// Close stops accepting, closes every connection and waits for their goroutines.
func (p *Proxy) Close() error {
	err := p.ln.Close()
	p.mu.Lock()
	p.closed = true
	for c := range p.conns {
		c.abort()
	}
	p.mu.Unlock()
	p.wg.Wait()
	return err
}

func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			return // closed
		}
		p.wg.Add(1)
		go p.serve(c.(*net.TCPConn))
	}
}

// pair is one proxied connection: the client's and the one to upstream.
type pair struct {
	conn [2]*net.TCPConn // [Up] reads from the client, [Down] from upstream
	done chan struct{}   // closed by abort
	once sync.Once
}

// abort closes both sides; the pair's goroutines then end.
func (c *pair) abort() {
	c.once.Do(func() {
		close(c.done)
		c.conn[0].Close()
		c.conn[1].Close()
	})
}

func (p *Proxy) serve(client *net.TCPConn) {
	defer p.wg.Done()
	accepted := time.Now()
	server, err := net.DialTimeout("tcp", p.upstream, 10*time.Second)
	if err != nil {
		client.Close()
		return
	}
	c := &pair{conn: [2]*net.TCPConn{client, server.(*net.TCPConn)}, done: make(chan struct{})}
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		c.abort()
		return
	}
	p.conns[c] = struct{}{}
	l := p.link
	p.mu.Unlock()

	var wg sync.WaitGroup
	for d := range 2 {
		q := make(chan chunk, max(2, l.Window()/l.chunk()))
		var notBefore time.Time
		if d == Up {
			notBefore = accepted.Add(l.RTT + l.RTT/2)
		}
		wg.Go(func() { p.read(c, d, q, l.chunk(), notBefore) })
		wg.Go(func() { p.write(c, d, q) })
	}
	wg.Wait()
	c.abort()
	p.mu.Lock()
	delete(p.conns, c)
	if len(p.conns) == 0 && p.idle != nil {
		close(p.idle)
		p.idle = nil
	}
	p.mu.Unlock()
}

// chunk is bytes (or the end of the stream) in the delay line.
type chunk struct {
	buf *[]byte   // nil at the end of the stream
	n   int       // bytes of *buf
	at  time.Time // when it reaches the receiver
	err error     // at the end: io.EOF for a FIN, anything else aborts
}

var bufs = sync.Pool{New: func() any { b := make([]byte, maxChunk); return &b }}

// read moves what the sender of direction d writes into the delay line q, in pieces of at most
// size bytes.
func (p *Proxy) read(c *pair, d int, q chan<- chunk, size int, notBefore time.Time) {
	src := c.conn[d]
	for {
		buf := bufs.Get().(*[]byte)
		n, err := src.Read((*buf)[:size])
		if n > 0 {
			at := p.schedule(d, n, time.Now())
			if at.Before(notBefore) {
				at = notBefore
			}
			select {
			case q <- chunk{buf: buf, n: n, at: at}:
			case <-c.done:
				return
			}
		} else {
			bufs.Put(buf)
		}
		if err != nil {
			select {
			case q <- chunk{at: time.Now().Add(p.Link().RTT / 2), err: err}:
			case <-c.done:
			}
			return
		}
	}
}

// schedule hands n bytes read at now to the transmitter of direction d and returns when they
// reach the other side.
func (p *Proxy) schedule(d, n int, now time.Time) time.Time {
	p.mu.Lock()
	defer p.mu.Unlock()
	start := now
	if p.free[d].After(start) {
		start = p.free[d]
	}
	end := start
	if p.link.Rate > 0 {
		end = start.Add(time.Duration(int64(n) * int64(time.Second) / p.link.Rate))
	}
	p.free[d] = end
	return end.Add(p.link.RTT / 2)
}

// write delivers the delay line q of direction d to its receiver, each chunk at its time.
func (p *Proxy) write(c *pair, d int, q <-chan chunk) {
	dst := c.conn[1-d]
	clk := newClock()
	defer clk.close()
	for {
		var ch chunk
		select {
		case ch = <-q:
		case <-c.done:
			return
		}
		clk.sleepUntil(ch.at)
		if ch.buf == nil {
			if ch.err == io.EOF {
				if dst.CloseWrite() == nil {
					return
				}
			}
			c.abort()
			return
		}
		_, err := dst.Write((*ch.buf)[:ch.n])
		bufs.Put(ch.buf)
		if err != nil {
			c.abort()
			return
		}
		p.bytes[d].Add(int64(ch.n))
	}
}

// clock sleeps a goroutine with the kernel's timer precision: a timerfd read through the
// netpoller. Without a timerfd it falls back to time.Sleep.
type clock struct {
	fd int
	f  *os.File
}

func newClock() *clock {
	fd, err := unix.TimerfdCreate(unix.CLOCK_MONOTONIC, unix.TFD_NONBLOCK|unix.TFD_CLOEXEC)
	if err != nil {
		return &clock{fd: -1}
	}
	// A non-blocking descriptor makes a pollable os.File. Its Fd method must not be called:
	// it would switch the descriptor to blocking mode.
	return &clock{fd: fd, f: os.NewFile(uintptr(fd), "shaper-timerfd")}
}

func (c *clock) close() {
	if c.f != nil {
		c.f.Close()
	}
}

// sleepUntil returns at t or shortly after.
func (c *clock) sleepUntil(t time.Time) {
	for {
		d := time.Until(t)
		if d <= 0 {
			return
		}
		if c.f == nil {
			time.Sleep(d)
			continue
		}
		spec := unix.ItimerSpec{Value: unix.NsecToTimespec(int64(d))}
		if err := unix.TimerfdSettime(c.fd, 0, &spec, nil); err != nil {
			time.Sleep(d)
			continue
		}
		var expirations [8]byte
		if _, err := c.f.Read(expirations[:]); err != nil {
			time.Sleep(time.Until(t))
		}
	}
}
