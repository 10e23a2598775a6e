package pacer_test

import (
	"math"
	"testing"
	"time"

	"github.com/mirrorworker/mirrorworker/pacer"
)

// TestScale measures each of docs/contract.md section 3's durations at real time (Scale 0
// and 1) and at Scale 0.01, on a floor of 5 ms (below every scaled constant),
// no start guard, and Rand 1 (the fallback draws its ceiling).
func TestScale(t *testing.T) {
	const floor = 5 * time.Millisecond
	ms := time.Millisecond
	// firstThrottle answers a first request at t0 with r.
	firstThrottle := func(t *testing.T, p *pacer.Pacer, r pacer.Response) pacer.Verdict {
		t.Helper()
		return throttle(t, p, t0, r)
	}
	tests := []struct {
		name         string
		measure      func(t *testing.T, p *pacer.Pacer) time.Duration
		real, scaled time.Duration
	}{
		{"fallback ceiling before any throttle", func(t *testing.T, p *pacer.Pacer) time.Duration {
			mustGrant(t, p, t0, 0)
			return state(t, p, t0).Ceiling
		}, 60 * time.Second, 600 * ms},
		{"interval after the first 429 (FirstStep)", func(t *testing.T, p *pacer.Pacer) time.Duration {
			firstThrottle(t, p, resp(429))
			return state(t, p, t0).Interval
		}, 2 * time.Second, 20 * ms},
		{"interval after many 429s (MaxInterval)", func(t *testing.T, p *pacer.Pacer) time.Duration {
			return state(t, p, escalate(t, p, t0, 12)).Interval
		}, 60 * time.Second, 600 * ms},
		{"fallback pause of a bare 429 (FallbackMin = ceiling)", func(t *testing.T, p *pacer.Pacer) time.Duration {
			return firstThrottle(t, p, resp(429)).Until.Sub(t0)
		}, 60 * time.Second, 600 * ms},
		{"fallback pause after a failed probe (ceiling doubled)", func(t *testing.T, p *pacer.Pacer) time.Duration {
			v := firstThrottle(t, p, resp(429))
			pm := mustGrant(t, p, v.Until, time.Hour)
			return p.Done(pm.Start, pm, resp(429)).Until.Sub(pm.Start)
		}, 120 * time.Second, 1200 * ms},
		{"fallback ceiling cap (MaxPause)", func(t *testing.T, p *pacer.Pacer) time.Duration {
			v := firstThrottle(t, p, resp(429))
			var pm pacer.Permit
			for range 8 {
				pm = mustGrant(t, p, v.Until, time.Hour)
				v = p.Done(pm.Start, pm, resp(429))
			}
			return v.Until.Sub(pm.Start)
		}, 600 * time.Second, 6 * time.Second},
		{"Retry-After 3600 is capped (MaxPause)", func(t *testing.T, p *pacer.Pacer) time.Duration {
			return firstThrottle(t, p, resp(429, "Retry-After", "3600")).Until.Sub(t0)
		}, 600 * time.Second, 6 * time.Second},
		{"Retry-After 5 is the origin's and not scaled", func(t *testing.T, p *pacer.Pacer) time.Duration {
			return firstThrottle(t, p, resp(429, "Retry-After", "5")).Until.Sub(t0)
		}, 5 * time.Second, 5 * time.Second},
		{"wait told while the probe runs (ProbeWait)", func(t *testing.T, p *pacer.Pacer) time.Duration {
			v := firstThrottle(t, p, resp(429, "Retry-After", "1"))
			mustGrant(t, p, v.Until, time.Hour) // the probe
			return mustRefuse(t, p, v.Until, time.Hour).Wait
		}, time.Second, 10 * ms},
		{"least wait of an in-flight refusal (InFlightMinWait)", func(t *testing.T, p *pacer.Pacer) time.Duration {
			mustGrant(t, p, t0, 0)
			mustGrant(t, p, t0, time.Hour) // reserved at 5 ms
			return mustRefuse(t, p, t0, time.Hour).Wait
		}, time.Second, 10 * ms},
		{"interval 18 s after a 429 (default QuietWindow)", func(t *testing.T, p *pacer.Pacer) time.Duration {
			firstThrottle(t, p, resp(429, "Retry-After", "1"))
			return state(t, p, at(18*time.Second)).Interval
		}, 2 * time.Second, 10 * ms},
		{"interval 18 s less 1 ns after a 429", func(t *testing.T, p *pacer.Pacer) time.Duration {
			firstThrottle(t, p, resp(429, "Retry-After", "1"))
			return state(t, p, at(18*time.Second-1)).Interval
		}, 2 * time.Second, 20 * ms},
		{"replayed cooldown an hour ahead is capped (Apply)", func(t *testing.T, p *pacer.Pacer) time.Duration {
			p.Apply(t0, pacer.Event{Type: pacer.EventCooldown, Authority: host, At: t0, Until: at(time.Hour)})
			return state(t, p, t0).CooldownUntil.Sub(t0)
		}, 600 * time.Second, 6 * time.Second},
		{"replayed ceiling of an hour is capped (Apply)", func(t *testing.T, p *pacer.Pacer) time.Duration {
			p.Apply(t0, pacer.Event{Type: pacer.EventCooldown, Authority: host, At: t0, Ceiling: time.Hour})
			return state(t, p, t0).Ceiling
		}, 600 * time.Second, 6 * time.Second},
		{"replayed interval of an hour is capped (Apply)", func(t *testing.T, p *pacer.Pacer) time.Duration {
			p.Apply(t0, pacer.Event{Type: pacer.EventInterval, Authority: host, At: t0, Interval: time.Hour})
			return state(t, p, t0).Interval
		}, 60 * time.Second, 600 * ms},
	}
	for _, tt := range tests {
		for _, sc := range []struct {
			scale float64
			want  time.Duration
		}{{0, tt.real}, {1, tt.real}, {0.01, tt.scaled}} {
			t.Run(tt.name+"/scale"+formatScale(sc.scale), func(t *testing.T) {
				p := newPacer(t, floor, &pacer.Options{Scale: sc.scale, Rand: fixedRand(1)})
				if got := tt.measure(t, p); got != sc.want {
					t.Fatalf("got %s, want %s", got, sc.want)
				}
			})
		}
	}
}

func formatScale(s float64) string {
	switch s {
	case 0:
		return "0"
	case 1:
		return "1"
	}
	return "0.01"
}

// The escalation formula min(max(2×interval, FirstStep, floor), max(MaxInterval,
// floor)) takes the scaled FirstStep and MaxInterval; a floor above them wins.
func TestScaleEscalationSequence(t *testing.T) {
	ms := time.Millisecond
	for _, tt := range []struct {
		floor time.Duration
		want  []time.Duration
	}{
		{0, []time.Duration{20 * ms, 40 * ms, 80 * ms, 160 * ms, 320 * ms, 600 * ms, 600 * ms}},
		{30 * ms, []time.Duration{60 * ms, 120 * ms, 240 * ms, 480 * ms, 600 * ms}},
		{time.Second, []time.Duration{time.Second, time.Second}}, // max(600 ms, floor) = floor
	} {
		t.Run(tt.floor.String(), func(t *testing.T) {
			p := newPacer(t, tt.floor, &pacer.Options{Scale: 0.01, QuietWindow: -1})
			now := t0
			for i, w := range tt.want {
				pm := mustGrant(t, p, now, time.Hour)
				v := p.Done(pm.Start, pm, resp(429, "Retry-After", "1"))
				if got := state(t, p, pm.Start).Interval; got != w {
					t.Fatalf("429 #%d: interval %s, want %s", i+1, got, w)
				}
				now = v.Until
			}
		})
	}
}

func TestScaleOutOfRangePanics(t *testing.T) {
	for _, s := range []float64{-0.5, 1.5, math.NaN(), math.Inf(1)} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("New with Scale %v did not panic", s)
				}
			}()
			pacer.New(&pacer.Options{Scale: s})
		}()
	}
	// A vanishing scale still leaves every duration at least 1 ns, so the
	// lazy decay never divides by zero.
	p := newPacer(t, 0, &pacer.Options{Scale: math.SmallestNonzeroFloat64})
	throttle(t, p, t0, resp(429))
	if st := state(t, p, at(time.Second)); st.Interval != 0 || st.CooldownUntil.Sub(t0) != time.Nanosecond {
		t.Fatalf("vanishing scale: %+v", st)
	}
}
