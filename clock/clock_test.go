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
