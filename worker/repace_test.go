package worker

import (
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
