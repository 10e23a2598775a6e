package strategy

import (
	"net/http"
	"time"

	"github.com/mirrorworker/mirrorworker/pacer"
)

// fixedRules is a fixed-interval pacer: the policy floor and nothing else.
// A throttling answer (429, or 503 with a valid positive Retry-After) is
// reported as throttled so the worker defers that one job, but the strategy
// learns nothing from it.
type fixedRules struct{}

func (fixedRules) settleLocked(*engine, time.Time, *entry) {}

func (fixedRules) learnLocked(_ *engine, now time.Time, _ *entry, _ pacer.Permit, r pacer.Response) pacer.Verdict {
	if throttleStatus(r, now) {
		return pacer.Verdict{Throttled: true, Reason: reason(r.Status)}
	}
	return pacer.Verdict{}
}

// throttleStatus is docs/contract.md section 3's status test: 429, or 503 with a valid
// positive Retry-After.
func throttleStatus(r pacer.Response, now time.Time) bool {
	if r.Status == http.StatusTooManyRequests {
		return true
	}
	if r.Status == http.StatusServiceUnavailable {
		_, ok := retryAfter(r, now)
		return ok
	}
	return false
}

// escalateRules is a crawler's domain backoff: on a 429 the interval doubles,
// from 2 s up to 60 s, Retry-After is ignored and a 503 is an ordinary server
// error; after a quiet window without a 429 the interval halves back toward
// the floor, one step per window.
type escalateRules struct{}

func (escalateRules) settleLocked(e *engine, now time.Time, st *entry) {
	decayLocked(e, now, st)
}

// decayLocked halves st's interval once per quiet window elapsed since the
// last throttling signal or the last decay step, never below the floor.
func decayLocked(e *engine, now time.Time, st *entry) {
	w := e.d(quietWindow)
	if st.interval <= e.floor || w <= 0 {
		return
	}
	from := st.lastThrot
	if st.decayedAt.After(from) {
		from = st.decayedAt
	}
	for steps := 0; now.Sub(from) >= w && st.interval > e.floor && steps < 64; steps++ {
		st.interval = max(st.interval/2, e.floor)
		from = from.Add(w)
		st.decayedAt = from
	}
}

func (escalateRules) learnLocked(e *engine, now time.Time, st *entry, _ pacer.Permit, r pacer.Response) pacer.Verdict {
	if r.Status != http.StatusTooManyRequests {
		return pacer.Verdict{}
	}
	e.escalateLocked(st, min(max(2*st.interval, e.d(firstStep)), max(e.d(escalateCap), e.floor)))
	st.lastThrot = now
	return pacer.Verdict{Throttled: true, Reason: reason(r.Status)}
}

// escalateRARules escalates on 429 and on every 503 to
// min(max(2 x interval, 2 s, Retry-After), floor + 60 s), and drops straight
// back to the floor 30 min after the last refusal. It has no cooldown: a
// Retry-After only stretches the spacing.
type escalateRARules struct{}

func (escalateRARules) settleLocked(e *engine, now time.Time, st *entry) {
	if st.interval > e.floor && now.Sub(st.lastThrot) >= e.d(quietWindow) {
		st.interval = e.floor
	}
}

func (escalateRARules) learnLocked(e *engine, now time.Time, st *entry, _ pacer.Permit, r pacer.Response) pacer.Verdict {
	if r.Status != http.StatusTooManyRequests && r.Status != http.StatusServiceUnavailable {
		return pacer.Verdict{}
	}
	ra, _ := retryAfter(r, now)
	e.escalateLocked(st, min(max(2*st.interval, e.d(firstStep), ra), e.floor+e.d(escalateCap)))
	st.lastThrot = now
	return pacer.Verdict{Throttled: true, Reason: reason(r.Status)}
}

// cooldownRules is a package proxy's upstream cooldown: a 429 (or a 503 with
// a valid positive Retry-After) stops all traffic to the authority for the
// Retry-After (capped at 600 s) or, without a usable hint, for a jittered
// fallback between 60 s and a ceiling that doubles on each failed probe up
// to 600 s. After the deadline one probe tests the authority. The spacing
// never changes: it stays at the floor.
type cooldownRules struct{}

func (cooldownRules) settleLocked(*engine, time.Time, *entry) {}

func (cooldownRules) learnLocked(e *engine, now time.Time, st *entry, pm pacer.Permit, r pacer.Response) pacer.Verdict {
	if !throttleStatus(r, now) {
		return pacer.Verdict{}
	}
	d, ok := retryAfter(r, now)
	if ok {
		d = min(d, e.d(cooldownCap))
	} else {
		if pm.Probe {
			st.ceiling = min(2*st.ceiling, e.d(cooldownCap))
		}
		lo := e.d(fallback)
		d = lo + time.Duration(e.uniform()*float64(st.ceiling-lo))
	}
	pauseLocked(st, now, d)
	st.confirm = true
	st.lastThrot = now
	return pacer.Verdict{Throttled: true, Reason: reason(r.Status), Until: st.until}
}

// feedbackRules is a client-side rate-limit library: it pauses the authority
// for a positive Retry-After or until an exhausted rate-limit family resets
// (on any status, a 200 included), each pause capped at 15 min; a 429 without
// a positive delay backs off 1 s, 2 s, 4 s... up to 30 s, counting
// consecutive 429s (any other status resets the count). When a pause ends
// every waiting caller may go at once: there is no probe. The spacing stays
// at the floor.
type feedbackRules struct{}

func (feedbackRules) settleLocked(*engine, time.Time, *entry) {}

func (feedbackRules) learnLocked(e *engine, now time.Time, st *entry, _ pacer.Permit, r pacer.Response) pacer.Verdict {
	is429 := r.Status == http.StatusTooManyRequests
	if is429 {
		st.streak++
	} else {
		st.streak = 0
	}
	fb := readFeedback(r, now)
	pause := fb.delay
	throttled := is429 ||
		(r.Status == http.StatusServiceUnavailable && fb.retryAfterValid) ||
		(r.Status == http.StatusForbidden && fb.exhausted)
	if pause <= 0 && is429 {
		pause = e.d(backoffBase)
		for i := 1; i < st.streak && pause < e.d(backoffCap); i++ {
			pause *= 2
		}
		pause = min(pause, e.d(backoffCap))
	}
	if pause <= 0 {
		if throttled {
			return pacer.Verdict{Throttled: true, Reason: reason(r.Status)}
		}
		return pacer.Verdict{}
	}
	pause = min(pause, e.d(feedbackCap))
	pauseLocked(st, now, pause)
	st.lastThrot = now
	v := pacer.Verdict{Throttled: throttled, Until: st.until, Reason: reason(r.Status)}
	if !throttled {
		v.Reason = "ratelimit"
	}
	return v
}

// feedbackReading is what the feedback strategy takes from a response.
type feedbackReading struct {
	delay           time.Duration // a positive Retry-After, else the longest exhausted reset
	retryAfterValid bool          // a valid Retry-After, zero included
	exhausted       bool          // some rate-limit family is exhausted
}

func readFeedback(r pacer.Response, now time.Time) feedbackReading {
	f := pacer.ParseFeedback(r.Status, r.Header, now)
	return feedbackReading{delay: f.Hint(), retryAfterValid: f.RetryAfterValid, exhausted: f.Exhausted()}
}
