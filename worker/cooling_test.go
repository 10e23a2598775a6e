package worker_test

import (
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/mirrorworker/mirrorworker/clock"
	"github.com/mirrorworker/mirrorworker/pacer"
	"github.com/mirrorworker/mirrorworker/worker"
)

// TestCoolingCollector: the gauge is how long the authority cooling longest
// has been cooling or probing without recovering; a recovery resets it.
func TestCoolingCollector(t *testing.T) {
	clk := clock.NewFake(time.Unix(1e9, 0))
	var states []pacer.State
	c := worker.NewCoolingCollector(func(time.Time) []pacer.State { return states }, clk)
	cool := func(a, state string) pacer.State { return pacer.State{Authority: a, State: state} }
	steps := []struct {
		name    string
		advance time.Duration
		states  []pacer.State
		want    float64
	}{
		{"nothing tracked", 0, nil, 0},
		{"a starts cooling", time.Minute, []pacer.State{cool("a:443", pacer.StateCooling), cool("b:443", pacer.StateActive)}, 0},
		{"a still cooling", 30 * time.Minute, []pacer.State{cool("a:443", pacer.StateCooling)}, 1800},
		{"a probing between cooldowns counts", 10 * time.Minute, []pacer.State{cool("a:443", pacer.StateProbing), cool("b:443", pacer.StateCooling)}, 2400},
		{"a recovered, b cooling since the last scrape", 5 * time.Minute, []pacer.State{cool("a:443", pacer.StateIdle), cool("b:443", pacer.StateCooling)}, 300},
		{"a cools again: from zero", time.Minute, []pacer.State{cool("a:443", pacer.StateCooling)}, 0},
	}
	for _, s := range steps {
		clk.Advance(s.advance)
		states = s.states
		if got := testutil.ToFloat64(c); got != s.want {
			t.Errorf("%s: %v, want %v", s.name, got, s.want)
		}
	}
}
