package pacer

import (
	"sync"
	"time"
)

// The fence (docs/adr/0007). Inside one pacer no two starts of a pace come
// closer than its interval by construction. Across a hand-over (another
// holder started the pace's requests until now: another pod, the other side
// of a policy change, a replay) the pacer cannot see the previous holder's
// starts, so every hand-over tells it one instant: the last start the
// previous holder may have made. The pacer then spaces the next start from
// that instant as if that request had started here. Computing the instant
// is the hand-over's business; spacing from it is the fence's alone, and
// this file is its only home:
//
//	hand-over                      who calls          the instant
//	partition taken over           TakeOvers (worker) the lease's Create send, or the hold's end after an expired lease
//	grant after a take-over        worker.GrantOwns   as the take-over
//	regroup (a group changed)      SetPolicyAt        the change plus MoveSettle
//	replay alone -> pods           pipeline (a pod)   the replays' LastStarts
//	replay after a replay          replay.Alone       the earlier replay's LastStarts
//	pods -> replay alone           replay.Alone       the last starts the owners granted
//
// Each instant is an upper bound on the previous holder's last start, never
// an estimate: a fence from too early an instant breaks the floor, one from
// too late an instant only delays the first request.

// MoveSettle is how long after a policy change that changed a group's
// members the pods may still start requests on the old paces: they apply
// the change at slightly different instants (the policy watch delivers it
// within milliseconds on a healthy cluster), and the pod that served a
// moved authority until then may have started a request to it just before
// it applied the change. So the regroup's fence instant is the change plus
// MoveSettle, and the floor holds across the move as long as every pod
// applies the change within MoveSettle of the others. It is also how long a
// permit of the old pace waits before it is asked again (Confirm), and how
// long the worker defers a moved job whose queue still runs the old pace's
// requests.
const MoveSettle = time.Second

// settledAt is the regroup's fence instant for a change at n: the last
// start any pod may have made on the old paces.
func settledAt(n int64) int64 { return n + int64(MoveSettle) }

// Fence tells the pacer that another holder may have started a request to
// auth as late as at: a hand-over (see the table above). The next start is
// spaced from at by the interval in force, as if that request had started
// here; a later start already known is kept. at may be later than now: a
// take-over that must hold its first request (a lease that expired rather
// than being given back) fences from the end of that hold, so no request to
// auth starts before at plus the interval. Fence publishes nothing.
func (p *Pacer) Fence(now time.Time, auth string, at time.Time) {
	n := now.UnixNano()
	key := p.PaceKey(auth)
	s := p.shardFor(key)
	s.mu.Lock()
	defer s.mu.Unlock()
	e := p.entryLocked(s, key, n)
	noteMemberLocked(e, key, auth)
	fenceLocked(e, at.UnixNano())
}

// FenceAll is Fence for every authority of every set of last starts (a
// replay's LastStarts, or the starts the owners granted it): the hand-overs
// that know the previous holder's last start authority by authority. An
// authority in several sets is fenced from its latest. It returns how many
// authorities it fenced.
func (p *Pacer) FenceAll(now time.Time, lasts ...map[string]time.Time) int {
	seen := map[string]bool{}
	for _, set := range lasts {
		for auth, at := range set {
			p.Fence(now, auth, at)
			seen[auth] = true
		}
	}
	return len(seen)
}

// fenceLocked spaces the entry's next start from at (see Fence): the one
// rule every hand-over ends in.
func fenceLocked(e *entry, at int64) {
	e.lastStart = max(e.lastStart, at)
	e.started = max(e.started, at)
	e.startedOther = max(e.startedOther, at)
}

// Fencer is what TakeOvers fences with; *Pacer is one.
type Fencer interface {
	Fence(now time.Time, auth string, at time.Time)
}

var _ Fencer = (*Pacer)(nil)

// TakeOvers holds the take-over instant of each partition a pod serves and
// fences an authority of a partition from it whenever a request to that
// authority is about to be asked for (a dispatch, a redirect hop, a grant).
// The pod learns which authorities a partition holds only as their jobs
// come, so the fence cannot be applied when the partition is taken; and
// Fence keeps a later start already known, so fencing again from the same
// instant changes nothing: no record of which authorities were fenced is
// kept, and none can go stale when a pace moves to another partition. Safe
// for concurrent use; create it with NewTakeOvers.
type TakeOvers struct {
	f Fencer

	mu sync.Mutex
	at map[int]time.Time // partition -> its take-over instant
}

// NewTakeOvers returns an empty set that fences through f.
func NewTakeOvers(f Fencer) *TakeOvers {
	return &TakeOvers{f: f, at: map[int]time.Time{}}
}

// Add records that partition part was taken over with the fence instant at
// (cluster's take-over instant: an upper bound on the previous owner's last
// start).
func (t *TakeOvers) Add(part int, at time.Time) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.at[part] = at
}

// Remove forgets part: it is given up.
func (t *TakeOvers) Remove(part int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	delete(t.at, part)
}

// Has reports whether part's take-over instant is known.
func (t *TakeOvers) Has(part int) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	_, ok := t.at[part]
	return ok
}

// Fence spaces auth's next start from the take-over of its partition part,
// if part was taken over here; it does nothing otherwise.
func (t *TakeOvers) Fence(now time.Time, part int, auth string) {
	t.mu.Lock()
	at, ok := t.at[part]
	t.mu.Unlock()
	if ok {
		t.f.Fence(now, auth, at)
	}
}
