package fetchtest

import (
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Proxy is a forward proxy on 127.0.0.1 for tests: HTTPS through CONNECT
// tunnels and HTTP as forwarded absolute-URI requests, both with
// keep-alive, as a corporate egress proxy does. It resolves names itself,
// through Routes (so test origins can have names the client cannot
// resolve, as behind a real proxy), and records every request it was
// asked. Safe for concurrent use.
type Proxy struct {
	// URL is the proxy's http:// URL.
	URL string
	srv *httptest.Server

	// Auth, if set, is the Proxy-Authorization every request must carry
	// (else 407).
	auth  string
	conns atomic.Int64 // client connections accepted

	mu      sync.Mutex
	hold    func(ProxyRequest) time.Duration
	routes  map[string]string // authority "host:port" -> loopback address
	seen    []ProxyRequest
	fwd     *http.Transport
	tunnels []net.Conn
}

// ProxyRequest is one request the proxy was asked.
type ProxyRequest struct {
	Method    string // CONNECT, or the forwarded method
	Authority string // host:port asked for
	Auth      string // its Proxy-Authorization
	Refused   bool   // 407 or no route
}

// NewProxy starts a proxy; routes maps the authorities it serves
// ("host:port") to the loopback addresses behind them; auth is the
// Proxy-Authorization it demands ("" for none). Close it when done.
func NewProxy(routes map[string]string, auth string) *Proxy {
	p := &Proxy{routes: map[string]string{}, auth: auth}
	for k, v := range routes {
		p.routes[k] = v
	}
	p.fwd = &http.Transport{
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			to, ok := p.route(addr)
			if !ok {
				return nil, &net.AddrError{Err: "no route", Addr: addr}
			}
			var d net.Dialer
			return d.DialContext(ctx, network, to)
		},
		MaxIdleConnsPerHost: 64,
	}
	p.srv = httptest.NewUnstartedServer(http.HandlerFunc(p.serve))
	p.srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			p.conns.Add(1)
		}
	}
	p.srv.Start()
	p.URL = p.srv.URL
	return p
}

// SetHold makes the proxy wait f(request) before it answers each request it
// routes (a CONNECT before it dials the origin): a slow egress proxy. nil
// waits for nothing.
func (p *Proxy) SetHold(f func(ProxyRequest) time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.hold = f
}

// Route adds or changes a route.
func (p *Proxy) Route(authority, addr string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.routes[authority] = addr
}

func (p *Proxy) route(authority string) (string, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	a, ok := p.routes[authority]
	return a, ok
}

// Conns is the number of client connections the proxy accepted.
func (p *Proxy) Conns() int64 { return p.conns.Load() }

// Requests returns what the proxy was asked, in order.
func (p *Proxy) Requests() []ProxyRequest {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]ProxyRequest(nil), p.seen...)
}

// Close stops the proxy and closes its tunnels.
func (p *Proxy) Close() {
	p.mu.Lock()
	for _, c := range p.tunnels {
		c.Close()
	}
	p.mu.Unlock()
	p.srv.CloseClientConnections()
	p.srv.Close()
	p.fwd.CloseIdleConnections()
}

func (p *Proxy) record(r ProxyRequest) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.seen = append(p.seen, r)
}

func (p *Proxy) serve(w http.ResponseWriter, r *http.Request) {
	target := r.Host
	if r.Method != http.MethodConnect {
		target = r.URL.Host
		if r.URL.Port() == "" {
			target += ":80"
		}
	}
	rec := ProxyRequest{Method: r.Method, Authority: target, Auth: r.Header.Get("Proxy-Authorization")}
	if p.auth != "" && rec.Auth != p.auth {
		rec.Refused = true
		p.record(rec)
		w.Header().Set("Proxy-Authenticate", `Basic realm="test"`)
		http.Error(w, "proxy authentication required", http.StatusProxyAuthRequired)
		return
	}
	to, ok := p.route(target)
	if !ok {
		rec.Refused = true
		p.record(rec)
		http.Error(w, "no route to "+target, http.StatusBadGateway)
		return
	}
	p.record(rec)
	p.mu.Lock()
	hold := p.hold
	p.mu.Unlock()
	if hold != nil {
		if d := hold(rec); d > 0 {
			t := time.NewTimer(d)
			select {
			case <-t.C:
			case <-r.Context().Done():
				t.Stop()
				return
			}
		}
	}
	if r.Method == http.MethodConnect {
		p.tunnel(w, to)
		return
	}
	out := r.Clone(r.Context())
	out.RequestURI = ""
	out.Header.Del("Proxy-Authorization")
	out.Header.Del("Proxy-Connection")
	resp, err := p.fwd.RoundTrip(out)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadGateway)
		return
	}
	defer resp.Body.Close()
	for k, vs := range resp.Header {
		w.Header()[k] = vs
	}
	w.WriteHeader(resp.StatusCode)
	io.Copy(w, resp.Body)
}

func (p *Proxy) tunnel(w http.ResponseWriter, to string) {
	up, err := net.DialTimeout("tcp", to, 10*time.Second)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadGateway)
		return
	}
	hj, ok := w.(http.Hijacker)
	if !ok {
		up.Close()
		http.Error(w, "no hijack", http.StatusInternalServerError)
		return
	}
	conn, brw, err := hj.Hijack()
	if err != nil {
		up.Close()
		return
	}
	if _, err := conn.Write([]byte("HTTP/1.1 200 Connection established\r\n\r\n")); err != nil {
		up.Close()
		conn.Close()
		return
	}
	p.mu.Lock()
	p.tunnels = append(p.tunnels, conn, up)
	p.mu.Unlock()
	var wg sync.WaitGroup
	wg.Add(2)
	go func() {
		defer wg.Done()
		if n := brw.Reader.Buffered(); n > 0 {
			b, _ := brw.Reader.Peek(n)
			up.Write(b)
		}
		io.Copy(up, conn)
		if tc, ok := up.(*net.TCPConn); ok {
			tc.CloseWrite()
		}
	}()
	go func() {
		defer wg.Done()
		io.Copy(conn, up)
		conn.Close()
	}()
	wg.Wait()
	up.Close()
	conn.Close()
}

// Hosts returns the authorities the proxy was asked for, with repeats.
func Hosts(rs []ProxyRequest) []string {
	var out []string
	for _, r := range rs {
		out = append(out, r.Authority)
	}
	return out
}

// HasHost reports whether any request asked for a host (any port).
func HasHost(rs []ProxyRequest, host string) bool {
	for _, r := range rs {
		if h, _, _ := strings.Cut(r.Authority, ":"); h == host {
			return true
		}
	}
	return false
}
