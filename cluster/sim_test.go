package cluster_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/http"
	"sort"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/mirrorworker/mirrorworker/authority"
	"github.com/mirrorworker/mirrorworker/clock"
	"github.com/mirrorworker/mirrorworker/cluster"
	"github.com/mirrorworker/mirrorworker/jobs"
	"github.com/mirrorworker/mirrorworker/pacer"
)

// memStore is a KV bucket with a TTL on a fake clock: what MIRROR_LEASES
// and MIRROR_PODS are to the Manager, in memory, so that a simulation can
// run minutes of a cluster's life in milliseconds.
type memStore struct {
	clk *clock.Fake
	ttl time.Duration

	mu  sync.Mutex
	rev uint64
	m   map[string]*memEntry
}

type memEntry struct {
	val []byte
	rev uint64
	at  time.Time
}

var _ cluster.Store = (*memStore)(nil)

func newMemStore(clk *clock.Fake, ttl time.Duration) *memStore {
	return &memStore{clk: clk, ttl: ttl, m: map[string]*memEntry{}}
}

func (s *memStore) liveLocked(key string) *memEntry {
	e := s.m[key]
	if e == nil || s.clk.Now().Sub(e.at) >= s.ttl {
		delete(s.m, key)
		return nil
	}
	return e
}

func (s *memStore) putLocked(key string, v []byte) uint64 {
	s.rev++
	s.m[key] = &memEntry{val: v, rev: s.rev, at: s.clk.Now()}
	return s.rev
}

func (s *memStore) Create(_ context.Context, key string, v []byte) (uint64, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.liveLocked(key) != nil {
		return 0, fmt.Errorf("key %s exists", key)
	}
	return s.putLocked(key, v), nil
}

func (s *memStore) Update(_ context.Context, key string, v []byte, rev uint64) (uint64, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	e := s.liveLocked(key)
	if e == nil || e.rev != rev {
		return 0, cluster.ErrLost
	}
	return s.putLocked(key, v), nil
}

func (s *memStore) Delete(_ context.Context, key string, rev uint64) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if e := s.liveLocked(key); e != nil && (rev == 0 || e.rev == rev) {
		delete(s.m, key)
	}
	return nil
}

func (s *memStore) Put(_ context.Context, key string, v []byte) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.putLocked(key, v)
	return nil
}

func (s *memStore) Keys(context.Context) ([]string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []string
	for k := range s.m {
		if s.liveLocked(k) != nil {
			out = append(out, k)
		}
	}
	sort.Strings(out)
	return out, nil
}

// simOrigin is the origin as it times requests: every start, what it told
// each authority, and how many requests were in flight.
type simOrigin struct {
	floor    time.Duration
	cap      int
	auths    map[string]*simAuth
	breaches []string
}

type simAuth struct {
	throttleEvery int // 0: never throttles
	retryAfter    time.Duration
	n             int
	starts        []time.Time
	until         time.Time
	cooled        bool // told to wait; the probe is owed
	probing       bool
	inflight      int
	byPod         map[string]int
}

type simReq struct {
	pod    *simPod
	auth   string
	pm     pacer.Permit
	done   time.Time
	status int
	hdr    http.Header
	probe  bool
}

func (o *simOrigin) breach(format string, a ...any) {
	o.breaches = append(o.breaches, fmt.Sprintf(format, a...))
}

func (o *simOrigin) start(now time.Time, pod *simPod, auth string, pm pacer.Permit, rng *rand.Rand) *simReq {
	a := o.auths[auth]
	if k := len(a.starts); k > 0 && now.Sub(a.starts[k-1]) < o.floor {
		o.breach("%s: start at %s by %s only %s after the last", auth, now.Format("15:04:05.000"), pod.id, now.Sub(a.starts[k-1]))
	}
	if now.Before(a.until) {
		o.breach("%s: start at %s by %s while told to wait until %s", auth, now.Format("15:04:05.000"), pod.id, a.until.Format("15:04:05.000"))
	}
	if a.probing {
		o.breach("%s: start at %s by %s while the probe runs", auth, now.Format("15:04:05.000"), pod.id)
	}
	r := &simReq{pod: pod, auth: auth, pm: pm, done: now.Add(time.Duration(5+rng.IntN(60)) * time.Millisecond), status: 200}
	if a.cooled && !now.Before(a.until) {
		a.cooled, a.probing, r.probe = false, true, true
	}
	a.starts = append(a.starts, now)
	a.byPod[pod.id]++
	a.inflight++
	if a.inflight > o.cap {
		o.breach("%s: %d requests in flight at %s", auth, a.inflight, now.Format("15:04:05.000"))
	}
	if a.throttleEvery > 0 && a.n%a.throttleEvery == a.throttleEvery-1 && !r.probe {
		r.status = http.StatusTooManyRequests
		r.hdr = http.Header{"Retry-After": {strconv.Itoa(int(a.retryAfter / time.Second))}}
	}
	a.n++
	return r
}

// answer is when the origin sends r's response.
func (o *simOrigin) answer(now time.Time, r *simReq) { o.end(now, r, true) }

// closed is when r's connection closes before its response reaches anyone
// (its pod was killed): the origin has told nobody to wait.
func (o *simOrigin) closed(now time.Time, r *simReq) { o.end(now, r, false) }

func (o *simOrigin) end(now time.Time, r *simReq, delivered bool) {
	a := o.auths[r.auth]
	a.inflight--
	if r.probe {
		a.probing = false
	}
	if delivered && r.status == http.StatusTooManyRequests {
		a.until = now.Add(a.retryAfter)
		a.cooled = true
	}
}

// simPod is one mirrorworker process: a lease manager and a pacer.
type simPod struct {
	id       string
	m        *cluster.Manager
	pc       *pacer.Pacer
	killed   bool
	pausedTo time.Time
	nextStep time.Time
	inflight []*simReq
	held     []*simReq // answered while the pod was stopped
	inbox    []simFact
	sim      *simulation
}

type simFact struct {
	at time.Time
	ev pacer.Event
}

func (p *simPod) Acquired(_ context.Context, part int, since time.Time) error {
	now := p.sim.clk.Now()
	for _, a := range p.sim.order {
		if jobs.Partition(authority.KeyOf(a), p.sim.parts) == part {
			p.pc.Fence(now, a, since)
		}
	}
	return nil
}

// Release ends the partition's requests at once (as a pod does when the
// release context runs out): the connections close, the origin stops
// counting them in flight.
func (p *simPod) Release(_ context.Context, part int) {
	// Called from the Manager's own goroutines: the simulation's lock
	// orders it with the simulated world.
	p.sim.mu.Lock()
	defer p.sim.mu.Unlock()
	now := p.sim.clk.Now()
	keep := p.inflight[:0]
	for _, r := range p.inflight {
		if jobs.Partition(authority.KeyOf(r.auth), p.sim.parts) == part {
			p.sim.origin.answer(now, &simReq{auth: r.auth, probe: r.probe})
			p.pc.Done(now, r.pm, pacer.Response{Cancelled: true})
			p.sim.cancelled[r] = true
			continue
		}
		keep = append(keep, r)
	}
	p.inflight = keep
}

func (p *simPod) Status() []byte { return []byte(`{}`) }

type simulation struct {
	mu        sync.Mutex // the simulated world; not held while a Manager steps
	clk       *clock.Fake
	rng       *rand.Rand
	leases    *memStore
	pods      *memStore
	ttl       time.Duration
	parts     int
	order     []string
	origin    *simOrigin
	all       []*simPod
	cancelled map[*simReq]bool
	events    []string
}

func (s *simulation) addPod(t *testing.T) *simPod {
	id := fmt.Sprintf("pod-%d", len(s.all))
	p := &simPod{id: id, sim: s}
	p.pc = pacer.New(&pacer.Options{
		Policy: &pacer.Policy{Default: pacer.Limits{Floor: s.origin.floor, MaxInFlight: s.origin.cap}},
		Rand:   s.rng.Float64,
		OnEvent: func(ev pacer.Event) {
			for _, q := range s.all {
				if q != p && !q.killed {
					q.inbox = append(q.inbox, simFact{at: s.clk.Now().Add(2 * time.Millisecond), ev: ev})
				}
			}
		},
	})
	m, err := cluster.New(s.leases, s.pods, p, cluster.Options{PodID: id, Partitions: s.parts, TTL: s.ttl, Clock: s.clk, Logger: zerolog.Nop()})
	if err != nil {
		t.Fatal(err)
	}
	p.m = m
	// A pod that joins has restored every fact so far (ADR 0004): give it
	// what the live pods know by replaying their facts into it.
	for _, q := range s.all {
		if !q.killed {
			for _, st := range q.pc.Snapshot(s.clk.Now()) {
				if !st.CooldownUntil.IsZero() {
					p.pc.Apply(s.clk.Now(), pacer.Event{Type: pacer.EventCooldown, Authority: st.Authority, At: s.clk.Now(), Until: st.CooldownUntil, Interval: st.Interval})
				}
			}
		}
	}
	s.all = append(s.all, p)
	s.events = append(s.events, fmt.Sprintf("%s join %s", s.clk.Now().Format("15:04:05.000"), id))
	return p
}

func (s *simulation) live() []*simPod {
	var out []*simPod
	for _, p := range s.all {
		if !p.killed {
			out = append(out, p)
		}
	}
	return out
}

func (s *simulation) step(t *testing.T, ctx context.Context) {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.clk.Now()
	for _, p := range s.all {
		if p.killed {
			continue
		}
		// Answers due: the origin sends them whether or not the pod runs.
		keep := p.inflight[:0]
		for _, r := range p.inflight {
			if s.cancelled[r] {
				continue
			}
			if r.done.After(now) {
				keep = append(keep, r)
				continue
			}
			s.origin.answer(r.done, r)
			p.held = append(p.held, r)
		}
		p.inflight = keep
		if now.Before(p.pausedTo) {
			continue
		}
		for _, r := range p.held {
			p.pc.Done(now, r.pm, pacer.Response{Status: r.status, Header: r.hdr})
		}
		p.held = p.held[:0]
		k := 0
		for _, f := range p.inbox {
			if f.at.After(now) {
				p.inbox[k] = f
				k++
				continue
			}
			p.pc.Apply(now, f.ev)
		}
		p.inbox = p.inbox[:k]
		// The dispatcher may run before the lease loop after a stop: it
		// must find its validity gone by itself.
		s.dispatch(p, now)
		if !now.Before(p.nextStep) {
			s.mu.Unlock()
			p.m.Step(ctx)
			s.mu.Lock()
			p.nextStep = now.Add(s.ttl / 4)
		}
	}
}

func (s *simulation) dispatch(p *simPod, now time.Time) {
	for _, a := range s.order {
		part := jobs.Partition(authority.KeyOf(a), s.parts)
		if !p.m.Owns(part) {
			continue
		}
		pm, err := p.pc.Acquire(now, a, 0)
		if err != nil {
			continue
		}
		if pm, err = p.pc.Confirm(now, pm); err != nil || pm.Start.After(now) || !p.m.Owns(part) {
			p.pc.Done(now, pm, pacer.Response{Cancelled: true})
			continue
		}
		p.inflight = append(p.inflight, s.origin.start(now, p, a, pm, s.rng))
	}
}

// TestSimulatedClusterKeepsOnePace runs pods on a fake clock with random
// kills, stops longer than the lease TTL (SIGSTOP) and joins, every pod
// always eager to send, and checks the politeness contract as the origin
// sees it in every seed: no two starts to an authority closer than the
// floor, none while the origin said wait, one probe at a time, never more
// than the in-flight cap; and the work keeps moving between pods.
func TestSimulatedClusterKeepsOnePace(t *testing.T) {
	seeds := 24
	if raceEnabled {
		seeds = 4
	}
	const (
		ttl  = 2 * time.Second
		run  = 90 * time.Second
		tick = 5 * time.Millisecond
	)
	for seed := range seeds {
		t.Run(fmt.Sprint("seed", seed), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(uint64(seed), 7))
			clk := clock.NewFake(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
			s := &simulation{
				clk: clk, rng: rng, ttl: ttl, parts: 8,
				leases: newMemStore(clk, ttl), pods: newMemStore(clk, ttl),
				// Floors on both sides of the lease loop's period (TTL/4), so
				// that a hand-over sooner than the floor is possible.
				origin:    &simOrigin{floor: []time.Duration{100 * time.Millisecond, 700 * time.Millisecond, 1500 * time.Millisecond}[seed%3], cap: 2, auths: map[string]*simAuth{}},
				cancelled: map[*simReq]bool{},
			}
			for i := range 12 {
				a := fmt.Sprintf("origin%d.example:443", i)
				sa := &simAuth{byPod: map[string]int{}}
				if i%3 == 0 {
					sa.throttleEvery, sa.retryAfter = 5+rng.IntN(10), time.Duration(1+rng.IntN(3))*time.Second
				}
				s.origin.auths[a] = sa
				s.order = append(s.order, a)
			}
			for range 3 {
				s.addPod(t)
			}
			ctx := context.Background()
			end := clk.Now().Add(run)
			kills, stops, joins := 0, 0, 0
			for clk.Now().Before(end) {
				clk.Advance(tick)
				s.mu.Lock()
				if rng.IntN(int(3*time.Second/tick)) == 0 {
					live := s.live()
					switch r := rng.IntN(3); {
					case r == 0 && len(live) > 1:
						p := live[rng.IntN(len(live))]
						p.killed = true
						for _, q := range p.inflight {
							if !s.cancelled[q] {
								s.origin.closed(clk.Now(), q) // the kernel closes its connections
							}
						}
						p.inflight = nil
						kills++
						s.events = append(s.events, fmt.Sprintf("%s kill %s", clk.Now().Format("15:04:05.000"), p.id))
					case r == 1 && len(live) > 0:
						p := live[rng.IntN(len(live))]
						d := ttl + time.Duration(rng.IntN(int(2*ttl)))
						p.pausedTo = clk.Now().Add(d)
						stops++
						s.events = append(s.events, fmt.Sprintf("%s stop %s for %s", clk.Now().Format("15:04:05.000"), p.id, d))
					case len(live) < 5:
						s.addPod(t)
						joins++
					}
				}
				s.mu.Unlock()
				s.step(t, ctx)
			}
			s.mu.Lock()
			defer s.mu.Unlock()
			served := 0
			for _, a := range s.origin.auths {
				if len(a.byPod) > 1 {
					served++
				}
			}
			total := 0
			for _, a := range s.origin.auths {
				total += len(a.starts)
			}
			if len(s.origin.breaches) > 0 {
				t.Errorf("%d breaches (first %v); events: %v", len(s.origin.breaches), s.origin.breaches[:min(5, len(s.origin.breaches))], s.events)
			}
			if total < int(run/s.origin.floor)*2 {
				t.Errorf("only %d requests in %s: the cluster stalled; events %v", total, run, s.events)
			}
			if kills+stops+joins > 0 && served == 0 {
				t.Errorf("no authority was ever served by two pods: nothing moved")
			}
			t.Logf("%d requests; %d kills, %d stops, %d joins; %d authorities served by more than one pod", total, kills, stops, joins, served)
		})
	}
}
