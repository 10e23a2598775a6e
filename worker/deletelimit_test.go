package worker

import (
	"context"
	"testing"
	"time"
)

func TestDeleteLimitSlidingWindow(t *testing.T) {
	t0 := time.Date(2026, 12, 3, 10, 0, 0, 0, time.UTC)
	type step struct {
		at        time.Duration
		ok, first bool
		wait      time.Duration // when refused
	}
	for _, tc := range []struct {
		name  string
		max   int
		steps []step
	}{
		{name: "no limit", max: 0, steps: []step{{at: 0, ok: true}, {at: 0, ok: true}, {at: 0, ok: true}}},
		{name: "two a minute", max: 2, steps: []step{
			{at: 0, ok: true},
			{at: 10 * time.Second, ok: true},
			{at: 20 * time.Second, first: true, wait: 40 * time.Second},
			// The second refusal of the episode is sent half a minute
			// further (one limit's worth of backlog ahead of it).
			{at: 30 * time.Second, wait: 30*time.Second + 30*time.Second},
			{at: 60 * time.Second, ok: true}, // the first delete left the window
			{at: 65 * time.Second, wait: 5*time.Second + time.Minute},
			{at: 70 * time.Second, ok: true},
		}},
		{name: "episode ends after a quiet minute", max: 1, steps: []step{
			{at: 0, ok: true},
			{at: time.Second, first: true, wait: 59 * time.Second},
			{at: 2 * time.Minute, ok: true},
			{at: 2*time.Minute + time.Second, first: true, wait: 59 * time.Second},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l := &deleteLimit{max: tc.max}
			for i, s := range tc.steps {
				wait, ok, first := l.take(t0.Add(s.at))
				if ok != s.ok || first != s.first || (!ok && wait != s.wait) {
					t.Errorf("step %d at %v: take = %v, %v, %v; want %v, %v, %v", i, s.at, wait, ok, first, s.wait, s.ok, s.first)
				}
			}
		})
	}
}

func TestDeleteLimitState(t *testing.T) {
	t0 := time.Date(2026, 12, 3, 10, 0, 0, 0, time.UTC)
	l := &deleteLimit{max: 2}
	l.take(t0)
	l.take(t0.Add(time.Second))
	if n, at := l.state(t0.Add(2 * time.Second)); n != 2 || !at.IsZero() {
		t.Errorf("state = %d, %v; want 2, not reached", n, at)
	}
	l.take(t0.Add(3 * time.Second))
	if n, at := l.state(t0.Add(4 * time.Second)); n != 2 || !at.Equal(t0.Add(3*time.Second)) {
		t.Errorf("state = %d, %v; want 2, reached at +3s", n, at)
	}
	if n, at := l.state(t0.Add(2 * time.Minute)); n != 0 || !at.IsZero() {
		t.Errorf("state a quiet minute later = %d, %v; want 0, not reached", n, at)
	}
}

func TestKeyLocks(t *testing.T) {
	var k keyLocks
	unlock, err := k.lock(context.Background(), "a")
	if err != nil {
		t.Fatal(err)
	}
	other, err := k.lock(context.Background(), "b")
	if err != nil {
		t.Fatalf("another key waits: %v", err)
	}
	other()
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := k.lock(ctx, "a"); err == nil {
		t.Fatal("a held key was taken twice")
	}
	got := make(chan func())
	go func() {
		u, _ := k.lock(context.Background(), "a")
		got <- u
	}()
	unlock()
	(<-got)()
	k.mu.Lock()
	n := len(k.held)
	k.mu.Unlock()
	if n != 0 {
		t.Errorf("%d keys left in the map after every release", n)
	}
}
