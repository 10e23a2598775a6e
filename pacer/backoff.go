package pacer

import "time"

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
)

// outcome is what a response says about the origin's health.
type outcome uint8

const (
	outcomeNone   outcome = iota // teaches nothing (cancelled; 503 with a valid Retry-After is throttling)
	outcomeFailed                // no answer (Err, status 0) or 5xx without a valid Retry-After
	outcomeOK                    // the origin answered below 500
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

// backoffLocked refuses a request to an authority backed off for failing.
// The entry's lock must be held.
func backoffLocked(e *entry, auth string, n int64) *RefusedError {
	if e.failUntil <= n {
		return nil
	}
	return &RefusedError{Authority: auth, Reason: ReasonBackoff, Wait: time.Duration(e.failUntil - n),
		Interval: time.Duration(e.interval), Until: time.Unix(0, e.failUntil)}
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
	case EventBackoffEnded:
		if at >= e.failAt {
			e.fails, e.failUntil, e.failAt = 0, 0, at
		}
	}
}
