package pacer_test

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/mirrorworker/mirrorworker/pacer"
	"github.com/mirrorworker/mirrorworker/stuborigin/limitreq"
)

// Before an authority has refused anything, a request does not start while
// the one started before it is unanswered (Options.ColdHold): the second of
// two in flight was the one that reached the origin after the cold blast's
// refusal had been written (ADR 0029, the fifteenth look). A 2xx's headers
// (Heard) or any answer (Done) free it; the hold ends twice the round trip
// of the answers timed so far after the open request's start (at least
// MinColdHold, at most ColdHold), or ColdHold after it while none is timed,
// and for good after ColdAnswers answers.
func TestTheColdBlastWaitsForEachAnswer(t *testing.T) {
	ms := time.Millisecond
	tests := []struct {
		name     string
		hold     time.Duration // Options.ColdHold
		answered int           // requests answered (200) one at a time before X, each after rtt
		rtt      time.Duration
		heard    int           // X's headers reported at 5 ms with this status; 0: none
		done     bool          // X answered (200) at 5 ms
		ask      time.Duration // a second request asks this long after X's start
		wait     time.Duration // ReasonInFlight's wait; 0: granted
	}{
		{"the second waits for the first's answer", pacer.DefaultColdHold, 0, 0, 0, false, ms, pacer.DefaultColdHold - ms},
		{"a 2xx's headers free it", pacer.DefaultColdHold, 0, 0, 200, false, 5 * ms, 0},
		{"a refusal's headers do not", pacer.DefaultColdHold, 0, 0, 429, false, 5 * ms, pacer.DefaultColdHold - 5*ms},
		{"its answer frees it", pacer.DefaultColdHold, 0, 0, 0, true, 5 * ms, 0},
		{"a hung first request holds it ColdHold at most", pacer.DefaultColdHold, 0, 0, 0, false, pacer.DefaultColdHold, 0},
		{"two round trips timed bound it", pacer.DefaultColdHold, 3, 20 * ms, 0, false, 5 * ms, 35 * ms},
		{"and end it", pacer.DefaultColdHold, 3, 20 * ms, 0, false, 40 * ms, 0},
		{"a refusal slower than fast admissions: MinColdHold holds it", pacer.DefaultColdHold, 3, ms, 0, false, 3 * ms, pacer.MinColdHold - 3*ms},
		{"and ends it", pacer.DefaultColdHold, 3, ms, 0, false, pacer.MinColdHold, 0},
		{"a ColdHold below MinColdHold bounds it", 10 * ms, 3, ms, 0, false, 3 * ms, 7 * ms},
		{"past ColdAnswers answers: two at once", pacer.DefaultColdHold, pacer.ColdAnswers, ms, 0, false, ms, 0},
		{"one answer short of it: still held", pacer.DefaultColdHold, pacer.ColdAnswers - 1, ms, 0, false, ms, pacer.MinColdHold - ms},
		{"without ColdHold: two at once", 0, 0, 0, 0, false, ms, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := pacer.New(&pacer.Options{
				Policy:     &pacer.Policy{Default: pacer.Limits{Floor: 0, MaxInFlight: 2}},
				StartGuard: -1,
				Rand:       fixedRand(0),
				ColdHold:   tt.hold,
			})
			start := t0
			for range tt.answered {
				a := mustGrant(t, p, start, 0)
				start = start.Add(tt.rtt)
				p.Done(start, a, resp(200))
			}
			x := mustGrant(t, p, start, 0)
			if tt.heard != 0 {
				// It reports a wait it ended: a 2xx's, on the open request.
				if got, want := p.Heard(start.Add(5*ms), x, tt.heard), tt.heard == 200; got != want {
					t.Fatalf("Heard(%d) = %v, want %v", tt.heard, got, want)
				}
			}
			if tt.done {
				p.Done(start.Add(5*ms), x, resp(200))
			}
			acquireWaits(t, p, start.Add(tt.ask), tt.wait)
		})
	}
}

// The cold hold binds the pace a group's members share, as the crossing
// rule does: a request to one member waits for the answer of another's.
func TestTheColdHoldHoldsAcrossAGroup(t *testing.T) {
	g, err := pacer.NewGroup([]string{"a.example:443", "b.example:443"})
	if err != nil {
		t.Fatal(err)
	}
	g.Limits = pacer.Limits{Floor: 0, MaxInFlight: 2}
	p := pacer.New(&pacer.Options{
		Policy:     &pacer.Policy{Default: pacer.Limits{Floor: 0, MaxInFlight: 2}, Groups: map[string]pacer.Group{"ab": g}},
		StartGuard: -1,
		ColdHold:   pacer.DefaultColdHold,
	})
	a, err := p.Acquire(t0, "a.example:443", 0)
	if err != nil {
		t.Fatal(err)
	}
	var re *pacer.RefusedError
	if _, err := p.Acquire(at(time.Millisecond), "b.example:443", 0); !errors.As(err, &re) || re.Reason != pacer.ReasonInFlight {
		t.Fatalf("b while a is unanswered: %v, want %s", err, pacer.ReasonInFlight)
	}
	p.Heard(at(2*time.Millisecond), a, 200)
	if _, err := p.Acquire(at(2*time.Millisecond), "b.example:443", 0); err != nil {
		t.Fatalf("b after a's headers: %v", err)
	}
}

// A limiter whose rate is the cold hold's own (50 r/s, answers after 20 ms:
// one request a round trip) refuses nothing during the hold; its burst goes
// after it, at full speed, and its refusal is that blast's. Counted from
// the cold start (64 answers and more) it read no depth and stepped 2 s,
// and these drains took 2.10-2.14x; counted from the hold's end they take
// what they took without the hold (main: 1.807, 1.462, 1.370x).
func TestTheBlastAfterTheColdHoldReadsItsDepth(t *testing.T) {
	const files = 300
	tests := []struct {
		burst    int64
		maxRatio float64
	}{
		{0, 1.81},
		{5, 1.47},
		{10, 1.38},
	}
	for _, tt := range tests {
		t.Run(fmt.Sprintf("burst%d", tt.burst), func(t *testing.T) {
			p := drainPacer(pacer.Limits{MaxInFlight: 2})
			r := drainBucket(t, p, &limitreq.Limiter{Limit: limitreq.Limit{Rate: 50, Burst: tt.burst}}, files, 2*time.Second, 20*time.Millisecond)
			ratio := r.drain.Seconds() * 50 / files
			t.Logf("ratio %.3f, %d rejections of %d, paces %v, refused at %v", ratio, r.rejections, r.requests, r.paces, r.refusedAt)
			if len(r.refusedAt) == 0 || r.refusedAt[0] < 64*20*time.Millisecond {
				t.Fatalf("refused at %v: want the first refusal after the cold hold's 64 answers", r.refusedAt)
			}
			if ratio > tt.maxRatio {
				t.Errorf("ratio %.3f (want at most %.2f)", ratio, tt.maxRatio)
			}
			r.checkHeld(t, 1)
		})
	}
}
