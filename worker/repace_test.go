package worker

import (
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/mirrorworker/mirrorworker/pacer"
)

// TestSchedulerRepaceAfterALoweredFloor: a job held in memory for the next
// slot at floor 1 s asks the pacer again after the floor is lowered to
// 200 ms and repace is called, and goes at the new slot instead of the old
// one; without repace it would wait for the old wake-up.
func TestSchedulerRepaceAfterALoweredFloor(t *testing.T) {
	p := pacer.New(&pacer.Options{Policy: policy(time.Second, 4), StartGuard: -1})
	s := newTestSched(p, func(o *schedOptions) { o.reserve = 0 })
	s.admit(t0, testJob(t, 1, "http://a.test/1", "default"))
	s.admit(t0, testJob(t, 2, "http://a.test/2", "default"))
	if grants, _, wake := s.next(t0); len(grants) != 1 || !wake.Equal(t0.Add(time.Second)) {
		t.Fatalf("grants %d, wake %v; want 1 and t0+1s", len(grants), wake.Sub(t0))
	}
	at := t0.Add(300 * time.Millisecond)
	if g, _, _ := s.next(at); len(g) != 0 {
		t.Fatal("granted before the old slot without a policy change")
	}
	p.SetPolicy(policy(200*time.Millisecond, 4))
	s.repace(at)
	g, _, _ := s.next(at)
	if len(g) != 1 {
		t.Fatalf("after the floor was lowered and repace: %d grants at +300ms, want 1", len(g))
	}
}

// After a throttle each answer brings the interval down (ADR 0029), so a
// job held on the wait its last refusal gave asks again when an answer of
// its authority comes in: here the probe's successor is answered, the
// interval halves from 2 s to 1 s, and the next job goes 1 s after it, not
// 2 s after, as its refusal had said.
func TestSchedulerAnswerShortensAHeldWait(t *testing.T) {
	p := pacer.New(&pacer.Options{Policy: policy(0, 2), StartGuard: -1, Rand: func() float64 { return 0 }})
	s := newTestSched(p, func(o *schedOptions) { o.reserve = 0 })
	for i := uint64(1); i <= 4; i++ {
		s.admit(t0, testJob(t, i, fmt.Sprintf("http://a.test/%d", i), "default"))
	}
	grantAt := func(at time.Time) grant {
		t.Helper()
		g, d, wake := s.next(at)
		if len(g) != 1 {
			t.Fatalf("at +%v: %d grants, want 1 (%d deferred, wake at +%v)", at.Sub(t0), len(g), len(d), wake.Sub(t0))
		}
		return g[0]
	}
	answer := func(at time.Time, g grant, r pacer.Response, requeue bool) {
		p.Done(at, g.permit, r)
		s.finished(at, g.job, 10*time.Millisecond, requeue)
	}
	ms := time.Millisecond
	// Two at once at floor 0; a 429 with Retry-After: 1 to one: cooldown
	// to +1.01 s, interval 2 s from the last start.
	first, _, _ := s.next(t0)
	if len(first) != 2 {
		t.Fatalf("%d grants at floor 0 with a cap of 2, want 2", len(first))
	}
	answer(t0.Add(10*ms), first[0], pacer.Response{Status: 429, Header: http.Header{"Retry-After": {"1"}}}, true)
	answer(t0.Add(10*ms), first[1], pacer.Response{Status: 200}, false)
	// The probe at +2 s, answered: the interval stays 2 s.
	probe := grantAt(t0.Add(2000 * ms))
	if g, _, _ := s.next(t0.Add(2000 * ms)); len(g) != 0 {
		t.Fatal("a second request beside the probe")
	}
	answer(t0.Add(2010*ms), probe, pacer.Response{Status: 200}, false)
	// The next at +4 s (2 s after the probe); a third asks while it is
	// in flight and is told +6 s.
	second := grantAt(t0.Add(4000 * ms))
	if g, _, wake := s.next(t0.Add(4005 * ms)); len(g) != 0 || !wake.Equal(t0.Add(6*time.Second)) {
		t.Fatalf("inside the 2 s interval: %d grants, wake at +%v; want none until +6s", len(g), wake.Sub(t0))
	}
	// Its answer halves the interval: the third may go at +5 s.
	answer(t0.Add(4010*ms), second, pacer.Response{Status: 200}, false)
	if g, _, _ := s.next(t0.Add(4010 * ms)); len(g) != 0 {
		t.Fatal("granted inside the 1 s interval")
	}
	if g, _, _ := s.next(t0.Add(5000 * ms)); len(g) != 1 {
		t.Fatalf("at +5 s, 1 s after the last start with the interval at 1 s: %d grants, want 1 (the hint of +6 s kept)", len(g))
	}
}
