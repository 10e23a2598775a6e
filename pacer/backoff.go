package pacer

import (
	"hash/maphash"
	"time"
)

// The failure backoff (docs/contract.md section 3, ADR 0023): an origin that
// fails (connections refused or cut, timeouts, 5xx without a valid
// Retry-After) is slowed as a whole, not asked again by every job's own
// retry. Options.Scale multiplies both.
const (
	// FailureBackoffMin is the base of the backoff when the floor is below
	// it: the first failure spaces the next request by twice the larger
	// of the floor and this.
	FailureBackoffMin = time.Second
	// MaxFailureBackoff caps the backoff (or the floor, if higher): an
	// origin down for an hour is asked about every 5 minutes.
	MaxFailureBackoff = 5 * time.Minute
	// failJitter: the backoff is drawn from [1-failJitter, 1] times the
	// doubled step, so that pods' and authorities' retries do not align.
	failJitter = 0.2
	// LimiterAnswerWithin is how soon a 503 without a valid Retry-After
	// must come back, from its request's start (Permit.Start as Confirm
	// last returned it), to be read as a rate limiter's refusal (judgeLocked,
	// docs/adr/0030): a limiter answers before any work is done (nginx's
	// limit_req rejects at once), an origin that fails mostly after some.
	// It is not scaled: it measures the network and the origin, not the
	// contract's clock.
	LimiterAnswerWithin = time.Second
)

// outcome is what a response says about the origin's health.
type outcome uint8

const (
	outcomeNone   outcome = iota // teaches nothing (cancelled; 503 with a valid Retry-After is throttling)
	outcomeFailed                // no answer (Err, status 0) or 5xx without a valid Retry-After
	outcomeOK                    // the origin answered below 500
	// outcomeURL: a 5xx that judgeLocked reads as one URL's failure, not
	// the origin's: the job's failure, no step of the origin's backoff.
	outcomeURL
)

func outcomeOf(r Response, fb *Feedback) outcome {
	switch {
	case r.Cancelled:
		return outcomeNone
	case r.Status == 0:
		if r.Err != nil {
			return outcomeFailed
		}
		return outcomeNone
	case r.Status >= 500:
		if fb != nil && fb.Throttled() {
			return outcomeNone
		}
		return outcomeFailed
	}
	return outcomeOK
}

// failReason is the Event.Reason of a failure.
func failReason(r Response) string {
	if r.Status == 0 {
		return "error"
	}
	return "5xx"
}

// healthLocked applies a response's outcome to the failure backoff. The
// entry's lock must be held.
func (p *Pacer) healthLocked(e *entry, auth string, n int64, r Response, oc outcome, fx *facts) {
	switch oc {
	case outcomeFailed:
		e.fails++
		base := max(e.floor, p.failMin)
		step := base
		for i := int32(0); i < e.fails && step > 0 && step < max(p.failMax, e.floor); i++ {
			step *= 2
		}
		step = min(step, max(p.failMax, e.floor))
		r01 := p.rnd()
		if !(r01 >= 0) || r01 > 1 {
			r01 = 0
		}
		d := max(int64(float64(step)*(1-failJitter*r01)), e.floor)
		e.failUntil = max(e.failUntil, n+d)
		e.failAt = n
		fx.add(Event{Type: EventBackoff, Authority: auth, At: time.Unix(0, n), Status: r.Status, Reason: failReason(r),
			Interval: time.Duration(e.interval), Until: time.Unix(0, e.failUntil), Failures: int(e.fails)})
	case outcomeOK:
		if e.fails == 0 && e.failUntil == 0 {
			return
		}
		fx.add(Event{Type: EventBackoffEnded, Authority: auth, At: time.Unix(0, n), Status: r.Status, Failures: int(e.fails),
			Interval: time.Duration(e.interval)})
		e.fails, e.failUntil, e.failAt = 0, 0, n
	}
}

// applyHealthLocked applies another pod's (or a replayed) backoff fact.
func (p *Pacer) applyHealthLocked(e *entry, ev Event, n, at int64) {
	switch ev.Type {
	case EventBackoff:
		if u := ev.Until.UnixNano(); !ev.Until.IsZero() && u > e.failUntil {
			e.failUntil = min(u, n+max(p.failMax, e.floor))
		}
		e.fails = max(e.fails, int32(min(ev.Failures, 64)))
		e.failAt = max(e.failAt, at)
		e.ans.originBad = max(e.ans.originBad, at) // the origin failed for another pod too
	case EventBackoffEnded:
		if at >= e.failAt {
			e.fails, e.failUntil, e.failAt = 0, 0, at
		}
	}
}

// answers is what an authority answered lately, by URL, so that a failure
// is read as the failure of what failed: the origin, one URL, or a rate
// limiter saying no (judgeLocked, docs/adr/0030). Instants are Unix
// nanoseconds, 0 meaning none; URLs are keys (urlKey), 0 meaning unknown.
// It is the pod's own memory, not a published fact: a pod without it (a
// restart, a hand-over) reads a 5xx as one URL's only while no other URL
// has failed since, and a 503 as a limiter's only after a success it saw
// itself; a backoff fact from another pod counts as the origin failing.
type answers struct {
	ok      int64  // the latest success (an answer below 500, not throttling)
	okURL   uint64 // ... and its URL
	okOther int64  // the latest success of a URL other than okURL
	bad     int64  // the latest 5xx answer read as a failure (the origin's or one URL's)
	badURL  uint64 // ... and its URL
	// badOther: the latest such 5xx of a URL other than badURL.
	badOther int64
	// originBad is the latest failure counted against the origin (here,
	// or in another pod's backoff fact).
	originBad int64
	limiter   int64 // the latest 503 read as a limiter's refusal
	// quiet is the cold blast's refusal by a limiter's 503 when it stepped
	// the interval below the contract's first step (escalateLocked: the
	// first step over the blast's depth), 0 otherwise or once used; quietSeq
	// is the permit of the first request started after it (0: none yet).
	// That one request, refused at once with nothing failed since, is still
	// the limiter's (limiterLocked): the short step is shorter than a slow
	// origin's spacing, and its full bucket refuses the request after it.
	quiet    int64
	quietSeq uint64
}

// opened notes the start of permit seq at n: the first start after a quiet
// step is the request whose refusal limiterLocked still reads as the
// limiter's.
func (a *answers) opened(seq uint64, n int64) {
	if a.quiet != 0 && a.quietSeq == 0 && n > a.quiet {
		a.quietSeq = seq
	}
}

// afterQuiet says whether pm is the request sent after the cold blast's
// short step (answers.quiet), and ends the exception: it is that request's
// alone, whatever its answer.
func (a *answers) afterQuiet(pm Permit) bool {
	if a.quietSeq == 0 || pm.seq != a.quietSeq {
		return false
	}
	a.quiet, a.quietSeq = 0, 0
	return true
}

// succeeded records a success of URL u at n.
func (a *answers) succeeded(n int64, u uint64) {
	if u != a.okURL {
		a.okOther = a.ok
	}
	a.ok, a.okURL = n, u
}

// failedURL records a 5xx failure of URL u at n.
func (a *answers) failedURL(n int64, u uint64) {
	if u != a.badURL {
		a.badOther = a.bad
	}
	a.bad, a.badURL = n, u
}

// okBesides is the latest success of a URL other than u.
func (a *answers) okBesides(u uint64) int64 {
	if a.okURL != u {
		return a.ok
	}
	return a.okOther
}

// badBesides is the latest 5xx failure of a URL other than u.
func (a *answers) badBesides(u uint64) int64 {
	if a.badURL != u {
		return a.bad
	}
	return a.badOther
}

// urlKey is the key answers knows a URL by (0 for none).
func (p *Pacer) urlKey(u string) uint64 {
	if u == "" {
		return 0
	}
	return max(maphash.String(p.seed, u), 1)
}

// judgeLocked reads a response's outcome against what the authority
// answered lately and records it (docs/contract.md section 3, ADR 0030):
//
//   - A 503 without a valid Retry-After is a rate limiter's refusal
//     (fb.Limiter is set; the outcome is throttling, outcomeNone) when it
//     came back within LimiterAnswerWithin of its start and the origin
//     let others through: a success arrived after the latest failure
//     counted against the origin, and after the latest refusal so read,
//     unless this request started before that refusal came, or at the
//     same instant (it was sent under the same pace and says nothing
//     new). Before any answer but limiter's refusals (the cold blast), the
//     first is a limiter's while another request is in flight, and the
//     rest of the blast crossed it. So an origin that answers every
//     request 503 is read as a limiter for at most the requests in flight
//     when it turned (or at the start), then as failing. One exception:
//     the request sent after the cold blast's short step (answers.quiet),
//     refused with nothing failed since, is still the limiter's
//     (fb.limiterAgain): a limiter slower than 1/step has not leaked a
//     place by then (ADR 0030, "The request after the cold blast's short
//     step"). An origin that admitted the blast and then answers every
//     request 503 is read as failing one request later.
//   - Any other 5xx of URL u is that URL's failure (outcomeURL: the job's
//     failure, no backoff step) unless something else went wrong since
//     another URL last succeeded: a 5xx of another URL, a failure counted
//     against the origin, a limiter's refusal. So one broken URL never
//     backs its origin off, however often it is retried, while 5xx
//     spanning two URLs with no success of another URL between them, and
//     every failure without an answer (refused, reset, timed out), are the
//     origin's. An origin that fails every URL is backed off from its
//     second failing URL on.
//
// The entry's lock must be held; u is urlKey(r.URL).
func (p *Pacer) judgeLocked(e *entry, pm Permit, n int64, r Response, u uint64, fb *Feedback, oc outcome) outcome {
	a := &e.ans
	quiet := a.quiet
	again := a.afterQuiet(pm)
	switch {
	case oc == outcomeOK:
		if !fb.Throttled() {
			a.succeeded(n, u)
		}
		return oc
	case oc != outcomeFailed:
		return oc
	case r.Status == 0:
		a.originBad = n
		return oc
	case p.limiterLocked(a, pm, n, *fb, e.inFlight):
		fb.Limiter = true
		a.limiter = n
		return outcomeNone
	case again && p.limiterAgainLocked(a, pm, n, *fb, quiet):
		fb.Limiter, fb.limiterAgain = true, true
		a.limiter = n
		return outcomeNone
	}
	last := max(a.badBesides(u), a.originBad, a.limiter)
	local := u != 0 && (last == 0 || a.okBesides(u) > last)
	a.failedURL(n, u)
	if local {
		return outcomeURL
	}
	a.originBad = n
	return oc
}

// limiterLocked says whether a 503 is a rate limiter's refusal (judgeLocked).
// inFlight is how many other requests of the authority are still
// unanswered.
func (p *Pacer) limiterLocked(a *answers, pm Permit, n int64, fb Feedback, inFlight int32) bool {
	if fb.Status != 503 || fb.Throttled() || fb.Exhausted() || pm.Start.IsZero() {
		return false
	}
	start := pm.Start.UnixNano()
	if n-start > int64(LimiterAnswerWithin) {
		return false
	}
	// Sent before the latest refusal so read came back, or as it came
	// (the same instant: granted before the pacer read it). It was sent
	// under the same pace and tells nothing new.
	crossed := a.limiter != 0 && start <= a.limiter
	if a.ok > a.originBad {
		return a.ok > a.limiter || crossed
	}
	// No success yet and nothing failed: the cold blast, whose refusals
	// may come back before the successes sent with them (a 503 is quicker
	// than a body). Its first is a limiter's while another request is on
	// its way (a lone request refused before any success is a failure);
	// the rest of the blast crossed it. An origin that answers 503 to
	// everything is read as failing from the first request sent after.
	return a.ok == 0 && a.originBad == 0 && a.bad == 0 && (crossed || a.limiter == 0 && inFlight > 0)
}

// limiterAgainLocked says whether a 503 to the request sent after the cold
// blast's short step (the refusal at quiet stepped it) that limiterLocked
// reads as a failure is still the limiter's: it came back at once and
// nothing failed since that refusal (a success between makes it the
// limiter's by limiterLocked already). A limiter whose bucket the blast
// filled refuses the request after the step unless a place leaked
// meanwhile, that is unless it admits at least 1/step (3 r/s for 333 ms);
// the contract's 2 s step covers every origin of 0.5 r/s and more, and the
// step after this refusal is that 2 s again (ADR 0030, "The request after
// the cold blast's short step").
func (p *Pacer) limiterAgainLocked(a *answers, pm Permit, n int64, fb Feedback, quiet int64) bool {
	if fb.Status != 503 || fb.Throttled() || fb.Exhausted() || pm.Start.IsZero() {
		return false
	}
	if n-pm.Start.UnixNano() > int64(LimiterAnswerWithin) {
		return false
	}
	return max(a.originBad, a.bad) < quiet
}
