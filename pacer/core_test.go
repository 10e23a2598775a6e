package pacer_test

import (
	"errors"
	"testing"
	"time"

	"github.com/mirrorworker/mirrorworker/pacer"
)

// TestOneCoreAnswersEveryPath pins the one order of checks (the pacer's
// decideLocked) as Acquire, Confirm and ReadyIn each see it: the holds
// (pause, cooldown, probe, backoff) refuse all three alike; the in-flight
// cap refuses a new request but not a permit already holding its place,
// and ReadyIn leaves it aside; spacing refuses Acquire beyond maxWait,
// moves a confirmed permit's Start, and is ReadyIn's wait.
func TestOneCoreAnswersEveryPath(t *testing.T) {
	const s = time.Second
	type answer struct {
		reason pacer.Reason // "" : granted (Acquire), started or moved (Confirm), ready (ReadyIn)
		wait   time.Duration
	}
	tests := []struct {
		name string
		// setup brings the pacer (floor 1 s, cap 3) to the state under
		// test at t0 and returns a permit granted before it, or nothing.
		setup   func(t *testing.T, p *pacer.Pacer) pacer.Permit
		acquire answer // Acquire(at(10s), maxWait 0)
		confirm answer // Confirm(at(10s)) of the permit setup returned
		moved   time.Duration
		ready   answer // ReadyIn(at(10s))
	}{{
		name: "idle",
		setup: func(t *testing.T, p *pacer.Pacer) pacer.Permit {
			return mustGrant(t, p, t0, 0)
		},
	}, {
		name: "paused",
		setup: func(t *testing.T, p *pacer.Pacer) pacer.Permit {
			pm := mustGrant(t, p, t0, 0)
			p.Apply(t0, pacer.Event{Type: pacer.EventPaused, Authority: host, At: t0, Until: at(15 * s)})
			return pm
		},
		acquire: answer{pacer.ReasonPaused, 5 * s},
		confirm: answer{pacer.ReasonPaused, 5 * s},
		ready:   answer{pacer.ReasonPaused, 5 * s},
	}, {
		name: "cooling",
		setup: func(t *testing.T, p *pacer.Pacer) pacer.Permit {
			pm := mustGrant(t, p, t0, 0)
			p.Apply(t0, pacer.Event{Type: pacer.EventCooldown, Authority: host, At: t0, Until: at(12 * s)})
			return pm
		},
		acquire: answer{pacer.ReasonCooling, 2 * s},
		confirm: answer{pacer.ReasonCooling, 2 * s},
		ready:   answer{pacer.ReasonCooling, 2 * s},
	}, {
		name: "probe out: others wait, the probe goes",
		setup: func(t *testing.T, p *pacer.Pacer) pacer.Permit {
			p.Apply(t0, pacer.Event{Type: pacer.EventCooldown, Authority: host, At: t0, Until: at(5 * s)})
			pm := mustGrant(t, p, at(9*s), 0)
			if !pm.Probe {
				t.Fatal("the first grant after the cooldown is not the probe")
			}
			return pm
		},
		acquire: answer{pacer.ReasonProbing, pacer.ProbeWait},
		ready:   answer{pacer.ReasonProbing, pacer.ProbeWait},
	}, {
		name: "at the cap: a new request waits, a held permit does not",
		setup: func(t *testing.T, p *pacer.Pacer) pacer.Permit {
			mustGrant(t, p, at(8*s), 0)
			mustGrant(t, p, at(9*s), 0)
			return mustGrant(t, p, at(9*s), 5*s) // reserved for 10 s
		},
		acquire: answer{pacer.ReasonInFlight, 1 * s}, // the gap to 11 s, at least the spacing
		ready:   answer{pacer.ReasonSpacing, 1 * s},  // the cap aside: the next slot after 10 s
	}, {
		name: "spacing: Acquire refuses, Confirm moves",
		setup: func(t *testing.T, p *pacer.Pacer) pacer.Permit {
			pm := mustGrant(t, p, t0, 0)
			mustGrant(t, p, at(9500*time.Millisecond), 0) // another start
			return pm
		},
		acquire: answer{pacer.ReasonSpacing, 500 * time.Millisecond},
		moved:   500 * time.Millisecond, // one interval after the other's start at 9.5 s
		ready:   answer{pacer.ReasonSpacing, 500 * time.Millisecond},
	}}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			now := at(10 * s)
			for _, path := range []string{"acquire", "confirm", "ready"} {
				pol, err := pacer.ParsePolicy([]byte(`{"default":{"floor":"1s","max_in_flight":3}}`))
				if err != nil {
					t.Fatal(err)
				}
				p := newPacer(t, s, &pacer.Options{Policy: pol})
				pm := tc.setup(t, p)
				var got answer
				var start time.Time
				switch path {
				case "acquire":
					_, err := p.Acquire(now, host, 0)
					got = refusal(t, err)
				case "confirm":
					cpm, err := p.Confirm(now, pm)
					got, start = refusal(t, err), cpm.Start
				case "ready":
					got.wait, _, got.reason = p.ReadyIn(now, host)
				}
				want := map[string]answer{"acquire": tc.acquire, "confirm": tc.confirm, "ready": tc.ready}[path]
				if got != want {
					t.Errorf("%s = %q %s, want %q %s", path, got.reason, got.wait, want.reason, want.wait)
				}
				if path == "confirm" && got.reason == "" && max(0, start.Sub(now)) != tc.moved {
					t.Errorf("confirm moved the start by %s, want %s", max(0, start.Sub(now)), tc.moved)
				}
			}
		})
	}
}

func refusal(t *testing.T, err error) (a struct {
	reason pacer.Reason
	wait   time.Duration
}) {
	t.Helper()
	if err == nil {
		return a
	}
	var re *pacer.RefusedError
	if !errors.As(err, &re) {
		t.Fatalf("err = %v, want a *RefusedError", err)
	}
	a.reason, a.wait = re.Reason, re.Wait
	return a
}

// TestChangedClosesOnEveryPolicyChange: the channel Changed gives closes
// at the next SetPolicy, not before, and the next one asked for waits for
// the change after that.
func TestChangedClosesOnEveryPolicyChange(t *testing.T) {
	p := newPacer(t, time.Second, nil)
	closed := func(c <-chan struct{}) bool {
		select {
		case <-c:
			return true
		default:
			return false
		}
	}
	c1 := p.Changed()
	if c1 != p.Changed() {
		t.Fatal("two channels before a change")
	}
	if closed(c1) {
		t.Fatal("closed before any change")
	}
	p.SetPolicyAt(t0, pacer.DefaultPolicy().WithDefaultFloor(200*time.Millisecond))
	if !closed(c1) {
		t.Fatal("not closed by SetPolicy")
	}
	c2 := p.Changed()
	if closed(c2) {
		t.Fatal("the channel asked for after the change is closed already")
	}
	p.SetPolicyAt(t0, pacer.DefaultPolicy())
	if !closed(c2) {
		t.Fatal("the second change did not close the second channel")
	}
}
