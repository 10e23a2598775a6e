package pacer_test

import (
	"testing"
	"time"

	"github.com/mirrorworker/mirrorworker/pacer"
)

// Once an authority has been throttled, a request does not start while the
// latest one is unanswered and younger than two refusal round trips: it
// would be on its way when a refusal of that one left the origin, and
// arrive while the origin had said wait (ADR 0029, "Requests that cross a
// refusal"). The answer frees it; so does the window's end (a long body
// keeps its request in flight long after its status came). An authority
// never throttled keeps its two in flight at once.
func TestNoRequestCrossesARefusal(t *testing.T) {
	const rtt = 20 * time.Millisecond // the refusal's round trip below
	ms := time.Millisecond
	tests := []struct {
		name      string
		throttled bool
		sent      time.Duration // X's write reported at this offset; 0: none
		answered  time.Duration // X answered (200) at this offset; 0: not yet
		lateSent  bool          // X's write reported just after its answer
		ask       time.Duration // a second request asks at this offset
		wait      time.Duration // ReasonInFlight's wait; 0: granted
	}{
		{"never throttled: two at once", false, 0, 0, false, ms, 0},
		{"the latest is young and unanswered", true, 0, 0, false, 5 * ms, 2*rtt - 5*ms},
		{"its answer frees the next at once", true, 0, 15 * ms, false, 15 * ms, 0},
		{"two round trips without an answer: a body on its way", true, 0, 0, false, 2 * rtt, 0},
		{"the write moves the window", true, 10 * ms, 0, false, 2*rtt + 5*ms, 5 * ms},
		{"a write reported after the answer opens nothing", true, 0, 15 * ms, true, 16 * ms, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := pacer.New(&pacer.Options{
				// A first step of 1 ms keeps the interval out of the way:
				// what holds the second request is the crossing rule.
				Policy:     &pacer.Policy{Default: pacer.Limits{Floor: 0, MaxInFlight: 2, FirstStep: time.Millisecond}},
				StartGuard: -1,
				Rand:       fixedRand(0),
			})
			start := t0
			if tt.throttled {
				// A refusal answered one round trip after its start, then
				// the probe after its Retry-After, answered.
				a := mustGrant(t, p, t0, 0)
				v := p.Done(at(rtt), a, resp(429, "Retry-After", "1"))
				probe := mustGrant(t, p, v.Until, 0)
				p.Done(v.Until.Add(rtt), probe, resp(200))
				start = v.Until.Add(rtt)
			}
			x := mustGrant(t, p, start, 0) // X starts now
			if tt.sent != 0 {
				p.Sent(start.Add(tt.sent), x)
			}
			if tt.answered != 0 {
				p.Done(start.Add(tt.answered), x, resp(200))
			}
			if tt.lateSent {
				p.Sent(start.Add(tt.answered), x)
			}
			acquireWaits(t, p, start.Add(tt.ask), tt.wait)
		})
	}
}
