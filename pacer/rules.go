package pacer

import (
	"time"
)

// Rules is a learning rule: how a Pacer reads a response and how what it
// learned relaxes with time. Everything else is the engine's and the same
// for every rule: the cooling and probe checks, the in-flight cap, floor
// spacing with short-wait reservation, the start guard, the refusal waits,
// Confirm, Fence, ReadyIn and the state views (docs/contract.md section 3's
// order; ADR 0015).
//
// Options.Rules nil is the HostPacer's own rule (×2 escalation once per
// signal, decay with the answers (ADR 0029), Retry-After and
// rate-limit-header cooldowns, announced budgets, the jittered fallback,
// events). It is built into the engine, on the entry's
// native representation, because it runs on every request of production
// traffic. Another Rules replaces all of that learning: the Pacer then
// neither publishes events (Options.OnEvent is not called) nor spends
// announced budgets; package strategy's comparison baselines are such rules.
//
// Both methods are called with the authority's lock held: they must not call
// the Pacer, and must be safe to call from several goroutines at once for
// different authorities.
type Rules interface {
	// Relax lets l relax with time (a decay toward the floor); it is called
	// before every Acquire decision and before Learn.
	Relax(now time.Time, l *Learning)
	// Learn reads the response to a granted request (pm.Probe tells whether
	// it was the probe after a cooldown) and returns the verdict. It is not
	// called for a cancelled request, a network error or a Status 0, which
	// teach nothing. If the probe's response is not Throttled, the engine
	// then clears the cooldown and resets Ceiling to the fallback minimum;
	// if the verdict is Throttled without an Until and a cooldown is in
	// force, the engine fills in its deadline.
	Learn(now time.Time, l *Learning, pm Permit, r Response) Verdict
}

// Learning is the part of one authority's state a Rules reads and writes.
type Learning struct {
	// Floor is the authority's policy floor (read only: a write is ignored).
	Floor time.Duration
	// Interval is the spacing in force; the engine never lets it below Floor.
	Interval time.Duration
	// Until is the cooldown deadline: no request starts before it. Zero
	// means none.
	Until time.Time
	// Probe says that when Until has passed a single probe must confirm the
	// recovery before other requests go; false lets every caller go at once.
	Probe bool
	// Ceiling is the fallback ceiling, the fallback minimum (scaled
	// FallbackMin) when the entry is made and after every recovery.
	Ceiling time.Duration
	// LastThrottle is the last throttling signal; it shows in State.
	LastThrottle time.Time
	// DecayRef is where the current quiet window started.
	DecayRef time.Time
	// Streak is a counter the rule may use as it likes (consecutive
	// throttling answers, say); the entry is never evicted while it is not
	// zero.
	Streak int
}

// ruled is the per-entry state of a Pacer with Options.Rules that has no
// place in the entry itself.
type ruled struct {
	probe  bool // the cooldown (entry.until) wants a probe when it ends
	streak int
}

// learningLocked reads e into a Learning. The entry's lock must be held.
func learningLocked(e *entry) Learning {
	return Learning{
		Floor:        time.Duration(e.floor),
		Interval:     time.Duration(e.interval),
		Until:        unixOrZero(e.until),
		Probe:        e.rule.probe,
		Ceiling:      time.Duration(e.ceiling),
		LastThrottle: unixOrZero(e.lastThrot),
		DecayRef:     unixOrZero(e.decayRef),
		Streak:       e.rule.streak,
	}
}

// storeLocked writes l back into e. The entry's lock must be held.
func (l *Learning) storeLocked(e *entry) {
	e.interval = max(int64(l.Interval), e.floor)
	e.until = nanosOrZero(l.Until)
	e.rule.probe = l.Probe
	e.ceiling = int64(l.Ceiling)
	e.lastThrot = nanosOrZero(l.LastThrottle)
	e.decayRef = nanosOrZero(l.DecayRef)
	e.rule.streak = l.Streak
}

// relaxLocked runs the rule's Relax on e, and ends a cooldown that has
// passed and wants no probe, so that the engine's checks see none. The
// entry's lock must be held.
func (p *Pacer) relaxLocked(e *entry, now time.Time) {
	l := learningLocked(e)
	p.rules.Relax(now, &l)
	l.storeLocked(e)
	p.spentLocked(e, now.UnixNano())
}

// spentLocked ends e's cooldown if it has passed and its rule wants no
// probe. The entry's lock must be held.
func (p *Pacer) spentLocked(e *entry, n int64) {
	if e.rule != nil && !e.rule.probe && e.until != 0 && e.until <= n {
		e.until = 0
	}
}

// acquireRules is Acquire with Options.Rules.
func (p *Pacer) acquireRules(now time.Time, auth string, maxWait time.Duration) (Permit, error) {
	n := now.UnixNano()
	s := p.shardFor(auth)
	s.mu.Lock()
	defer s.mu.Unlock()
	e := p.entryLocked(s, auth, n)
	p.relaxLocked(e, now)
	pm, re := p.acquireLocked(s, e, auth, auth, now, n, maxWait) // Rules know no groups
	if re != nil {
		return Permit{}, re
	}
	return pm, nil
}

// doneRules is Done with Options.Rules.
func (p *Pacer) doneRules(now time.Time, pm Permit, r Response) Verdict {
	n := now.UnixNano()
	s := p.shardFor(pm.Authority)
	s.mu.Lock()
	defer s.mu.Unlock()
	e := s.m[pm.Authority]
	if e == nil {
		return Verdict{}
	}
	if pm.seq != 0 && e.inFlight > 0 {
		e.inFlight--
	}
	probe := pm.seq != 0 && pm.seq == e.probeSeq
	if probe {
		e.probeSeq = 0
	}
	learn := !r.Cancelled && r.Err == nil && r.Status != 0
	p.unsentDoneLocked(e, pm.seq, n, learn)
	if !learn {
		return Verdict{}
	}
	p.relaxLocked(e, now)
	l := learningLocked(e)
	pm.Probe = probe
	v := p.rules.Learn(now, &l, pm, r)
	l.storeLocked(e)
	if probe && !v.Throttled {
		e.until, e.ceiling = 0, p.fallbackMin
	}
	p.spentLocked(e, n)
	if v.Throttled && v.Until.IsZero() && e.until > n {
		v.Until = time.Unix(0, e.until)
	}
	return v
}

func nanosOrZero(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return t.UnixNano()
}
