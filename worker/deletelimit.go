package worker

import (
	"sync"
	"time"
)

// DefaultMaxDeletesPerMinute is Options.MaxDeletesPerMinute's default: a
// pod removes at most this many objects in any minute. A mirror's honest
// deletes come from upstream prunes (a yanked release, an expired snapshot:
// from a handful to some thousands at a time), and pausing them costs only
// time: 100,000 deletes pass in 100 minutes. A producer gone wrong (a
// listing read as empty, a filter inverted) costs at most this many objects
// per pod before the pod logs, shows in status and in
// mirrorworker_delete_limit_reached that deleting is paused; the rest of
// the mirror is still there when an operator looks.
const DefaultMaxDeletesPerMinute = 1000

// MaxDeletesPerMinuteLimit bounds the flag: the window keeps one instant
// per delete it allows (8 MiB at this bound).
const MaxDeletesPerMinuteLimit = 1_000_000

// deleteWindow is the span the limit counts deletes over.
const deleteWindow = time.Minute

// deleteLimit allows at most max deletes in any deleteWindow (a sliding
// window, not a token bucket: the flag's "per minute" holds over every
// minute). Time is a parameter. Safe for concurrent use; the zero value
// (max 0) allows everything.
type deleteLimit struct {
	mu     sync.Mutex
	max    int         // 0: no limit
	starts []time.Time // the last max deletes allowed, a ring
	next   int         // the oldest of starts once it is full
	// refused counts the deletes refused since the limit was last free for
	// a whole window: each is sent further out, so that a backlog comes
	// back at the limit's rate rather than all at once.
	refused     int
	lastRefused time.Time
	reachedAt   time.Time // when the current episode of refusals began (zero: none)
}

// take reports whether a delete may start at now, and counts it; when it
// may not, wait is how long the delete should wait before it asks again,
// and first reports the first refusal of an episode (for the one log line
// an episode gets).
func (l *deleteLimit) take(now time.Time) (wait time.Duration, ok, first bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.max <= 0 {
		return 0, true, false
	}
	if !l.reachedAt.IsZero() && now.Sub(l.lastRefused) >= deleteWindow {
		l.reachedAt, l.refused = time.Time{}, 0
	}
	if len(l.starts) < l.max {
		l.starts = append(l.starts, now)
		return 0, true, false
	}
	oldest := l.starts[l.next]
	if free := oldest.Add(deleteWindow); !now.Before(free) {
		l.starts[l.next] = now
		l.next = (l.next + 1) % l.max
		return 0, true, false
	}
	first = l.reachedAt.IsZero()
	if first {
		l.reachedAt = now
	}
	l.refused++
	l.lastRefused = now
	wait = oldest.Add(deleteWindow).Sub(now) + time.Duration(int64(deleteWindow)*int64(l.refused-1)/int64(l.max))
	return wait, false, first
}

// state returns the deletes allowed within the window before now, and
// since when the limit has refused deletes (zero: it does not).
func (l *deleteLimit) state(now time.Time) (lastMinute int, reachedAt time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, t := range l.starts {
		if now.Sub(t) < deleteWindow {
			lastMinute++
		}
	}
	if !l.reachedAt.IsZero() && now.Sub(l.lastRefused) >= deleteWindow {
		l.reachedAt, l.refused = time.Time{}, 0
	}
	return lastMinute, l.reachedAt
}
