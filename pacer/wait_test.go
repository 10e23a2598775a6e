package pacer_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/mirrorworker/mirrorworker/clock"
	"github.com/mirrorworker/mirrorworker/pacer"
)

// waitResult is what one Wait returned.
type waitResult struct {
	pm  pacer.Permit
	err error
}

func startWait(ctx context.Context, clk clock.Clock, p *pacer.Pacer, pm pacer.Permit) <-chan waitResult {
	ch := make(chan waitResult, 1)
	go func() {
		pm, err := pacer.Wait(ctx, clk, p, pm)
		ch <- waitResult{pm, err}
	}()
	return ch
}

// advanceUntil advances clk by step until ch yields, with a bound on steps.
func advanceUntil(t *testing.T, clk *clock.Fake, step time.Duration, ch <-chan waitResult) waitResult {
	t.Helper()
	deadline := time.After(10 * time.Second)
	for {
		select {
		case r := <-ch:
			return r
		case <-deadline:
			t.Fatal("Wait did not return")
		default:
		}
		if clk.Timers() > 0 {
			clk.Advance(step)
		} else {
			time.Sleep(time.Millisecond) // let the waiting goroutine arm its timer
		}
	}
}

func TestWaitSleepsToTheReservedStartAndConfirms(t *testing.T) {
	clk := clock.NewFake(t0)
	p := pacer.New(&pacer.Options{Policy: &pacer.Policy{Default: pacer.Limits{Floor: time.Second, MaxInFlight: 2}}, StartGuard: -1})
	first, err := p.Acquire(t0, host, 0)
	if err != nil {
		t.Fatal(err)
	}
	second, err := p.Acquire(t0, host, time.Second)
	if err != nil || !second.Start.Equal(at(time.Second)) {
		t.Fatalf("reserved %+v, %v", second, err)
	}
	if got, err := pacer.Wait(context.Background(), clk, p, first); err != nil || !got.Start.Equal(t0) {
		t.Fatalf("Wait(first) = %+v, %v; want it to go at once", got, err)
	}
	r := advanceUntil(t, clk, 100*time.Millisecond, startWait(context.Background(), clk, p, second))
	if r.err != nil || !clk.Now().Equal(at(time.Second)) {
		t.Fatalf("Wait(second) = %v at %v, want it to go at 1 s", r.err, clk.Now().Sub(t0))
	}
	if st := state(t, p, clk.Now()); st.InFlight != 2 {
		t.Fatalf("in flight %d, want both permits still held", st.InFlight)
	}
}

func TestWaitGivesARevokedPermitBack(t *testing.T) {
	clk := clock.NewFake(t0)
	p := pacer.New(&pacer.Options{Policy: &pacer.Policy{Default: pacer.Limits{Floor: time.Second, MaxInFlight: 2}}, StartGuard: -1})
	first, _ := p.Acquire(t0, host, 0)
	second, err := p.Acquire(t0, host, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	// A cooldown learned before the reserved start revokes the reservation.
	p.Done(at(500*time.Millisecond), first, resp(429, "Retry-After", "30"))
	clk.Advance(500 * time.Millisecond)
	r := advanceUntil(t, clk, 100*time.Millisecond, startWait(context.Background(), clk, p, second))
	var re *pacer.RefusedError
	if !errors.As(r.err, &re) || re.Reason != pacer.ReasonCooling {
		t.Fatalf("Wait = %+v, %v; want a cooling refusal", r.pm, r.err)
	}
	if st := state(t, p, clk.Now()); st.InFlight != 0 {
		t.Fatalf("in flight %d, want the revoked permit given back", st.InFlight)
	}
}

func TestWaitEndsWithItsContext(t *testing.T) {
	clk := clock.NewFake(t0)
	p := pacer.New(&pacer.Options{Policy: &pacer.Policy{Default: pacer.Limits{Floor: time.Second, MaxInFlight: 2}}, StartGuard: -1})
	p.Acquire(t0, host, 0)
	second, _ := p.Acquire(t0, host, time.Second)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := pacer.Wait(ctx, clk, p, second); !errors.Is(err, context.Canceled) {
		t.Fatalf("Wait = %v, want context.Canceled", err)
	}
	if st := state(t, p, clk.Now()); st.InFlight != 1 {
		t.Fatalf("in flight %d, want the waiting permit given back", st.InFlight)
	}
}

// TestAcquireWaitWithinMaxWait: AcquireWait reserves a start no further
// ahead than maxWait and sleeps to it; a refusal that hold declines comes
// back at once, and hold is told the time left.
func TestAcquireWaitWithinMaxWait(t *testing.T) {
	within := func(re *pacer.RefusedError, left time.Duration) bool { return re.Wait <= left }
	for _, tc := range []struct {
		name    string
		maxWait time.Duration
		wantAt  time.Duration // the start, from t0 (-1: refused at t0)
	}{
		{name: "the next slot within maxWait", maxWait: 2 * time.Second, wantAt: time.Second},
		{name: "the next slot past maxWait", maxWait: 500 * time.Millisecond, wantAt: -1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clk := clock.NewFake(t0)
			p := pacer.New(&pacer.Options{Policy: &pacer.Policy{Default: pacer.Limits{Floor: time.Second, MaxInFlight: 2}}, StartGuard: -1})
			if _, err := p.Acquire(t0, host, 0); err != nil {
				t.Fatal(err)
			}
			ch := make(chan waitResult, 1)
			go func() {
				pm, err := pacer.AcquireWait(context.Background(), clk, p, host, tc.maxWait, within)
				ch <- waitResult{pm, err}
			}()
			r := advanceUntil(t, clk, 100*time.Millisecond, ch)
			if tc.wantAt < 0 {
				var re *pacer.RefusedError
				if !errors.As(r.err, &re) || re.Reason != pacer.ReasonSpacing || !clk.Now().Equal(t0) {
					t.Fatalf("AcquireWait = %+v, %v at %v; want the spacing refusal at once", r.pm, r.err, clk.Now().Sub(t0))
				}
				return
			}
			if r.err != nil || !r.pm.Start.Equal(at(tc.wantAt)) || !clk.Now().Equal(at(tc.wantAt)) {
				t.Fatalf("AcquireWait = %+v, %v at %v; want a start at %v", r.pm, r.err, clk.Now().Sub(t0), tc.wantAt)
			}
		})
	}
}
