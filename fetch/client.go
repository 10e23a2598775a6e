// Package fetch makes the worker's upstream HTTP requests: a GET with
// per-hop admission (each redirect hop is admitted by its own authority
// through a Gate), manual redirects, a destination check on every resolved
// address, connect/TLS/header/body-idle timeouts, a minimum transfer rate
// and a total deadline that grows with the expected size, a maximum body
// size (and the job's expected size, checked before and while reading), and
// classification of the final status.
//
// It sends each authority's credential (Options.Credentials) to that
// authority only, goes through an egress proxy when Options.Proxy names one
// (checking the destination before the proxy is asked), stores bodies as
// sent (no transparent decompression), and knows nothing of the pacer's
// rules, of NATS or of where bodies end up.
package fetch

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/mirrorworker/mirrorworker/authority"
)

// DefaultUserAgent is sent when Options.UserAgent is empty.
const DefaultUserAgent = "mirrorworker (+https://github.com/mirrorworker/mirrorworker)"

// UserAgent returns the User-Agent for a build version, e.g.
// "mirrorworker/1.2.0 (+https://github.com/mirrorworker/mirrorworker)".
func UserAgent(version string) string {
	return "mirrorworker/" + version + " (+https://github.com/mirrorworker/mirrorworker)"
}

// Defaults of the transfer-rate options (Options.MinRate and the rest).
const (
	// DefaultMinRate is the slowest transfer kept, in bytes per second: a
	// body trickling below it frees its fetch slot (ErrTooSlow).
	DefaultMinRate = 1 << 10
	// DefaultMinRateWindow is the time over which the rate is judged; a
	// pause shorter than it costs nothing if the window's bytes arrive.
	DefaultMinRateWindow = 30 * time.Second
	// DefaultDeadlineBase and DefaultDeadlineRate make the total deadline
	// of a body: 5 min plus its expected size at 16 KiB/s (1 GiB: ~18 h).
	DefaultDeadlineBase = 5 * time.Minute
	DefaultDeadlineRate = 16 << 10
)

// Defaults of the connection pool (Options.MaxIdleConns and the rest); see
// docs/adr/0014-connection-pool-bounds-and-held-overflow.md.
const (
	// DefaultMaxIdleConns bounds the idle keep-alive connections kept across
	// all authorities, and so the file descriptors and memory they hold
	// (about 22 KiB of RSS each with their buffers and two goroutines,
	// measured; plus the kernel's socket): at most 16384 descriptors and
	// ~350 MiB however many authorities are cycled, and never more than
	// poolLimit allows under the process's file limit. It covers a worker
	// cycling 10,000 authorities (one or two connections each); a pool
	// smaller than the authorities in use closes each connection, least
	// recently used first, before its authority comes round again, and
	// every job then pays a connect (and a TLS handshake).
	DefaultMaxIdleConns = 16384
	// DefaultMaxIdleConnsPerHost is the idle connections kept per
	// authority: the default in-flight cap (2) with room for a policy that
	// raises it. Connections beyond it are closed after their request.
	DefaultMaxIdleConnsPerHost = 4
	// DefaultIdleConnTimeout closes a connection idle this long: an
	// authority not asked again within it costs a new connect, not a
	// descriptor held for nothing. Origins often close sooner themselves.
	DefaultIdleConnTimeout = 90 * time.Second
)

// poolLimit is want idle connections within a file limit of files (0:
// unknown): at most the limit less 1024 descriptors for everything else
// (the mirror's files, NATS, requests in flight, listeners), or half the
// limit when that is more, so that idle connections cannot starve the
// store of descriptors.
func poolLimit(want, files int) int {
	if files <= 0 {
		return want
	}
	return max(min(want, max(files/2, files-1024)), 1)
}

// drainLimit bounds how much of a redirect or non-2xx body is read so its
// connection can be reused; a longer body costs its connection instead.
const drainLimit = 64 << 10

// Defaults of the timeouts and the body size limit (Options), which the
// commands' flags share.
const (
	DefaultConnectTimeout        = 10 * time.Second // Options.ConnectTimeout and TLSHandshakeTimeout
	DefaultResponseHeaderTimeout = 30 * time.Second
	DefaultIdleTimeout           = 60 * time.Second
	DefaultMaxBodySize           = 16 << 30 // bytes
)

// Options configure a Client. A nil *Options, and any zero field, means the
// default given on the field.
type Options struct {
	ConnectTimeout        time.Duration // DefaultConnectTimeout
	TLSHandshakeTimeout   time.Duration // DefaultConnectTimeout
	ResponseHeaderTimeout time.Duration // DefaultResponseHeaderTimeout, from the request written to the headers read
	// IdleTimeout bounds the wait for each read of a body to make progress
	// (a slow but moving transfer is never cut). DefaultIdleTimeout.
	IdleTimeout time.Duration
	// MinRate is the slowest body transfer kept, in bytes per second,
	// judged over each MinRateWindow of time spent waiting on the origin
	// (time the caller spends elsewhere, say writing to a slow disk, does
	// not count). A window that brings fewer than MinRate x MinRateWindow
	// bytes fails the read with ErrTooSlow, so a trickle cannot hold a
	// fetch slot while every read still makes progress within IdleTimeout.
	// DefaultMinRate; negative: no minimum.
	MinRate       int64
	MinRateWindow time.Duration // DefaultMinRateWindow
	// DeadlineBase and DeadlineRate make the total deadline of a body,
	// counted from its response headers: DeadlineBase plus the expected
	// size (Content-Length, else Request.Size, else MaxBodySize) at
	// DeadlineRate bytes per second. Past it reads fail with ErrTooSlow.
	// DefaultDeadlineBase and DefaultDeadlineRate; a negative DeadlineRate:
	// no total deadline.
	DeadlineBase time.Duration
	DeadlineRate int64
	MaxBodySize  int64 // DefaultMaxBodySize
	// MaxRedirects is the number of redirects followed (10). Negative: none.
	MaxRedirects int
	UserAgent    string // DefaultUserAgent
	// AllowPrivate admits loopback, private, shared (CGNAT), unspecified,
	// multicast and reserved destinations. Link-local and cloud metadata
	// addresses are refused regardless.
	AllowPrivate bool
	// MaxIdleConns bounds the idle connections kept across all authorities
	// (DefaultMaxIdleConns, and never more than poolLimit allows under the
	// process's file limit); MaxIdleConnsPerHost those kept per authority
	// (DefaultMaxIdleConnsPerHost); IdleConnTimeout closes one idle longer
	// (DefaultIdleConnTimeout). Together they bound the descriptors the
	// pool holds, whatever the number of authorities: MaxIdleConns plus
	// the requests in flight.
	MaxIdleConns        int
	MaxIdleConnsPerHost int
	IdleConnTimeout     time.Duration
	TLSConfig           *tls.Config // nil: system roots
	// Credentials, if set, gives each hop's authority its credential
	// (headers, TLS material); a redirect to another authority gets that
	// authority's, never the first one's.
	Credentials CredentialSource
	// Proxy is the egress proxy (ProxyFromEnv reads the environment's);
	// the zero value is none. The politeness key stays the origin's
	// authority, and the destination is checked before the proxy is asked.
	Proxy Proxy
	// Resolver looks up a proxied request's host for that check (the
	// direct dialer checks the addresses it connects to); nil: the
	// system's.
	Resolver Resolver
	// Throttle, if set, caps the bandwidth of 2xx bodies (package
	// bandwidth): every read of a body first waits for its share, and the
	// wait is not held against the body's transfer rate or deadlines.
	// Bodies drained by the client (redirects, errors) are not throttled.
	Throttle Throttle
}

func (o *Options) withDefaults() Options {
	var r Options
	if o != nil {
		r = *o
	}
	def := func(d *time.Duration, v time.Duration) {
		if *d <= 0 {
			*d = v
		}
	}
	def(&r.ConnectTimeout, DefaultConnectTimeout)
	def(&r.TLSHandshakeTimeout, DefaultConnectTimeout)
	def(&r.ResponseHeaderTimeout, DefaultResponseHeaderTimeout)
	def(&r.IdleTimeout, DefaultIdleTimeout)
	def(&r.MinRateWindow, DefaultMinRateWindow)
	def(&r.DeadlineBase, DefaultDeadlineBase)
	if r.MinRate == 0 {
		r.MinRate = DefaultMinRate
	}
	if r.DeadlineRate == 0 {
		r.DeadlineRate = DefaultDeadlineRate
	}
	if r.MaxBodySize <= 0 {
		r.MaxBodySize = DefaultMaxBodySize
	}
	switch {
	case r.MaxRedirects == 0:
		r.MaxRedirects = 10
	case r.MaxRedirects < 0:
		r.MaxRedirects = 0
	}
	if r.UserAgent == "" {
		r.UserAgent = DefaultUserAgent
	}
	if r.MaxIdleConns <= 0 {
		r.MaxIdleConns = DefaultMaxIdleConns
	}
	r.MaxIdleConns = poolLimit(r.MaxIdleConns, fileLimit())
	if r.MaxIdleConnsPerHost <= 0 {
		r.MaxIdleConnsPerHost = DefaultMaxIdleConnsPerHost
	}
	def(&r.IdleConnTimeout, DefaultIdleConnTimeout)
	return r
}

// Client fetches objects. It owns its transport and connection pool. A
// Client is safe for concurrent use; its configuration is fixed at New.
type Client struct {
	opt        Options
	check      func(netip.Addr) (reason string) // CheckAddr with opt.AllowPrivate; tests widen it
	transport  *http.Transport
	hc         *http.Client
	proxy      func(*http.Request) (*url.URL, error) // nil: direct
	proxyAddrs map[string]bool                       // host:port of the proxies, dialled unchecked
	resolver   Resolver
	tlsc       tlsClients // clients of credentials with TLS material
	// userAgent is the User-Agent header's value, shared by every request
	// (net/http does not modify a request's headers): one slice fewer per
	// request.
	userAgent []string
}

// New returns a Client; nil Options means the defaults.
func New(o *Options) *Client {
	c := &Client{opt: o.withDefaults()}
	c.userAgent = []string{c.opt.UserAgent}
	c.check = func(a netip.Addr) string { return CheckAddr(a, c.opt.AllowPrivate) }
	c.resolver = c.opt.Resolver
	if c.resolver == nil {
		c.resolver = net.DefaultResolver
	}
	c.setupProxy(c.opt.Proxy)
	var tlsConf *tls.Config
	if c.opt.TLSConfig != nil {
		tlsConf = c.opt.TLSConfig.Clone()
	}
	c.hc = c.newClient(tlsConf)
	c.transport = c.hc.Transport.(*http.Transport)
	return c
}

// newClient is an HTTP client with a transport of its own, with TLS
// configuration tlsConf (nil: system roots).
func (c *Client) newClient(tlsConf *tls.Config) *http.Client {
	var proxy func(*http.Request) (*url.URL, error)
	if c.proxy != nil {
		proxy = c.proxy
	}
	t := &http.Transport{
		Proxy:                 proxy, // nil: direct
		DialContext:           c.dialContext,
		TLSClientConfig:       tlsConf,
		ForceAttemptHTTP2:     true,
		TLSHandshakeTimeout:   c.opt.TLSHandshakeTimeout,
		ResponseHeaderTimeout: c.opt.ResponseHeaderTimeout,
		DisableCompression:    true, // bodies are stored as sent
		MaxIdleConns:          c.opt.MaxIdleConns,
		MaxIdleConnsPerHost:   c.opt.MaxIdleConnsPerHost,
		IdleConnTimeout:       c.opt.IdleConnTimeout,
		ExpectContinueTimeout: time.Second,
	}
	return &http.Client{
		Transport: t,
		CheckRedirect: func(*http.Request, []*http.Request) error {
			return http.ErrUseLastResponse // Do follows redirects itself, hop by hop
		},
	}
}

// CloseIdleConnections closes pooled connections not in use.
func (c *Client) CloseIdleConnections() {
	c.transport.CloseIdleConnections()
	c.tlsc.closeIdle()
}

// Do fetches r.URL with a GET, following redirects itself. Before every hop
// (hop 0 is the first request) it checks a literal IP destination, then
// calls gate with the hop's authority; a gate error aborts Do before that
// request starts and is returned wrapped. The gate's done func is called
// exactly once per admitted hop: for a redirect or non-2xx answer once its
// body is drained, on a transport error with Result.Err, and for a 2xx final
// answer when Response.Body is closed, so the request counts as in flight
// while its body streams. A nil gate admits everything.
//
// On success the Response holds the final status and headers; Body is set
// only for a 2xx status and must be closed. Its reads fail with
// ErrBodyTooLarge, ErrSizeMismatch, ErrTruncated, ErrIdleTimeout or
// ErrTooSlow. Errors from Do: a *RefusedError, ErrTooManyRedirects,
// ErrInvalidURL, ErrBodyTooLarge or ErrSizeMismatch (from Content-Length),
// the gate's error, or a transport error (see ReasonCode).
func (c *Client) Do(ctx context.Context, r Request, gate Gate) (*Response, error) {
	u, err := url.Parse(r.URL)
	if err != nil {
		return nil, fmt.Errorf("url: %v: %w", err, ErrInvalidURL)
	}
	first := u
	for hop := max(r.Hops, 0); ; hop++ {
		a, err := authority.FromURL(u)
		if err != nil {
			return nil, fmt.Errorf("hop %d: %v: %w", hop, err, ErrInvalidURL)
		}
		if err := c.checkLiteral(a.Host); err != nil {
			return nil, fmt.Errorf("hop %d: %w", hop, err)
		}
		done := func(Result) {}
		if gate != nil {
			d, err := gate(ctx, hop, a)
			if err != nil {
				return nil, &GateError{Hop: hop, Authority: a, URL: u.String(), Err: err}
			}
			if d != nil {
				done = d
			}
		}
		// The first hop is the first authority by definition: not parsed
		// again (sameAuthority takes two authority.FromURL).
		resp, err := c.send(ctx, u, a, r, u == first || sameAuthority(first, u), done)
		if err != nil {
			return nil, fmt.Errorf("hop %d: %w", hop, err)
		}
		if resp.Body != nil || !isRedirect(resp.Status) {
			resp.FinalURL = u.String()
			resp.Hops = hop + 1
			return resp, nil
		}
		loc := resp.Header.Get("Location")
		if loc == "" {
			// A redirect that does not say where is the origin's mistake:
			// returned as the final answer, which Classify calls permanent.
			resp.FinalURL = u.String()
			resp.Hops = hop + 1
			return resp, nil
		}
		if hop >= c.opt.MaxRedirects {
			return nil, fmt.Errorf("%d redirects, last from %s: %w", hop+1, redact(u), ErrTooManyRedirects)
		}
		next, err := u.Parse(loc)
		if err != nil {
			return nil, fmt.Errorf("hop %d: redirect location %q: %v: %w", hop, loc, err, ErrInvalidURL)
		}
		next.User = nil // credentials are never sent along a redirect
		next.Fragment, next.RawFragment = "", ""
		u = next
	}
}

// send makes one request and reports it to done as specified by Do.
// Bodies of redirects and non-2xx answers are drained and closed here.
func (c *Client) send(ctx context.Context, u *url.URL, a authority.Authority, r Request, firstAuthority bool, done func(Result)) (*Response, error) {
	hctx, cancel := context.WithCancelCause(ctx)
	req, err := newGet(hctx, u)
	if err != nil {
		cancel(nil)
		done(Result{Err: err})
		return nil, fmt.Errorf("request: %v: %w", err, ErrInvalidURL)
	}
	for k, vs := range r.Header {
		if !firstAuthority && isCredential(k) {
			continue
		}
		req.Header[http.CanonicalHeaderKey(k)] = append([]string(nil), vs...)
	}
	req.Header["User-Agent"] = c.userAgent
	if r.ETag != "" {
		req.Header.Set("If-None-Match", r.ETag)
	}
	if r.LastModified != "" {
		req.Header.Set("If-Modified-Since", r.LastModified)
	}
	if r.From > 0 && r.IfRange != "" {
		// Evaluated after If-None-Match (RFC 9110 section 13.2.2): an
		// unchanged stored object still answers 304, a changed one 200.
		req.Header.Set("Range", "bytes="+strconv.FormatInt(r.From, 10)+"-")
		req.Header.Set("If-Range", r.IfRange)
	}
	hc := c.hc
	var cred *Credential
	if c.opt.Credentials != nil {
		// Asked per hop: each authority gets its own credential or none.
		if cred = c.opt.Credentials.Credential(a); cred != nil {
			for k, vs := range cred.Header {
				req.Header[k] = append([]string(nil), vs...) // the credential is shared
			}
			if cred.TLS != nil {
				hc = c.tlsc.get(cred, func(tc *tls.Config) *http.Client {
					tc = tc.Clone()
					if c.opt.TLSConfig != nil && tc.RootCAs == nil {
						tc.RootCAs = c.opt.TLSConfig.RootCAs
					}
					return c.newClient(tc)
				})
			}
		}
	}
	if c.proxy != nil {
		if pu, err := c.proxy(req); err == nil && pu != nil {
			// The proxy would resolve and dial on our behalf, past the
			// dialer's check: the destination is checked here first.
			if err := c.checkProxied(ctx, a.Host); err != nil {
				cancel(nil)
				done(Result{Err: err})
				return nil, err
			}
		}
	}

	hr, err := hc.Do(req)
	if err != nil {
		cancel(nil)
		done(Result{Err: err, Cancelled: ctx.Err() != nil})
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err // its message carries the full URL, query string included
		}
		return nil, fmt.Errorf("get %s: %w", redact(u), err)
	}
	resp := &Response{Status: hr.StatusCode, Header: hr.Header}
	if cred != nil {
		resp.CredentialVersion = cred.Version
	}
	b := &body{
		rc:     hr.Body,
		max:    c.opt.MaxBodySize,
		want:   hr.ContentLength,
		idle:   c.opt.IdleTimeout,
		ctx:    ctx,
		hctx:   hctx,
		cancel: cancel,
		done:   done,
		res:    Result{Status: hr.StatusCode, Header: hr.Header},
		now:    time.Now,
	}
	b.watch = time.AfterFunc(b.idle, b.watchCut)
	b.watch.Stop()
	if c.opt.MinRate > 0 {
		b.minRate, b.window = c.opt.MinRate, c.opt.MinRateWindow
		b.need = int64(float64(c.opt.MinRate) * c.opt.MinRateWindow.Seconds())
	}
	if hr.StatusCode < 200 || hr.StatusCode > 299 {
		b.drain()
		return resp, nil
	}
	if hr.StatusCode == http.StatusPartialContent && r.From > 0 && r.IfRange != "" {
		rest, err := checkRange(hr.Header.Get("Content-Range"), r)
		if err != nil {
			b.Close()
			return nil, err
		}
		// From here the size checks are the rest's.
		resp.Offset, r.Size, r.HasSize = r.From, rest, true
	}
	// The expected size is checked before a byte of the body is read: an
	// origin that announces other bytes than the job expects costs nothing.
	if r.HasSize && hr.ContentLength >= 0 && hr.ContentLength != r.Size {
		b.Close()
		return nil, fmt.Errorf("content-length %d, the job expects %d bytes: %w", hr.ContentLength, r.Size, ErrSizeMismatch)
	}
	if hr.ContentLength > c.opt.MaxBodySize {
		b.Close()
		return nil, fmt.Errorf("content-length %d > %d: %w", hr.ContentLength, c.opt.MaxBodySize, ErrBodyTooLarge)
	}
	if r.HasSize && r.Size >= 0 && r.Size < b.max {
		b.max, b.sizeLimited = r.Size, true
	}
	if c.opt.DeadlineRate > 0 {
		expected := hr.ContentLength
		if expected < 0 {
			expected = b.max
		}
		b.deadlineIn = totalDeadline(c.opt.DeadlineBase, c.opt.DeadlineRate, expected)
		b.deadlineAt = b.now().Add(b.deadlineIn)
		b.deadline = time.AfterFunc(b.deadlineIn, func() { cancel(errDeadlineCut) })
	}
	if c.opt.Throttle != nil {
		b.throttle = c.opt.Throttle.Body(a)
	}
	resp.Body = b
	return resp, nil
}

// newGet is http.NewRequestWithContext(ctx, "GET", u.String(), nil)
// without printing u and parsing it back (ninth pass of ADR 0036): the
// request gets a copy of u, with an empty port dropped as NewRequest drops
// it. The only parse left is of "", whose URL the copy fills.
func newGet(ctx context.Context, u *url.URL) (*http.Request, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "", nil)
	if err != nil {
		return nil, err
	}
	*req.URL = *u
	req.URL.Host = strings.TrimSuffix(u.Host, ":") // as net/http's removeEmptyPort
	req.Host = req.URL.Host
	return req, nil
}

// checkRange returns the length of the rest of the body that a 206 answer
// to r carries, from its Content-Range: it must run from r.From to the
// end of a body of known length, r.Size when the job gives it.
func checkRange(cr string, r Request) (rest int64, err error) {
	bad := func(why string) (int64, error) {
		return 0, fmt.Errorf("content-range %q for bytes=%d-: %s: %w", cr, r.From, why, ErrRangeMismatch)
	}
	spec, ok := strings.CutPrefix(cr, "bytes ")
	if !ok {
		return bad("not a byte range")
	}
	rng, total, ok := strings.Cut(spec, "/")
	first, last, ok2 := strings.Cut(rng, "-")
	if !ok || !ok2 {
		return bad("malformed")
	}
	s, err1 := strconv.ParseInt(first, 10, 64)
	e, err2 := strconv.ParseInt(last, 10, 64)
	n, err3 := strconv.ParseInt(total, 10, 64)
	switch {
	case err1 != nil || err2 != nil || err3 != nil || e < s:
		return bad("malformed or of unknown length")
	case s != r.From:
		return bad("another start")
	case e != n-1:
		return bad("not up to the end")
	case r.HasSize && n != r.Size:
		return bad(fmt.Sprintf("a body of %d bytes, the job expects %d", n, r.Size))
	}
	return n - s, nil
}

// totalDeadline is base plus size bytes at rate bytes per second, capped so
// that it never overflows.
func totalDeadline(base time.Duration, rate, size int64) time.Duration {
	const maxD = time.Duration(1<<62 - 1)
	d := float64(size) / float64(rate) * float64(time.Second)
	if d >= float64(maxD-base) {
		return maxD
	}
	return base + time.Duration(d)
}

func isRedirect(status int) bool {
	switch status {
	case http.StatusMovedPermanently, http.StatusFound, http.StatusSeeOther,
		http.StatusTemporaryRedirect, http.StatusPermanentRedirect:
		return true
	}
	return false
}

func sameAuthority(a, b *url.URL) bool {
	x, err1 := authority.FromURL(a)
	y, err2 := authority.FromURL(b)
	return err1 == nil && err2 == nil && x == y && a.Scheme == b.Scheme
}

// isCredential reports headers that must not follow a redirect to another
// origin (as net/http's own redirect policy does).
func isCredential(k string) bool {
	switch http.CanonicalHeaderKey(k) {
	case "Authorization", "Cookie", "Proxy-Authorization", "Www-Authenticate":
		return true
	}
	return false
}

// redact returns u without userinfo, query or fragment, fit for logs.
func redact(u *url.URL) string {
	v := *u
	v.User, v.RawQuery, v.ForceQuery, v.Fragment, v.RawFragment = nil, "", false, "", ""
	return v.String()
}
