package clock_test

import (
	"testing"
	"time"

	"github.com/mirrorworker/mirrorworker/clock"
)

func TestFakeTimers(t *testing.T) {
	t0 := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	f := clock.NewFake(t0)
	a := f.NewTimer(2 * time.Second)
	b := f.NewTimer(5 * time.Second)
	f.Advance(time.Second)
	select {
	case <-a.C():
		t.Fatal("timer fired early")
	default:
	}
	f.Advance(time.Second)
	select {
	case got := <-a.C():
		if !got.Equal(t0.Add(2 * time.Second)) {
			t.Fatalf("fired at %v", got)
		}
	default:
		t.Fatal("timer did not fire at its deadline")
	}
	if !b.Stop() {
		t.Fatal("Stop on an armed timer returned false")
	}
	f.Advance(10 * time.Second)
	select {
	case <-b.C():
		t.Fatal("stopped timer fired")
	default:
	}
	b.Reset(time.Second)
	if f.Timers() != 1 {
		t.Fatalf("Timers() = %d, want 1", f.Timers())
	}
	f.Advance(time.Second)
	if _, ok := <-b.C(); !ok {
		t.Fatal("reset timer did not fire")
	}
}

func TestSleepInterrupted(t *testing.T) {
	f := clock.NewFake(time.Unix(0, 0))
	done := make(chan struct{})
	close(done)
	if clock.Sleep(f, time.Hour, done) {
		t.Fatal("Sleep reported a full wait after done was closed")
	}
	if !clock.Sleep(f, 0, nil) {
		t.Fatal("zero Sleep should report a full wait")
	}
}

func TestFakeDeadlines(t *testing.T) {
	t0 := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	tests := []struct {
		name    string
		arm     []time.Duration // timers armed at t0
		advance time.Duration
		want    []time.Duration // deadlines listed after the advance, from t0
	}{
		{name: "none", want: nil},
		{name: "in order", arm: []time.Duration{3 * time.Second, time.Second, 2 * time.Second},
			want: []time.Duration{time.Second, 2 * time.Second, 3 * time.Second}},
		{name: "fired ones leave", arm: []time.Duration{time.Second, 2 * time.Second, 3 * time.Second},
			advance: 2 * time.Second, want: []time.Duration{3 * time.Second}},
		{name: "not yet due stays", arm: []time.Duration{time.Minute},
			advance: time.Minute - time.Millisecond, want: []time.Duration{time.Minute}},
		{name: "fired immediately", arm: []time.Duration{0}, want: nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := clock.NewFake(t0)
			for _, d := range tt.arm {
				f.NewTimer(d)
			}
			f.Advance(tt.advance)
			got := f.Deadlines()
			if len(got) != len(tt.want) {
				t.Fatalf("Deadlines() = %v, want %d deadlines", got, len(tt.want))
			}
			for i, d := range tt.want {
				if !got[i].Equal(t0.Add(d)) {
					t.Errorf("deadline %d = %v, want t0+%v", i, got[i], d)
				}
			}
		})
	}
}
