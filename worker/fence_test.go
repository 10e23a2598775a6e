package worker

import (
	"testing"
	"time"

	"github.com/mirrorworker/mirrorworker/pacer"
)

// TestTakeOverFencesTheFirstStart: a partition taken over (takeOver, from
// cluster's Hooks.Acquired) spaces the first start to each of its
// authorities from the take-over's instant by the floor, through the one
// fence (pacer.Pacer.Fence), whether the first start is a dispatched job's
// or a redirect hop's; a partition served from a cold start is not held.
// It fails if the dispatch or the hop does not call the fence.
func TestTakeOverFencesTheFirstStart(t *testing.T) {
	const floor = time.Second
	tests := []struct {
		name     string
		takeOver bool
		since    time.Duration // the take-over's fence instant, from t0
		hop      bool          // the first start is a redirect hop's (hopBegin), not a dispatch
		first    time.Duration // no start before t0 plus this
	}{
		{name: "not taken over: at once"},
		{name: "taken over at t0: a floor after it", takeOver: true, first: floor},
		{name: "an expired lease's hold: a floor after the hold", takeOver: true, since: 4 * time.Second, first: 4*time.Second + floor},
		{name: "a hop after a take-over", takeOver: true, hop: true, first: floor},
		{name: "a hop after a hold", takeOver: true, since: 4 * time.Second, hop: true, first: 4*time.Second + floor},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := pacer.New(&pacer.Options{Policy: policy(floor, 1)})
			s := newTestSched(p, func(o *schedOptions) {
				o.partitions, o.owns, o.holdMax = 4, func(int) bool { return true }, time.Minute
			})
			j := testJob(t, 1, "http://a.test/1", "default")
			j.part = s.partitionOf(j.auth)
			if tt.takeOver {
				s.takeOver(j.part, t0.Add(tt.since))
			}
			if tt.hop {
				if !s.hopBegin(t0, j.part, j.auth) {
					t.Fatal("hopBegin: the partition is not served")
				}
				defer s.hopEnd(j.part)
				pm, err := p.Acquire(t0, j.auth, time.Hour)
				if err != nil {
					t.Fatal(err)
				}
				if want := t0.Add(tt.first); pm.Start.Before(want) {
					t.Errorf("the hop's first start at t0+%s, want no sooner than t0+%s", pm.Start.Sub(t0), tt.first)
				}
				return
			}
			if d, deferred := s.admit(t0, j); deferred {
				t.Fatalf("admitted job deferred: %+v", d)
			}
			if tt.first > 0 {
				if g, d, _ := s.next(t0); len(g)+len(d) != 0 {
					t.Fatalf("at t0: %d grants, %d deferrals; want the job held by the fence", len(g), len(d))
				}
				if g, _, _ := s.next(t0.Add(tt.first - time.Millisecond)); len(g) != 0 {
					t.Fatalf("granted at t0+%s, want no sooner than t0+%s", g[0].permit.Start.Sub(t0), tt.first)
				}
			}
			g, _, _ := s.next(t0.Add(tt.first + 10*time.Millisecond))
			if len(g) != 1 {
				t.Fatalf("at t0+%s: %d grants, want the job's", tt.first+10*time.Millisecond, len(g))
			}
			if want := t0.Add(tt.first); g[0].permit.Start.Before(want) {
				t.Errorf("first start at t0+%s, want no sooner than t0+%s", g[0].permit.Start.Sub(t0), tt.first)
			}
		})
	}
}
