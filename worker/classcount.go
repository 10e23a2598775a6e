package worker

import (
	"sync"
	"time"
)

// ClassRequests are the requests a pod started in the last minute, by job
// class: what `mirrorworker status` sums into the share replays had
// (docs/adr/0025: at most one in four while live jobs wait).
type ClassRequests struct {
	Live   int64 `json:"live"`
	Replay int64 `json:"replay"`
}

// classSlot is how long one slot of classCounts counts; classSlots of them
// make the minute.
const (
	classSlot  = 10 * time.Second
	classSlots = 6
)

// classCounts counts request starts by class over the last minute, in
// slots of classSlot. The zero value is ready; safe for concurrent use.
type classCounts struct {
	mu    sync.Mutex
	slots [classSlots]struct {
		n            int64 // the slot's number: unix time / classSlot
		live, replay int64
	}
}

func (c *classCounts) add(now time.Time, replay bool) {
	n := now.UnixNano() / int64(classSlot)
	c.mu.Lock()
	defer c.mu.Unlock()
	s := &c.slots[n%classSlots]
	if s.n != n {
		s.n, s.live, s.replay = n, 0, 0
	}
	if replay {
		s.replay++
	} else {
		s.live++
	}
}

// lastMinute is what the slots of the last minute counted (the current
// slot included).
func (c *classCounts) lastMinute(now time.Time) ClassRequests {
	n := now.UnixNano() / int64(classSlot)
	c.mu.Lock()
	defer c.mu.Unlock()
	var r ClassRequests
	for _, s := range c.slots {
		if s.n > n-classSlots && s.n <= n {
			r.Live += s.live
			r.Replay += s.replay
		}
	}
	return r
}
