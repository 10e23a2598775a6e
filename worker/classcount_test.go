package worker

import (
	"testing"
	"time"
)

// TestClassCountsKeepTheLastMinute: starts counted by class, in slots of
// 10 s; what is older than the minute is not counted, and a slot reused a
// minute later starts from zero.
func TestClassCountsKeepTheLastMinute(t *testing.T) {
	var c classCounts
	t0 := time.Unix(1_000_000_000, 0) // a slot's start
	c.add(t0, false)
	c.add(t0.Add(time.Second), true)
	c.add(t0.Add(25*time.Second), false)
	if got := c.lastMinute(t0.Add(30 * time.Second)); got != (ClassRequests{Live: 2, Replay: 1}) {
		t.Errorf("after 30 s: %+v, want 2 live, 1 replay", got)
	}
	// 65 s on: the first slot (0-10 s) has left the minute.
	if got := c.lastMinute(t0.Add(65 * time.Second)); got != (ClassRequests{Live: 1}) {
		t.Errorf("after 65 s: %+v, want 1 live", got)
	}
	// 61 s on, the first slot's place is used again: it starts anew.
	c.add(t0.Add(61*time.Second), true)
	if got := c.lastMinute(t0.Add(62 * time.Second)); got != (ClassRequests{Live: 1, Replay: 1}) {
		t.Errorf("after 62 s: %+v, want 1 live (25 s), 1 replay (61 s)", got)
	}
	if got := c.lastMinute(t0.Add(10 * time.Minute)); got != (ClassRequests{}) {
		t.Errorf("10 min on: %+v, want nothing", got)
	}
}
