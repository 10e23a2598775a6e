package fetch_test

import (
	"bytes"
	"compress/gzip"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mirrorworker/mirrorworker/authority"
	"github.com/mirrorworker/mirrorworker/fetch"
)

// origin is a real loopback HTTP server that counts requests and new
// connections.
type origin struct {
	*httptest.Server
	requests atomic.Int64
	conns    atomic.Int64
}

func newOrigin(t *testing.T, h http.HandlerFunc) *origin {
	t.Helper()
	o := &origin{}
	o.Server = httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		o.requests.Add(1)
		h(w, r)
	}))
	o.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			o.conns.Add(1)
		}
	}
	o.Start()
	t.Cleanup(o.Close)
	return o
}

func (o *origin) auth(t *testing.T) authority.Authority {
	t.Helper()
	a, err := authority.Parse(o.URL)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// gateLog is a Gate that records every admission and every done call.
type gateLog struct {
	mu    sync.Mutex
	hops  []int
	auths []authority.Authority
	done  []fetch.Result
	err   error // returned by the gate when set
}

func (g *gateLog) gate(_ context.Context, hop int, a authority.Authority) (func(fetch.Result), error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.err != nil {
		return nil, g.err
	}
	g.hops = append(g.hops, hop)
	g.auths = append(g.auths, a)
	var once atomic.Bool
	return func(r fetch.Result) {
		if once.Swap(true) {
			panic("done called twice")
		}
		g.mu.Lock()
		defer g.mu.Unlock()
		g.done = append(g.done, r)
	}, nil
}

func (g *gateLog) doneStatuses() []int {
	g.mu.Lock()
	defer g.mu.Unlock()
	var s []int
	for _, r := range g.done {
		s = append(s, r.Status)
	}
	return s
}

func private(o *fetch.Options) *fetch.Options {
	if o == nil {
		o = &fetch.Options{}
	}
	o.AllowPrivate = true
	return o
}

func TestRedirectChainGatesEveryHop(t *testing.T) {
	var a, b *origin
	a = newOrigin(t, func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/start":
			http.Redirect(w, r, b.URL+"/one?x=1", http.StatusFound)
		case "/final":
			if got := r.Header.Get("Accept"); got != "application/x-test" {
				t.Errorf("final hop Accept = %q", got)
			}
			io.WriteString(w, "payload")
		default:
			http.NotFound(w, r)
		}
	})
	b = newOrigin(t, func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/one":
			w.Header().Set("Location", "two") // relative to /one
			w.WriteHeader(http.StatusMovedPermanently)
			io.WriteString(w, "moved")
		case "/two":
			w.Header().Set("Location", a.URL+"/final")
			w.WriteHeader(http.StatusTemporaryRedirect)
		default:
			http.NotFound(w, r)
		}
	})
	c := fetch.New(private(nil))
	g := &gateLog{}
	resp, err := c.Do(context.Background(), fetch.Request{
		URL:    a.URL + "/start",
		Header: http.Header{"Accept": {"application/x-test"}},
	}, g.gate)
	if err != nil {
		t.Fatal(err)
	}
	aa, ba := a.auth(t), b.auth(t)
	if aa == ba {
		t.Fatal("the two origins share an authority")
	}
	wantAuths := []authority.Authority{aa, ba, ba, aa}
	if fmt.Sprint(g.hops) != "[0 1 2 3]" || fmt.Sprint(g.auths) != fmt.Sprint(wantAuths) {
		t.Errorf("gate calls: hops %v auths %v, want [0 1 2 3] %v", g.hops, g.auths, wantAuths)
	}
	// The final hop stays in flight until its body is closed.
	if got := fmt.Sprint(g.doneStatuses()); got != "[302 301 307]" {
		t.Errorf("done before Close: %s", got)
	}
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	resp.Body.Close() // idempotent: done is still called once
	if got := fmt.Sprint(g.doneStatuses()); got != "[302 301 307 200]" {
		t.Errorf("done after Close: %s", got)
	}
	if string(body) != "payload" || resp.Status != 200 || resp.Hops != 4 || resp.FinalURL != a.URL+"/final" {
		t.Errorf("response: status %d hops %d final %q body %q", resp.Status, resp.Hops, resp.FinalURL, body)
	}
	for _, r := range g.done {
		if r.Err != nil || r.Cancelled {
			t.Errorf("hop result %+v", r)
		}
	}
}

// newOriginOn starts an origin listening on a given loopback address, or
// skips the test where that address cannot be bound (127.0.0.2 on macOS).
func newOriginOn(t *testing.T, addr string, h http.HandlerFunc) *origin {
	t.Helper()
	l, err := net.Listen("tcp", addr)
	if err != nil {
		t.Skipf("cannot listen on %s: %v", addr, err)
	}
	o := &origin{}
	o.Server = &httptest.Server{Listener: l, Config: &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		o.requests.Add(1)
		h(w, r)
	})}}
	o.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			o.conns.Add(1)
		}
	}
	o.Start()
	t.Cleanup(o.Close)
	return o
}

func TestDestinationRefused(t *testing.T) {
	// target is a live loopback server that no test may reach.
	target := newOrigin(t, func(http.ResponseWriter, *http.Request) {})
	port := target.auth(t).Port
	// The redirecting origin listens on 127.0.0.2, and the client treats
	// that one address as public, so a redirect from it to loopback is
	// judged exactly as one from the internet would be.
	public := netip.MustParseAddr("127.0.0.2")
	redirector := newOriginOn(t, "127.0.0.2:0", func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, r.URL.Query().Get("to"), http.StatusFound)
	})
	tests := []struct {
		name         string
		allowPrivate bool
		url          string // requested directly
		redirectTo   string // or reached by a redirect from the public origin
		reason       string
	}{
		{name: "metadata by redirect", allowPrivate: true, redirectTo: "http://169.254.169.254/latest/meta-data/", reason: "metadata"},
		{name: "metadata direct", allowPrivate: true, url: "http://169.254.169.254/", reason: "metadata"},
		{name: "aws metadata v6", allowPrivate: true, redirectTo: "http://[fd00:ec2::254]/", reason: "metadata"},
		{name: "alibaba metadata", allowPrivate: true, redirectTo: "http://100.100.100.200/", reason: "metadata"},
		{name: "mapped metadata", allowPrivate: true, redirectTo: "http://[::ffff:169.254.169.254]/", reason: "metadata"},
		{name: "nat64 metadata", allowPrivate: true, redirectTo: "http://[64:ff9b::a9fe:a9fe]/", reason: "metadata"},
		{name: "link-local v4", allowPrivate: true, redirectTo: "http://169.254.1.2:8080/", reason: "link_local"},
		{name: "link-local v6", allowPrivate: true, redirectTo: "http://[fe80::1]/", reason: "link_local"},
		{name: "loopback by redirect", redirectTo: "http://127.0.0.1:" + port + "/", reason: "loopback"},
		{name: "loopback name by redirect", redirectTo: "http://localhost:" + port + "/", reason: "loopback"},
		{name: "loopback direct", url: target.URL + "/", reason: "loopback"},
		{name: "loopback name direct", url: "http://localhost:" + port + "/", reason: "loopback"},
		{name: "mapped loopback", url: "http://[::ffff:127.0.0.1]:" + port + "/", reason: "loopback"},
		{name: "unspecified", url: "http://0.0.0.0:" + port + "/", reason: "unspecified"},
		{name: "private", url: "http://10.1.2.3/", reason: "private"},
		{name: "cgnat", url: "http://100.64.0.1/", reason: "private"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := fetch.NewTreatingAsPublic(&fetch.Options{AllowPrivate: tt.allowPrivate}, public)
			start, wantHops := tt.url, "[]"
			if tt.redirectTo != "" {
				start, wantHops = redirector.URL+"/?to="+url.QueryEscape(tt.redirectTo), "[0]"
			}
			if strings.Contains(tt.name, "name") {
				// A name is judged after resolution, inside the dialer,
				// so its hop has been admitted by the gate.
				wantHops = map[string]string{"[]": "[0]", "[0]": "[0 1]"}[wantHops]
			}
			conns := target.conns.Load()
			g := &gateLog{}
			resp, err := c.Do(context.Background(), fetch.Request{URL: start}, g.gate)
			if n := target.conns.Load() - conns; n != 0 {
				t.Errorf("the refused target saw %d connections", n)
			}
			var re *fetch.RefusedError
			if !errors.As(err, &re) {
				t.Fatalf("Do = %v, %v; want a *RefusedError", resp, err)
			}
			if re.Reason != tt.reason {
				t.Errorf("reason %q, want %q (%v)", re.Reason, tt.reason, err)
			}
			if got := fetch.ReasonCode(err, 0); got != "destination_refused" || !fetch.IsPermanent(err) {
				t.Errorf("ReasonCode %q, IsPermanent %v", got, fetch.IsPermanent(err))
			}
			if got := fmt.Sprint(g.hops); got != wantHops {
				t.Errorf("gate admitted hops %s, want %s", got, wantHops)
			}
			if len(g.done) != len(g.hops) {
				t.Errorf("%d hops admitted, %d done", len(g.hops), len(g.done))
			}
		})
	}
	// The same names are reachable when private networks are allowed, so
	// the refusals above are the policy's doing.
	c := fetch.New(private(nil))
	resp, err := c.Do(context.Background(), fetch.Request{URL: "http://localhost:" + port + "/"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if target.requests.Load() != 1 {
		t.Errorf("allowed request: target saw %d requests", target.requests.Load())
	}
}

func TestCheckAddr(t *testing.T) {
	tests := []struct {
		addr      string
		strict    string // reason with AllowPrivate false
		permitted string // reason with AllowPrivate true
	}{
		{"93.184.215.14", "", ""},
		{"2606:2800:21f:cb07:6820:80da:af6b:8b2c", "", ""},
		{"169.254.169.254", "metadata", "metadata"},
		{"fd00:ec2::254", "metadata", "metadata"},
		{"100.100.100.200", "metadata", "metadata"},
		{"::ffff:169.254.169.254", "metadata", "metadata"},
		{"64:ff9b::a9fe:a9fe", "metadata", "metadata"},
		{"2002:a9fe:a9fe::1", "metadata", "metadata"},
		{"169.254.0.1", "link_local", "link_local"},
		{"fe80::1", "link_local", "link_local"},
		{"fe80::1%eth0", "link_local", "link_local"},
		{"ff02::1", "link_local", "link_local"},
		{"224.0.0.1", "link_local", "link_local"},
		{"127.0.0.1", "loopback", ""},
		{"127.255.0.9", "loopback", ""},
		{"::1", "loopback", ""},
		{"::ffff:127.0.0.1", "loopback", ""},
		{"64:ff9b::7f00:1", "loopback", ""},
		{"10.0.0.1", "private", ""},
		{"172.16.0.1", "private", ""},
		{"172.32.0.1", "", ""},
		{"192.168.1.1", "private", ""},
		{"fc00::1", "private", ""},
		{"fd12:3456::1", "private", ""},
		{"100.64.0.1", "private", ""},
		{"100.127.255.255", "private", ""},
		{"100.128.0.1", "", ""},
		{"0.0.0.0", "unspecified", ""},
		{"0.1.2.3", "unspecified", ""},
		{"::", "unspecified", ""},
		{"239.1.2.3", "multicast", ""},
		{"ff0e::1", "multicast", ""},
		{"255.255.255.255", "reserved", ""},
		{"240.0.0.1", "reserved", ""},
	}
	for _, tt := range tests {
		t.Run(tt.addr, func(t *testing.T) {
			a := netip.MustParseAddr(tt.addr)
			if got := fetch.CheckAddr(a, false); got != tt.strict {
				t.Errorf("strict: %q, want %q", got, tt.strict)
			}
			if got := fetch.CheckAddr(a, true); got != tt.permitted {
				t.Errorf("allow private: %q, want %q", got, tt.permitted)
			}
		})
	}
}

// TestContinuationCountsEarlierRedirects: a fetch that goes on from a hop
// an earlier fetch reached (Request.Hops) has only the rest of the
// redirect limit, and its hops are numbered on from there.
func TestContinuationCountsEarlierRedirects(t *testing.T) {
	o := newOrigin(t, func(w http.ResponseWriter, r *http.Request) {
		n, _ := strconv.Atoi(strings.TrimPrefix(r.URL.Path, "/"))
		http.Redirect(w, r, "/"+strconv.Itoa(n+1), http.StatusFound)
	})
	var hops []int
	gate := func(_ context.Context, hop int, _ authority.Authority) (func(fetch.Result), error) {
		hops = append(hops, hop)
		return nil, nil
	}
	c := fetch.New(private(&fetch.Options{MaxRedirects: 3}))
	before := o.requests.Load()
	_, err := c.Do(context.Background(), fetch.Request{URL: o.URL + "/2", Hops: 2}, gate)
	if !errors.Is(err, fetch.ErrTooManyRedirects) {
		t.Fatalf("Do: %v, want ErrTooManyRedirects", err)
	}
	if got := o.requests.Load() - before; got != 2 {
		t.Errorf("%d requests, want 2 (hops 2 and 3 of a limit of 3 redirects)", got)
	}
	if fmt.Sprint(hops) != "[2 3]" {
		t.Errorf("gate saw hops %v, want [2 3]", hops)
	}
}

// TestGateErrorNamesTheHop: a hop the gate refuses ends Do before its
// request, with a *GateError holding the hop's URL (userinfo dropped at
// the redirect) and the gate's own error.
func TestGateErrorNamesTheHop(t *testing.T) {
	second := newOrigin(t, func(w http.ResponseWriter, r *http.Request) {
		t.Errorf("the refused hop reached its origin: %s", r.URL)
	})
	first := newOrigin(t, func(w http.ResponseWriter, r *http.Request) {
		loc, _ := url.Parse(second.URL + "/obj?x=1")
		loc.User = url.UserPassword("u", "p")
		http.Redirect(w, r, loc.String(), http.StatusFound)
	})
	refused := errors.New("refused for the test")
	gate := func(_ context.Context, hop int, _ authority.Authority) (func(fetch.Result), error) {
		if hop == 1 {
			return nil, refused
		}
		return nil, nil
	}
	_, err := fetch.New(private(nil)).Do(context.Background(), fetch.Request{URL: first.URL + "/start"}, gate)
	var ge *fetch.GateError
	if !errors.As(err, &ge) || !errors.Is(err, refused) {
		t.Fatalf("Do: %v, want a *GateError wrapping the gate's error", err)
	}
	if want := second.URL + "/obj?x=1"; ge.Hop != 1 || ge.URL != want {
		t.Errorf("GateError hop %d URL %q, want hop 1 URL %q", ge.Hop, ge.URL, want)
	}
}

func TestMaxRedirects(t *testing.T) {
	o := newOrigin(t, func(w http.ResponseWriter, r *http.Request) {
		n, _ := strconv.Atoi(strings.TrimPrefix(r.URL.Path, "/"))
		http.Redirect(w, r, "/"+strconv.Itoa(n+1), http.StatusFound)
	})
	tests := []struct {
		name     string
		max      int
		requests int64
	}{
		{name: "default 10", max: 0, requests: 11},
		{name: "three", max: 3, requests: 4},
		{name: "none", max: -1, requests: 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			before := o.requests.Load()
			g := &gateLog{}
			c := fetch.New(private(&fetch.Options{MaxRedirects: tt.max}))
			_, err := c.Do(context.Background(), fetch.Request{URL: o.URL + "/0"}, g.gate)
			if !errors.Is(err, fetch.ErrTooManyRedirects) || fetch.ReasonCode(err, 0) != "too_many_redirects" {
				t.Fatalf("Do: %v", err)
			}
			if got := o.requests.Load() - before; got != tt.requests {
				t.Errorf("%d requests, want %d", got, tt.requests)
			}
			if int64(len(g.hops)) != tt.requests || len(g.done) != len(g.hops) {
				t.Errorf("%d admitted, %d done, want %d", len(g.hops), len(g.done), tt.requests)
			}
		})
	}
	// Exactly MaxRedirects redirects is fine.
	c := fetch.New(private(&fetch.Options{MaxRedirects: 3}))
	stop := newOrigin(t, func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/3" {
			io.WriteString(w, "ok")
			return
		}
		n, _ := strconv.Atoi(strings.TrimPrefix(r.URL.Path, "/"))
		http.Redirect(w, r, "/"+strconv.Itoa(n+1), http.StatusFound)
	})
	resp, err := c.Do(context.Background(), fetch.Request{URL: stop.URL + "/0"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.Hops != 4 || resp.Status != 200 {
		t.Errorf("hops %d status %d", resp.Hops, resp.Status)
	}
}

func TestRedirectOddities(t *testing.T) {
	o := newOrigin(t, func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/nolocation":
			w.WriteHeader(http.StatusFound)
		case "/ftp":
			w.Header().Set("Location", "ftp://example.org/file")
			w.WriteHeader(http.StatusMovedPermanently)
		}
	})
	c := fetch.New(private(nil))
	resp, err := c.Do(context.Background(), fetch.Request{URL: o.URL + "/nolocation"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if resp.Status != 302 || resp.Body != nil || fetch.Classify(resp.Status) != fetch.ClassPermanent {
		t.Errorf("no Location: status %d body %v class %v", resp.Status, resp.Body, fetch.Classify(resp.Status))
	}
	_, err = c.Do(context.Background(), fetch.Request{URL: o.URL + "/ftp"}, nil)
	if !errors.Is(err, fetch.ErrInvalidURL) || !fetch.IsPermanent(err) {
		t.Errorf("redirect to ftp: %v", err)
	}
}

func TestConditionalRequest(t *testing.T) {
	const etag, lastMod = `"v1"`, "Wed, 21 Oct 2015 07:28:00 GMT"
	var seen http.Header
	o := newOrigin(t, func(w http.ResponseWriter, r *http.Request) {
		seen = r.Header.Clone()
		if r.Header.Get("If-None-Match") == etag {
			w.WriteHeader(http.StatusNotModified)
			return
		}
		w.Header().Set("ETag", etag)
		w.Header().Set("Last-Modified", lastMod)
		io.WriteString(w, "v1 body")
	})
	c := fetch.New(private(&fetch.Options{UserAgent: fetch.UserAgent("1.2.3")}))
	g := &gateLog{}
	resp, err := c.Do(context.Background(), fetch.Request{URL: o.URL, ETag: etag, LastModified: lastMod}, g.gate)
	if err != nil {
		t.Fatal(err)
	}
	if resp.Status != 304 || resp.Body != nil || fetch.Classify(resp.Status) != fetch.ClassNotModified {
		t.Errorf("status %d body %v", resp.Status, resp.Body)
	}
	if fmt.Sprint(g.doneStatuses()) != "[304]" {
		t.Errorf("done: %v", g.doneStatuses())
	}
	if seen.Get("If-None-Match") != etag || seen.Get("If-Modified-Since") != lastMod {
		t.Errorf("conditional headers not sent: %v", seen)
	}
	if ua := seen.Get("User-Agent"); ua != "mirrorworker/1.2.3 (+https://github.com/mirrorworker/mirrorworker)" {
		t.Errorf("User-Agent %q", ua)
	}
	// Without stored metadata, no conditional header is sent.
	resp, err = c.Do(context.Background(), fetch.Request{URL: o.URL}, nil)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.Status != 200 || string(b) != "v1 body" || resp.Header.Get("ETag") != etag {
		t.Errorf("unconditional: %d %q %v", resp.Status, b, resp.Header)
	}
	if _, ok := seen["If-None-Match"]; ok {
		t.Error("If-None-Match sent without an ETag")
	}
}

func TestBodyStoredAsSent(t *testing.T) {
	var gz bytes.Buffer
	zw := gzip.NewWriter(&gz)
	zw.Write(bytes.Repeat([]byte("compressible "), 1000))
	zw.Close()
	var acceptEncoding []string
	o := newOrigin(t, func(w http.ResponseWriter, r *http.Request) {
		acceptEncoding = r.Header.Values("Accept-Encoding")
		w.Header().Set("Content-Encoding", "gzip")
		w.Header().Set("Content-Type", "text/plain")
		w.Write(gz.Bytes())
	})
	c := fetch.New(private(nil))
	resp, err := c.Do(context.Background(), fetch.Request{URL: o.URL}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	got, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, gz.Bytes()) {
		t.Errorf("body changed in transit: %d bytes, sent %d", len(got), gz.Len())
	}
	if resp.Header.Get("Content-Encoding") != "gzip" {
		t.Errorf("Content-Encoding %q", resp.Header.Get("Content-Encoding"))
	}
	if len(acceptEncoding) != 0 {
		t.Errorf("Accept-Encoding sent: %q", acceptEncoding)
	}
}

// hijack answers with raw bytes and closes the connection.
func hijack(t *testing.T, w http.ResponseWriter, raw string) {
	conn, buf, err := http.NewResponseController(w).Hijack()
	if err != nil {
		t.Error(err)
		return
	}
	buf.WriteString(raw)
	buf.Flush()
	conn.Close()
}

func TestTruncatedBody(t *testing.T) {
	o := newOrigin(t, func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/length":
			hijack(t, w, "HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n"+strings.Repeat("x", 100))
		case "/chunked":
			hijack(t, w, "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n64\r\n"+strings.Repeat("x", 100)+"\r\n")
		case "/noheaders":
			hijack(t, w, "")
		}
	})
	c := fetch.New(private(nil))
	for _, path := range []string{"/length", "/chunked"} {
		t.Run(path, func(t *testing.T) {
			g := &gateLog{}
			resp, err := c.Do(context.Background(), fetch.Request{URL: o.URL + path}, g.gate)
			if err != nil {
				t.Fatal(err)
			}
			got, err := io.ReadAll(resp.Body)
			if !errors.Is(err, fetch.ErrTruncated) || fetch.ReasonCode(err, 0) != "truncated" || fetch.IsPermanent(err) {
				t.Errorf("read %d bytes, err %v; want ErrTruncated", len(got), err)
			}
			if _, err := resp.Body.Read(make([]byte, 1)); !errors.Is(err, fetch.ErrTruncated) {
				t.Errorf("error not sticky: %v", err)
			}
			resp.Body.Close()
			if len(g.done) != 1 || g.done[0].Status != 200 || !errors.Is(g.done[0].Err, fetch.ErrTruncated) {
				t.Errorf("done: %+v", g.done)
			}
		})
	}
	t.Run("no response", func(t *testing.T) {
		g := &gateLog{}
		_, err := c.Do(context.Background(), fetch.Request{URL: o.URL + "/noheaders"}, g.gate)
		if err == nil || fetch.ReasonCode(err, 0) != "network" {
			t.Errorf("Do: %v (%s)", err, fetch.ReasonCode(err, 0))
		}
		if len(g.done) != 1 || g.done[0].Err == nil || g.done[0].Cancelled {
			t.Errorf("done: %+v", g.done)
		}
	})
}

func TestBodyTooLarge(t *testing.T) {
	payload := strings.Repeat("y", 200)
	o := newOrigin(t, func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/chunked" {
			io.WriteString(w, payload[:50])
			w.(http.Flusher).Flush() // no Content-Length from here on
			io.WriteString(w, payload[50:])
			return
		}
		w.Header().Set("Content-Length", strconv.Itoa(len(payload)))
		io.WriteString(w, payload)
	})
	c := fetch.New(private(&fetch.Options{MaxBodySize: 100}))
	g := &gateLog{}
	_, err := c.Do(context.Background(), fetch.Request{URL: o.URL + "/length"}, g.gate)
	if !errors.Is(err, fetch.ErrBodyTooLarge) || fetch.ReasonCode(err, 0) != "body_too_large" || !fetch.IsPermanent(err) {
		t.Errorf("Content-Length over the limit: %v", err)
	}
	if len(g.done) != 1 || g.done[0].Status != 200 || g.done[0].Err != nil {
		t.Errorf("done: %+v", g.done)
	}

	resp, err := c.Do(context.Background(), fetch.Request{URL: o.URL + "/chunked"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	got, err := io.ReadAll(resp.Body)
	if !errors.Is(err, fetch.ErrBodyTooLarge) {
		t.Errorf("chunked over the limit: %v", err)
	}
	if len(got) > 100 {
		t.Errorf("%d bytes passed a 100-byte limit", len(got))
	}

	// Exactly at the limit passes.
	c = fetch.New(private(&fetch.Options{MaxBodySize: 200}))
	resp, err = c.Do(context.Background(), fetch.Request{URL: o.URL + "/chunked"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	got, err = io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil || string(got) != payload {
		t.Errorf("at the limit: %d bytes, %v", len(got), err)
	}
}

func TestTimeouts(t *testing.T) {
	release := make(chan struct{})
	t.Cleanup(func() { close(release) }) // runs before the servers close
	o := newOrigin(t, func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/stall":
			io.WriteString(w, "some bytes")
			w.(http.Flusher).Flush()
		case "/slow":
			for range 5 {
				io.WriteString(w, "z")
				w.(http.Flusher).Flush()
				time.Sleep(60 * time.Millisecond)
			}
			return
		case "/noheaders":
		}
		select {
		case <-release:
		case <-r.Context().Done():
		}
	})
	c := fetch.New(private(&fetch.Options{IdleTimeout: 200 * time.Millisecond, ResponseHeaderTimeout: 200 * time.Millisecond}))

	t.Run("body idle", func(t *testing.T) {
		g := &gateLog{}
		resp, err := c.Do(context.Background(), fetch.Request{URL: o.URL + "/stall"}, g.gate)
		if err != nil {
			t.Fatal(err)
		}
		got, err := io.ReadAll(resp.Body)
		if !errors.Is(err, fetch.ErrIdleTimeout) || fetch.ReasonCode(err, 0) != "timeout" || fetch.IsPermanent(err) {
			t.Errorf("read %q, %v; want ErrIdleTimeout", got, err)
		}
		if string(got) != "some bytes" {
			t.Errorf("read %q before the stall", got)
		}
		resp.Body.Close()
		if len(g.done) != 1 || !errors.Is(g.done[0].Err, fetch.ErrIdleTimeout) || g.done[0].Cancelled {
			t.Errorf("done: %+v", g.done)
		}
	})
	t.Run("slow but moving", func(t *testing.T) {
		// 5 bytes 60ms apart take longer than the idle timeout in total.
		resp, err := c.Do(context.Background(), fetch.Request{URL: o.URL + "/slow"}, nil)
		if err != nil {
			t.Fatal(err)
		}
		got, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil || string(got) != "zzzzz" {
			t.Errorf("read %q, %v", got, err)
		}
	})
	t.Run("response headers", func(t *testing.T) {
		_, err := c.Do(context.Background(), fetch.Request{URL: o.URL + "/noheaders"}, nil)
		if fetch.ReasonCode(err, 0) != "timeout" {
			t.Errorf("Do: %v (%s)", err, fetch.ReasonCode(err, 0))
		}
	})
	t.Run("caller cancels", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		g := &gateLog{}
		resp, err := fetch.New(private(nil)).Do(ctx, fetch.Request{URL: o.URL + "/stall"}, g.gate)
		if err != nil {
			t.Fatal(err)
		}
		buf := make([]byte, 10)
		io.ReadFull(resp.Body, buf)
		cancel()
		_, err = io.ReadAll(resp.Body)
		if !errors.Is(err, context.Canceled) || fetch.ReasonCode(err, 0) != "cancelled" {
			t.Errorf("read after cancel: %v", err)
		}
		resp.Body.Close()
		if len(g.done) != 1 || !g.done[0].Cancelled {
			t.Errorf("done: %+v", g.done)
		}
	})
}

func TestThrottledBodyDrainedAndConnectionReused(t *testing.T) {
	tests := []struct {
		name     string
		bodySize int
		status   int
		reuse    bool
	}{
		{name: "429 small body", bodySize: 10 << 10, status: 429, reuse: true},
		{name: "503 small body", bodySize: 100, status: 503, reuse: true},
		{name: "404 empty body", bodySize: 0, status: 404, reuse: true},
		// Past the drain bound the connection is given up, not read to
		// the end: the control that shows the count above means reuse.
		{name: "429 huge body", bodySize: 1 << 20, status: 429, reuse: false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			body := strings.Repeat("t", tt.bodySize)
			o := newOrigin(t, func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Retry-After", "120")
				w.WriteHeader(tt.status)
				io.WriteString(w, body)
			})
			c := fetch.New(private(nil))
			const n = 5
			for range n {
				g := &gateLog{}
				resp, err := c.Do(context.Background(), fetch.Request{URL: o.URL}, g.gate)
				if err != nil {
					t.Fatal(err)
				}
				if resp.Status != tt.status || resp.Body != nil || resp.Header.Get("Retry-After") != "120" {
					t.Fatalf("status %d body %v header %v", resp.Status, resp.Body, resp.Header)
				}
				if len(g.done) != 1 || g.done[0].Status != tt.status || g.done[0].Header.Get("Retry-After") != "120" || g.done[0].Err != nil {
					t.Fatalf("done: %+v", g.done)
				}
			}
			conns := o.conns.Load()
			if tt.reuse && conns != 1 {
				t.Errorf("%d connections for %d requests, want 1", conns, n)
			}
			if !tt.reuse && conns != n {
				t.Errorf("%d connections for %d requests, want %d", conns, n, n)
			}
		})
	}
}

type refusal struct{ wait time.Duration }

func (r *refusal) Error() string { return "cooling for " + r.wait.String() }

func TestGateErrorAbortsBeforeRequest(t *testing.T) {
	o := newOrigin(t, func(w http.ResponseWriter, r *http.Request) {})
	c := fetch.New(private(nil))
	g := &gateLog{err: &refusal{wait: time.Minute}}
	_, err := c.Do(context.Background(), fetch.Request{URL: o.URL}, g.gate)
	var r *refusal
	if !errors.As(err, &r) || r.wait != time.Minute {
		t.Fatalf("Do: %v; want the gate's error", err)
	}
	if o.requests.Load() != 0 || o.conns.Load() != 0 {
		t.Errorf("server saw %d requests, %d connections", o.requests.Load(), o.conns.Load())
	}

	// A refusal on a redirect hop: the first hop ran, the second did not.
	var hits atomic.Int64
	b := newOrigin(t, func(http.ResponseWriter, *http.Request) { hits.Add(1) })
	a := newOrigin(t, func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, b.URL, http.StatusFound)
	})
	bAuth := b.auth(t)
	var doneCalls atomic.Int64
	gate := func(_ context.Context, hop int, au authority.Authority) (func(fetch.Result), error) {
		if au == bAuth {
			return nil, &refusal{wait: time.Second}
		}
		return func(fetch.Result) { doneCalls.Add(1) }, nil
	}
	_, err = c.Do(context.Background(), fetch.Request{URL: a.URL}, gate)
	if !errors.As(err, &r) {
		t.Fatalf("Do: %v", err)
	}
	if hits.Load() != 0 || b.conns.Load() != 0 || a.requests.Load() != 1 || doneCalls.Load() != 1 {
		t.Errorf("b hits %d conns %d, a requests %d, done %d", hits.Load(), b.conns.Load(), a.requests.Load(), doneCalls.Load())
	}
}

func TestClassify(t *testing.T) {
	tests := []struct {
		status int
		want   fetch.Class
	}{
		{200, fetch.ClassSuccess}, {204, fetch.ClassSuccess}, {206, fetch.ClassPermanent},
		{304, fetch.ClassNotModified}, {301, fetch.ClassPermanent}, {300, fetch.ClassPermanent},
		{100, fetch.ClassPermanent}, {400, fetch.ClassPermanent}, {401, fetch.ClassAuthFailed}, {403, fetch.ClassAuthFailed},
		{404, fetch.ClassPermanent}, {410, fetch.ClassPermanent}, {408, fetch.ClassTransient},
		{429, fetch.ClassThrottled}, {500, fetch.ClassTransient}, {502, fetch.ClassTransient},
		{503, fetch.ClassTransient}, {599, fetch.ClassTransient}, {600, fetch.ClassPermanent},
	}
	for _, tt := range tests {
		if got := fetch.Classify(tt.status); got != tt.want {
			t.Errorf("Classify(%d) = %v, want %v", tt.status, got, tt.want)
		}
	}
}

func TestReasonCode(t *testing.T) {
	tests := []struct {
		err    error
		status int
		want   string
	}{
		{nil, 0, ""},
		{nil, 404, "http_404"},
		{nil, 503, "http_503"},
		{fmt.Errorf("hop 1: %w", &fetch.RefusedError{Reason: "metadata"}), 0, "destination_refused"},
		{&url.Error{Op: "Get", Err: &net.OpError{Op: "dial", Err: &fetch.RefusedError{}}}, 0, "destination_refused"},
		{fmt.Errorf("x: %w", fetch.ErrTooManyRedirects), 302, "too_many_redirects"},
		{fetch.ErrBodyTooLarge, 200, "body_too_large"},
		{fetch.ErrTruncated, 200, "truncated"},
		{fetch.ErrInvalidURL, 0, "invalid_url"},
		{fetch.ErrIdleTimeout, 200, "timeout"},
		{context.DeadlineExceeded, 0, "timeout"},
		{context.Canceled, 0, "cancelled"},
		{&net.DNSError{Err: "no such host", IsNotFound: true}, 0, "dns"},
		{&net.OpError{Op: "dial", Err: errors.New("connection refused")}, 0, "network"},
	}
	for _, tt := range tests {
		if got := fetch.ReasonCode(tt.err, tt.status); got != tt.want {
			t.Errorf("ReasonCode(%v, %d) = %q, want %q", tt.err, tt.status, got, tt.want)
		}
	}
}
