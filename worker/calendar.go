package worker

import "time"

// calendar spreads the jobs deferred to one authority over the slots the
// authority can plausibly serve, so that they come back one interval apart
// instead of all at the cooldown deadline (ADR 0001).
//
// The k-th job deferred since the calendar was last reset comes back at
// base + k×step, where base is the earliest instant the authority can take
// a request. The sequence restarts (k = 0) when the earliest instant moves
// past the calendar's last slot: a new, later cooldown, or slots that have
// all passed. Offsets wrap at spread so that no job is sent further away
// than base+spread, whatever the interval: a job beyond the horizon shares a
// slot with an earlier one and, if the authority is still busy when it
// comes back, is deferred again. Jitter is added by the caller.
//
// The zero value is an empty calendar. A calendar is not safe for
// concurrent use; the scheduler guards it.
type calendar struct {
	base time.Time // the first slot of the current sequence
	last time.Time // the latest slot handed out in it
	k    int64     // jobs deferred in the current sequence
}

// slot returns the instant at which the next deferred job should come back.
// wait is how long from now until the authority can take a request, step
// the spacing between two of its requests, spread the horizon (0: none).
func (c *calendar) slot(now time.Time, wait, step, spread time.Duration) time.Time {
	earliest := now.Add(max(wait, 0))
	step = max(step, 0)
	if c.base.IsZero() || c.last.Before(earliest) {
		c.base, c.last, c.k = earliest, earliest, 0
	}
	off := time.Duration(c.k) * step
	if spread > 0 && off >= spread {
		off %= spread
	}
	c.k++
	at := c.base.Add(off)
	if at.Before(earliest) {
		at = earliest
	}
	if at.After(c.last) {
		c.last = at
	}
	return at
}

// passed reports whether every slot handed out lies before now, so the
// calendar holds nothing worth keeping.
func (c *calendar) passed(now time.Time) bool {
	return c.base.IsZero() || c.last.Before(now)
}
