package bucket

import (
	"testing"
	"time"
)

func TestPace(t *testing.T) {
	t0 := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	const paceMax = 5 * time.Second
	p := pace{max: paceMax}
	if d := p.reserve(t0); d != 0 {
		t.Fatalf("unthrottled reserve waits %s", d)
	}
	if d, first := p.throttle(); d != paceMin || !first {
		t.Fatalf("first throttle: %s %v; want %s true", d, first, paceMin)
	}
	if d, first := p.throttle(); d != 2*paceMin || first {
		t.Fatalf("second throttle: %s %v", d, first)
	}
	// Writes booked at one instant are spaced by the delay.
	for i, want := range []time.Duration{0, 2 * paceMin, 4 * paceMin} {
		if d := p.reserve(t0); d != want {
			t.Fatalf("reserve %d waits %s, want %s", i, d, want)
		}
	}
	// Later than the booked slots, a write starts at once.
	if d := p.reserve(t0.Add(time.Second)); d != 0 {
		t.Fatalf("reserve after the slots waits %s", d)
	}
	for range 20 {
		p.throttle()
	}
	if p.spacing() != paceMax {
		t.Fatalf("spacing %s after many throttles, want the cap %s", p.spacing(), paceMax)
	}
	// Successes shorten it by a quarter each, down to none.
	p.ok()
	if p.spacing() != paceMax-paceMax/4 {
		t.Fatalf("spacing %s after one success", p.spacing())
	}
	for range 30 {
		p.ok()
	}
	if p.spacing() != 0 {
		t.Fatalf("spacing %s after many successes, want 0", p.spacing())
	}
}
