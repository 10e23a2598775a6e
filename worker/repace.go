package worker

import "time"

// repace drops the timers of every authority with jobs in memory and puts
// them on the ready ring, so that their heads ask the pacer again at once:
// the dispatcher calls it when the pacer's policy changed (Pacer.Changed),
// since a lowered floor shortens the waits those timers were armed for. A
// raised floor needs none (the pacer refuses or moves every start by the
// new floor), but one is harmless: each authority costs one more Acquire.
// Their stale timers fire later and find nothing to do.
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
