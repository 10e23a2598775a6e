package fetch_test

import (
	"context"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/mirrorworker/mirrorworker/authority"
	"github.com/mirrorworker/mirrorworker/credentials"
	"github.com/mirrorworker/mirrorworker/fetch"
	"github.com/mirrorworker/mirrorworker/fetch/fetchtest"
)

// recorder is a loopback origin that records the credential headers of
// every request and answers 200 only to the credential it wants.
type recorder struct {
	srv  *httptest.Server
	mu   sync.Mutex
	got  []http.Header
	want func(r *http.Request) bool
}

func (o *recorder) handler(w http.ResponseWriter, r *http.Request) {
	o.mu.Lock()
	o.got = append(o.got, r.Header.Clone())
	o.mu.Unlock()
	if loc := r.URL.Query().Get("to"); loc != "" {
		http.Redirect(w, r, loc, http.StatusFound)
		return
	}
	if o.want != nil && !o.want(r) {
		http.Error(w, "who are you", http.StatusUnauthorized)
		return
	}
	io.WriteString(w, "ok "+r.URL.Path)
}

func (o *recorder) headers() []http.Header {
	o.mu.Lock()
	defer o.mu.Unlock()
	return append([]http.Header(nil), o.got...)
}

func newRecorder(t *testing.T, want func(*http.Request) bool, tc *tls.Config) *recorder {
	t.Helper()
	o := &recorder{want: want}
	o.srv = httptest.NewUnstartedServer(http.HandlerFunc(o.handler))
	if tc != nil {
		o.srv.TLS = tc
		o.srv.StartTLS()
	} else {
		o.srv.Start()
	}
	t.Cleanup(o.srv.Close)
	return o
}

func hostPort(t *testing.T, raw string) string {
	t.Helper()
	a, err := authority.Parse(raw)
	if err != nil {
		t.Fatal(err)
	}
	return a.String()
}

func writeFile(t *testing.T, dir, name string, data []byte) {
	t.Helper()
	if err := os.WriteFile(filepath.Join(dir, name), data, 0o600); err != nil {
		t.Fatal(err)
	}
}

func get(t *testing.T, c *fetch.Client, u string) (*fetch.Response, string, error) {
	t.Helper()
	resp, err := c.Do(context.Background(), fetch.Request{URL: u}, nil)
	if err != nil {
		return nil, "", err
	}
	var body string
	if resp.Body != nil {
		b, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil {
			return resp, "", err
		}
		body = string(b)
	}
	return resp, body, nil
}

// TestCredentialsPerAuthority: bearer, basic, a custom header and mTLS
// (with the origin's own CA) each reach their origin, a wrong one gives a
// 401 classified auth_failed, and a redirect to another authority carries
// none of them.
func TestCredentialsPerAuthority(t *testing.T) {
	ca, err := fetchtest.NewCA()
	if err != nil {
		t.Fatal(err)
	}
	bearer := newRecorder(t, func(r *http.Request) bool { return r.Header.Get("Authorization") == "Bearer tok-bearer-1" }, nil)
	basic := newRecorder(t, func(r *http.Request) bool {
		u, p, ok := r.BasicAuth()
		return ok && u == "mirror" && p == "pw-basic-1"
	}, nil)
	header := newRecorder(t, func(r *http.Request) bool { return r.Header.Get("X-Api-Key") == "key-header-1" }, nil)
	stc, err := ca.ServerTLS(true, "127.0.0.1")
	if err != nil {
		t.Fatal(err)
	}
	mtls := newRecorder(t, func(r *http.Request) bool {
		return r.TLS != nil && len(r.TLS.PeerCertificates) == 1 && r.TLS.PeerCertificates[0].Subject.CommonName == "mirror-client"
	}, stc)
	wrong := newRecorder(t, func(r *http.Request) bool { return r.Header.Get("Authorization") == "Bearer right" }, nil)
	other := newRecorder(t, nil, nil) // the CDN a redirect goes to

	dir := t.TempDir()
	cert, key, err := ca.Issue("mirror-client")
	if err != nil {
		t.Fatal(err)
	}
	writeFile(t, dir, "client.crt", cert)
	writeFile(t, dir, "client.key", key)
	writeFile(t, dir, "ca.pem", ca.PEM)
	writeFile(t, dir, "bearer.token", []byte("tok-bearer-1\n"))
	writeFile(t, dir, "credentials.json", []byte(`{"authorities": {
		"`+hostPort(t, bearer.srv.URL)+`": {"bearer_file": "bearer.token"},
		"`+hostPort(t, basic.srv.URL)+`": {"basic": {"username": "mirror", "password": "pw-basic-1"}},
		"`+hostPort(t, header.srv.URL)+`": {"header": {"name": "x-api-key", "value": "key-header-1"}},
		"`+hostPort(t, mtls.srv.URL)+`": {"client_cert_file": "client.crt", "client_key_file": "client.key", "ca_file": "ca.pem"},
		"`+hostPort(t, wrong.srv.URL)+`": {"bearer": "wrong"}
	}}`))
	set, err := credentials.Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	c := fetch.New(&fetch.Options{AllowPrivate: true, Credentials: set})
	defer c.CloseIdleConnections()

	for _, o := range []*recorder{bearer, basic, header, mtls} {
		resp, body, err := get(t, c, o.srv.URL+"/obj")
		if err != nil {
			t.Fatalf("%s: %v", o.srv.URL, err)
		}
		if resp.Status != 200 || body != "ok /obj" {
			t.Errorf("%s: %d %q, want 200", o.srv.URL, resp.Status, body)
		}
		if resp.CredentialVersion != 0 {
			t.Errorf("%s: version %d from a bare Load, want 0", o.srv.URL, resp.CredentialVersion)
		}
	}
	resp, _, err := get(t, c, wrong.srv.URL+"/obj")
	if err != nil {
		t.Fatal(err)
	}
	if resp.Status != 401 || fetch.Classify(resp.Status) != fetch.ClassAuthFailed || fetch.Classify(403) != fetch.ClassAuthFailed {
		t.Errorf("wrong credential: %d classified %v, want 401 auth_failed", resp.Status, fetch.Classify(resp.Status))
	}
	// An mTLS origin without the certificate: the TLS handshake fails.
	if _, _, err := get(t, fetch.New(&fetch.Options{AllowPrivate: true, TLSConfig: &tls.Config{RootCAs: ca.Pool}}), mtls.srv.URL+"/x"); err == nil {
		t.Error("mTLS origin answered a client without its certificate")
	}

	// Redirects: each hop gets its own authority's credential, never the
	// first one's.
	for _, o := range []*recorder{bearer, basic, header} {
		resp, _, err := get(t, c, o.srv.URL+"/r?to="+url.QueryEscape(other.srv.URL+"/cdn"))
		if err != nil || resp.Status != 200 || resp.Hops != 2 {
			t.Fatalf("redirect from %s: %v %+v", o.srv.URL, err, resp)
		}
	}
	got := other.headers()
	if len(got) != 3 {
		t.Fatalf("the other origin saw %d requests, want 3", len(got))
	}
	for _, h := range got {
		for _, k := range []string{"Authorization", "X-Api-Key", "Cookie", "Proxy-Authorization"} {
			if v := h.Get(k); v != "" {
				t.Errorf("the redirect's other authority received %s: %q", k, v)
			}
		}
	}
	// A redirect back to the same authority keeps it (it is its own).
	resp, _, err = get(t, c, bearer.srv.URL+"/r?to=/again")
	if err != nil || resp.Status != 200 {
		t.Fatalf("same-authority redirect: %v %+v", err, resp)
	}
}

// mapResolver resolves the names of a test.
type mapResolver map[string]netip.Addr

func (m mapResolver) LookupNetIP(_ context.Context, _, host string) ([]netip.Addr, error) {
	if a, ok := m[host]; ok {
		return []netip.Addr{a}, nil
	}
	return nil, &net.DNSError{Err: "no such host", Name: host, IsNotFound: true}
}

// TestProxy: HTTPS through CONNECT and HTTP forwarded, both to origins
// only the proxy can resolve; mTLS through the tunnel; connections reused;
// the gate sees the origin's authority; the proxy's credential from
// Options, never in an error; metadata, link-local and private
// destinations refused before the proxy is asked; NO_PROXY goes direct.
func TestProxy(t *testing.T) {
	ca, err := fetchtest.NewCA()
	if err != nil {
		t.Fatal(err)
	}
	stc, err := ca.ServerTLS(true, "secure.test")
	if err != nil {
		t.Fatal(err)
	}
	secure := newRecorder(t, func(r *http.Request) bool { return r.Header.Get("Authorization") == "Bearer behind-proxy" }, stc)
	plain := newRecorder(t, nil, nil)
	direct := newRecorder(t, nil, nil)
	const proxyPass = "proxy-pass-Zq81"
	proxyAuth := "Basic " + basicToken("egress", proxyPass)
	px := fetchtest.NewProxy(map[string]string{
		"secure.test:443": strings.TrimPrefix(secure.srv.URL, "https://"),
		"plain.test:80":   strings.TrimPrefix(plain.srv.URL, "http://"),
	}, proxyAuth)
	defer px.Close()

	dir := t.TempDir()
	cert, key, _ := ca.Issue("mirror-client")
	writeFile(t, dir, "c.crt", cert)
	writeFile(t, dir, "c.key", key)
	writeFile(t, dir, "ca.pem", ca.PEM)
	writeFile(t, dir, "creds.json", []byte(`{"authorities": {"secure.test:443": {"bearer": "behind-proxy", "client_cert_file": "c.crt", "client_key_file": "c.key", "ca_file": "ca.pem"}}}`))
	set, err := credentials.Load(filepath.Join(dir, "creds.json"))
	if err != nil {
		t.Fatal(err)
	}
	res := mapResolver{
		"evil.test":      netip.MustParseAddr("169.254.169.254"),
		"private.test":   netip.MustParseAddr("10.1.2.3"),
		"linklocal.test": netip.MustParseAddr("fe80::1"),
	}
	env := map[string]string{"HTTPS_PROXY": px.URL, "http_proxy": px.URL, "NO_PROXY": "direct.test"}
	pc := fetch.ProxyFromEnv(func(k string) string { return env[k] })
	pc.User = url.UserPassword("egress", proxyPass)
	if s := pc.String(); strings.Contains(s, proxyPass) || !strings.Contains(s, "authenticated") {
		t.Errorf("Proxy.String() = %q", s)
	}
	c := fetch.New(&fetch.Options{Credentials: set, Proxy: pc, Resolver: res})
	defer c.CloseIdleConnections()

	var gated []string
	var gmu sync.Mutex
	gate := func(_ context.Context, _ int, a authority.Authority) (func(fetch.Result), error) {
		gmu.Lock()
		gated = append(gated, a.String())
		gmu.Unlock()
		return nil, nil
	}
	for i := range 10 {
		for _, u := range []string{"https://secure.test/obj", "http://plain.test/obj"} {
			resp, err := c.Do(context.Background(), fetch.Request{URL: u}, gate)
			if err != nil {
				t.Fatalf("%d %s: %v", i, u, err)
			}
			if resp.Body == nil {
				t.Fatalf("%s: %d, want 200", u, resp.Status)
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.Status != 200 || string(b) != "ok /obj" {
				t.Fatalf("%s: %d %q", u, resp.Status, b)
			}
		}
	}
	var connects, forwards int
	for _, r := range px.Requests() {
		switch {
		case r.Method == http.MethodConnect && r.Authority == "secure.test:443":
			connects++
		case r.Method == http.MethodGet && r.Authority == "plain.test:80":
			forwards++
		default:
			t.Errorf("proxy asked %+v", r)
		}
		if r.Auth != proxyAuth {
			t.Errorf("proxy request %s %s without the proxy's credential", r.Method, r.Authority)
		}
	}
	if connects != 1 || forwards != 10 {
		t.Errorf("%d CONNECTs for 10 HTTPS requests (want 1: the tunnel is reused), %d forwarded (want 10)", connects, forwards)
	}
	gmu.Lock()
	for _, a := range gated {
		if a != "secure.test:443" && a != "plain.test:80" {
			t.Errorf("gate asked for %s: the politeness key must be the origin's", a)
		}
	}
	gmu.Unlock()
	for _, h := range plain.headers() {
		if h.Get("Proxy-Authorization") != "" || h.Get("Authorization") != "" {
			t.Errorf("the forwarded origin received credentials: %v", h)
		}
	}

	// Refused before the proxy is asked.
	before := len(px.Requests())
	for _, tc := range []struct{ url, reason string }{
		{"http://169.254.169.254/latest/meta-data/", fetch.ReasonMetadata},
		{"http://metadata.google.internal/computeMetadata/v1/", fetch.ReasonMetadata},
		{"https://evil.test/", fetch.ReasonMetadata},
		{"http://linklocal.test/", fetch.ReasonLinkLocal},
		{"http://private.test/", fetch.ReasonPrivate},
		{"http://[fe80::1]/", fetch.ReasonLinkLocal},
	} {
		_, err := c.Do(context.Background(), fetch.Request{URL: tc.url}, nil)
		var re *fetch.RefusedError
		if !errors.As(err, &re) || re.Reason != tc.reason {
			t.Errorf("%s: %v, want refused %s", tc.url, err, tc.reason)
		}
	}
	if n := len(px.Requests()); n != before {
		t.Errorf("the proxy was asked %d times for refused destinations: %v", n-before, fetchtest.Hosts(px.Requests()[before:]))
	}

	// NO_PROXY: direct (and so dialled and checked here).
	dc := fetch.New(&fetch.Options{AllowPrivate: true, Proxy: fetch.Proxy{HTTPProxy: px.URL, NoProxy: "127.0.0.1"}})
	defer dc.CloseIdleConnections()
	if resp, _, err := get(t, dc, direct.srv.URL+"/d"); err != nil || resp.Status != 200 {
		t.Fatalf("NO_PROXY origin: %v %+v", err, resp)
	}
	if n := len(px.Requests()); n != before {
		t.Errorf("a NO_PROXY origin went through the proxy")
	}

	// A wrong proxy credential fails without the password in the error.
	bad := fetch.New(&fetch.Options{Proxy: fetch.Proxy{HTTPSProxy: px.URL, User: url.UserPassword("egress", "nope-"+proxyPass)}, Resolver: res})
	_, err = bad.Do(context.Background(), fetch.Request{URL: "https://secure.test/obj"}, nil)
	if err == nil {
		t.Fatal("a wrong proxy credential fetched")
	}
	if strings.Contains(err.Error(), proxyPass) || strings.Contains(err.Error(), "egress:") {
		t.Errorf("error carries the proxy credential: %v", err)
	}
}

func basicToken(user, pass string) string {
	r, _ := http.NewRequest("GET", "http://x/", nil)
	r.SetBasicAuth(user, pass)
	return strings.TrimPrefix(r.Header.Get("Authorization"), "Basic ")
}
