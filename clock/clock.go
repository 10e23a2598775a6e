// Package clock is the seam through which mirrorworker reads and waits on
// time, so that tests drive time with Fake.Advance instead of sleeping.
//
// Pure logic (package pacer) takes the current instant as a parameter and does
// not use this package; code that has to wait (the worker's scheduler, fetch
// slots waiting for a reserved start) does.
package clock

import (
	"sort"
	"sync"
	"time"
)

// Clock tells the time and makes timers. Implementations are safe for
// concurrent use.
type Clock interface {
	Now() time.Time
	NewTimer(d time.Duration) Timer
}

// Timer is the subset of *time.Timer that callers need.
type Timer interface {
	C() <-chan time.Time
	// Stop prevents the timer from firing; it reports whether it did so.
	Stop() bool
	// Reset changes the timer to fire after d.
	Reset(d time.Duration) bool
}

// Real is the wall clock.
type Real struct{}

var _ Clock = Real{}

// Now returns time.Now().
func (Real) Now() time.Time { return time.Now() }

// NewTimer returns a real timer.
func (Real) NewTimer(d time.Duration) Timer { return realTimer{time.NewTimer(d)} }

type realTimer struct{ t *time.Timer }

func (r realTimer) C() <-chan time.Time        { return r.t.C }
func (r realTimer) Stop() bool                 { return r.t.Stop() }
func (r realTimer) Reset(d time.Duration) bool { return r.t.Reset(d) }

// Fake is a manually advanced clock for tests. The zero value is not usable;
// call NewFake. It is safe for concurrent use.
type Fake struct {
	mu     sync.Mutex
	now    time.Time
	timers []*fakeTimer
}

var _ Clock = (*Fake)(nil)

// NewFake returns a Fake clock reading t.
func NewFake(t time.Time) *Fake { return &Fake{now: t} }

// Now returns the fake time.
func (f *Fake) Now() time.Time {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.now
}

// NewTimer returns a timer that fires when the fake time reaches now+d.
func (f *Fake) NewTimer(d time.Duration) Timer {
	f.mu.Lock()
	defer f.mu.Unlock()
	t := &fakeTimer{f: f, c: make(chan time.Time, 1)}
	f.armLocked(t, d)
	return t
}

// Advance moves the fake time forward by d and fires every timer that is
// due, in deadline order.
func (f *Fake) Advance(d time.Duration) {
	f.mu.Lock()
	f.now = f.now.Add(d)
	now := f.now
	var due []*fakeTimer
	keep := f.timers[:0]
	for _, t := range f.timers {
		if !t.when.After(now) {
			due = append(due, t)
		} else {
			keep = append(keep, t)
		}
	}
	f.timers = keep
	sort.Slice(due, func(i, j int) bool { return due[i].when.Before(due[j].when) })
	for _, t := range due {
		t.armed = false
		select {
		case t.c <- now:
		default:
		}
	}
	f.mu.Unlock()
}

// Timers returns how many timers are armed; tests use it to wait until a
// goroutine has started waiting before they advance the clock.
func (f *Fake) Timers() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.timers)
}

// Deadlines returns the instants at which the armed timers will fire, in
// order. A test that advanced the clock waits on it to see that a goroutine
// has gone back to waiting, and for which instant: Advance disarms every
// timer it fires before it returns, so a deadline listed afterwards is
// either one the advance did not reach or one armed again since.
func (f *Fake) Deadlines() []time.Time {
	f.mu.Lock()
	defer f.mu.Unlock()
	ds := make([]time.Time, 0, len(f.timers))
	for _, t := range f.timers {
		ds = append(ds, t.when)
	}
	sort.Slice(ds, func(i, j int) bool { return ds[i].Before(ds[j]) })
	return ds
}

// armLocked schedules t; f.mu must be held.
func (f *Fake) armLocked(t *fakeTimer, d time.Duration) {
	t.when = f.now.Add(d)
	if d <= 0 {
		select {
		case t.c <- f.now:
		default:
		}
		return
	}
	t.armed = true
	f.timers = append(f.timers, t)
}

// removeLocked unschedules t; f.mu must be held.
func (f *Fake) removeLocked(t *fakeTimer) bool {
	for i, x := range f.timers {
		if x == t {
			f.timers = append(f.timers[:i], f.timers[i+1:]...)
			t.armed = false
			return true
		}
	}
	return false
}

type fakeTimer struct {
	f     *Fake
	c     chan time.Time
	when  time.Time
	armed bool
}

func (t *fakeTimer) C() <-chan time.Time { return t.c }

func (t *fakeTimer) Stop() bool {
	t.f.mu.Lock()
	defer t.f.mu.Unlock()
	return t.f.removeLocked(t)
}

func (t *fakeTimer) Reset(d time.Duration) bool {
	t.f.mu.Lock()
	defer t.f.mu.Unlock()
	was := t.f.removeLocked(t)
	t.f.armLocked(t, d)
	return was
}

// Sleep waits for d on c, or until done is closed; it reports whether the
// full duration passed.
func Sleep(c Clock, d time.Duration, done <-chan struct{}) bool {
	if d <= 0 {
		return true
	}
	t := c.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C():
		return true
	case <-done:
		return false
	}
}
