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
// Every strategy is a *pacer.Pacer: the HostPacer's one decision engine
// (cooling, probe, in-flight cap, spacing with short-wait reservation, the
// start guard, the refusal waits, Confirm) with the strategy's learning rule
// (pacer.Rules) plugged in, so that a side-by-side run differs only in how
// each strategy learns (ADR 0015).
//
// It does not: derive authorities, sleep, read a clock, or publish events.
// These are comparison baselines, not production pacers.
package strategy

import (
	"fmt"
	"math/rand/v2"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/mirrorworker/mirrorworker/pacer"
)

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
	// Zero means pacer.DefaultFloor; a negative value means no floor.
	Floor time.Duration
	// MaxInFlight is the per-authority in-flight cap; zero means
	// pacer.DefaultMaxInFlight.
	MaxInFlight int
	// Scale multiplies every time constant of the strategy (not the floor,
	// which is policy, and not delays read from the origin), as
	// pacer.Options.Scale does. Zero means 1; it must not exceed 1.
	Scale float64
	// Rand returns a uniform float in [0, 1) for jitter; nil uses math/rand/v2.
	Rand func() float64
	// StartGuard is extra spacing added to the interval, as
	// pacer.Options.StartGuard: zero means the HostPacer's default
	// (pacer.StartGuardFor: a fiftieth of the floor, at most
	// pacer.MaxStartGuard), negative none.
	// Every strategy gets the same, so that only learning differs.
	StartGuard time.Duration
}

// New returns the strategy called name. The result is safe for concurrent
// use.
func New(name string, o Options) (*pacer.Pacer, error) {
	if !(o.Scale >= 0 && o.Scale <= 1) {
		return nil, fmt.Errorf("strategy %s: scale %v outside [0, 1]", name, o.Scale)
	}
	if o.MaxInFlight < 0 {
		return nil, fmt.Errorf("strategy %s: negative in-flight cap %d", name, o.MaxInFlight)
	}
	scale := o.Scale
	if scale == 0 {
		scale = 1
	}
	c := consts{scale: scale, rand: o.Rand}
	if c.rand == nil {
		c.rand = rand.Float64
	}
	var r pacer.Rules // nil: the HostPacer's own
	switch name {
	case HostPacer:
	case Fixed:
		r = fixedRules{}
	case Escalate:
		r = escalateRules{c}
	case EscalateRA:
		r = escalateRARules{c}
	case Cooldown:
		r = &cooldownRules{consts: c}
	case Feedback:
		r = feedbackRules{c}
	case CurlRetry:
		return nil, fmt.Errorf("strategy %s: a reference client, not a pacer (the load test runs it)", name)
	default:
		return nil, fmt.Errorf("unknown strategy %q (want one of %v)", name, Names())
	}
	floor := o.Floor
	switch {
	case floor == 0:
		floor = pacer.DefaultFloor
	case floor < 0:
		floor = 0
	}
	capN := o.MaxInFlight
	if capN == 0 {
		capN = pacer.DefaultMaxInFlight
	}
	po := &pacer.Options{
		Policy:     &pacer.Policy{Default: pacer.Limits{Floor: floor, MaxInFlight: capN}},
		Rand:       o.Rand,
		Scale:      scale,
		StartGuard: o.StartGuard,
		Rules:      r,
	}
	if r == nil {
		// The HostPacer's quiet window is scaled like every other
		// strategy's (pacer.Options.Scale scales only its default).
		po.QuietWindow = max(time.Nanosecond, c.d(pacer.DefaultQuietWindow))
	}
	return pacer.New(po), nil
}

// Parse splits a comma-separated list of strategy names ("all" for every
// one, the reference clients last), keeping the order given and refusing
// unknown or repeated names. Reference clients (References) are accepted
// beside the strategies.
func Parse(list string) ([]string, error) {
	all := append(Names(), References()...)
	if list == "all" {
		return all, nil
	}
	known := map[string]bool{}
	for _, n := range all {
		known[n] = true
	}
	var out []string
	seen := map[string]bool{}
	for _, n := range strings.Split(list, ",") {
		switch {
		case n == "":
			return nil, fmt.Errorf("strategy list %q: empty name", list)
		case !known[n]:
			sorted := append([]string(nil), all...)
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

// consts scales a strategy's constants and draws its jitter.
type consts struct {
	scale float64
	rand  func() float64
}

// d scales a strategy constant.
func (c consts) d(k time.Duration) time.Duration { return time.Duration(float64(k) * c.scale) }

// pauseLocked extends l's cooldown to now+d; a pause never shortens a
// longer one already in force.
func pauseLocked(l *pacer.Learning, now time.Time, d time.Duration) {
	if u := now.Add(d); u.After(l.Until) {
		l.Until = u
	}
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
