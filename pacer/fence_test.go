package pacer_test

import (
	"testing"
	"time"

	"github.com/mirrorworker/mirrorworker/pacer"
)

// TestFenceAllSpacesFromTheLatest: a replay hand-over fences every
// authority of the previous holders' last starts (FenceAll), each from its
// latest, and leaves the others alone.
func TestFenceAllSpacesFromTheLatest(t *testing.T) {
	const other = "b.example:443"
	p := newPacer(t, time.Second, nil)
	n := p.FenceAll(t0,
		map[string]time.Time{host: at(-800 * time.Millisecond)},
		map[string]time.Time{host: at(-200 * time.Millisecond), other: at(-900 * time.Millisecond)},
	)
	if n != 2 {
		t.Errorf("FenceAll fenced %d authorities, want 2", n)
	}
	tests := []struct {
		auth  string
		first time.Duration // from t0: the latest last start plus the floor
	}{
		{host, 800 * time.Millisecond},
		{other, 100 * time.Millisecond},
		{"c.example:443", 0},
	}
	for _, tt := range tests {
		t.Run(tt.auth, func(t *testing.T) {
			if wait, _, _ := p.ReadyIn(t0, tt.auth); wait != tt.first {
				t.Errorf("first request in %s, want %s", wait, tt.first)
			}
		})
	}
}

// TestRegroupFencesTheFirstStart: a policy change that moves an authority
// into or out of a group is a hand-over (the pod that served its old pace
// may have started a request just before it applied the change), so the
// first start of every pace the move touched is fenced from the change
// plus MoveSettle, through the one fence, even with nothing learned to
// carry. It fails if the regroup does not fence.
func TestRegroupFencesTheFirstStart(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	t1 := t0.Add(time.Minute) // long after any start: only the fence holds
	const a, b = "a.example:80", "b.example:80"
	tests := []struct {
		name     string
		from, to *pacer.Policy
		auth     string
		floor    time.Duration // of auth's pace after the change
	}{
		{name: "joins a group", from: groupPolicy(a), to: groupPolicy(a, b), auth: b, floor: 500 * time.Millisecond},
		{name: "a new group", from: groupPolicy(), to: groupPolicy(a), auth: a, floor: 500 * time.Millisecond},
		{name: "the group it stays in changed", from: groupPolicy(a, b), to: groupPolicy(a), auth: a, floor: 500 * time.Millisecond},
		{name: "leaves by name", from: groupPolicy(a, b), to: groupPolicy(b), auth: a, floor: time.Second},
		{name: "leaves by a pattern", from: groupPolicy("*.example:80"), to: groupPolicy(b), auth: a, floor: time.Second},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := pacer.New(&pacer.Options{Policy: tt.from, StartGuard: -1})
			pm, err := p.Acquire(t0, tt.auth, 0)
			if err != nil {
				t.Fatal(err)
			}
			pm, _ = p.Confirm(t0, pm)
			p.Done(t0, pm, pacer.Response{Status: 200})
			p.SetPolicyAt(t1, tt.to)
			pm, err = p.Acquire(t1, tt.auth, time.Minute)
			if err != nil {
				t.Fatal(err)
			}
			if want := t1.Add(pacer.MoveSettle + tt.floor); pm.Start.Before(want) {
				t.Errorf("first start after the change at t1+%s, want no sooner than t1+%s", pm.Start.Sub(t1), want.Sub(t1))
			}
		})
	}
}
