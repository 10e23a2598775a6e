// Package strategy provides the politeness strategies the load test compares
// against the HostPacer: each is a small pacer that behaves the way a
// well-known kind of system reacts to throttling (a fixed-interval pacer, a
// crawler's domain backoff, a package proxy's upstream cooldown, a client-side
// rate-limit library), and "hostpacer" is this project's pacer.New.
//
// Every strategy keeps the same floor spacing and per-authority in-flight cap
// as the HostPacer, so a side-by-side run compares only how each one reacts to
// throttling. Every time constant of a strategy (the 2 s first step, the 60 s
// fallback, the 30 min quiet window...) is multiplied by Options.Scale, so a
// load test can compress an hour of politeness into a minute. Values that
// come from the origin (Retry-After, rate-limit resets) are never scaled: the
// origin is already running on compressed time.
//
// It does not: derive authorities, sleep, read a clock, bound its memory
// (an entry per authority is kept for the life of the value, which suits a
// load test and nothing else), or publish events. These are comparison
// baselines, not production pacers.
package strategy

import (
	"fmt"
	"math/rand/v2"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/mirrorworker/mirrorworker/pacer"
)

// Pacer is what the worker needs from a politeness strategy: the worker's own
// Pacer interface, repeated here so this package does not import the worker.
type Pacer interface {
	Acquire(now time.Time, auth string, maxWait time.Duration) (pacer.Permit, error)
	Done(now time.Time, pm pacer.Permit, r pacer.Response) pacer.Verdict
}

// Names of the strategies New knows, the HostPacer first.
const (
	HostPacer  = "hostpacer"
	Fixed      = "fixed"
	Escalate   = "escalate"
	EscalateRA = "escalate-ra"
	Cooldown   = "cooldown"
	Feedback   = "feedback"
)

// Names returns every strategy name New accepts, in report order.
func Names() []string {
	return []string{HostPacer, Fixed, Escalate, EscalateRA, Cooldown, Feedback}
}

// Options configure a strategy. The zero value is the defaults.
type Options struct {
	// Floor is the minimum spacing between request starts to one authority.
	// Zero means the default 1 s; a negative value means no floor.
	Floor time.Duration
	// MaxInFlight is the per-authority in-flight cap; zero means 2.
	MaxInFlight int
	// Scale multiplies every time constant of the strategy (not the floor,
	// which is policy, and not delays read from the origin). Zero means 1.
	Scale float64
	// Rand returns a uniform float in [0, 1) for jitter; nil uses math/rand/v2.
	Rand func() float64
	// StartGuard is extra spacing added to the interval, as
	// pacer.Options.StartGuard: zero means the HostPacer's default (a
	// quarter of the floor, at most pacer.MaxStartGuard), negative none.
	// Every strategy gets the same, so that only learning differs.
	StartGuard time.Duration
}

// New returns the strategy called name. The result is safe for concurrent
// use.
func New(name string, o Options) (Pacer, error) {
	if o.Scale < 0 {
		return nil, fmt.Errorf("strategy %s: negative scale %v", name, o.Scale)
	}
	if o.MaxInFlight < 0 {
		return nil, fmt.Errorf("strategy %s: negative in-flight cap %d", name, o.MaxInFlight)
	}
	if name == HostPacer {
		return newHostPacer(o)
	}
	var r rules
	switch name {
	case Fixed:
		r = fixedRules{}
	case Escalate:
		r = escalateRules{}
	case EscalateRA:
		r = escalateRARules{}
	case Cooldown:
		r = cooldownRules{}
	case Feedback:
		r = feedbackRules{}
	default:
		return nil, fmt.Errorf("unknown strategy %q (want one of %v)", name, Names())
	}
	return newEngine(r, o), nil
}

// Parse splits a comma-separated list of strategy names ("all" for every
// one), keeping the order given and refusing unknown or repeated names.
func Parse(list string) ([]string, error) {
	if list == "all" {
		return Names(), nil
	}
	known := map[string]bool{}
	for _, n := range Names() {
		known[n] = true
	}
	var out []string
	seen := map[string]bool{}
	for _, n := range strings.Split(list, ",") {
		switch {
		case n == "":
			return nil, fmt.Errorf("strategy list %q: empty name", list)
		case !known[n]:
			sorted := Names()
			sort.Strings(sorted)
			return nil, fmt.Errorf("unknown strategy %q (want all or a list of %v)", n, sorted)
		case seen[n]:
			return nil, fmt.Errorf("strategy %q listed twice", n)
		}
		seen[n] = true
		out = append(out, n)
	}
	return out, nil
}

// Constants every strategy scales, named after the documents they come from.
const (
	firstStep   = 2 * time.Second  // first escalation step
	escalateCap = 60 * time.Second // escalation cap
	quietWindow = 30 * time.Minute // no throttling for this long: relax
	fallback    = 60 * time.Second // cooldown without a usable hint
	cooldownCap = 600 * time.Second
	feedbackCap = 15 * time.Minute
	backoffBase = 1 * time.Second
	backoffCap  = 30 * time.Second
)

// entry is one authority's state. Fields are read and written with the
// engine's mutex held.
type entry struct {
	interval  time.Duration // spacing in force, never below the floor
	lastStart time.Time     // the latest granted start (possibly reserved ahead)
	started   time.Time     // the latest actual start (Confirm)
	inFlight  int

	until     time.Time // no request before this (cooldown or pause)
	confirm   bool      // the pause is over but a probe must confirm it
	probing   bool      // the probe is in flight
	ceiling   time.Duration
	lastThrot time.Time // last throttling signal (decay starts here)
	decayedAt time.Time // last lazy decay step
	streak    int       // consecutive 429s (feedback)
}

// rules is what distinguishes one strategy from another: how it reads a
// response and how its state relaxes with time. Both methods are called with
// the engine's mutex held.
type rules interface {
	settleLocked(e *engine, now time.Time, st *entry)
	learnLocked(e *engine, now time.Time, st *entry, pm pacer.Permit, r pacer.Response) pacer.Verdict
}

// engine holds the decision common to every strategy (cooling, probe,
// in-flight cap, floor spacing with short-wait reservation, in docs/contract.md
// section 3's order) and delegates learning to its rules. The decision copies the
// HostPacer's, refusal waits included (pacer.ProbeWait,
// pacer.InFlightMinWait, scaled as the HostPacer scales them), so that a side-by-side
// run differs only in how each strategy learns. Safe for concurrent use.
type engine struct {
	rules       rules
	floor       time.Duration
	startGuard  time.Duration
	maxInFlight int
	scale       float64

	randMu sync.Mutex
	rand   func() float64

	mu      sync.Mutex
	entries map[string]*entry
}

func newEngine(r rules, o Options) *engine {
	e := &engine{rules: r, floor: o.Floor, startGuard: o.StartGuard, maxInFlight: o.MaxInFlight, scale: o.Scale, rand: o.Rand, entries: map[string]*entry{}}
	switch {
	case e.floor == 0:
		e.floor = time.Second
	case e.floor < 0:
		e.floor = 0
	}
	if e.maxInFlight == 0 {
		e.maxInFlight = 2
	}
	switch {
	case e.startGuard == 0:
		e.startGuard = min(e.floor/4, pacer.MaxStartGuard)
	case e.startGuard < 0:
		e.startGuard = 0
	}
	if e.scale == 0 {
		e.scale = 1
	}
	if e.rand == nil {
		e.rand = rand.Float64
	}
	return e
}

// d scales a strategy constant.
func (e *engine) d(c time.Duration) time.Duration { return time.Duration(float64(c) * e.scale) }

func (e *engine) uniform() float64 {
	e.randMu.Lock()
	defer e.randMu.Unlock()
	return e.rand()
}

func (e *engine) entryLocked(auth string) *entry {
	st := e.entries[auth]
	if st == nil {
		st = &entry{interval: e.floor, ceiling: e.d(fallback)}
		e.entries[auth] = st
	}
	return st
}

// Acquire decides whether a request to auth may start at now, or within
// maxWait by reserving the next slot.
func (e *engine) Acquire(now time.Time, auth string, maxWait time.Duration) (pacer.Permit, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	st := e.entryLocked(auth)
	e.rules.settleLocked(e, now, st)
	if now.Before(st.until) {
		return pacer.Permit{}, &pacer.RefusedError{Authority: auth, Reason: pacer.ReasonCooling, Wait: st.until.Sub(now), Interval: st.interval, Until: st.until}
	}
	probe := false
	if st.confirm {
		if st.probing {
			return pacer.Permit{}, &pacer.RefusedError{Authority: auth, Reason: pacer.ReasonProbing, Wait: e.d(pacer.ProbeWait), Interval: st.interval}
		}
		probe = true
	}
	var gap time.Duration
	if !st.lastStart.IsZero() {
		gap = st.lastStart.Add(st.interval + e.guard()).Sub(now)
	}
	if st.inFlight >= e.maxInFlight {
		return pacer.Permit{}, &pacer.RefusedError{Authority: auth, Reason: pacer.ReasonInFlight, Wait: max(gap, st.interval, e.d(pacer.InFlightMinWait)), Interval: st.interval}
	}
	start := now
	if gap > 0 {
		if gap > maxWait {
			return pacer.Permit{}, &pacer.RefusedError{Authority: auth, Reason: pacer.ReasonSpacing, Wait: gap, Interval: st.interval}
		}
		start = now.Add(gap)
	}
	st.lastStart = start
	st.inFlight++
	if probe {
		st.probing = true
	}
	return pacer.Permit{Authority: auth, Start: start, Probe: probe, Interval: st.interval}, nil
}

// guard is the start guard (Options.StartGuard).
func (e *engine) guard() time.Duration { return e.startGuard }

var _ interface {
	Confirm(now time.Time, pm pacer.Permit) (pacer.Permit, error)
} = (*engine)(nil)

// Confirm re-checks a granted permit just before its request starts, as
// the HostPacer's Confirm does: a pause learned since the grant refuses it,
// and a request that would start closer than the interval (plus the start
// guard) to the latest actual start gets a later Start to wait for. Without
// it a request whose timer fired late and the next one, on time, leave
// closer than the floor: the sent<floor the load test reported for every
// strategy but hostpacer before the engine had this.
func (e *engine) Confirm(now time.Time, pm pacer.Permit) (pacer.Permit, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	st := e.entries[pm.Authority]
	if st == nil {
		return pm, nil
	}
	if now.Before(st.until) {
		return pm, &pacer.RefusedError{Authority: pm.Authority, Reason: pacer.ReasonCooling, Wait: st.until.Sub(now), Interval: st.interval, Until: st.until}
	}
	start := now
	if pm.Start.After(start) {
		start = pm.Start
	}
	if !st.started.IsZero() {
		if next := st.started.Add(st.interval + e.guard()); next.After(start) {
			start = next
		}
	}
	if start.After(now) {
		pm.Start = start
		if start.After(st.lastStart) {
			st.lastStart = start
		}
		return pm, nil
	}
	st.started = now
	if now.After(st.lastStart) {
		st.lastStart = now
	}
	return pm, nil
}

// Done reports what a granted request observed and returns the strategy's
// reading of it. A Permit this engine did not grant is ignored.
func (e *engine) Done(now time.Time, pm pacer.Permit, r pacer.Response) pacer.Verdict {
	e.mu.Lock()
	defer e.mu.Unlock()
	st := e.entries[pm.Authority]
	if st == nil {
		return pacer.Verdict{}
	}
	if st.inFlight > 0 {
		st.inFlight--
	}
	if pm.Probe {
		st.probing = false
	}
	if r.Cancelled || r.Err != nil || r.Status == 0 {
		// Nothing was learned; a probe's slot goes to the next caller.
		return pacer.Verdict{}
	}
	e.rules.settleLocked(e, now, st)
	v := e.rules.learnLocked(e, now, st, pm, r)
	if pm.Probe && !v.Throttled {
		st.confirm = false
		st.ceiling = e.d(fallback)
	}
	if v.Throttled && v.Until.IsZero() && now.Before(st.until) {
		v.Until = st.until
	}
	return v
}

// pauseLocked extends st's pause to now+d; a pause never shortens a longer
// one already in force.
func pauseLocked(st *entry, now time.Time, d time.Duration) {
	if u := now.Add(d); u.After(st.until) {
		st.until = u
	}
}

// escalateLocked sets st's interval to iv, never below the floor. As in the
// HostPacer, the next slot is the last start plus the interval in force, so
// an escalation also pushes back a slot not yet reserved.
func (e *engine) escalateLocked(st *entry, iv time.Duration) {
	st.interval = max(iv, e.floor)
}

// retryAfter reads a valid, positive Retry-After from r.
func retryAfter(r pacer.Response, now time.Time) (time.Duration, bool) {
	if r.Header == nil {
		return 0, false
	}
	v := r.Header.Get("Retry-After")
	if v == "" {
		return 0, false
	}
	d, ok := pacer.ParseRetryAfter(v, r.Header.Get("Date"), now)
	return d, ok && d > 0
}

func reason(status int) string { return strconv.Itoa(status) }
