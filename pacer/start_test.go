package pacer_test

import (
	"errors"
	"testing"
	"time"

	"github.com/mirrorworker/mirrorworker/pacer"
)

// newPacerCap is a Pacer with an in-flight cap of c, so several
// reservations can be out at once, and Options.StartGuard guard (0 is the
// default guard, unlike newPacer).
func newPacerCap(t *testing.T, floor time.Duration, c int, guard time.Duration) *pacer.Pacer {
	t.Helper()
	return pacer.New(&pacer.Options{
		Policy:     &pacer.Policy{Default: pacer.Limits{Floor: floor, MaxInFlight: c}},
		StartGuard: guard,
		Rand:       fixedRand(0),
	})
}

func mustConfirm(t *testing.T, p *pacer.Pacer, now time.Time, pm pacer.Permit) pacer.Permit {
	t.Helper()
	got, err := p.Confirm(now, pm)
	if err != nil {
		t.Fatalf("Confirm at %s: %v", now.Sub(t0), err)
	}
	return got
}

// The late wake seen in the load test: A's slot wakes 25 ms late, B's on
// time. B is moved to A's actual start + interval + guard, and a grant after
// that is spaced from B's new start; the reported interval stays the floor.
func TestConfirmSpacesFromTheActualStart(t *testing.T) {
	const floor = 100 * time.Millisecond
	ms := time.Millisecond
	tests := []struct {
		name           string
		guard          time.Duration // Options.StartGuard
		aSlot, bSlot   time.Duration // reservations
		aStart         time.Duration // A's actual start, 25 ms late
		bMoved, cStart time.Duration // B's new Start; the next grant's
	}{
		{"no guard", -1, 100 * ms, 200 * ms, 125 * ms, 225 * ms, 325 * ms},
		{"default guard (floor/50 = 2 ms)", 0, 102 * ms, 204 * ms, 127 * ms, 229 * ms, 331 * ms},
		{"explicit guard 5 ms", 5 * ms, 105 * ms, 210 * ms, 130 * ms, 235 * ms, 340 * ms},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := newPacerCap(t, floor, 8, tt.guard)
			first := mustGrant(t, p, t0, 0)
			if got := mustConfirm(t, p, t0, first); got != first {
				t.Fatalf("Confirm of a permit granted for now at that instant = %+v, want it unchanged %+v", got, first)
			}
			a := mustGrant(t, p, t0, time.Second)
			b := mustGrant(t, p, t0, time.Second)
			if !a.Start.Equal(at(tt.aSlot)) || !b.Start.Equal(at(tt.bSlot)) {
				t.Fatalf("reserved %s and %s, want %s and %s", a.Start.Sub(t0), b.Start.Sub(t0), tt.aSlot, tt.bSlot)
			}
			if got := mustConfirm(t, p, at(tt.aStart), a); got != a {
				t.Fatalf("late A moved: %+v", got)
			}
			b2 := mustConfirm(t, p, at(tt.bSlot), b)
			if !b2.Start.Equal(at(tt.bMoved)) || b2.Interval != floor || b2.Probe {
				t.Fatalf("B confirmed on time: start %s interval %s, want moved to %s, interval %s", b2.Start.Sub(t0), b2.Interval, tt.bMoved, floor)
			}
			// Woken a little early for the new Start: moved to the same instant.
			if got := mustConfirm(t, p, at(tt.bMoved-ms), b2); !got.Start.Equal(b2.Start) {
				t.Fatalf("B confirmed 1 ms early: start %s, want %s", got.Start.Sub(t0), tt.bMoved)
			}
			// The next slot moved with B: a new caller is spaced from it.
			c := mustGrant(t, p, at(tt.aStart), time.Second)
			if !c.Start.Equal(at(tt.cStart)) {
				t.Fatalf("next grant at %s, want %s", c.Start.Sub(t0), tt.cStart)
			}
			if got := mustConfirm(t, p, at(tt.bMoved), b2); got != b2 {
				t.Fatalf("B at its new start = %+v, want %+v", got, b2)
			}
			if got := mustConfirm(t, p, at(tt.cStart), c); got != c {
				t.Fatalf("C at its slot = %+v, want %+v", got, c)
			}
			if st := state(t, p, at(tt.cStart)); st.Interval != floor || st.InFlight != 4 {
				t.Fatalf("state %+v, want interval %s, 4 in flight", st, floor)
			}
			for _, pm := range []pacer.Permit{first, a, b2, c} {
				p.Done(at(time.Second), pm, resp(200))
			}
			if st := state(t, p, at(time.Second)); st.InFlight != 0 {
				t.Fatalf("in flight after every Done: %d", st.InFlight)
			}
		})
	}
}

// A late start also moves the next slot when nothing else is reserved, and
// a start guard never enters the reported interval nor the escalation.
func TestLateStartMovesTheNextSlot(t *testing.T) {
	p := pacer.New(nil) // floor 1 s, default guard min(20 ms, 2 ms)
	a := mustGrant(t, p, t0, 0)
	mustConfirm(t, p, at(300*time.Millisecond), a) // started 300 ms after its grant
	re := mustRefuse(t, p, at(time.Second), 0)
	if re.Reason != pacer.ReasonSpacing || re.Wait != 302*time.Millisecond || re.Interval != time.Second {
		t.Fatalf("refusal %+v, want spacing 302ms interval 1s", re)
	}
	if st := state(t, p, at(time.Second)); !st.NextSlot.Equal(at(1302*time.Millisecond)) || st.Interval != time.Second {
		t.Fatalf("state %+v, want next slot 1.302s, interval 1s", st)
	}
	v := p.Done(at(time.Second), a, resp(429, "Retry-After", "1"))
	if st := state(t, p, v.Until); st.Interval != 2*time.Second {
		t.Fatalf("escalated interval %s, want 2s (the guard is not escalated)", st.Interval)
	}
}

// A permit is never spaced from its own start, however often it is
// confirmed, and confirming it again only moves its own start.
func TestConfirmTwiceDoesNotDoubleCount(t *testing.T) {
	const floor = 100 * time.Millisecond
	p := newPacerCap(t, floor, 8, -1)
	a := mustGrant(t, p, t0, 0)
	for _, d := range []time.Duration{0, 0, 5 * time.Millisecond} {
		if got := mustConfirm(t, p, at(d), a); got != a {
			t.Fatalf("A confirmed again at %s: %+v, want unchanged", d, got)
		}
	}
	// A's start is now 5 ms, once: B is spaced from it, not from 0 twice.
	b := mustGrant(t, p, at(5*time.Millisecond), time.Second)
	if !b.Start.Equal(at(105 * time.Millisecond)) {
		t.Fatalf("B reserved at %s, want 105ms", b.Start.Sub(t0))
	}
	for range 2 {
		if got := mustConfirm(t, p, at(105*time.Millisecond), b); got != b {
			t.Fatalf("B at its slot: %+v, want unchanged", got)
		}
	}
	// A confirmed once more, after B started: now it is too close to B.
	if got := mustConfirm(t, p, at(110*time.Millisecond), a); !got.Start.Equal(at(205 * time.Millisecond)) {
		t.Fatalf("A again after B: start %s, want 205ms", got.Start.Sub(t0))
	}
}

func TestConfirmEdges(t *testing.T) {
	t.Run("before Start the permit keeps its Start and records nothing", func(t *testing.T) {
		p := newPacerCap(t, time.Second, 8, -1)
		mustGrant(t, p, t0, 0)
		b := mustGrant(t, p, t0, time.Hour)
		if got := mustConfirm(t, p, at(500*time.Millisecond), b); got != b {
			t.Fatalf("early Confirm = %+v, want %+v", got, b)
		}
		if got := mustConfirm(t, p, at(time.Second), b); got != b {
			t.Fatalf("Confirm at Start = %+v, want %+v", got, b)
		}
	})
	t.Run("a Permit not made by Acquire is returned unchanged", func(t *testing.T) {
		p := newPacer(t, time.Second, nil)
		mustGrant(t, p, t0, 0)
		foreign := pacer.Permit{Authority: host, Start: t0}
		if got := mustConfirm(t, p, t0, foreign); got != foreign {
			t.Fatalf("%+v", got)
		}
	})
	t.Run("floor 0 never moves a start", func(t *testing.T) {
		p := newPacerCap(t, 0, 8, 0)
		a := mustGrant(t, p, t0, 0)
		b := mustGrant(t, p, t0, 0)
		mustConfirm(t, p, at(time.Millisecond), a)
		if got := mustConfirm(t, p, at(time.Millisecond), b); got != b {
			t.Fatalf("%+v", got)
		}
	})
	t.Run("a promoted probe that must wait keeps Probe and its slot", func(t *testing.T) {
		p := newPacerCap(t, time.Second, 8, -1)
		a := mustGrant(t, p, t0, 0)
		b := mustGrant(t, p, t0, time.Hour) // reserved at 1 s
		p.Done(at(500*time.Millisecond), a, resp(429, "Retry-After", "1"))
		// B becomes the probe, and the escalated 2 s interval from A's
		// start at 0 moves it to 2 s.
		b2 := mustConfirm(t, p, at(1500*time.Millisecond), b)
		if !b2.Probe || !b2.Start.Equal(at(2*time.Second)) {
			t.Fatalf("B after the deadline = %+v, want the probe at 2s", b2)
		}
		if re := mustRefuse(t, p, at(1600*time.Millisecond), time.Hour); re.Reason != pacer.ReasonProbing {
			t.Fatalf("another caller while B waits as the probe: %+v", re)
		}
		if got := mustConfirm(t, p, at(2*time.Second), b2); got != b2 {
			t.Fatalf("B at 2 s = %+v, want %+v", got, b2)
		}
	})
	t.Run("a probe overtaken by a new cooldown is revoked", func(t *testing.T) {
		p := newPacer(t, 0, nil)
		a := mustGrant(t, p, t0, 0)
		b := mustGrant(t, p, t0, 0)
		p.Done(t0, a, resp(429, "Retry-After", "5"))
		probe := mustGrant(t, p, at(5*time.Second), 0)
		if !probe.Probe {
			t.Fatal("not the probe")
		}
		// b, sent before the first cooldown, answers late with a longer one.
		p.Done(at(5*time.Second), b, resp(429, "Retry-After", "10"))
		_, err := p.Confirm(at(5*time.Second), probe)
		var re *pacer.RefusedError
		if !errors.As(err, &re) || re.Reason != pacer.ReasonCooling || re.Wait != 10*time.Second {
			t.Fatalf("Confirm of the probe during the new cooldown = %v, want cooling 10s", err)
		}
		p.Done(at(5*time.Second), probe, pacer.Response{Cancelled: true})
		if pm := mustGrant(t, p, at(15*time.Second), time.Hour); !pm.Probe {
			t.Fatalf("after the new deadline: %+v, want the probe", pm)
		}
	})
}

// Done frees the probe slot even when given the copy from before Confirm
// promoted the permit.
func TestDoneWithThePreConfirmCopyOfAProbe(t *testing.T) {
	p := newPacer(t, 0, nil)
	a := mustGrant(t, p, t0, 0)
	b := mustGrant(t, p, t0, 0)
	p.Done(t0, a, resp(429, "Retry-After", "5"))
	if pr := mustConfirm(t, p, at(6*time.Second), b); !pr.Probe {
		t.Fatalf("%+v, want the probe", pr)
	}
	if v := p.Done(at(7*time.Second), b, resp(200)); !v.Until.IsZero() {
		t.Fatalf("probe success through the old copy left a cooldown: %+v", v)
	}
	if st := state(t, p, at(7*time.Second)); st.Probing || st.InFlight != 0 || !st.CooldownUntil.IsZero() {
		t.Fatalf("state %+v, want recovered", st)
	}
}
