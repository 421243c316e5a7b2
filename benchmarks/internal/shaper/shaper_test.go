package shaper

import (
	"bytes"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"sync"
	"testing"
	"time"
)

func TestParseLink(t *testing.T) {
	for _, tc := range []struct {
		in   string
		rate int64
		rtt  time.Duration
		bad  bool
	}{
		{in: "100mbit/10ms", rate: 12_500_000, rtt: 10 * time.Millisecond},
		{in: "1gbit/1ms", rate: 125_000_000, rtt: time.Millisecond},
		{in: "512kbit/150ms", rate: 64_000, rtt: 150 * time.Millisecond},
		{in: "2.5Gbit/500us", rate: 312_500_000, rtt: 500 * time.Microsecond},
		{in: "10gbit/0.2ms", rate: 1_250_000_000, rtt: 200 * time.Microsecond},
		{in: "unlimited"},
		{in: "100mbit", bad: true},
		{in: "100mb/10ms", bad: true},
		{in: "-1mbit/10ms", bad: true},
		{in: "100mbit/fast", bad: true},
	} {
		l, err := ParseLink(tc.in)
		if tc.bad {
			if err == nil {
				t.Errorf("ParseLink(%q) = %+v, want an error", tc.in, l)
			}
			continue
		}
		if err != nil || l.Rate != tc.rate || l.RTT != tc.rtt || l.String() != tc.in {
			t.Errorf("ParseLink(%q) = %+v, %v; want rate %d, RTT %v", tc.in, l, err, tc.rate, tc.rtt)
		}
	}
}

func TestWindow(t *testing.T) {
	for _, tc := range []struct {
		link string
		want int
	}{
		{"100mbit/10ms", 512 << 10},      // BDP 125 kB: twice that is below the floor
		{"1gbit/20ms", 5_000_000},        // 2 x 2.5 MB
		{"10gbit/100ms", 8 << 20},        // capped
		{"unlimited", 512 << 10},         // no rate: the floor
		{"100mbit/100ms", 2 * 1_250_000}, // 2 x BDP
	} {
		l, err := ParseLink(tc.link)
		if err != nil {
			t.Fatal(err)
		}
		if got := l.Window(); got != tc.want {
			t.Errorf("%s: Window() = %d, want %d", tc.link, got, tc.want)
		}
	}
}

// exchangeServer is the upstream of the tests: on each connection it sends its own stream
// (down) while it reads the client's to the end (up), then sends the sha256 of what it read and
// closes.
func exchangeServer(t *testing.T, down func(n int) []byte) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for i := 0; ; i++ {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func(c net.Conn, i int) {
				defer c.Close()
				sent := make(chan error, 1)
				go func() { _, err := c.Write(down(i)); sent <- err }()
				h := sha256.New()
				if _, err := io.Copy(h, c); err != nil {
					return
				}
				if <-sent != nil {
					return
				}
				c.Write(h.Sum(nil))
			}(c, i)
		}
	}()
	return ln.Addr().String()
}

func random(seed uint64, n int) []byte {
	b := make([]byte, n)
	r := rand.New(rand.NewPCG(seed, 7))
	for i := range b {
		b[i] = byte(r.Uint32())
	}
	return b
}

func startProxy(t *testing.T, upstream, link string) *Proxy {
	t.Helper()
	l, err := ParseLink(link)
	if err != nil {
		t.Fatal(err)
	}
	p, err := Listen("127.0.0.1:0", upstream, l)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	return p
}

// exchange sends up through the proxy, half-closes, and returns everything the server sent
// until it closed.
func exchange(addr string, up []byte) ([]byte, error) {
	c, err := net.Dial("tcp", addr)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(60 * time.Second))
	sent := make(chan error, 1)
	go func() {
		_, err := c.Write(up)
		if err == nil {
			err = c.(*net.TCPConn).CloseWrite()
		}
		sent <- err
	}()
	got, err := io.ReadAll(c)
	return got, errors.Join(err, <-sent)
}

func checkExchange(up, down, got []byte) error {
	sum := sha256.Sum256(up)
	want := append(bytes.Clone(down), sum[:]...)
	if !bytes.Equal(got, want) {
		return fmt.Errorf("received %d bytes, want the server's %d bytes and the sha256 of the %d bytes sent (equal: down %t, digest %t)",
			len(got), len(down), len(up), len(got) >= len(down) && bytes.Equal(got[:len(down)], down),
			len(got) == len(want) && bytes.Equal(got[len(down):], sum[:]))
	}
	return nil
}

func TestBytesUnchangedBothWays(t *testing.T) {
	for _, link := range []string{"unlimited", "1gbit/1ms", "400mbit/4ms"} {
		t.Run(link, func(t *testing.T) {
			down := random(1, 3<<20+123)
			p := startProxy(t, exchangeServer(t, func(int) []byte { return down }), link)
			up := random(2, 5<<20+7)
			got, err := exchange(p.Addr(), up)
			if err != nil {
				t.Fatal(err)
			}
			if err := checkExchange(up, down, got); err != nil {
				t.Fatal(err)
			}
			if !p.WaitIdle(10 * time.Second) {
				t.Fatalf("%d connections still open after both sides closed", p.Conns())
			}
			if u, d := p.Bytes(); u != int64(len(up)) || d != int64(len(got)) {
				t.Errorf("Bytes() = %d up, %d down; want %d, %d", u, d, len(up), len(got))
			}
		})
	}
}

func TestConcurrentConnections(t *testing.T) {
	const conns = 16
	downs := make([][]byte, conns)
	for i := range downs {
		downs[i] = random(uint64(100+i), (i+1)*37<<10)
	}
	// The server numbers connections in accept order; each client finds its own stream by
	// the digest the server appends, so the streams differ in size per connection.
	var mu sync.Mutex
	sizes := map[int]int{}
	p := startProxy(t, exchangeServer(t, func(i int) []byte {
		mu.Lock()
		sizes[i] = len(downs[i%conns])
		mu.Unlock()
		return downs[i%conns]
	}), "200mbit/2ms")
	var wg sync.WaitGroup
	errs := make(chan error, conns)
	for i := range conns {
		wg.Go(func() {
			up := random(uint64(200+i), (conns-i)*53<<10)
			got, err := exchange(p.Addr(), up)
			if err != nil {
				errs <- err
				return
			}
			for _, down := range downs {
				if checkExchange(up, down, got) == nil {
					return
				}
			}
			errs <- fmt.Errorf("connection %d: received %d bytes, matching no server stream", i, len(got))
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if !p.WaitIdle(10 * time.Second) {
		t.Fatalf("%d connections still open", p.Conns())
	}
}

func TestServerCloseReachesClient(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Write([]byte("bye"))
			c.Close() // without reading: the client's request is never consumed
		}
	}()
	p := startProxy(t, ln.Addr().String(), "100mbit/10ms")
	c, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	got, err := io.ReadAll(c)
	if err != nil || string(got) != "bye" {
		t.Fatalf("read %q, %v; want \"bye\" then EOF", got, err)
	}
	// The client's direction stays open (a half-close) until the client closes too.
	c.Close()
	if !p.WaitIdle(10 * time.Second) {
		t.Fatalf("%d connections still open", p.Conns())
	}
}

func TestClientCloseReachesServer(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	result := make(chan error, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			result <- err
			return
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(10 * time.Second))
		got, err := io.ReadAll(c)
		if err == nil && string(got) != "hello" {
			err = fmt.Errorf("server read %q, want \"hello\"", got)
		}
		result <- err
	}()
	p := startProxy(t, ln.Addr().String(), "100mbit/10ms")
	c, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	c.Write([]byte("hello"))
	c.Close()
	if err := <-result; err != nil {
		t.Fatal(err)
	}
	if !p.WaitIdle(10 * time.Second) {
		t.Fatalf("%d connections still open", p.Conns())
	}
}

func TestCloseEndsConnections(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			defer c.Close() // never answers
		}
	}()
	p := startProxy(t, ln.Addr().String(), "unlimited")
	c, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.Write([]byte("GET / HTTP/1.1\r\n\r\n"))
	for p.Conns() == 0 {
		time.Sleep(time.Millisecond)
	}
	done := make(chan struct{})
	go func() { p.Close(); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("Close did not return with a connection open")
	}
	c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := c.Read(make([]byte, 1)); err == nil {
		t.Fatal("read after Close succeeded")
	}
}

// TestLinkIsNeverFaster checks lower bounds only, which the model guarantees: the proxy never
// delivers a byte before its time, however loaded the machine is.
func TestLinkIsNeverFaster(t *testing.T) {
	const n = 1 << 20
	big, small := random(3, n), []byte("y")
	srv := exchangeServer(t, func(i int) []byte {
		if i == 0 {
			return small
		}
		return big
	})
	l, err := ParseLink("80mbit/20ms") // 10 MB/s
	if err != nil {
		t.Fatal(err)
	}
	p := startProxy(t, srv, l.Name)

	// The server's digest leaves once the request and its end arrived: after the handshake
	// (1 RTT) and the request's way up (RTT/2); it comes down in RTT/2.
	start := time.Now()
	got, err := exchange(p.Addr(), []byte("x"))
	if err == nil {
		err = checkExchange([]byte("x"), small, got)
	}
	if err != nil {
		t.Fatalf("exchange: %v", err)
	}
	if elapsed := time.Since(start); elapsed < 2*l.RTT {
		t.Errorf("request and answer in %v, the link cannot do it in less than %v", elapsed, 2*l.RTT)
	}

	// The server sends 1 MiB as soon as it accepts: serialisation plus the way down.
	start = time.Now()
	got, err = exchange(p.Addr(), nil)
	if err == nil {
		err = checkExchange(nil, big, got)
	}
	if err != nil {
		t.Fatalf("exchange: %v", err)
	}
	if elapsed, min := time.Since(start), time.Duration(n)*time.Second/time.Duration(l.Rate)+l.RTT/2; elapsed < min {
		t.Errorf("1 MiB down in %v, the link cannot do it in less than %v", elapsed, min)
	}

	// Two connections at once share the rate: 2 MiB in all.
	start = time.Now()
	var wg sync.WaitGroup
	for range 2 {
		wg.Go(func() { exchange(p.Addr(), nil) })
	}
	wg.Wait()
	if elapsed, min := time.Since(start), 2*time.Duration(n)*time.Second/time.Duration(l.Rate); elapsed < min {
		t.Errorf("2 x 1 MiB down in %v, the shared link cannot do it in less than %v", elapsed, min)
	}
}
