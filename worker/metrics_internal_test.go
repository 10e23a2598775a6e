package worker

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"
)

// TestSetHeldSetsEachStatesSeries: the series looked up once (Metrics.held)
// are mirrorworker_held_jobs' own, state by state.
func TestSetHeldSetsEachStatesSeries(t *testing.T) {
	m, err := NewMetrics(nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	m.setHeld([3]int{3, 5, 7}, 2)
	for i, want := range []float64{3, 5, 7} {
		if got := testutil.ToFloat64(m.HeldJobs.WithLabelValues(heldStates[i])); got != want {
			t.Errorf("held_jobs{state=%q} = %v, want %v", heldStates[i], got, want)
		}
	}
	if got := testutil.ToFloat64(m.Inflight); got != 2 {
		t.Errorf("inflight = %v, want 2", got)
	}
}

// BenchmarkSetHeld is the scheduler's report of its counts, made at every
// change of them (ADR 0036, ninth pass):
//
//	go test -run '^$' -bench BenchmarkSetHeld -benchmem ./worker/
func BenchmarkSetHeld(b *testing.B) {
	m, err := NewMetrics(nil, 0)
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	n := 0
	for b.Loop() {
		n++
		m.setHeld([3]int{n, n + 1, n + 2}, n)
	}
}
