// Package bandwidth caps the bytes per second of origin bodies: per
// authority (its policy's Limits.Bandwidth, over all its bodies in flight on
// this pod) and per pod (one cap over every body, run's --max-bandwidth).
// Each cap is a token bucket (golang.org/x/time/rate) spent on body reads:
// Caps is the fetch client's fetch.Throttle, and a body asks it before each
// read for at most one read's worth (Burst). A policy change (SetPolicy)
// applies from each body's next read on.
//
// It does not pace requests (package pacer does: floors and in-flight caps
// still apply), does not throttle the bodies the fetch client drains
// itself (redirects and errors, at most 64 KiB each), and does not share
// buckets across pods: the pod that owns an authority's partition is the
// only one that fetches from it, so its buckets are the authority's. A
// hand-over starts the new owner's bucket with one read's worth.
package bandwidth

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/time/rate"

	"github.com/mirrorworker/mirrorworker/authority"
	"github.com/mirrorworker/mirrorworker/clock"
	"github.com/mirrorworker/mirrorworker/fetch"
	"github.com/mirrorworker/mirrorworker/pacer"
)

// The bounds of a cap's burst: what one read may take at once.
const (
	MinBurst = 1 << 10
	MaxBurst = 64 << 10
)

// Burst is the bucket size of a cap of r bytes per second, and so the most
// one read takes at once: a sixteenth of a second's worth, within MinBurst
// and MaxBurst. Over any window of t, a cap's bodies read at most r×t plus
// one Burst (the bucket starts full), plus, for each body, the rest of the
// one read it was granted before the window began.
func Burst(r int64) int {
	return int(max(min(r/16, MaxBurst), MinBurst))
}

// The cap label of the metrics.
const (
	CapAuthority = "authority"
	CapPod       = "pod"
)

// OtherLabel labels every authority when Options.Labels is nil.
const OtherLabel = "other"

// Options configure Caps. A nil *Options is the defaults.
type Options struct {
	// Policy is the policy in force at the start (SetPolicy replaces it);
	// nil: no authority is capped.
	Policy *pacer.Policy
	// PodLimit caps the bytes per second of every body on this pod
	// together; 0: no cap.
	PodLimit int64
	// Clock times the waits; nil is the wall clock.
	Clock clock.Clock
	// Registerer gets the metrics; nil keeps them private.
	Registerer prometheus.Registerer
	// Labels returns the host and port labels of an authority, with their
	// number capped (the worker's metrics' labeller); nil labels every
	// authority OtherLabel.
	Labels func(auth string) (host, port string)
}

// Caps holds the token buckets of one pod. It is safe for concurrent use.
type Caps struct {
	clk    clock.Clock
	pod    *rate.Limiter // nil: no pod cap
	labels func(string) (string, string)
	m      metrics
	policy atomic.Pointer[pacer.Policy]

	mu      sync.Mutex
	keys    map[string]*key // by pace key (an authority or a group): those with bodies in flight, or a bucket not full
	sweepAt int             // sweep idle keys when there are more than this
}

var _ fetch.Throttle = (*Caps)(nil)

// key is one authority's bucket.
type key struct {
	lim  atomic.Pointer[rate.Limiter] // nil: not capped
	refs int                          // bodies in flight; guarded by Caps.mu
}

type metrics struct {
	bytes, wait *prometheus.CounterVec
}

// New returns the Caps of o.
func New(o *Options) (*Caps, error) {
	if o == nil {
		o = &Options{}
	}
	c := &Caps{clk: o.Clock, labels: o.Labels, keys: map[string]*key{}, sweepAt: 64}
	if c.clk == nil {
		c.clk = clock.Real{}
	}
	if c.labels == nil {
		c.labels = func(string) (string, string) { return OtherLabel, OtherLabel }
	}
	if o.PodLimit < 0 || o.PodLimit > 0 && o.PodLimit < pacer.MinPolicyBandwidth {
		return nil, fmt.Errorf("bandwidth: pod cap %d B/s: want 0 (none) or at least %d", o.PodLimit, pacer.MinPolicyBandwidth)
	}
	if o.PodLimit > 0 {
		c.pod = newLimiter(o.PodLimit)
	}
	c.policy.Store(o.Policy)
	var err error
	if c.m, err = newMetrics(o.Registerer); err != nil {
		return nil, err
	}
	return c, nil
}

func newMetrics(reg prometheus.Registerer) (metrics, error) {
	m := metrics{
		bytes: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "mirrorworker", Name: "bandwidth_throttled_bytes_total",
			Help: "Body bytes whose read waited for a bandwidth cap, by authority (host labels capped) and cap (authority: its policy's bandwidth; pod: --max-bandwidth)."},
			[]string{"host", "port", "cap"}),
		wait: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "mirrorworker", Name: "bandwidth_wait_seconds_total",
			Help: "Time body reads waited for a bandwidth cap, by authority (host labels capped) and cap; not counted against the minimum transfer rate."},
			[]string{"host", "port", "cap"}),
	}
	if reg == nil {
		return m, nil
	}
	for _, v := range []**prometheus.CounterVec{&m.bytes, &m.wait} {
		if err := reg.Register(*v); err != nil {
			var are prometheus.AlreadyRegisteredError
			if !errors.As(err, &are) {
				return m, fmt.Errorf("register bandwidth metrics: %w", err)
			}
			*v = are.ExistingCollector.(*prometheus.CounterVec) // a second pipeline on one registry
		}
	}
	// Exported at 0 from the start, so that the dashboard's panels of a
	// worker no cap has slowed yet say 0, not "No data"; the authorities'
	// own series come with their first wait.
	for _, c := range []string{CapAuthority, CapPod} {
		m.bytes.WithLabelValues(OtherLabel, OtherLabel, c)
		m.wait.WithLabelValues(OtherLabel, OtherLabel, c)
	}
	return m, nil
}

func newLimiter(r int64) *rate.Limiter { return rate.NewLimiter(rate.Limit(r), Burst(r)) }

// set gives k the cap r (0: none) at now. A cap changed from one rate to
// another keeps its bucket's tokens; a new cap starts with a full bucket.
func (k *key) set(r int64, now time.Time) {
	cur := k.lim.Load()
	switch {
	case r <= 0:
		k.lim.Store(nil)
	case cur == nil:
		k.lim.Store(newLimiter(r))
	case cur.Limit() != rate.Limit(r):
		cur.SetLimitAt(now, rate.Limit(r))
		cur.SetBurstAt(now, Burst(r))
	}
}

// idle reports whether k may be forgotten at now: no body holds it and its
// bucket is as a new one would be. Caps.mu must be held.
func (k *key) idleLocked(now time.Time) bool {
	if k.refs > 0 {
		return false
	}
	lim := k.lim.Load()
	return lim == nil || lim.TokensAt(now) >= float64(lim.Burst())
}

// SetPolicy replaces the policy whose Limits.Bandwidth caps each
// authority. Bodies in flight take the new cap from their next read; a
// bucket changed from one cap to another keeps its tokens. A nil p caps no
// authority.
func (c *Caps) SetPolicy(p *pacer.Policy) {
	c.policy.Store(p)
	now := c.clk.Now()
	c.mu.Lock()
	defer c.mu.Unlock()
	for name, k := range c.keys {
		k.set(p.Limits(name).Bandwidth, now)
	}
}

// bandwidthOf is the cap of a pace key under the policy in force.
func (c *Caps) bandwidthOf(auth string) int64 {
	p := c.policy.Load()
	if p == nil {
		return 0
	}
	return p.Limits(auth).Bandwidth
}

// Body returns the throttle of one body of a (fetch.Throttle).
// A member of a politeness group shares its group's bucket (the bucket is
// keyed by the pace key, pacer.Policy.PaceKey); a body keeps the bucket it
// began with when a policy change moves its authority.
func (c *Caps) Body(a authority.Authority) fetch.BodyThrottle {
	name := a.String()
	pk := c.policy.Load().PaceKey(name)
	now := c.clk.Now()
	c.mu.Lock()
	defer c.mu.Unlock()
	k := c.keys[pk]
	if k == nil {
		k = &key{}
		k.set(c.bandwidthOf(pk), now)
		c.keys[pk] = k
		c.sweepLocked(now)
	}
	k.refs++
	host, port := c.labels(name)
	return &body{c: c, k: k, name: name, host: host, port: port}
}

// sweepLocked forgets idle keys once there are more than sweepAt, so the
// map holds the authorities with bodies in flight and those whose buckets
// are still refilling, however many authorities pass. c.mu must be held.
func (c *Caps) sweepLocked(now time.Time) {
	if len(c.keys) <= c.sweepAt {
		return
	}
	for name, k := range c.keys {
		if k.idleLocked(now) {
			delete(c.keys, name)
		}
	}
	c.sweepAt = max(64, 2*len(c.keys))
}

// tracked is the number of buckets held, for tests.
func (c *Caps) tracked() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.keys)
}

// body is one body's share: fetch.BodyThrottle. Wait is called by one
// reader at a time; Close may come concurrently with a Wait.
type body struct {
	c          *Caps
	k          *key
	name       string
	host, port string
	closed     atomic.Bool
}

// Wait grants up to n bytes: the least of n and the bursts of the caps in
// force, once every cap's bucket has them. The pod's cap is taken first and
// the authority's last, right before the read, so the authority's bytes go
// at the instants its bucket grants them (the promise to the origin); a
// body waiting for its authority holds at most one read's worth of the
// pod's.
func (b *body) Wait(ctx context.Context, n int) (int, error) {
	pod, own := b.c.pod, b.k.lim.Load()
	var err error
	if pod != nil {
		if n, err = b.take(ctx, pod, min(n, pod.Burst()), CapPod); err != nil {
			return 0, err
		}
	}
	if own != nil {
		if n, err = b.take(ctx, own, min(n, own.Burst()), CapAuthority); err != nil {
			return 0, err
		}
	}
	return n, nil
}

// take reserves n tokens of lim and waits until they are due; on ctx's end
// the reservation is given back.
func (b *body) take(ctx context.Context, lim *rate.Limiter, n int, capName string) (int, error) {
	for {
		now := b.c.clk.Now()
		r := lim.ReserveN(now, n)
		if !r.OK() { // the burst was lowered since it was read
			n = max(1, min(n, lim.Burst()))
			continue
		}
		d := r.DelayFrom(now)
		if d == 0 {
			return n, nil
		}
		t := b.c.clk.NewTimer(d)
		select {
		case <-t.C():
			b.c.m.bytes.WithLabelValues(b.host, b.port, capName).Add(float64(n))
			b.c.m.wait.WithLabelValues(b.host, b.port, capName).Add(d.Seconds())
			return n, nil
		case <-ctx.Done():
			t.Stop()
			end := b.c.clk.Now()
			r.CancelAt(end)
			b.c.m.wait.WithLabelValues(b.host, b.port, capName).Add(end.Sub(now).Seconds())
			return 0, ctx.Err()
		}
	}
}

// Close ends the body's hold on its authority's bucket; the bucket is
// forgotten now if no other body holds it and it is full.
func (b *body) Close() {
	if b.closed.Swap(true) {
		return
	}
	now := b.c.clk.Now()
	b.c.mu.Lock()
	defer b.c.mu.Unlock()
	b.k.refs--
	if b.k.idleLocked(now) && b.c.keys[b.name] == b.k {
		delete(b.c.keys, b.name)
	}
}
