package fetcher

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Where a registry may redirect a blob request.
//
// A registry (or a mirror) may send a blob request elsewhere: to blob storage, a CDN. Since
// what it is sent to is served as the blob, a hostile registry could otherwise point the
// daemon at a service reachable only from the node (a metadata service on a link-local
// address, a local admin port) and have its answer read back. So a hop to another origin is
// refused when:
//
//   - it goes from https to plain http (anywhere in the chain); or
//   - it leads to an address that is not public (loopback, link-local, unspecified, private,
//     or another special range; IPv4-mapped and NAT64 IPv6 addresses count as their IPv4
//     address) unless the registry itself is at an address of that same class: a registry on
//     loopback may redirect to loopback, one on a private network to that network, one on a
//     public address to public addresses only.
//
// The registry's class is that of the addresses its host name resolves to. The target's is
// checked twice: its host name resolved before the hop is sent, and the address actually
// dialed (for the transports the package makes, and any *http.Transport given as the storage
// transport), so that a name resolving to another address by then (DNS rebinding) is refused
// too.

// addrClass is the reachability class of an address.
type addrClass uint8

const (
	classPublic addrClass = iota
	classPrivate
	classLoopback
	classLinkLocal
	classUnspecified
	classSpecial // multicast, broadcast, reserved and documentation-only ranges of IPv4
)

func (c addrClass) String() string {
	switch c {
	case classPublic:
		return "public"
	case classPrivate:
		return "private"
	case classLoopback:
		return "loopback"
	case classLinkLocal:
		return "link-local"
	case classUnspecified:
		return "unspecified"
	}
	return "special-purpose"
}

var (
	nat64     = netip.MustParsePrefix("64:ff9b::/96")
	cgnat     = netip.MustParsePrefix("100.64.0.0/10")
	thisNet   = netip.MustParsePrefix("0.0.0.0/8")
	reserved4 = netip.MustParsePrefix("240.0.0.0/4")
)

// classOf returns a's class.
func classOf(a netip.Addr) addrClass {
	a = a.Unmap()
	if a.Is6() && nat64.Contains(a) {
		b := a.As16()
		a = netip.AddrFrom4([4]byte(b[12:]))
	}
	switch {
	case a.IsLoopback():
		return classLoopback
	case a.IsUnspecified() || a.Is4() && thisNet.Contains(a):
		return classUnspecified
	case a.IsLinkLocalUnicast() || a.IsLinkLocalMulticast():
		return classLinkLocal
	case a.IsPrivate() || a.Is4() && cgnat.Contains(a):
		return classPrivate
	case !a.IsGlobalUnicast() || a.Is4() && reserved4.Contains(a):
		return classSpecial
	}
	return classPublic
}

// errRedirectRefused: a redirect that this file's rules forbid.
var errRedirectRefused = fmt.Errorf("%w: redirect refused", ErrBadResponse)

// checkHopScheme refuses a hop from https to plain http.
func checkHopScheme(secure bool, to *url.URL) error {
	if secure && to.Scheme != "https" {
		return fmt.Errorf("%w: from https to plain http (%s)", errRedirectRefused, to.Host)
	}
	return nil
}

// checkHopAddr refuses target unless it is public or of the class of one of the registry's
// addresses, origin.
func checkHopAddr(origin []netip.Addr, target netip.Addr) error {
	c := classOf(target)
	if c == classPublic {
		return nil
	}
	for _, o := range origin {
		if classOf(o) == c {
			return nil
		}
	}
	return fmt.Errorf("%w: %s is a %s address and the registry is not at one", errRedirectRefused, target.Unmap(), c)
}

// hopPolicy rides in a redirected request's context down to the dialer.
type hopPolicy struct {
	origin []netip.Addr // the registry's addresses
	addr   string       // host:port the hop is for; other dials (a proxy) are not checked
}

type hopPolicyKey struct{}

func withHopPolicy(ctx context.Context, p *hopPolicy) context.Context {
	return context.WithValue(ctx, hopPolicyKey{}, p)
}

// checkDialed checks the address a redirected request is about to use (or used), when ctx
// carries a hop policy for the host:port dialed.
func checkDialed(ctx context.Context, dialed, remote string) error {
	p, _ := ctx.Value(hopPolicyKey{}).(*hopPolicy)
	if p == nil || !strings.EqualFold(p.addr, dialed) {
		return nil
	}
	ap, err := netip.ParseAddrPort(remote)
	if err != nil {
		return fmt.Errorf("%w: dialed %q, not an IP address", errRedirectRefused, remote)
	}
	return checkHopAddr(p.origin, ap.Addr())
}

// guardDials returns a transport like rt whose dials for redirected requests check the
// address dialed: before connecting with the transport's default dialer, right after
// connecting with its own DialContext. Connections are pooled apart for each set of address
// classes the registries are at, so that one dialed for a registry on loopback is never
// reused for a hop away from a public registry. rt itself when it is not an *http.Transport:
// the addresses its names resolve to are then checked only before the hop is sent.
func guardDials(rt http.RoundTripper) http.RoundTripper {
	t, ok := rt.(*http.Transport)
	if !ok {
		return rt
	}
	return &guardedTransport{base: t, pools: map[uint8]*http.Transport{}}
}

type guardedTransport struct {
	base  *http.Transport
	mu    sync.Mutex
	pools map[uint8]*http.Transport // guarded by mu; by the classes of the registry's addresses
}

func (g *guardedTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	var classes uint8
	if p, _ := req.Context().Value(hopPolicyKey{}).(*hopPolicy); p != nil {
		for _, a := range p.origin {
			classes |= 1 << classOf(a)
		}
	}
	g.mu.Lock()
	t := g.pools[classes]
	if t == nil {
		t = guardedClone(g.base)
		g.pools[classes] = t
	}
	g.mu.Unlock()
	return t.RoundTrip(req)
}

// CloseIdleConnections closes the idle connections of every pool.
func (g *guardedTransport) CloseIdleConnections() {
	g.mu.Lock()
	defer g.mu.Unlock()
	for _, t := range g.pools {
		t.CloseIdleConnections()
	}
}

// guardedClone returns a copy of t whose dials check the address dialed.
func guardedClone(t *http.Transport) *http.Transport {
	t = t.Clone()
	t.DisableCompression = true
	inner := t.DialContext
	if inner == nil {
		d := &net.Dialer{Timeout: 30 * time.Second, KeepAlive: 30 * time.Second}
		d.ControlContext = func(ctx context.Context, _, address string, _ syscall.RawConn) error {
			return checkDialed(ctx, dialedAddr(ctx), address)
		}
		inner = d.DialContext
	}
	t.DialContext = func(ctx context.Context, network, addr string) (net.Conn, error) {
		ctx = context.WithValue(ctx, dialedKey{}, addr)
		conn, err := inner(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		if err := checkDialed(ctx, addr, conn.RemoteAddr().String()); err != nil {
			_ = conn.Close()
			return nil, err
		}
		return conn, nil
	}
	return t
}

type dialedKey struct{}

func dialedAddr(ctx context.Context) string {
	s, _ := ctx.Value(dialedKey{}).(string)
	return s
}

// lookupAddrs resolves host to its addresses (a literal address is itself).
func lookupAddrs(ctx context.Context, host string) ([]netip.Addr, error) {
	if a, err := netip.ParseAddr(strings.Trim(host, "[]")); err == nil {
		return []netip.Addr{a}, nil
	}
	return net.DefaultResolver.LookupNetIP(ctx, "ip", host)
}

// originAddrs returns the addresses of the endpoint's registry, looked up on first use. None
// when the lookup fails: redirects then go to public addresses only.
func (b *Blob) originAddrs(ctx context.Context, ep *endpoint) []netip.Addr {
	ep.originMu.Lock()
	defer ep.originMu.Unlock()
	if ep.origin == nil {
		addrs, err := b.o.lookup(ctx, ep.url.Hostname())
		if err != nil {
			b.o.log.Debug("looking up the registry's addresses failed; redirects go to public addresses only",
				"host", ep.url.Hostname(), "err", err)
			return nil
		}
		ep.origin = addrs
	}
	return ep.origin
}

// checkHop checks a hop of a redirect chain from ep's registry to next before it is sent.
func (b *Blob) checkHop(ctx context.Context, ep *endpoint, secure bool, next *url.URL) error {
	if sameOrigin(next, ep.url) {
		return nil
	}
	if err := checkHopScheme(secure, next); err != nil {
		return err
	}
	addrs, err := b.o.lookup(ctx, next.Hostname())
	if err != nil {
		return nil // the dial will fail the same way, transiently
	}
	origin := b.originAddrs(ctx, ep)
	for _, a := range addrs {
		if err := checkHopAddr(origin, a); err != nil {
			return err
		}
	}
	return nil
}

// hopContext returns ctx carrying the policy for a request to u, a hop away from ep's
// registry; ctx itself for a request to the registry.
func (b *Blob) hopContext(ctx context.Context, ep *endpoint, u *url.URL) context.Context {
	if sameOrigin(u, ep.url) {
		return ctx
	}
	port := u.Port()
	if port == "" {
		port = map[string]string{"http": "80", "https": "443"}[u.Scheme]
	}
	return withHopPolicy(ctx, &hopPolicy{origin: b.originAddrs(ctx, ep), addr: net.JoinHostPort(u.Hostname(), port)})
}
