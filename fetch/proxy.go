package fetch

import (
	"context"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"strings"

	"golang.org/x/net/http/httpproxy"
)

// Proxy is the egress proxy of the client: HTTPProxy serves http:// URLs
// (forwarded requests), HTTPSProxy https:// URLs (a CONNECT tunnel, TLS to
// the origin inside it), and NoProxy lists the hosts reached directly, with
// the syntax and rules of net/http's ProxyFromEnvironment (which also never
// proxies localhost and loopback addresses). The zero value is no proxy.
type Proxy struct {
	HTTPProxy  string
	HTTPSProxy string
	NoProxy    string
	// User, if set, authenticates to the proxy (Proxy-Authorization: Basic),
	// on CONNECT and on forwarded requests. It is never part of an error or
	// of Proxy.String.
	User *url.Userinfo
}

// ProxyFromEnv reads HTTP_PROXY, HTTPS_PROXY and NO_PROXY (or their
// lowercase forms) through getenv, as ProxyFromEnvironment does from the
// process environment.
func ProxyFromEnv(getenv func(string) string) Proxy {
	get := func(k string) string {
		if v := getenv(k); v != "" {
			return v
		}
		return getenv(strings.ToLower(k))
	}
	return Proxy{HTTPProxy: get("HTTP_PROXY"), HTTPSProxy: get("HTTPS_PROXY"), NoProxy: get("NO_PROXY")}
}

// IsZero reports whether p names no proxy at all.
func (p Proxy) IsZero() bool { return p.HTTPProxy == "" && p.HTTPSProxy == "" }

// String describes p for a log line: the proxies' scheme, host and port,
// without user information or path.
func (p Proxy) String() string {
	if p.IsZero() {
		return "none"
	}
	var parts []string
	if u := proxyURL(p.HTTPProxy); u != nil {
		parts = append(parts, "http="+u.Scheme+"://"+u.Host)
	}
	if u := proxyURL(p.HTTPSProxy); u != nil {
		parts = append(parts, "https="+u.Scheme+"://"+u.Host)
	}
	if p.NoProxy != "" {
		parts = append(parts, "no_proxy="+p.NoProxy)
	}
	if p.User != nil {
		parts = append(parts, "authenticated")
	}
	return strings.Join(parts, " ")
}

// proxyURL parses a proxy setting as httpproxy does: a bare host:port is
// an http:// proxy. nil: empty or unparseable.
func proxyURL(s string) *url.URL {
	if s == "" {
		return nil
	}
	u, err := url.Parse(s)
	if err != nil || u.Scheme == "" || u.Host == "" {
		if u2, err2 := url.Parse("http://" + s); err2 == nil && u2.Host != "" {
			return u2
		}
		return nil
	}
	return u
}

// proxyAddr is the address the transport dials for proxy u.
func proxyAddr(u *url.URL) string {
	port := u.Port()
	if port == "" {
		switch u.Scheme {
		case "https":
			port = "443"
		case "socks5", "socks5h":
			port = "1080"
		default:
			port = "80"
		}
	}
	return net.JoinHostPort(u.Hostname(), port)
}

// setupProxy fills the client's proxy function and the addresses of its
// proxies, which the dialer exempts from the destination check (the
// proxy is the operator's choice; the origin behind it is checked by
// checkProxied before the proxy is asked).
func (c *Client) setupProxy(p Proxy) {
	if p.IsZero() {
		return
	}
	c.proxyAddrs = map[string]bool{}
	for _, s := range []string{p.HTTPProxy, p.HTTPSProxy} {
		if u := proxyURL(s); u != nil {
			c.proxyAddrs[proxyAddr(u)] = true
		}
	}
	pf := (&httpproxy.Config{HTTPProxy: p.HTTPProxy, HTTPSProxy: p.HTTPSProxy, NoProxy: p.NoProxy}).ProxyFunc()
	user := p.User
	c.proxy = func(r *http.Request) (*url.URL, error) {
		u, err := pf(r.URL)
		if u == nil || err != nil {
			return u, err
		}
		if user != nil {
			v := *u
			v.User = user
			u = &v
		}
		return u, nil
	}
}

// metadataNames are cloud metadata services by name, refused before any
// lookup or proxy: through a proxy the name is resolved by the proxy, so
// the addresses alone cannot be trusted to catch them.
var metadataNames = map[string]bool{
	"metadata":                     true,
	"metadata.google.internal":     true,
	"metadata.goog":                true,
	"metadata.azure.com":           true,
	"instance-data":                true,
	"instance-data.ec2.internal":   true,
	"metadata.tencentyun.com":      true,
	"metadata.platformequinix.com": true,
}

// checkProxied refuses the destination of a request that is about to go
// through a proxy, before the proxy is asked: a metadata service by name,
// then every address the name resolves to here, with CheckAddr's rules.
// A name that does not resolve here is left to the proxy (which resolves
// it for CONNECT and forwarded requests alike): ADR 0020 says what the
// proxy is then trusted with.
func (c *Client) checkProxied(ctx context.Context, host string) error {
	h := strings.TrimSuffix(strings.ToLower(host), ".")
	if metadataNames[h] {
		return &RefusedError{Host: host, Addr: host, Reason: ReasonMetadata}
	}
	if _, err := netip.ParseAddr(h); err == nil {
		return nil // checked by checkLiteral
	}
	if !c.opt.AllowPrivate && (h == "localhost" || strings.HasSuffix(h, ".localhost")) {
		return &RefusedError{Host: host, Addr: h, Reason: ReasonLoopback}
	}
	lctx, cancel := context.WithTimeout(ctx, c.opt.ConnectTimeout)
	defer cancel()
	addrs, err := c.resolver.LookupNetIP(lctx, "ip", h)
	if err != nil {
		return nil
	}
	for _, a := range addrs {
		if r := c.check(a); r != "" {
			return &RefusedError{Host: host, Addr: a.String(), Reason: r}
		}
	}
	return nil
}

// Resolver looks names up; *net.Resolver is one.
type Resolver interface {
	LookupNetIP(ctx context.Context, network, host string) ([]netip.Addr, error)
}

var _ Resolver = (*net.Resolver)(nil)
