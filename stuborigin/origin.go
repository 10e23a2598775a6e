package stuborigin

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/mirrorworker/mirrorworker/clock"
	"github.com/mirrorworker/mirrorworker/internal/rxstamp"
)

// Options configure an Origin. A nil *Options means the defaults.
type Options struct {
	// Authorities is how many authorities (listeners, limiter shards) to
	// serve; default 1.
	Authorities int
	// Clock is the limiter store's clock: bucket refill, shard windows,
	// the Date header, statistics and slow bodies all read it. Default
	// clock.Real{}.
	Clock clock.Clock
	// Logger receives operator logs; the zero value discards them.
	Logger zerolog.Logger
	// GapFloor, when set, makes /stats count arrival gaps below it.
	GapFloor time.Duration
	// OnArrival, when set, is called once per request to an authority,
	// after its admission, with what the origin timed and decided: a trace
	// to tell which two requests made a gap below the floor. It is called
	// from the handlers' goroutines, concurrently and in the order the
	// handlers ran, which is not always the order of arrival.
	OnArrival func(Arrival)
	// OnTold, when set, is called once per answer that tells its caller
	// a deadline to wait for, just before the answer is written (Told),
	// from the handlers' goroutines, concurrently.
	OnTold func(Told)
	// MaxIdentities per authority (default 100,000). A new identity beyond
	// it is refused with 503 capacity_exhausted: evicting one would hand it
	// a full bucket, which is failing open.
	MaxIdentities int
	// MaxTimeline is how many seconds of per-second timeline are kept per
	// authority (default 3600).
	MaxTimeline int
	// ShutdownTimeout bounds the graceful shutdown in Run (default 5 s).
	ShutdownTimeout time.Duration
	// Registerer, when set, also gets the origin's metrics collector, for
	// a process that exports them on a /metrics of its own. The admin
	// handler always serves a registry the origin owns, holding only its
	// metrics. Two origins on one Registerer clash (New fails): wrap it
	// for each with prometheus.WrapRegistererWith to tell them apart.
	Registerer prometheus.Registerer
}

// Origin is a throttling stub origin serving one or more authorities. It is
// safe for concurrent use. Build it with New, bind with Listen (and
// ListenAdmin), then Run; or use Start and Close.
type Origin struct {
	profile *Profile
	clk     clock.Clock
	// kernel: arrivals are timed by the kernel's receive time for the
	// gap statistics (the authorities' listeners are stamped, package
	// rxstamp), as on the real clock only: a loaded machine delays a
	// handler, not the bytes on the wire, so the handler's own time would
	// show gaps below the floor that no client sent.
	kernel bool
	// onArrival is Options.OnArrival (nil: no trace).
	onArrival func(Arrival)
	// onTold is Options.OnTold (nil: none).
	onTold func(Told)
	log    zerolog.Logger
	start  time.Time
	salt   []byte
	quotas map[string]*quotaSpec
	shards []*shard
	faults atomic.Pointer[Faults]
	shutTO time.Duration
	reg    *prometheus.Registry // served on the admin /metrics

	mu        sync.Mutex
	listeners []net.Listener
	urls      []string
	adminLn   net.Listener
	adminURL  string
	running   bool
	cancel    context.CancelFunc
	done      chan struct{}
	runErr    error
}

// New returns an Origin for p. p must not be modified afterwards.
func New(p *Profile, o *Options) (*Origin, error) {
	if p == nil {
		return nil, errors.New("stuborigin: nil profile")
	}
	if err := p.Validate(); err != nil {
		return nil, fmt.Errorf("stuborigin: profile: %w", err)
	}
	var opt Options
	if o != nil {
		opt = *o
	}
	if opt.Authorities == 0 {
		opt.Authorities = 1
	}
	if opt.Authorities < 0 || opt.Authorities > 10000 {
		return nil, fmt.Errorf("stuborigin: authorities must be between 1 and 10000, got %d", opt.Authorities)
	}
	if opt.Clock == nil {
		opt.Clock = clock.Real{}
	}
	if opt.MaxIdentities <= 0 {
		opt.MaxIdentities = 100_000
	}
	if opt.MaxTimeline <= 0 {
		opt.MaxTimeline = 3600
	}
	if opt.ShutdownTimeout <= 0 {
		opt.ShutdownTimeout = 5 * time.Second
	}
	if err := p.Faults.validate(opt.Authorities); err != nil {
		return nil, fmt.Errorf("stuborigin: profile: faults: %w", err)
	}
	og := &Origin{
		profile:   p,
		clk:       opt.Clock,
		kernel:    isReal(opt.Clock),
		onArrival: opt.OnArrival,
		onTold:    opt.OnTold,
		log:       opt.Logger,
		start:     opt.Clock.Now(),
		quotas:    map[string]*quotaSpec{},
		shutTO:    opt.ShutdownTimeout,
	}
	if p.AnonymousSalt != "" {
		og.salt = []byte(p.AnonymousSalt)
	} else {
		og.salt = make([]byte, 16)
		rand.Read(og.salt)
	}
	for name, q := range p.Quotas {
		og.quotas[name] = compileQuota(name, q)
	}
	if _, ok := og.quotas["anonymous"]; !ok && p.ProxyLimited() {
		// The proxy's limiter admits; the identity still needs a quota
		// for what reads one (an undisclosed ban's wait): one that never
		// binds.
		og.quotas["anonymous"] = &quotaSpec{name: "none",
			burst:     bucketSpec{capacity: 1e9, interval: time.Nanosecond},
			sustained: bucketSpec{capacity: 1e9, interval: time.Nanosecond}, window: time.Second}
	}
	var slots int64
	if p.Shard.Capacity > 0 {
		slots = tenantSlots(p.Shard)
	}
	for i := range opt.Authorities {
		og.shards = append(og.shards, &shard{
			index:    i,
			spec:     p.Shard,
			slots:    slots,
			start:    og.start,
			floor:    opt.GapFloor,
			maxIDs:   opt.MaxIdentities,
			maxTL:    opt.MaxTimeline,
			headers:  p.headers(),
			penalty:  p.Penalty,
			limitReq: p.LimitReq,
			stick:    p.StickTable,
			name:     "authority-" + strconv.Itoa(i),
			ids:      map[string]*identity{},
			window:   -1 << 62,
			byGroup:  map[string]int64{},
			reasons:  map[string]int64{},
			byKind:   map[string]*kindCounts{},
		})
	}
	f := p.Faults
	og.faults.Store(&f)
	if err := og.registerMetrics(opt.Registerer); err != nil {
		return nil, fmt.Errorf("stuborigin: %w", err)
	}
	return og, nil
}

// isReal says whether c is the real clock (arrivals then have kernel
// receive times to be timed by).
func isReal(c clock.Clock) bool {
	_, ok := c.(clock.Real)
	return ok
}

// Listen binds one listener per authority and returns their base URLs
// ("http://127.0.0.1:18000"). With a non-zero port the listeners take
// consecutive ports from it; with port 0 each gets its own free port.
func (og *Origin) Listen(addr string) ([]string, error) {
	host, portStr, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, fmt.Errorf("listen %q: %w", addr, err)
	}
	port, err := strconv.Atoi(portStr)
	if err != nil || port < 0 || port+len(og.shards)-1 > 65535 {
		return nil, fmt.Errorf("listen %q: port must be 0, or leave room for %d consecutive ports", addr, len(og.shards))
	}
	og.mu.Lock()
	defer og.mu.Unlock()
	if og.listeners != nil {
		return nil, errors.New("listen: already listening")
	}
	var lns []net.Listener
	var urls []string
	for i := range og.shards {
		p := 0
		if port != 0 {
			p = port + i
		}
		ln, err := net.Listen("tcp", net.JoinHostPort(host, strconv.Itoa(p)))
		if err != nil {
			for _, l := range lns {
				l.Close()
			}
			return nil, fmt.Errorf("listen authority %d: %w", i, err)
		}
		lns = append(lns, ln)
		urls = append(urls, "http://"+ln.Addr().String())
	}
	for i, s := range og.shards {
		s.mu.Lock()
		s.name = lns[i].Addr().String()
		s.url = urls[i]
		s.mu.Unlock()
	}
	og.listeners, og.urls = lns, urls
	return append([]string(nil), urls...), nil
}

// ListenAdmin binds the admin listener and returns its base URL.
func (og *Origin) ListenAdmin(addr string) (string, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return "", fmt.Errorf("listen admin: %w", err)
	}
	og.mu.Lock()
	defer og.mu.Unlock()
	if og.adminLn != nil || og.running {
		ln.Close()
		return "", errors.New("listen admin: already listening, or already running (bind before Run)")
	}
	og.adminLn = ln
	og.adminURL = "http://" + ln.Addr().String()
	return og.adminURL, nil
}

// URLs returns the authorities' base URLs (empty before Listen).
func (og *Origin) URLs() []string {
	og.mu.Lock()
	defer og.mu.Unlock()
	return append([]string(nil), og.urls...)
}

// AdminURL returns the admin base URL ("" before ListenAdmin).
func (og *Origin) AdminURL() string {
	og.mu.Lock()
	defer og.mu.Unlock()
	return og.adminURL
}

// Run serves every bound listener until ctx is cancelled or Close is
// called, then shuts down gracefully (in-flight responses get
// Options.ShutdownTimeout). It returns nil after a requested shutdown.
func (og *Origin) Run(ctx context.Context) error {
	serve, err := og.begin(ctx)
	if err != nil {
		return err
	}
	return serve()
}

// Start binds the authorities on addr and runs the origin in the
// background until ctx is cancelled or Close is called.
func (og *Origin) Start(ctx context.Context, addr string) ([]string, error) {
	urls, err := og.Listen(addr)
	if err != nil {
		return nil, err
	}
	serve, err := og.begin(ctx)
	if err != nil {
		og.Close()
		return nil, err
	}
	go serve()
	return urls, nil
}

// begin registers a run, so that Close waits for it, and returns the
// function that serves until shutdown.
func (og *Origin) begin(ctx context.Context) (func() error, error) {
	og.mu.Lock()
	defer og.mu.Unlock()
	if og.running {
		return nil, errors.New("run: already running")
	}
	if og.listeners == nil && og.adminLn == nil {
		return nil, errors.New("run: nothing to serve: call Listen first")
	}
	ctx, cancel := context.WithCancel(ctx)
	og.running, og.cancel, og.done = true, cancel, make(chan struct{})
	done := og.done
	type srvLn struct {
		srv *http.Server
		ln  net.Listener
	}
	var all []srvLn
	newServer := func(h http.Handler) *http.Server {
		return &http.Server{
			Handler:           h,
			ReadHeaderTimeout: 10 * time.Second,
			IdleTimeout:       60 * time.Second,
			// Slow bodies watch the request context: cancelling the base
			// context on shutdown ends them.
			BaseContext: func(net.Listener) context.Context { return ctx },
		}
	}
	for i, ln := range og.listeners {
		srv := newServer(og.Handler(i))
		if og.kernel {
			ln = rxstamp.Serve(srv, ln)
		}
		all = append(all, srvLn{srv, ln})
	}
	if og.adminLn != nil {
		all = append(all, srvLn{newServer(og.AdminHandler()), og.adminLn})
	}
	urls, admin := append([]string(nil), og.urls...), og.adminURL

	return func() error {
		defer cancel()
		og.log.Info().Strs("urls", urls).Str("admin", admin).Str("profile", og.profile.Name).
			Str("penalty", og.profile.Penalty.Describe()).Msg("stub origin serving")
		errc := make(chan error, len(all))
		var wg sync.WaitGroup
		for _, x := range all {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if err := x.srv.Serve(x.ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
					errc <- fmt.Errorf("serve %s: %w", x.ln.Addr(), err)
				}
			}()
		}
		var err error
		select {
		case <-ctx.Done():
		case err = <-errc:
		}
		sctx, scancel := context.WithTimeout(context.WithoutCancel(ctx), og.shutTO)
		cancel()
		for _, x := range all {
			if e := x.srv.Shutdown(sctx); e != nil {
				x.srv.Close()
			}
		}
		scancel()
		wg.Wait()
		og.log.Info().Msg("stub origin stopped")
		og.mu.Lock()
		og.runErr = err
		og.mu.Unlock()
		close(done)
		return err
	}, nil
}

// Close stops a running origin and waits for Run to return, or closes the
// bound listeners when it never ran. It returns Run's error.
func (og *Origin) Close() error {
	og.mu.Lock()
	if !og.running {
		for _, l := range og.listeners {
			l.Close()
		}
		if og.adminLn != nil {
			og.adminLn.Close()
		}
		og.mu.Unlock()
		return nil
	}
	cancel, done := og.cancel, og.done
	og.mu.Unlock()
	cancel()
	<-done
	og.mu.Lock()
	defer og.mu.Unlock()
	return og.runErr
}

// Profile returns the origin's profile (read-only).
func (og *Origin) Profile() *Profile { return og.profile }

// Faults returns the faults in force.
func (og *Origin) Faults() Faults {
	f := *og.faults.Load()
	f.Authorities = append([]int(nil), f.Authorities...)
	return f
}

// SetFaults replaces the faults in force.
func (og *Origin) SetFaults(f Faults) error {
	if err := f.validate(len(og.shards)); err != nil {
		return fmt.Errorf("faults: %w", err)
	}
	f.Authorities = append([]int(nil), f.Authorities...)
	og.faults.Store(&f)
	og.log.Info().Interface("faults", f).Msg("faults set")
	return nil
}

// Stats returns a snapshot of every authority, identities included.
func (og *Origin) Stats() Stats { return og.stats(true) }

func (og *Origin) stats(withIdentities bool) Stats {
	st := Stats{Profile: og.profile.Name, Start: og.start, Now: og.clk.Now()}
	for _, s := range og.shards {
		st.Authorities = append(st.Authorities, s.stats(withIdentities, st.Now))
	}
	return st
}

// identify maps r to its caller identity. A request with an unknown or
// malformed bearer token is admitted as anonymous (so that a flood of bad
// tokens is still limited) and then answered 401; tokenOK reports that.
func (og *Origin) identify(r *http.Request) (c caller, tokenOK bool) {
	rc := og.profile.routeClass(r.URL.Path)
	tokenOK = true
	if auth := r.Header.Get("Authorization"); auth != "" {
		scheme, tok, _ := strings.Cut(auth, " ")
		if strings.EqualFold(scheme, "Bearer") {
			if t, ok := og.profile.Tokens[strings.TrimSpace(tok)]; ok {
				qn := t.Quota
				if qn == "" {
					qn = "default"
				}
				return caller{
					key:        "tenant=" + t.Tenant + " principal=" + t.Principal + " route=" + rc,
					group:      "tenant=" + t.Tenant,
					kind:       "authenticated",
					quota:      og.quotas[qn],
					tenant:     t.Tenant,
					principal:  t.Principal,
					routeClass: rc,
				}, true
			}
		}
		tokenOK = false
	}
	key := "anon:" + anonymousHash(og.salt, networkOf(r.RemoteAddr), rc)
	return caller{key: key, group: key, kind: "anonymous", quota: og.quotas["anonymous"], routeClass: rc}, tokenOK
}

// networkOf returns the caller's network range: /24 for IPv4 (IPv4-mapped
// IPv6 included), /56 for IPv6. An unparsable address maps to one shared
// range, which is the conservative choice.
func networkOf(remoteAddr string) netip.Prefix {
	ap, err := netip.ParseAddrPort(remoteAddr)
	if err != nil {
		return netip.Prefix{}
	}
	a := ap.Addr().Unmap()
	bits := 56
	if a.Is4() {
		bits = 24
	}
	p, _ := a.WithZone("").Prefix(bits)
	return p
}

func anonymousHash(salt []byte, p netip.Prefix, routeClass string) string {
	h := sha256.New()
	h.Write(salt)
	h.Write([]byte{0})
	h.Write([]byte(p.String()))
	h.Write([]byte{0})
	h.Write([]byte(routeClass))
	return hex.EncodeToString(h.Sum(nil)[:8])
}
