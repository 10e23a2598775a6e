package worker

import "time"

// Repace makes every authority held in memory ask the pacer again at once,
// instead of at the wake-up its last refusal gave: call it after the
// pacer's policy changed (package policy's Options.Changed), since a
// lowered floor shortens those waits. A raised floor needs no call (the
// pacer refuses or moves every start by the new floor), but one is
// harmless: each authority costs one more Acquire. It is safe for
// concurrent use.
func (w *Worker) Repace() {
	w.sched.repace(w.o.Clock.Now())
	w.poke()
}

// repace drops the wait hints of every authority with jobs in memory and
// puts them on the ready ring; their stale timers fire later and find
// nothing to do.
func (s *scheduler) repace(now time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, a := range s.auths {
		if a.n == 0 || a.inReady || !a.armed.After(now) {
			continue
		}
		a.armed, a.waitRelease = time.Time{}, false
		s.wakeLocked(a, now)
	}
}
