package fetch

import (
	"context"
	"net"
	"net/netip"
	"syscall"
	"time"
)

// Reasons a destination is refused (RefusedError.Reason).
const (
	ReasonLinkLocal   = "link_local"
	ReasonMetadata    = "metadata"
	ReasonLoopback    = "loopback"
	ReasonPrivate     = "private"
	ReasonUnspecified = "unspecified"
	ReasonMulticast   = "multicast"
	ReasonReserved    = "reserved"
)

var (
	// Cloud metadata services. 169.254.169.254 is also link-local; it is
	// listed so the refusal names it for what it is.
	metadataAddrs = []netip.Addr{
		netip.MustParseAddr("169.254.169.254"), // AWS, GCP, Azure, OpenStack, ...
		netip.MustParseAddr("fd00:ec2::254"),   // AWS over IPv6
		netip.MustParseAddr("100.100.100.200"), // Alibaba Cloud
	}
	thisNetwork = netip.MustParsePrefix("0.0.0.0/8")     // Linux connects 0.x to the local host
	cgnat       = netip.MustParsePrefix("100.64.0.0/10") // RFC 6598 shared address space
	reserved4   = netip.MustParsePrefix("240.0.0.0/4")   // includes 255.255.255.255
	nat64       = netip.MustParsePrefix("64:ff9b::/96")  // RFC 6052 well-known prefix
	sixToFour   = netip.MustParsePrefix("2002::/16")     // RFC 3056: 2002:AABB:CCDD::
	v4Compat    = netip.MustParsePrefix("::/96")         // deprecated IPv4-compatible (not :: or ::1)
)

// CheckAddr reports why a connection to addr must be refused, or "" if it
// may be made. Link-local and cloud metadata addresses are always refused;
// loopback, private, shared (CGNAT), unspecified, multicast and reserved
// addresses only when allowPrivate is false. IPv4-mapped, IPv4-compatible,
// NAT64 (64:ff9b::/96) and 6to4 IPv6 addresses are judged by the IPv4
// address they carry, since that is where the packets end up.
func CheckAddr(addr netip.Addr, allowPrivate bool) (reason string) {
	addr = addr.WithZone("")
	if v4, ok := embeddedV4(addr); ok {
		if r := CheckAddr(v4, allowPrivate); r != "" {
			return r
		}
	}
	addr = addr.Unmap()
	for _, m := range metadataAddrs {
		if addr == m {
			return ReasonMetadata
		}
	}
	switch {
	case addr.IsLinkLocalUnicast(), addr.IsLinkLocalMulticast(), addr.IsInterfaceLocalMulticast():
		return ReasonLinkLocal
	case allowPrivate:
		return ""
	case addr.IsLoopback():
		return ReasonLoopback
	case addr.IsUnspecified(), thisNetwork.Contains(addr):
		return ReasonUnspecified
	case addr.IsPrivate(), cgnat.Contains(addr):
		return ReasonPrivate
	case addr.IsMulticast():
		return ReasonMulticast
	case reserved4.Contains(addr):
		return ReasonReserved
	}
	return ""
}

// embeddedV4 returns the IPv4 address an IPv6 address hands its packets to
// through a translation mechanism, if any. IPv4-mapped addresses are left to
// Unmap.
func embeddedV4(a netip.Addr) (netip.Addr, bool) {
	if !a.Is6() || a.Is4In6() {
		return netip.Addr{}, false
	}
	b := a.As16()
	switch {
	case nat64.Contains(a):
		return netip.AddrFrom4([4]byte(b[12:16])), true
	case sixToFour.Contains(a):
		return netip.AddrFrom4([4]byte(b[2:6])), true
	case v4Compat.Contains(a) && !a.IsUnspecified() && !a.IsLoopback():
		return netip.AddrFrom4([4]byte(b[12:16])), true
	}
	return netip.Addr{}, false
}

// checkLiteral refuses a URL host that is an IP literal before anything
// else happens, for a clear early error. Names are checked after resolution
// by the dialer's control hook.
func (c *Client) checkLiteral(host string) error {
	a, err := netip.ParseAddr(host)
	if err != nil {
		return nil
	}
	if r := c.check(a); r != "" {
		return &RefusedError{Host: host, Addr: a.String(), Reason: r}
	}
	return nil
}

// dialContext dials through a net.Dialer whose control hook checks every
// resolved address just before connect(2), so no name, redirect or DNS
// answer can reach a refused destination. The refusal reaches the caller as a
// *RefusedError inside the *net.OpError and *url.Error the stack wraps it in.
func (c *Client) dialContext(ctx context.Context, network, address string) (net.Conn, error) {
	host, _, err := net.SplitHostPort(address)
	if err != nil {
		host = address
	}
	if c.proxyAddrs[address] {
		// The operator's proxy (often on a private address); the origin
		// behind it was checked before the proxy was asked.
		d := net.Dialer{Timeout: c.opt.ConnectTimeout, KeepAlive: 30 * time.Second}
		return wrapWrites(d.DialContext(ctx, network, address))
	}
	d := net.Dialer{
		Timeout:   c.opt.ConnectTimeout,
		KeepAlive: 30 * time.Second,
		ControlContext: func(_ context.Context, _, addr string, _ syscall.RawConn) error {
			ap, err := netip.ParseAddrPort(addr)
			if err != nil {
				return &RefusedError{Host: host, Addr: addr, Reason: ReasonReserved}
			}
			if r := c.check(ap.Addr()); r != "" {
				return &RefusedError{Host: host, Addr: ap.Addr().String(), Reason: r}
			}
			return nil
		},
	}
	return wrapWrites(d.DialContext(ctx, network, address))
}
