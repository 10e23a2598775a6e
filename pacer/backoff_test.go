package pacer_test

import (
	"errors"
	"net/http"
	"syscall"
	"testing"
	"time"

	"github.com/mirrorworker/mirrorworker/pacer"
)

// TestFailureBackoff: consecutive failures (no answer, 5xx without a valid
// Retry-After) double the spacing from the floor up to the cap; an answer
// below 500 ends it; a 503 with a valid Retry-After is throttling (a
// cooldown), not a failure; a cancelled request teaches nothing.
func TestFailureBackoff(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	const a = "origin.example:443"
	var evs []pacer.Event
	p := pacer.New(&pacer.Options{
		Policy:     &pacer.Policy{Default: pacer.Limits{Floor: time.Second, MaxInFlight: 2}},
		StartGuard: -1,
		Rand:       func() float64 { return 0 }, // no jitter: the step itself
		OnEvent:    func(ev pacer.Event) { evs = append(evs, ev) },
	})
	now := t0
	// send takes a permit at now (failing the test if refused) and reports r.
	send := func(r pacer.Response) pacer.Verdict {
		t.Helper()
		pm, err := p.Acquire(now, a, 0)
		if err != nil {
			t.Fatalf("at +%s: %v", now.Sub(t0), err)
		}
		if pm, err = p.Confirm(now, pm); err != nil {
			t.Fatalf("confirm at +%s: %v", now.Sub(t0), err)
		}
		return p.Done(now, pm, r)
	}
	refused := func(at time.Time) *pacer.RefusedError {
		t.Helper()
		_, err := p.Acquire(at, a, 0)
		var re *pacer.RefusedError
		if !errors.As(err, &re) {
			return nil
		}
		return re
	}
	refusedConn := pacer.Response{Err: syscall.ECONNREFUSED}
	wantSteps := []time.Duration{2 * time.Second, 4 * time.Second, 8 * time.Second, 16 * time.Second}
	for i, step := range wantSteps {
		r := refusedConn
		if i%2 == 1 {
			r = pacer.Response{Status: 500}
		}
		send(r)
		re := refused(now.Add(step - time.Millisecond))
		if re == nil || re.Reason != pacer.ReasonBackoff {
			t.Fatalf("failure %d: %v just before +%s, want a backoff refusal", i+1, re, step)
		}
		if re.Wait != time.Millisecond {
			t.Fatalf("failure %d: wait %s, want 1ms", i+1, re.Wait)
		}
		st := p.Snapshot(now)[0]
		if st.State != pacer.StateBackoff || st.Failures != i+1 || !st.BackoffUntil.Equal(now.Add(step)) || !st.CooldownUntil.IsZero() {
			t.Fatalf("failure %d: state %+v", i+1, st)
		}
		now = now.Add(step)
	}
	// The cap.
	for range 12 {
		send(pacer.Response{Status: 502})
		st := p.Snapshot(now)[0]
		if d := st.BackoffUntil.Sub(now); d > pacer.MaxFailureBackoff {
			t.Fatalf("backoff %s above the cap %s", d, pacer.MaxFailureBackoff)
		}
		now = st.BackoffUntil
	}
	if d := p.Snapshot(now.Add(-time.Nanosecond))[0]; d.Failures != 16 {
		t.Fatalf("failures %d, want 16", d.Failures)
	}
	// A 404 is an answer: the backoff ends, the floor is back.
	send(pacer.Response{Status: 404})
	if wait, _, reason := p.ReadyIn(now.Add(time.Second), a); wait != 0 {
		t.Fatalf("after an answer, at the floor: wait %s (%s)", wait, reason)
	}
	if wait, _, reason := p.ReadyIn(now.Add(999*time.Millisecond), a); reason != pacer.ReasonSpacing || wait != time.Millisecond {
		t.Fatalf("after an answer, just before the floor: wait %s (%s), want 1ms spacing", wait, reason)
	}
	now = now.Add(time.Second)
	st := p.Snapshot(now)[0]
	if st.Failures != 0 || !st.BackoffUntil.IsZero() || st.State == pacer.StateBackoff {
		t.Fatalf("after an answer: %+v", st)
	}
	// A 503 without Retry-After that took its time (no limiter's quick
	// no, TestLimiter503): backoff, no cooldown (the seed rule).
	pm, err := p.Acquire(now, a, 0)
	if err != nil {
		t.Fatal(err)
	}
	if pm, err = p.Confirm(now, pm); err != nil {
		t.Fatal(err)
	}
	now = now.Add(pacer.LimiterAnswerWithin + time.Millisecond)
	p.Done(now, pm, pacer.Response{Status: 503})
	st = p.Snapshot(now)[0]
	if st.State != pacer.StateBackoff || !st.CooldownUntil.IsZero() {
		t.Fatalf("503 without Retry-After: %+v, want backoff and no cooldown", st)
	}
	now = st.BackoffUntil
	// A 503 with a valid Retry-After: a cooldown; the failures stay
	// counted (it is no answer of a healthy origin, nor a failure).
	v := send(pacer.Response{Status: 503, Header: http.Header{"Retry-After": {"30"}}})
	if !v.Throttled {
		t.Fatal("503 with Retry-After not throttled")
	}
	if st := p.Snapshot(now)[0]; st.State != pacer.StateCooling || st.Failures != 1 || !st.BackoffUntil.IsZero() {
		t.Fatalf("503 with Retry-After: %+v, want cooling, failures 1 and no backoff", st)
	}
	var backoffs, ended int
	for _, ev := range evs {
		switch ev.Type {
		case pacer.EventBackoff:
			backoffs++
		case pacer.EventBackoffEnded:
			ended++
		}
	}
	if backoffs != 17 || ended != 1 {
		t.Fatalf("%d backoff and %d backoff_ended events, want 17 and 1", backoffs, ended)
	}
}

// TestFailureBackoffRevokesAReservation: a slot reserved before a failure
// is not used during the backoff; a cancelled request does not count.
func TestFailureBackoffRevokesAReservation(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	const a = "origin.example:443"
	p := pacer.New(&pacer.Options{Policy: &pacer.Policy{Default: pacer.Limits{Floor: time.Second, MaxInFlight: 2}},
		StartGuard: -1, Rand: func() float64 { return 0 }})
	first, err := p.Acquire(t0, a, 0)
	if err != nil {
		t.Fatal(err)
	}
	second, err := p.Acquire(t0, a, 2*time.Second) // reserved for t0+1s
	if err != nil {
		t.Fatal(err)
	}
	p.Done(t0.Add(100*time.Millisecond), first, pacer.Response{Err: errors.New("read: connection reset by peer")})
	_, err = p.Confirm(second.Start, second)
	var re *pacer.RefusedError
	if !errors.As(err, &re) || re.Reason != pacer.ReasonBackoff {
		t.Fatalf("confirm of a reservation after a failure = %v, want a backoff refusal", err)
	}
	p.Done(second.Start, second, pacer.Response{Cancelled: true})
	if st := p.Snapshot(second.Start)[0]; st.Failures != 1 || st.InFlight != 0 {
		t.Fatalf("after the cancelled reservation: %+v, want 1 failure, nothing in flight", st)
	}
	wait, _, reason := p.ReadyIn(second.Start, a)
	if reason != pacer.ReasonBackoff || wait != 1100*time.Millisecond {
		t.Fatalf("ReadyIn = %s %s, want 1.1s backoff", wait, reason)
	}
}

// TestFailureBackoffAppliesFromFacts: another pod's backoff facts give the
// same state (a hand-over carries the backoff), and its recovery ends it.
func TestFailureBackoffAppliesFromFacts(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	const a = "origin.example:443"
	var evs []pacer.Event
	pol := &pacer.Policy{Default: pacer.Limits{Floor: time.Second, MaxInFlight: 2}}
	p := pacer.New(&pacer.Options{Policy: pol, OnEvent: func(ev pacer.Event) { evs = append(evs, ev) }})
	pm, err := p.Acquire(t0, a, 0)
	if err != nil {
		t.Fatal(err)
	}
	p.Done(t0, pm, pacer.Response{Status: 500})
	q := pacer.New(&pacer.Options{Policy: pol})
	for _, ev := range evs {
		q.Apply(t0, ev)
	}
	want := p.Snapshot(t0)[0]
	got := q.Snapshot(t0)[0]
	if got.State != pacer.StateBackoff || !got.BackoffUntil.Equal(want.BackoffUntil) || got.Failures != 1 {
		t.Fatalf("applied: %+v, want the backoff until %v", got, want.BackoffUntil)
	}
	q.Apply(t0.Add(time.Second), pacer.Event{Type: pacer.EventBackoffEnded, Authority: a, At: t0.Add(time.Second)})
	if got := q.Snapshot(t0.Add(time.Second))[0]; got.Failures != 0 || !got.BackoffUntil.IsZero() {
		t.Fatalf("after backoff_ended: %+v", got)
	}
	// An old recovery does not end a newer backoff.
	q.Apply(t0.Add(2*time.Second), pacer.Event{Type: pacer.EventBackoff, Authority: a, At: t0.Add(2 * time.Second), Until: t0.Add(5 * time.Second), Failures: 2})
	q.Apply(t0.Add(2*time.Second), pacer.Event{Type: pacer.EventBackoffEnded, Authority: a, At: t0.Add(time.Second)})
	if got := q.Snapshot(t0.Add(2 * time.Second))[0]; got.Failures != 2 || !got.BackoffUntil.Equal(t0.Add(5*time.Second)) {
		t.Fatalf("an older recovery ended a newer backoff: %+v", got)
	}
}

// TestFailureBackoffMinNegative: with no base, the backoff doubles from the
// floor alone, so a floor of 0 backs nothing off.
func TestFailureBackoffMinNegative(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	const a = "origin.example:443"
	p := pacer.New(&pacer.Options{Policy: &pacer.Policy{Default: pacer.Limits{Floor: 0, MaxInFlight: 1}}, FailureBackoffMin: -1})
	for i := range 5 {
		pm, err := p.Acquire(t0, a, 0)
		if err != nil {
			t.Fatalf("request %d at floor 0 with no backoff base: %v", i, err)
		}
		p.Done(t0, pm, pacer.Response{Status: 500})
	}
	q := pacer.New(&pacer.Options{Policy: &pacer.Policy{Default: pacer.Limits{Floor: 250 * time.Millisecond, MaxInFlight: 1}},
		FailureBackoffMin: -1, Rand: func() float64 { return 0 }, StartGuard: -1})
	pm, _ := q.Acquire(t0, a, 0)
	q.Done(t0, pm, pacer.Response{Status: 500})
	if st := q.Snapshot(t0)[0]; !st.BackoffUntil.Equal(t0.Add(500 * time.Millisecond)) {
		t.Fatalf("backoff until %v, want twice the 250 ms floor", st.BackoffUntil.Sub(t0))
	}
}
