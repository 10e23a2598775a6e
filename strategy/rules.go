package strategy

import (
	"net/http"
	"sync"
	"time"

	"github.com/mirrorworker/mirrorworker/pacer"
)

// fixedRules is a fixed-interval pacer: the policy floor and nothing else.
// A throttling answer (429, or 503 with a valid positive Retry-After) is
// reported as throttled so the worker defers that one job, but the strategy
// learns nothing from it.
type fixedRules struct{}

func (fixedRules) Relax(time.Time, *pacer.Learning) {}

func (fixedRules) Learn(now time.Time, _ *pacer.Learning, _ pacer.Permit, r pacer.Response) pacer.Verdict {
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
type escalateRules struct{ consts }

// Relax halves l's interval once per quiet window elapsed since the last
// throttling signal or the last decay step, never below the floor.
func (c escalateRules) Relax(now time.Time, l *pacer.Learning) {
	w := c.d(quietWindow)
	if l.Interval <= l.Floor || w <= 0 {
		return
	}
	from := l.LastThrottle
	if l.DecayRef.After(from) {
		from = l.DecayRef
	}
	for steps := 0; now.Sub(from) >= w && l.Interval > l.Floor && steps < 64; steps++ {
		l.Interval = max(l.Interval/2, l.Floor)
		from = from.Add(w)
		l.DecayRef = from
	}
}

func (c escalateRules) Learn(now time.Time, l *pacer.Learning, _ pacer.Permit, r pacer.Response) pacer.Verdict {
	if r.Status != http.StatusTooManyRequests {
		return pacer.Verdict{}
	}
	l.Interval = min(max(2*l.Interval, c.d(firstStep)), max(c.d(escalateCap), l.Floor))
	l.LastThrottle = now
	return pacer.Verdict{Throttled: true, Reason: reason(r.Status)}
}

// escalateRARules escalates on 429 and on every 503 to
// min(max(2 x interval, 2 s, Retry-After), floor + 60 s), and drops straight
// back to the floor 30 min after the last refusal. It has no cooldown: a
// Retry-After only stretches the spacing.
type escalateRARules struct{ consts }

func (c escalateRARules) Relax(now time.Time, l *pacer.Learning) {
	if l.Interval > l.Floor && now.Sub(l.LastThrottle) >= c.d(quietWindow) {
		l.Interval = l.Floor
	}
}

func (c escalateRARules) Learn(now time.Time, l *pacer.Learning, _ pacer.Permit, r pacer.Response) pacer.Verdict {
	if r.Status != http.StatusTooManyRequests && r.Status != http.StatusServiceUnavailable {
		return pacer.Verdict{}
	}
	ra, _ := retryAfter(r, now)
	l.Interval = min(max(2*l.Interval, c.d(firstStep), ra), l.Floor+c.d(escalateCap))
	l.LastThrottle = now
	return pacer.Verdict{Throttled: true, Reason: reason(r.Status)}
}

// cooldownRules is a package proxy's upstream cooldown: a 429 (or a 503 with
// a valid positive Retry-After) stops all traffic to the authority for the
// Retry-After (capped at 600 s) or, without a usable hint, for a jittered
// fallback between 60 s and a ceiling that doubles on each failed probe up
// to 600 s. After the deadline one probe tests the authority. The spacing
// never changes: it stays at the floor.
type cooldownRules struct {
	consts
	mu sync.Mutex // serialises rand, which need not be safe for concurrent use
}

func (*cooldownRules) Relax(time.Time, *pacer.Learning) {}

func (c *cooldownRules) Learn(now time.Time, l *pacer.Learning, pm pacer.Permit, r pacer.Response) pacer.Verdict {
	if !throttleStatus(r, now) {
		return pacer.Verdict{}
	}
	d, ok := retryAfter(r, now)
	if ok {
		d = min(d, c.d(cooldownCap))
	} else {
		if pm.Probe {
			l.Ceiling = min(2*l.Ceiling, c.d(cooldownCap))
		}
		lo := c.d(fallback)
		c.mu.Lock()
		u := c.rand()
		c.mu.Unlock()
		d = lo + time.Duration(u*float64(l.Ceiling-lo))
	}
	pauseLocked(l, now, d)
	l.Probe = true
	l.LastThrottle = now
	return pacer.Verdict{Throttled: true, Reason: reason(r.Status), Until: l.Until}
}

// feedbackRules is a client-side rate-limit library: it pauses the authority
// for a positive Retry-After or until an exhausted rate-limit family resets
// (on any status, a 200 included), each pause capped at 15 min; a 429 without
// a positive delay backs off 1 s, 2 s, 4 s... up to 30 s, counting
// consecutive 429s (any other status resets the count). When a pause ends
// every waiting caller may go at once: there is no probe. The spacing stays
// at the floor.
type feedbackRules struct{ consts }

func (feedbackRules) Relax(time.Time, *pacer.Learning) {}

func (c feedbackRules) Learn(now time.Time, l *pacer.Learning, _ pacer.Permit, r pacer.Response) pacer.Verdict {
	is429 := r.Status == http.StatusTooManyRequests
	if is429 {
		l.Streak++
	} else {
		l.Streak = 0
	}
	fb := readFeedback(r, now)
	pause := fb.delay
	throttled := is429 ||
		(r.Status == http.StatusServiceUnavailable && fb.retryAfterValid) ||
		(r.Status == http.StatusForbidden && fb.exhausted)
	if pause <= 0 && is429 {
		pause = c.d(backoffBase)
		for i := 1; i < l.Streak && pause < c.d(backoffCap); i++ {
			pause *= 2
		}
		pause = min(pause, c.d(backoffCap))
	}
	if pause <= 0 {
		if throttled {
			return pacer.Verdict{Throttled: true, Reason: reason(r.Status)}
		}
		return pacer.Verdict{}
	}
	pause = min(pause, c.d(feedbackCap))
	pauseLocked(l, now, pause)
	l.LastThrottle = now
	v := pacer.Verdict{Throttled: throttled, Until: l.Until, Reason: reason(r.Status)}
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
