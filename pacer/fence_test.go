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

// TestTakeOversFenceEveryAsk: a partition's take-over instant fences each of
// its authorities whenever one is asked for, from the instant Add recorded;
// asking again after a start of this pod's changes nothing (the fence keeps
// the later start), so no record of the fenced authorities is needed; a
// partition not taken over, or given up, fences nothing.
func TestTakeOversFenceEveryAsk(t *testing.T) {
	const floor = time.Second
	tests := []struct {
		name    string
		add     bool
		since   time.Duration // the take-over's instant, from t0
		remove  bool
		asks    int           // TakeOvers.Fence calls before the first Acquire
		first   time.Duration // the first start, from t0
		restart time.Duration // the second start, from t0, after asking again
	}{
		{name: "not taken over", asks: 1, first: 0, restart: floor},
		{name: "taken over at t0", add: true, asks: 1, first: floor, restart: 2 * floor},
		{name: "asked three times", add: true, asks: 3, first: floor, restart: 2 * floor},
		{name: "an expired lease's hold", add: true, since: 4 * time.Second, asks: 1, first: 4*time.Second + floor, restart: 4*time.Second + 2*floor},
		{name: "given up", add: true, remove: true, asks: 1, first: 0, restart: floor},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := newPacer(t, floor, nil)
			to := pacer.NewTakeOvers(p)
			if tt.add {
				to.Add(3, at(tt.since))
			}
			if tt.remove {
				to.Remove(3)
			}
			if got, want := to.Has(3), tt.add && !tt.remove; got != want {
				t.Errorf("Has = %v, want %v", got, want)
			}
			for range tt.asks {
				to.Fence(t0, 3, host)
			}
			pm, err := p.Acquire(t0, host, time.Hour)
			if err != nil {
				t.Fatal(err)
			}
			if got := pm.Start.Sub(t0); got != tt.first {
				t.Errorf("first start at t0+%v, want t0+%v", got, tt.first)
			}
			p.Done(pm.Start, pm, pacer.Response{Status: 200})
			to.Fence(pm.Start, 3, host) // asked again: the start just made is later
			pm, err = p.Acquire(pm.Start, host, time.Hour)
			if err != nil {
				t.Fatal(err)
			}
			if got := pm.Start.Sub(t0); got != tt.restart {
				t.Errorf("second start at t0+%v, want t0+%v", got, tt.restart)
			}
		})
	}
}

// BenchmarkAcquireDoneHotTakenOver is BenchmarkAcquireDoneHot with the
// take-over fence asked before every Acquire, as the worker's scheduler
// does for an authority of a partition taken over: the price of keeping no
// record of which authorities were fenced.
func BenchmarkAcquireDoneHotTakenOver(b *testing.B) {
	p := pacer.New(nil)
	to := pacer.NewTakeOvers(p)
	to.Add(1, t0.Add(-time.Hour)) // long past: the steady state, every ask a no-op
	ok := pacer.Response{Status: 200}
	now := t0
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		to.Fence(now, 1, host)
		pm, err := p.Acquire(now, host, 0)
		if err != nil {
			b.Fatal(err)
		}
		p.Done(now, pm, ok)
		now = now.Add(spacing)
	}
}
