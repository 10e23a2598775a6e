package pacer_test

import (
	"testing"
	"time"

	"github.com/mirrorworker/mirrorworker/pacer"
)

// pauseRule pauses an authority for its fixed pause on every 429, wanting a
// probe when probe is set, and tries to push the interval below the floor
// and to change the floor (both of which the engine must refuse).
type pauseRule struct {
	pause   time.Duration
	probe   bool
	learned int
}

func (*pauseRule) Relax(time.Time, *pacer.Learning) {}

func (r *pauseRule) Learn(now time.Time, l *pacer.Learning, _ pacer.Permit, resp pacer.Response) pacer.Verdict {
	r.learned++
	l.Interval, l.Floor = 0, 0
	if resp.Status != 429 {
		return pacer.Verdict{}
	}
	l.Until, l.Probe = now.Add(r.pause), r.probe
	return pacer.Verdict{Throttled: true, Reason: "429"}
}

// TestRulesPlugIntoTheEngine: a rule's cooldown is enforced by the engine's
// own checks, with or without a probe; the engine fills the verdict's
// deadline, keeps the interval at the floor, publishes nothing, and does
// not call Learn for a cancelled request.
func TestRulesPlugIntoTheEngine(t *testing.T) {
	for _, probe := range []bool{true, false} {
		r := &pauseRule{pause: 10 * time.Second, probe: probe}
		events := 0
		p := pacer.New(&pacer.Options{
			Policy:     &pacer.Policy{Default: pacer.Limits{Floor: time.Second, MaxInFlight: 2}},
			StartGuard: -1,
			Rules:      r,
			OnEvent:    func(pacer.Event) { events++ },
		})
		pm := mustGrant(t, p, t0, 0)
		v := p.Done(t0, pm, resp(429))
		if !v.Throttled || !v.Until.Equal(at(10*time.Second)) {
			t.Fatalf("probe=%v: verdict %+v, want throttled until 10 s", probe, v)
		}
		if re := mustRefuse(t, p, at(5*time.Second), time.Hour); re.Reason != pacer.ReasonCooling || re.Wait != 5*time.Second {
			t.Fatalf("probe=%v: refusal %+v, want cooling for 5 s", probe, re)
		}
		first := mustGrant(t, p, at(10*time.Second), 0)
		if first.Probe != probe || first.Interval != time.Second {
			t.Fatalf("probe=%v: first grant after the pause %+v, want Probe %v at the 1 s floor", probe, first, probe)
		}
		_, err := p.Acquire(at(11*time.Second), host, 0)
		switch re, _ := err.(*pacer.RefusedError); {
		case probe && (re == nil || re.Reason != pacer.ReasonProbing):
			t.Fatalf("while the probe is out: %v, want a probing refusal", err)
		case !probe && err != nil:
			t.Fatalf("no probe wanted: %v, want a grant a floor later", err)
		}
		n := r.learned
		p.Done(at(11*time.Second), first, pacer.Response{Cancelled: true})
		if r.learned != n {
			t.Fatalf("probe=%v: Learn called for a cancelled request", probe)
		}
		if events != 0 {
			t.Fatalf("probe=%v: %d events published by a pacer with its own rule", probe, events)
		}
		if st := state(t, p, at(11*time.Second)); st.Floor != time.Second || st.Interval != time.Second {
			t.Fatalf("probe=%v: floor %s interval %s, want the rule's writes refused", probe, st.Floor, st.Interval)
		}
	}
}
