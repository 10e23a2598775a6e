package worker

import (
	"context"
	"errors"
	"runtime"
	"testing"
	"time"

	"github.com/mirrorworker/mirrorworker/clock"
	"github.com/mirrorworker/mirrorworker/pacer"
)

// slotPacer refuses an authority as cooling until open, and after that
// reserves its one next slot, at slot, for an Acquire whose maxWait
// reaches it (as pacer.Pacer does for spacing). Only what a hop's acquire
// asks is implemented.
type slotPacer struct {
	Pacer // nil: the hop asks nothing else
	open  time.Time
	slot  time.Time
}

func (p *slotPacer) Acquire(now time.Time, auth string, maxWait time.Duration) (pacer.Permit, error) {
	switch {
	case now.Before(p.open):
		return pacer.Permit{}, &pacer.RefusedError{Authority: auth, Reason: pacer.ReasonCooling, Wait: p.open.Sub(now), Until: p.open}
	case p.slot.Sub(now) > maxWait:
		return pacer.Permit{}, &pacer.RefusedError{Authority: auth, Reason: pacer.ReasonSpacing, Wait: p.slot.Sub(now)}
	}
	return pacer.Permit{Authority: auth, Start: later(now, p.slot)}, nil
}

func (p *slotPacer) Confirm(_ time.Time, pm pacer.Permit) (pacer.Permit, error) { return pm, nil }

func (p *slotPacer) Done(time.Time, pacer.Permit, pacer.Response) pacer.Verdict {
	return pacer.Verdict{}
}

// TestHopWaitsUpToHoldMaxInAll runs a redirect hop's acquire on a fake
// clock: the hop waits out a refusal and a reserved start only while the
// whole wait stays within HoldMax, as decideHold holds a job in memory;
// past it the refusal comes back (the job is deferred), at the instant it
// is known. The loop this replaced reserved a start up to HoldMax after
// the end of the refusal it had waited out: the "late reservation" row
// started 1.5 s after the hop asked, with a HoldMax of 1 s.
func TestHopWaitsUpToHoldMaxInAll(t *testing.T) {
	t.Parallel()
	const holdMax = time.Second
	t0 := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	for _, tc := range []struct {
		name       string
		open, slot time.Duration // from t0
		wantStart  time.Duration // when the request starts (-1: none)
		wantReason pacer.Reason  // the refusal returned, when none starts
		wantAt     time.Duration // when the refusal is returned
	}{
		{name: "free", wantStart: 0},
		{name: "reserved slot", slot: 700 * time.Millisecond, wantStart: 700 * time.Millisecond},
		{name: "refusal, then a slot within HoldMax", open: 300 * time.Millisecond, slot: 900 * time.Millisecond, wantStart: 900 * time.Millisecond},
		{name: "refusal longer than HoldMax", open: 2 * time.Second, wantStart: -1, wantReason: pacer.ReasonCooling},
		{name: "late reservation", open: 600 * time.Millisecond, slot: 1500 * time.Millisecond, wantStart: -1, wantReason: pacer.ReasonSpacing, wantAt: 600 * time.Millisecond},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clk := clock.NewFake(t0)
			d := &hopDeps{pacer: &slotPacer{open: t0.Add(tc.open), slot: t0.Add(tc.slot)}, clk: clk, holdMax: holdMax}
			type result struct {
				pm  pacer.Permit
				err error
				at  time.Duration
			}
			done := make(chan result, 1)
			go func() {
				pm, err := d.acquire(context.Background(), "a.example:443")
				done <- result{pm, err, clk.Now().Sub(t0)}
			}()
			var r result
			deadline := time.Now().Add(10 * time.Second) // a guard, not a wait
		wait:
			for {
				select {
				case r = <-done:
					break wait
				default:
				}
				if time.Now().After(deadline) {
					t.Fatal("acquire did not return")
				}
				if clk.Timers() == 0 {
					runtime.Gosched() // the hop has not armed its next wait yet
					continue
				}
				clk.Advance(10 * time.Millisecond)
			}
			if tc.wantStart >= 0 {
				if r.err != nil || r.at != tc.wantStart || !r.pm.Start.Equal(t0.Add(tc.wantStart)) {
					t.Fatalf("acquire = %+v, %v at %v; want a start at %v", r.pm, r.err, r.at, tc.wantStart)
				}
				return
			}
			var re *pacer.RefusedError
			if !errors.As(r.err, &re) || re.Reason != tc.wantReason || r.at != tc.wantAt {
				t.Fatalf("acquire = %+v, %v at %v; want the %s refusal at %v", r.pm, r.err, r.at, tc.wantReason, tc.wantAt)
			}
		})
	}
}
