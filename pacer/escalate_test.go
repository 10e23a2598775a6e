package pacer_test

import (
	"math"
	"testing"
	"time"

	"github.com/mirrorworker/mirrorworker/pacer"
)

// Two requests in flight together, both answered 429: the second answer was
// sent under the interval the first already doubled, so it does not double
// it again (ADR 0029; ADR 0006 §4 escalated twice). So does one started at
// the very instant the first answer came back but before the pacer read it:
// a blast's admission answered at that instant frees a place, and the
// request it lets start leaves under the interval not yet escalated (on a
// virtual clock, where the two coincide, its refusal doubled nginx's
// depth-1 step of 2 s to 4 s: ADR 0029, the thirteenth look, "The crossing
// sibling"). A request started after the escalation does escalate.
func TestOneEscalationPerSignal(t *testing.T) {
	tests := []struct {
		name    string
		secondA time.Duration // when the second request starts
		want    time.Duration // interval after both answers
	}{
		{"both in flight when the first is answered", 0, 2 * time.Second},
		{"the second started as the first was answered, before it was read", 10 * time.Millisecond, 2 * time.Second},
		{"the second started after the escalation", 3 * time.Second, 4 * time.Second},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := newPacerCap(t, 0, 2, -1)
			a := mustGrant(t, p, t0, 0)
			var b pacer.Permit
			if tt.secondA < time.Second {
				b = mustGrant(t, p, at(tt.secondA), 0)
			}
			p.Done(at(10*time.Millisecond), a, resp(429, "Retry-After", "1"))
			if tt.secondA >= time.Second {
				b = mustGrant(t, p, at(tt.secondA), 0) // the probe, after the cooldown
			}
			p.Done(at(tt.secondA+20*time.Millisecond), b, resp(429, "Retry-After", "1"))
			if got := state(t, p, at(tt.secondA+time.Second)).Interval; got != tt.want {
				t.Fatalf("interval %s, want %s", got, tt.want)
			}
		})
	}
}

// After a throttle the interval comes back with the answers, not after a
// quiet window: the probe's answer leaves it (the contract), each later
// answer halves it down to the floor when no pace is learned yet, at most
// once per half second (the ramp dwells, so that its refusal reads the
// rate); facts are published only when it halves or reaches the floor. A 429 without
// Retry-After still cools for the fallback (60 s) first.
func TestAnswersBringTheIntervalBack(t *testing.T) {
	tests := []struct {
		name  string
		r     pacer.Response
		until time.Duration
	}{
		{"Retry-After 2", resp(429, "Retry-After", "2"), 2 * time.Second},
		{"no Retry-After: the fallback first", resp(429), pacer.FallbackMin},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var evs []pacer.Event
			p := newPacer(t, 100*time.Millisecond, &pacer.Options{QuietWindow: -1, OnEvent: func(e pacer.Event) {
				if e.Type == pacer.EventInterval {
					evs = append(evs, e)
				}
			}})
			v := throttle(t, p, t0, tt.r)
			if got := v.Until.Sub(t0); got != tt.until {
				t.Fatalf("cooldown %s, want %s", got, tt.until)
			}
			now := v.Until
			var got []time.Duration
			for i := 0; i < 6; i++ {
				pm := mustGrant(t, p, now, time.Hour)
				now = pm.Start
				p.Done(now, pm, resp(200))
				got = append(got, state(t, p, now).Interval)
			}
			ms := time.Millisecond
			// Below rampHalving (500 ms) a level is held that long: 250 ms
			// for two answers.
			want := []time.Duration{2000 * ms, 1000 * ms, 500 * ms, 250 * ms, 250 * ms, 125 * ms}
			if !equalDurations(got, want) {
				t.Fatalf("intervals after each answer %v, want %v", got, want)
			}
			if len(evs) != 5 { // the escalation, then each halving
				t.Fatalf("%d interval facts, want 5: %+v", len(evs), evs)
			}
		})
	}
}

// Below the pace learned between two escalations the interval creeps, one
// Decay-th of a halving per answer (Limits.Decay, live per authority), four
// times faster from a loose reading. (A decay so fast that one step
// passes the reading's upper bound stops there: TestCreepHoldsShortOfTheUpperBound.)
func TestCreepBelowTheLearnedPace(t *testing.T) {
	for _, decay := range []int{0, 100} {
		p := pacer.New(&pacer.Options{
			Policy:     &pacer.Policy{Default: pacer.Limits{Floor: 0, MaxInFlight: 1, Decay: decay, FirstStep: time.Second}},
			Rand:       fixedRand(0),
			StartGuard: -1,
		})
		now := t0
		answer := func(r pacer.Response) {
			pm := mustGrant(t, p, now, time.Hour)
			now = pm.Start
			v := p.Done(now, pm, r)
			if !v.Until.IsZero() {
				now = v.Until
			}
		}
		answer(resp(429, "Retry-After", "1")) // 1 s interval
		// The ramp: 1 s, 500, 250, 250 and 125 ms, a loose reading (8
		// to 16 r/s); twenty answers would dwell at 31 ms long enough to
		// read the rate tight, which holds.
		for i := 0; i < 5; i++ {
			answer(resp(200))
		}
		answer(resp(429, "Retry-After", "1")) // learns a pace, interval 2 × the interval in force
		for i := 0; i < 8; i++ {
			answer(resp(200))
		}
		pace := state(t, p, now).Interval
		answer(resp(200))
		got := state(t, p, now).Interval
		steps := decay
		if steps == 0 {
			steps = pacer.DefaultDecay
		}
		// The reading here is loose (its bounds far apart): the creep
		// from it is looseCreep (4) times faster (reading.go).
		steps = max(1, steps/4)
		if pace == 0 || got >= pace || float64(got) < float64(pace)*0.5 {
			t.Fatalf("decay %d: interval %s after an answer at the pace %s", decay, got, pace)
		}
		wantRatio := math.Exp2(-1 / float64(steps))
		if r := float64(got) / float64(pace); r < wantRatio-0.01 || r > wantRatio+0.01 {
			t.Fatalf("decay %d: one answer took the interval from %s to %s (x%.4f), want x%.4f", decay, pace, got, r, wantRatio)
		}
	}
}

// A loose reading's creep stops short of its upper bound, a rate the
// origin refused, and holds there for Decay answers before it creeps on
// (reading.capFor): a bound read too low (a depth read one high) costs a
// while, not the rest of the run.
func TestCreepHoldsShortOfTheUpperBound(t *testing.T) {
	const decay = 10
	p := pacer.New(&pacer.Options{
		Policy:     &pacer.Policy{Default: pacer.Limits{Floor: 0, MaxInFlight: 1, Decay: decay, FirstStep: time.Second}},
		Rand:       fixedRand(0),
		StartGuard: -1,
	})
	now := t0
	answer := func(r pacer.Response) {
		pm := mustGrant(t, p, now, time.Hour)
		now = pm.Start.Add(10 * time.Millisecond) // the answer's latency
		v := p.Done(now, pm, r)
		if !v.Until.IsZero() {
			now = v.Until
		}
	}
	answer(resp(429, "Retry-After", "1"))
	for i := 0; i < 20; i++ {
		answer(resp(200))
	}
	answer(resp(429, "Retry-After", "1")) // a loose reading with an upper bound
	var ivs []time.Duration
	for i := 0; i < 60; i++ {
		answer(resp(200))
		ivs = append(ivs, state(t, p, now).Interval)
	}
	// The longest run of answers that left the interval as it was, after
	// the probe's and before the floor.
	held, run := 0, 0
	for i := 2; i < len(ivs); i++ {
		if ivs[i] == ivs[i-1] && ivs[i] > 0 {
			run++
			held = max(held, run)
		} else {
			run = 0
		}
	}
	if held < decay-1 || held > decay+1 {
		t.Fatalf("the creep held %d answers (want about %d), intervals %v", held, decay, ivs)
	}
	if last := ivs[len(ivs)-1]; last >= ivs[2] {
		t.Fatalf("the creep never went on past the hold: %v", ivs)
	}
}

func equalDurations(a, b []time.Duration) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// Once a pace is learned, an escalation steps from it (twice the pace, and
// what the bucket needs to drain after the Retry-After), not from the
// contract's 2 s first step, which is the step from an interval nothing is
// known about (ADR 0029, the sixth look); an operator's first_step still
// wins. A pace refused again before the answers can read anything (the
// origin's limit dropped) doubles with the interval at each refusal.
func TestEscalationStepsFromTheLearnedPace(t *testing.T) {
	tests := []struct {
		name      string
		firstStep time.Duration // Limits.FirstStep; 0: the default
		// want is the interval after the second refusal; 0: the step
		// from the pace.
		want time.Duration
	}{
		{"the default: twice the pace", 0, 0},
		{"an operator's first step wins", 1500 * time.Millisecond, 1500 * time.Millisecond},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := pacer.New(&pacer.Options{
				Policy:     &pacer.Policy{Default: pacer.Limits{Floor: 0, MaxInFlight: 1, FirstStep: tt.firstStep}},
				Rand:       fixedRand(0),
				StartGuard: -1,
			})
			now := t0
			answer := func(r pacer.Response) {
				pm := mustGrant(t, p, now, time.Hour)
				now = pm.Start.Add(10 * time.Millisecond) // the answer's latency
				if v := p.Done(now, pm, r); !v.Until.IsZero() {
					now = v.Until
				}
			}
			// A blast of six (the bucket's depth), its refusal, the
			// ramp and its refusal: the second reads a pace.
			for i := 0; i < 6; i++ {
				answer(resp(200))
			}
			answer(resp(429, "Retry-After", "1"))
			for i := 0; i < 20; i++ {
				answer(resp(200))
			}
			answer(resp(429, "Retry-After", "1"))
			st := state(t, p, now)
			if st.Pace == 0 {
				t.Fatalf("no pace learned: %+v", st)
			}
			if tt.want != 0 && st.Interval != tt.want {
				t.Fatalf("interval %s after the second refusal, want the operator's %s", st.Interval, tt.want)
			}
			// The step from the pace: at least twice it, at most the
			// step without a cooldown that State shows (a Retry-After
			// drains part of the bucket), under the contract's 2 s.
			if tt.want == 0 && (st.Interval < 2*time.Duration(st.Pace) || st.Interval > time.Duration(st.FirstStep) || st.FirstStep >= pacer.Duration(pacer.FirstStep)) {
				t.Fatalf("interval %s after the second refusal, pace %s, first step shown %s: want from twice the pace to the first step, under %s",
					st.Interval, st.Pace, st.FirstStep, pacer.FirstStep)
			}
			// The probe refused: nothing read since, the pace is stale.
			answer(resp(429, "Retry-After", "1"))
			st2 := state(t, p, now)
			if st2.Interval != min(2*st.Interval, pacer.MaxInterval) {
				t.Fatalf("interval %s after a refused probe, want twice %s", st2.Interval, st.Interval)
			}
			if tt.firstStep == 0 && st2.Pace != 2*st.Pace {
				t.Fatalf("pace %s after a refused probe, want twice %s", st2.Pace, st.Pace)
			}
		})
	}
}
