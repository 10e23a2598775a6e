package worker

import (
	"container/heap"
	"errors"
	"math/rand/v2"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/mirrorworker/mirrorworker/authority"
	"github.com/mirrorworker/mirrorworker/jobs"
	"github.com/mirrorworker/mirrorworker/pacer"
	"github.com/nats-io/nats.go"
)

// jobState is where a held job is. A job is held from intake until it is
// acked, terminated, deferred or handed back.
type jobState int

const (
	stateQueued   jobState = iota // in its authority's queue
	stateWaiting                  // granted; its fetch slot waits for Permit.Start
	stateFetching                 // its request (or the store) is running
)

func (s jobState) String() string { return [...]string{"queued", "waiting", "fetching"}[s] }

// heldJob is one delivered job the worker holds in memory.
type heldJob struct {
	job  jobs.Job
	data []byte
	seq  uint64 // stream sequence: identifies the job across deliveries
	part int    // its authority's partition (0 with one consumer)
	// prior is the deliveries the job had before it was parked
	// (jobs.HeaderDeliveries), so deliveries per job count across parking.
	prior uint64
	laned bool // delivered by a lane (lane.go)
	// hops and origin are set on a continuation (handoff.go): redirects
	// already followed, and the job's original URL.
	hops   int
	origin string
	// replay is set on a replay job (replayjob.go).
	replay *replayJob
	auth   string // "host:port" of the first hop
	etag   string // from the stored metadata, for a conditional request
	lastMo string
	// delivered is NumDelivered of the live delivery (guarded by
	// scheduler.mu once the job is queued).
	delivered uint64
	received  time.Time
	queuedAt  time.Time
	// throttles are the throttling answers this delivery met, kept for
	// diagnosis (they never count against the failure budget).
	throttles []jobs.Attempt

	// ackMu orders this delivery's acknowledgements: once settled (its
	// ack, NAK or term sent) no in-progress ack follows (Worker.settle).
	ackMu   sync.Mutex
	settled bool

	// Guarded by scheduler.mu.
	msg     Msg
	state   jobState
	touched time.Time // last delivery or in-progress ack
}

// setContinuation copies a continuation's headers onto another copy of
// it (a parked one).
func setContinuation(h nats.Header, j *heldJob) {
	if j.origin != "" {
		h.Set(jobs.HeaderContinues, j.origin)
		h.Set(jobs.HeaderHops, strconv.Itoa(j.hops))
	}
	j.replay.copyTo(h)
}

// grant is a job handed to a fetch slot with the permit for its first hop.
type grant struct {
	job    *heldJob
	permit pacer.Permit
}

// deferral is a job taken out of memory without being fetched, with the
// calendar's delay and the reason; decideRoute (route.go) says where it
// goes: NAKed, parked (and laned), or handed back (reasonHandover).
type deferral struct {
	job    *heldJob
	delay  time.Duration
	reason reason
}

// schedOptions are the scheduler's knobs (see Options).
type schedOptions struct {
	slots      int
	holdMax    time.Duration
	reserve    time.Duration // maxWait passed to Acquire: a slot reserved this close is taken
	maxHeld    int
	maxPerAuth int
	spread     time.Duration
	inflightRe time.Duration // retry of an in-flight refusal when no completion wakes it
	rand       func() float64
	// partitions > 0: jobs come from that many partitions, served only
	// while owns(partition) is true (docs/adr/0007).
	partitions int
	owns       func(p int) bool
	// overHorizon: an authority whose queue past maxPerAuth is served
	// within it is held, pausing its partition's intake; one that makes no
	// progress for it no longer pauses it (see saturated). holdMax if 0.
	overHorizon time.Duration
}

// scheduler holds the per-authority queues and decides, on the pacer's
// answers, which job goes to a free fetch slot, which waits in memory and
// which is deferred. It does no I/O: its methods take the current instant
// and return what the caller must do. It is safe for concurrent use.
type scheduler struct {
	pacer Pacer
	o     schedOptions

	mu     sync.Mutex
	auths  map[string]*authQ
	ready  []*authQ // authorities whose head may ask the pacer now, round robin
	timers wakeHeap
	bySeq  map[uint64]*heldJob
	counts [3]int // held jobs per state
	// nheld is the sum of counts, changed under mu with it, so that
	// held() reads it without mu: the intakes and every wake-up of them
	// (Worker.wakeIntake, several a job) ask it.
	nheld atomic.Int64
	busy  int // fetch slots in use
	// busyPart counts fetch slots in use per partition (and redirect hops
	// to its authorities from jobs of others, hopBegin).
	busyPart map[int]int
	// takeOvers fences each authority from its partition's take-over
	// (against its previous owner) whenever it asks the pacer.
	takeOvers *pacer.TakeOvers
	// overs are the authorities queued past maxPerAuth because they drain
	// fast (authQ.over).
	overs map[*authQ]struct{}
	// onCounts, if set, is called with the per-state counts after a change,
	// under mu (it must only set gauges).
	onCounts func(counts [3]int, busy int)
}

// authQ is one authority's queue and what the scheduler learned of it.
type authQ struct {
	name     string
	part     int // its partition
	tenants  map[string]*fifo
	order    []string // tenants in round-robin order
	cursor   int
	n        int           // queued jobs
	inflight int           // our granted permits not yet done (first hops)
	maxSeen  int           // most permits we ever had out at once, >= 1 once used
	svc      time.Duration // EWMA of a job's time in its slot
	gap      time.Duration // EWMA of the time between completions while busy
	lastDone time.Time
	granted  time.Time // when its last permit was granted
	// armed is when the head asks the pacer again (its timer in the heap),
	// after a refusal; zero: at once. It is when to ask, not the pacer's
	// answer: admissions ask the pacer (ReadyIn), which has the last word.
	armed time.Time
	// waitRelease: refused for the in-flight cap; a completion wakes it
	// (armed is the fallback).
	waitRelease bool
	cal         calendar
	inReady     bool
	// over: the queue was let past maxPerAuth because the authority serves
	// it within overHorizon (deferOnAdmitLocked), since overSince; its
	// partition's intake waits until the queue is back under the cap, or
	// the authority stops serving it fast (scheduler.saturated).
	over      bool
	overSince time.Time
	// overRun is when the current run of over episodes began (episodes
	// less than overHorizon apart are one run); overEnded is when the last
	// episode ended. A run longer than overHorizon ends, and the authority
	// may not be over again until overBlocked: its overflow is deferred as
	// a slow authority's, and its partition's other authorities are reached
	// at pull speed meanwhile (docs/adr/0014).
	overRun, overEnded, overBlocked time.Time
	// bg holds the authority's replay jobs, after its live ones (replayjob.go).
	bg background
	// liveSinceGrant counts its live jobs taken since the pod's pacer last
	// granted a start to another program (Worker.GrantLiveFirst).
	liveSinceGrant int
}

type fifo struct{ jobs []*heldJob }

func (f *fifo) push(j *heldJob)  { f.jobs = append(f.jobs, j) }
func (f *fifo) front(j *heldJob) { f.jobs = append([]*heldJob{j}, f.jobs...) }
func (f *fifo) pop() *heldJob {
	j := f.jobs[0]
	f.jobs[0] = nil
	f.jobs = f.jobs[1:]
	return j
}

func newScheduler(p Pacer, o schedOptions) *scheduler {
	if o.rand == nil {
		o.rand = rand.Float64
	}
	if o.overHorizon <= 0 {
		o.overHorizon = o.holdMax
	}
	if o.inflightRe <= 0 {
		o.inflightRe = time.Second
	}
	return &scheduler{pacer: p, o: o, auths: map[string]*authQ{}, bySeq: map[uint64]*heldJob{},
		busyPart: map[int]int{}, takeOvers: pacer.NewTakeOvers(p), overs: map[*authQ]struct{}{}}
}

func (s *scheduler) authLocked(name string) *authQ {
	a := s.auths[name]
	if a == nil {
		a = &authQ{name: name, tenants: map[string]*fifo{}, part: s.partitionOf(name)}
		s.auths[name] = a
	}
	return a
}

// partitionOf returns the partition an authority's jobs are served in: its
// pace key's (its politeness group's, or its own), under the policy in
// force.
func (s *scheduler) partitionOf(auth string) int {
	if s.o.partitions <= 0 {
		return 0
	}
	return jobs.Partition(authority.KeyOf(s.pacer.PaceKey(auth)), s.o.partitions)
}

// ownsLocked reports whether this worker may start requests of partition p.
func (s *scheduler) ownsLocked(p int) bool {
	return s.o.owns == nil || s.o.owns(p)
}

// takeOver records that partition p was taken over at since: the first
// request to each of its authorities is spaced from since.
func (s *scheduler) takeOver(p int, since time.Time) {
	s.takeOvers.Add(p, since)
}

// drainPartition removes every queued job of partition p (it is being
// given up) and returns them.
func (s *scheduler) drainPartition(p int) []*heldJob {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []*heldJob
	for _, a := range s.auths {
		if a.part != p {
			continue
		}
		for a.n > 0 {
			j := s.popLocked(a)
			s.dropLocked(j)
			out = append(out, j)
		}
	}
	s.takeOvers.Remove(p)
	s.notifyLocked()
	return out
}

// queuedByAuth returns the queued jobs per authority.
func (s *scheduler) queuedByAuth() map[string]int {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := map[string]int{}
	for name, a := range s.auths {
		if a.n+a.inflight > 0 {
			out[name] = a.n + a.inflight
		}
	}
	return out
}

// hopBegin counts a redirect hop to auth, an authority of partition p
// other than its job's, as a request of p while it runs, so that giving p
// up waits for it (RemovePartition), and fences auth from p's take-over as
// next does for p's own authorities. It counts nothing and returns false
// when p is not served here: the hop is handed over (handoff.go).
func (s *scheduler) hopBegin(now time.Time, p int, auth string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.ownsLocked(p) {
		return false
	}
	s.busyPart[p]++
	s.takeOvers.Fence(now, p, auth)
	return true
}

// hopEnd ends what hopBegin counted.
func (s *scheduler) hopEnd(p int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.busyPart[p]--; s.busyPart[p] <= 0 {
		delete(s.busyPart, p)
	}
}

// busyIn returns how many fetch slots work on jobs of partition p.
func (s *scheduler) busyIn(p int) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.busyPart[p]
}

// pipeline returns the jobs of auth in memory: queued, waiting or fetching.
func (s *scheduler) pipeline(auth string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	if a := s.auths[auth]; a != nil {
		return a.n + a.inflight
	}
	return 0
}

// forgetLocked drops an authority that holds nothing worth keeping.
func (s *scheduler) forgetLocked(a *authQ, now time.Time) {
	if s.auths[a.name] == a && a.n == 0 && a.inflight == 0 && !a.inReady && !a.armed.After(now) && a.cal.passed(now) {
		delete(s.auths, a.name)
	}
}

func (s *scheduler) setStateLocked(j *heldJob, st jobState) {
	s.counts[j.state]--
	j.state = st
	s.counts[st]++
}

func (s *scheduler) notifyLocked() {
	if s.onCounts != nil {
		s.onCounts(s.counts, s.busy)
	}
}

// held returns how many jobs are held in memory.
func (s *scheduler) held() int { return int(s.nheld.Load()) }

// redelivered handles a delivery of a job that is already held (its ack
// wait ran out somewhere): the newer message replaces the old one so that
// acks go to the live delivery. It reports whether the job was held.
func (s *scheduler) redelivered(seq, delivered uint64, m Msg, now time.Time) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	j := s.bySeq[seq]
	if j == nil {
		return false
	}
	j.msg, j.touched = m, now
	j.delivered = max(j.delivered, delivered)
	return true
}

// admit takes a newly delivered job. It returns a deferral when the job
// should not be held: its authority is known to be unable to take a request
// within HoldMax, or its queue is full (MaxHeldPerAuthority).
func (s *scheduler) admit(now time.Time, j *heldJob) (deferral, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	a := s.authLocked(j.auth)
	if d, ok := s.deferOnAdmitLocked(now, a, j); ok {
		return d, true
	}
	j.queuedAt, j.touched = now, now
	j.state = stateQueued
	s.counts[stateQueued]++
	s.nheld.Add(1)
	s.bySeq[j.seq] = j
	s.enqueueLocked(a, j, false)
	s.wakeLocked(a, now)
	s.notifyLocked()
	return deferral{}, false
}

// tryDefer returns the deferral admit would make, committing its calendar
// slot, without queueing the job otherwise; the intake uses it to skip the
// target lookup for a job that will not be held.
func (s *scheduler) tryDefer(now time.Time, j *heldJob) (deferral, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	a := s.authLocked(j.auth)
	d, ok := s.deferOnAdmitLocked(now, a, j)
	s.forgetLocked(a, now)
	return d, ok
}

func (s *scheduler) deferOnAdmitLocked(now time.Time, a *authQ, j *heldJob) (deferral, bool) {
	if a.part != j.part && s.o.partitions > 0 {
		// The job was moved into its authority's new pace's partition
		// (a politeness group changed): the queue takes the new partition
		// once the old pace's requests have ended (decideHold).
		if h, why := decideHold(holdFacts{settling: a.n > 0 || a.inflight > 0}); h == holdDefer {
			return deferral{job: j, delay: regroupDelay, reason: why}, true
		}
		a.part = j.part
	}
	// The pacer's live answer (ReadyIn changes nothing), not one remembered
	// from a refusal: a pause resumed, a floor lowered or a recovery learned
	// from another pod count at once. The in-flight cap is the queue's own
	// state: a completion wakes a head refused for it.
	wait, spacing, refused := s.pacer.ReadyIn(now, a.name)
	f := holdFacts{wait: wait, release: a.waitRelease, reason: reasonOf(refused), holdMax: s.o.holdMax, overHorizon: s.o.overHorizon}
	var per time.Duration
	if a.n >= s.o.maxPerAuth && (f.release || f.wait <= s.o.holdMax) {
		// The queue ahead takes about n×perJob; that estimate rests on the
		// interval in force, which may decay, so it is capped by the spread
		// like every calendar offset.
		per = a.perJob(spacing)
		ahead := time.Duration(a.n) * per
		if s.o.spread > 0 {
			ahead = min(ahead, s.o.spread)
		}
		if a.over && now.Sub(a.overRun) > s.o.overHorizon {
			s.blockOverLocked(a, now)
		}
		f.full = true
		f.drainIn = f.wait + max(ahead, 10*time.Millisecond) // until the head may go (unless only a completion holds it), then the queue
		f.drains = !a.stalled(now, s.o.overHorizon) && !now.Before(a.overBlocked)
	}
	h, why := decideHold(f)
	switch h {
	case holdDefer:
		wait, step := f.wait, spacing
		if why == reasonOverflow {
			wait, step = f.drainIn, per
		}
		return deferral{job: j, delay: s.deferDelayLocked(now, a, wait, step), reason: why}, true
	case holdOver:
		// The authority serves its whole queue soon (within ParkAfter,
		// short of which a deferred job would be NAKed and delivered again
		// for nothing): the job waits in memory, and the partition's intake
		// stops pulling until the queue is back under the cap, so memory
		// stays with the other authorities (docs/adr/0014).
		if !a.over {
			a.over, a.overSince = true, now
			if a.overEnded.IsZero() || now.Sub(a.overEnded) > s.o.overHorizon {
				a.overRun = now
			}
			s.overs[a] = struct{}{}
		}
	}
	return deferral{}, false
}

// saturated reports whether partition p (0 with one consumer) has an
// authority queued past MaxHeldPerAuthority because it drains fast (within
// overHorizon): its intake waits rather than pull jobs that would overflow.
// An authority that has neither completed nor started a request for
// overHorizon (an origin that stalled) no longer holds the partition: its
// next jobs overflow to the stream as any slow authority's do, and the
// other authorities are pulled again.
func (s *scheduler) saturated(now time.Time, p int) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	sat := false
	for a := range s.overs {
		if a.part != p {
			continue
		}
		if now.Sub(later(later(a.lastDone, a.granted), a.overSince)) > s.o.overHorizon {
			s.endOverLocked(a, now)
			continue
		}
		if now.Sub(a.overRun) > s.o.overHorizon {
			s.blockOverLocked(a, now)
			continue
		}
		sat = true
	}
	return sat
}

// underCapLocked ends a's saturation once its queue is under the cap.
func (s *scheduler) underCapLocked(a *authQ) {
	if a.over && a.n < s.o.maxPerAuth {
		s.endOverLocked(a, later(a.lastDone, a.granted))
	}
}

// stalled reports an authority with requests in flight that neither
// completed nor started one for d: its observed pace is stale, and its
// queue is not served soon whatever the estimate says.
func (a *authQ) stalled(now time.Time, d time.Duration) bool {
	return a.inflight > 0 && now.Sub(later(a.lastDone, a.granted)) > d
}

// endOverLocked ends a's over episode at about now (the latest instant
// the scheduler knows of a: its last grant or completion, when no now is
// at hand).
func (s *scheduler) endOverLocked(a *authQ, now time.Time) {
	a.over, a.overEnded = false, later(now, a.overSince)
	delete(s.overs, a)
}

// blockOverLocked ends a run of over episodes that held a's partition for
// longer than overHorizon: for the next overHorizon a's overflow is deferred
// again, so that the partition's other authorities are pulled.
func (s *scheduler) blockOverLocked(a *authQ, now time.Time) {
	s.endOverLocked(a, now)
	a.overBlocked = now.Add(s.o.overHorizon)
}

func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// perJob estimates how long the authority takes per job: the spacing in
// force, or the observed gap between completions while it was busy (which
// includes every other cost of a job: slots, the target's writes).
func (a *authQ) perJob(spacing time.Duration) time.Duration {
	per := spacing
	switch {
	case a.gap > 0:
		per = max(per, a.gap)
	case a.svc > 0:
		per = max(per, a.svc/time.Duration(max(a.maxSeen, 1)))
	}
	return max(per, 100*time.Microsecond)
}

func (s *scheduler) enqueueLocked(a *authQ, j *heldJob, front bool) {
	if j.replay != nil {
		a.putBackground(j, front)
		return
	}
	t := a.tenants[j.job.Tenant]
	if t == nil {
		t = &fifo{}
		a.tenants[j.job.Tenant] = t
		a.order = append(a.order, j.job.Tenant)
	}
	if front {
		t.front(j)
	} else {
		t.push(j)
	}
	a.n++
}

// popLocked takes the next job of a, round robin between its tenants.
func (s *scheduler) popLocked(a *authQ) *heldJob {
	if j := s.popBackgroundLocked(a); j != nil {
		return j
	}
	for range len(a.order) {
		if a.cursor >= len(a.order) {
			a.cursor = 0
		}
		name := a.order[a.cursor]
		t := a.tenants[name]
		if len(t.jobs) == 0 {
			delete(a.tenants, name)
			a.order = append(a.order[:a.cursor], a.order[a.cursor+1:]...)
			continue
		}
		j := t.pop()
		a.n--
		a.liveSinceGrant++
		s.underCapLocked(a)
		if len(t.jobs) == 0 {
			delete(a.tenants, name)
			a.order = append(a.order[:a.cursor], a.order[a.cursor+1:]...)
		} else {
			a.cursor++
		}
		return j
	}
	return nil
}

// peekLocked returns the job popLocked would take.
func (s *scheduler) peekLocked(a *authQ) *heldJob {
	for i := range len(a.order) {
		t := a.tenants[a.order[(a.cursor+i)%len(a.order)]]
		if len(t.jobs) > 0 {
			return t.jobs[0]
		}
	}
	return a.peekBackground()
}

// wakeLocked puts a on the ready ring if it has work and nothing holds it.
func (s *scheduler) wakeLocked(a *authQ, now time.Time) {
	if a.inReady || a.n == 0 || a.armed.After(now) {
		return
	}
	a.armed, a.waitRelease = time.Time{}, false
	a.inReady = true
	s.ready = append(s.ready, a)
}

// next hands ready jobs to free fetch slots, asking the pacer for each
// authority's head in round robin. It returns the grants to start, the jobs
// to defer, and when to call it again at the latest (zero: on an event).
func (s *scheduler) next(now time.Time) (grants []grant, defers []deferral, wake time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.wakeDueLocked(now)
	// An authority granted a slot goes to the back of the ring, so every
	// authority's head gets a turn before any gets two; a refused one leaves
	// the ring. Each turn grants a slot or removes an authority: it ends.
	for len(s.ready) > 0 && s.busy < s.o.slots {
		a := s.ready[0]
		s.ready[0] = nil
		s.ready = s.ready[1:]
		a.inReady = false
		if s.peekLocked(a) == nil {
			continue
		}
		if ds, left := s.leaveLocked(now, a); left {
			defers = append(defers, ds...)
			continue
		}
		s.takeOvers.Fence(now, a.part, a.name)
		pm, err := s.pacer.Acquire(now, a.name, s.o.reserve)
		if err != nil {
			defers = append(defers, s.refusedLocked(now, a, err)...)
			continue
		}
		grants = append(grants, s.grantLocked(now, a, pm))
	}
	if len(s.timers) > 0 {
		wake = s.timers[0].at
	}
	s.notifyLocked()
	return grants, defers, wake
}

// wakeDueLocked puts the authorities whose timers are due back on the ring.
func (s *scheduler) wakeDueLocked(now time.Time) {
	for len(s.timers) > 0 && !s.timers[0].at.After(now) {
		w := heap.Pop(&s.timers).(wakeAt)
		a := w.a
		s.wakeLocked(a, now) // nothing if a later refusal armed it again
		s.forgetLocked(a, now)
	}
}

// leaveLocked hands back every queued job of a when its jobs are no longer
// served here (decideHold): the partition's lease is gone or being given
// back, so another pod serves these jobs now and gets them at once; or a
// policy change moved the authority into or out of a politeness group, so
// the intake moves each into the partition of its new pace.
func (s *scheduler) leaveLocked(now time.Time, a *authQ) ([]deferral, bool) {
	cur := s.partitionOf(a.name)
	h, why := decideHold(holdFacts{gone: !s.ownsLocked(a.part), regrouped: cur != a.part})
	if h != holdDefer {
		return nil, false
	}
	var defers []deferral
	for a.n > 0 {
		j := s.popLocked(a)
		s.dropLocked(j)
		defers = append(defers, deferral{job: j, reason: why})
	}
	if cur != a.part && a.inflight == 0 {
		a.part = cur
	}
	s.forgetLocked(a, now)
	return defers, true
}

// grantLocked gives a's head job the pacer's permit pm and puts a back at
// the end of the ring if more of its jobs wait.
func (s *scheduler) grantLocked(now time.Time, a *authQ, pm pacer.Permit) grant {
	j := s.popLocked(a)
	s.setStateLocked(j, stateWaiting)
	a.inflight++
	a.granted = now
	a.maxSeen = max(a.maxSeen, a.inflight)
	s.busy++
	s.busyPart[a.part]++
	if a.n > 0 {
		a.inReady = true
		s.ready = append(s.ready, a)
	}
	return grant{job: j, permit: pm}
}

// refusedLocked decides (decideHold) what a refusal of a's head means: wait
// for a release or a timer in memory, or, when a cannot take a request
// within HoldMax, send every queued job of a back to the stream, spread by
// the calendar.
func (s *scheduler) refusedLocked(now time.Time, a *authQ, err error) []deferral {
	var re *pacer.RefusedError
	if !errors.As(err, &re) {
		// A pacer that fails otherwise is a bug; retry later rather than spin.
		re = &pacer.RefusedError{Authority: a.name, Reason: pacer.ReasonSpacing, Wait: s.o.inflightRe}
	}
	h, why := decideHold(holdFacts{wait: re.Wait, release: re.Reason == pacer.ReasonInFlight, reason: reasonOf(re.Reason),
		holdMax: s.o.holdMax, overHorizon: s.o.overHorizon})
	switch h {
	case holdRelease:
		// A completion of one of this authority's requests wakes it;
		// the timer is a fallback for permits held elsewhere.
		a.waitRelease = true
		s.armLocked(a, now.Add(max(re.Wait, s.o.inflightRe)))
	case holdTimer, holdQueue:
		s.armLocked(a, now.Add(re.Wait))
	default:
		var defers []deferral
		for a.n > 0 {
			j := s.popLocked(a)
			s.dropLocked(j)
			defers = append(defers, deferral{job: j, delay: s.deferDelayLocked(now, a, re.Wait, re.Interval), reason: why})
		}
		s.forgetLocked(a, now)
		return defers
	}
	return nil
}

func (s *scheduler) armLocked(a *authQ, at time.Time) {
	a.armed = at
	heap.Push(&s.timers, wakeAt{at: at, a: a})
}

// dropLocked forgets a job that leaves memory.
func (s *scheduler) dropLocked(j *heldJob) {
	s.counts[j.state]--
	s.nheld.Add(-1)
	delete(s.bySeq, j.seq)
}

// deferDelayLocked returns the NAK delay of the next job deferred to a:
// its calendar slot plus jitter.
func (s *scheduler) deferDelayLocked(now time.Time, a *authQ, wait, step time.Duration) time.Duration {
	at := a.cal.slot(now, wait, step, s.o.spread)
	// Jitter up to half a step (at least 5% of the wait, at most 1 s), so
	// that workers sharing a consumer do not line up on the same instants.
	j := min(max(step/2, wait/20, 10*time.Millisecond), time.Second)
	return at.Sub(now) + time.Duration(s.o.rand()*float64(j))
}

// deferFor returns the delay for a job deferred outside the dispatcher (a
// redirect hop refused, a throttled answer) using the refused authority's
// calendar. The refusal is the pacer's: the authority's next admissions
// hear it from the pacer (ReadyIn), not from here.
func (s *scheduler) deferFor(now time.Time, auth string, wait, step time.Duration) time.Duration {
	s.mu.Lock()
	defer s.mu.Unlock()
	a := s.authLocked(auth)
	d := s.deferDelayLocked(now, a, wait, step)
	s.forgetLocked(a, now)
	return d
}

// fetching marks a granted job as running its request.
func (s *scheduler) fetching(j *heldJob) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.setStateLocked(j, stateFetching)
	s.notifyLocked()
}

// finished ends a granted job's slot: its first-hop permit is done and the
// job has left memory (acked, deferred, retried, dead-lettered, handed back)
// unless requeue is set, in which case it goes back to the head of its
// tenant's queue (a throttled answer: the pacer decides when it goes next).
func (s *scheduler) finished(now time.Time, j *heldJob, took time.Duration, requeue bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.busy--
	a := s.authLocked(j.auth)
	if s.busyPart[a.part]--; s.busyPart[a.part] <= 0 {
		delete(s.busyPart, a.part)
	}
	if a.inflight > 0 {
		a.inflight--
	}
	if took > 0 {
		a.svc = ewma(a.svc, took)
	}
	if !a.lastDone.IsZero() && a.n > 0 {
		// Only gaps while jobs were waiting measure the authority's pace.
		a.gap = ewma(a.gap, now.Sub(a.lastDone))
	}
	a.lastDone = now
	if requeue {
		s.setStateLocked(j, stateQueued)
		j.queuedAt = now
		s.enqueueLocked(a, j, true)
		// A throttled answer: ask the pacer at once, which now knows the
		// wait. A long one defers (parks) the queue instead of holding the
		// job in memory until an earlier refusal's timer fires.
		a.armed, a.waitRelease = time.Time{}, false
	} else {
		s.dropLocked(j)
		if a.n > 0 {
			// An answer can bring the authority's interval down (ADR
			// 0029: after a throttle each answer shortens it, and the
			// first may jump from the 2 s step to a learned pace of
			// 100 ms): the jobs held on the wait the last refusal gave
			// ask again now. One Acquire per answer, never a spin.
			a.armed, a.waitRelease = time.Time{}, false
		}
	}
	s.releasedLocked(a, now)
	s.forgetLocked(a, now)
	s.notifyLocked()
}

// released tells the scheduler that a permit of auth was done (any hop), so
// a head refused for the in-flight cap may ask again.
func (s *scheduler) released(now time.Time, auth string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if a := s.auths[auth]; a != nil {
		s.releasedLocked(a, now)
	}
}

func (s *scheduler) releasedLocked(a *authQ, now time.Time) {
	if a.waitRelease {
		a.armed, a.waitRelease = time.Time{}, false
	}
	s.wakeLocked(a, now)
}

// drain removes every queued job (shutdown) and returns them.
func (s *scheduler) drain() []*heldJob {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []*heldJob
	for _, a := range s.auths {
		a.inReady = false
		for a.n > 0 {
			j := s.popLocked(a)
			s.dropLocked(j)
			out = append(out, j)
		}
	}
	s.ready = nil
	s.notifyLocked()
	return out
}

// touchDue returns the held jobs not touched since before cutoff and
// marks them touched at now, for in-progress acks.
func (s *scheduler) touchDue(now, cutoff time.Time) []*heldJob {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []*heldJob
	for _, j := range s.bySeq {
		if j.touched.Before(cutoff) {
			j.touched = now
			out = append(out, j)
		}
	}
	// Forget authorities whose calendars have passed (bounded memory).
	for _, a := range s.auths {
		s.forgetLocked(a, now)
	}
	return out
}

// msgOf returns the live message of a held job.
func (s *scheduler) msgOf(j *heldJob) Msg {
	s.mu.Lock()
	defer s.mu.Unlock()
	return j.msg
}

// deliveries returns the job's deliveries: NumDelivered of its live
// delivery, plus those it had before it was parked.
func (s *scheduler) deliveries(j *heldJob) uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return j.prior + j.delivered
}

// authorities returns how many authorities the scheduler tracks (tests).
func (s *scheduler) authorities() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.auths)
}

type wakeAt struct {
	at time.Time
	a  *authQ
}

type wakeHeap []wakeAt

func (h wakeHeap) Len() int           { return len(h) }
func (h wakeHeap) Less(i, j int) bool { return h[i].at.Before(h[j].at) }
func (h wakeHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *wakeHeap) Push(x any)        { *h = append(*h, x.(wakeAt)) }
func (h *wakeHeap) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}

func ewma(avg, x time.Duration) time.Duration {
	if avg == 0 {
		return x
	}
	return (avg*7 + x) / 8
}

// startable returns how many jobs of auth, at most want, can start within
// HoldMax from now, and false when none can: only what the authority can
// start in that time (more would wait longer than that in memory, and be
// deferred again), and only the probe while one is due (the rest once it
// has answered), so that jobs coming back never arrive as a burst.
func startable(readyIn readyInFunc, holdMax time.Duration, now time.Time, auth string, want int) (int, bool) {
	wait, spacing, reason := readyIn(now, auth)
	if h, _ := decideHold(holdFacts{wait: wait, reason: reasonOf(reason), holdMax: holdMax}); h == holdDefer {
		return 0, false
	}
	if spacing > 0 {
		want = min(want, 1+int((holdMax-wait)/spacing))
	}
	if reason == pacer.ReasonProbing {
		want = 1
	}
	return want, true
}

// background is an authority's queue of replay jobs. While live jobs of
// the authority wait, a replay job gets the next request only after
// LiveFirstRun live jobs had theirs: a replay takes at most one request in
// LiveFirstRun+1 (a quarter of the authority's pace) while live jobs
// wait, and all of it when none do. Guarded by scheduler.mu.
type background struct {
	q    fifo
	live int // live jobs taken since the last replay job, while replay jobs waited
}

// LiveFirstRun is how many live jobs of an authority go before one of its
// replay jobs, while both wait.
const LiveFirstRun = 3

// putBackground queues a replay job (front: put back at the head).
func (a *authQ) putBackground(j *heldJob, front bool) {
	if front {
		a.bg.q.front(j)
	} else {
		a.bg.q.push(j)
	}
	a.n++
}

// popBackgroundLocked takes a's next job when it is a replay job, and
// returns nil when it is a live one (popLocked's round robin takes it).
func (s *scheduler) popBackgroundLocked(a *authQ) *heldJob {
	nb := len(a.bg.q.jobs)
	if nb == 0 {
		return nil
	}
	if a.n > nb && a.bg.live < LiveFirstRun {
		a.bg.live++
		return nil
	}
	a.bg.live = 0
	a.n--
	s.underCapLocked(a)
	return a.bg.q.pop()
}

// peekBackground is a's first replay job, nil if none.
func (a *authQ) peekBackground() *heldJob {
	if len(a.bg.q.jobs) == 0 {
		return nil
	}
	return a.bg.q.jobs[0]
}
