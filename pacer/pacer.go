package pacer

import (
	"cmp"
	"fmt"
	"hash/maphash"
	"math"
	"math/rand/v2"
	"net/http"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Fixed numbers of docs/contract.md section 3 (not configurable: they are the contract).
// Options.Scale multiplies all of them, for time-compressed load tests only.
const (
	FirstStep       = 2 * time.Second   // the first escalation step above a small interval
	MaxInterval     = 60 * time.Second  // escalation stops here (or at the floor, if higher)
	FallbackMin     = 60 * time.Second  // the fallback cooldown is drawn from [FallbackMin, ceiling]
	MaxPause        = 600 * time.Second // cap of any header-derived pause and of the fallback ceiling
	ProbeWait       = time.Second       // Wait told to callers while a probe is in flight
	InFlightMinWait = time.Second       // least Wait told to callers refused by the in-flight cap
)

// Defaults of Options.
const (
	DefaultQuietWindow = 30 * time.Minute
	DefaultMaxEntries  = 1 << 20
	// MaxStartGuard caps the default StartGuard, a fiftieth of the floor
	// (startGuardDiv): 2 ms from a floor of 100 ms up. Requests are spaced
	// from their writes (Sent, ADR 0027), so the guard covers only the
	// scheduling between a write and its report, not a connection's set-up
	// (ADR 0029 measured it).
	MaxStartGuard = 2 * time.Millisecond
	startGuardDiv = 50
	// DefaultColdHold is the longest a request to an authority that has
	// not refused anything yet waits for the answer to the one started
	// before it (Options.ColdHold): the bound when no answer has been
	// timed yet (a first request, its connection's set-up included), and
	// the cap of twice the round trips timed since.
	DefaultColdHold = time.Second
	// MinColdHold is the least the cold hold waits for an unanswered
	// request once round trips are timed (at most Options.ColdHold):
	// twice the admissions' round trip alone is too short for a refusal
	// slower than they are. In a pods run the blast's 429 came back in
	// 3.76 ms where its admissions had taken 1.1-1.5 ms, the hold had
	// ended at 3 ms, and the next request reached the origin after the
	// refusal had been written (ADR 0029, the fifteenth look). A hold
	// ends at the answer's headers (Heard), so the bound costs only
	// where one answer is slower than the rest, at most ColdAnswers
	// times per authority.
	MinColdHold = 25 * time.Millisecond
)

// ColdAnswers is how many answers without a refusal an authority gets one
// request at a time (Options.ColdHold): a limiter refuses a blast from a
// cold start after its burst, and a second request sent beside the one it
// refuses arrives after the refusal was written, while the origin has said
// wait (ADR 0029, the fifteenth look). It is maxBlast, the most admissions
// before a first refusal that the pacer still reads as a bucket's depth:
// nginx's limit_req refuses within it up to burst=62 (its documentation's
// example is burst=5, examples elsewhere burst=20), and an HAProxy stick
// table's "http_req_rate(10s) gt 20" at the 21st request; one that allows
// 100 in 10 s, or an API gateway's burst of thousands, refuses after it.
// An origin that has answered that many without refusing is paced by its
// floor alone, two at once at floor 0: the hold costs at most ColdAnswers
// requests' overlap per authority (per entry: one forgotten starts cold).
const ColdAnswers = maxBlast

// StartGuardFor is the default start guard at floor (Options.StartGuard 0):
// min(floor/50, MaxStartGuard).
func StartGuardFor(floor time.Duration) time.Duration {
	return min(floor/startGuardDiv, MaxStartGuard)
}

// Defaults of the convergence after a throttling answer (ADR 0029), which a
// policy may set per authority or group (Limits.FirstStep, Limits.Decay).
const (
	// DefaultDecay is how many answered requests it takes the interval to
	// halve once it is at or below the pace learned from the origin's
	// admissions: it probes the origin's limit from below, 0.2% faster per
	// answer. Above the learned pace (or the floor, with none learned) the
	// interval halves with every answer.
	DefaultDecay = 350
	// MaxDecay is the largest Decay a policy may give.
	MaxDecay = 1 << 20
	// minPaceAnswers is how many answers between two escalations it takes
	// to learn a pace from them: fewer say too little about the rate.
	minPaceAnswers = 3
	// limiterTick is a limiter's clock resolution: nginx counts the
	// time between two requests in whole milliseconds.
	limiterTick = int64(time.Millisecond)
)

// State names of State.State and the keys of Counts.
const (
	StateIdle      = "idle"      // at the floor, nothing in flight, next slot passed
	StateActive    = "active"    // requests in flight or a slot reserved
	StateEscalated = "escalated" // interval above the floor
	StateCooling   = "cooling"   // a cooldown is in force
	StateProbing   = "probing"   // the cooldown is over and awaits (or runs) its probe
	StatePaused    = "paused"    // an operator paused the authority
	StateBackoff   = "backoff"   // failing: no request before the backoff's end (backoff.go)
)

// Options configure a Pacer. The zero value of every field is its default.
type Options struct {
	// Policy gives the limits (floors, caps, steps, groups); nil is the default policy.
	Policy *Policy
	// QuietWindow is how long without a throttling signal before an escalated
	// interval halves; 0 means 30 min, negative disables this decay. It
	// brings back an authority nobody uses; one in use comes back faster,
	// with each answer (Limits.Decay, ADR 0029), whatever QuietWindow says.
	QuietWindow time.Duration
	// MaxEntries bounds the tracked authorities; 0 means 1<<20. Idle entries
	// at their floor are evicted to stay under it. Entries that must not be
	// forgotten (escalated, cooling, awaiting a probe, in flight, slot not yet
	// passed) are never evicted, so the bound is exceeded rather than forget
	// one of them.
	MaxEntries int
	// Rand returns a number in [0, 1) for the fallback jitter; nil uses
	// math/rand/v2. It is called with a lock held, possibly from several
	// goroutines at once: it must be safe for concurrent use and must not
	// call the Pacer.
	Rand func() float64
	// OnEvent, if set, receives every fact (the pacer logs nothing: the
	// facts.Sink logs, counts and publishes), never under a lock, in the order they happened for one authority. It must not block
	// for long: it runs on the caller's goroutine of Acquire or Done.
	OnEvent func(Event)
	// Scale compresses time for load tests: it multiplies every fixed
	// duration of docs/contract.md section 3 (FirstStep, MaxInterval, FallbackMin,
	// MaxPause both as the fallback ceiling's cap and as every pause's cap,
	// ProbeWait, InFlightMinWait) and the default QuietWindow. 0 or 1 is real
	// time; New panics unless 0 <= Scale <= 1, because a Scale outside that
	// range is a programming error and clamping it would let a load test
	// report on rules it did not run. Delays the origin sends (Retry-After,
	// rate-limit resets) are not scaled, since the origin already runs on
	// the compressed clock, but they are capped at the scaled MaxPause: the
	// cap protects against hostile headers, and in a compressed run the
	// scaled cap is the one that means 600 s. Floors (policy), an explicit
	// QuietWindow and StartGuard are not scaled.
	Scale float64
	// StartGuard is extra spacing added to the interval wherever the pacer
	// spaces request starts: grants, reservations and Confirm's check of
	// actual starts. A request still travels from Confirm to the origin's
	// socket with scheduling jitter, so two requests confirmed exactly one
	// interval apart reach the origin closer than that whenever the first is
	// delayed more on its way; the guard absorbs that. It never enters the
	// reported Interval nor the escalation arithmetic. 0 means
	// min(floor/4, MaxStartGuard) for each authority (0 when the floor is
	// 0); negative means none. It is not scaled: the jitter it covers is the
	// machine's, not the origin's.
	StartGuard time.Duration
	// FailureBackoffMin is the base of a failing origin's backoff when the
	// floor is below it (backoff.go); 0 means FailureBackoffMin (scaled by
	// Scale), negative means none: the backoff doubles from the floor alone,
	// and a floor of 0 then backs nothing off (tests of other rules).
	FailureBackoffMin time.Duration
	// Rules is the learning rule (rules.go); nil is the HostPacer's own.
	// With another rule the Pacer publishes no events, spends no announced
	// budget and ignores QuietWindow (decay is the rule's Relax).
	Rules Rules
	// AwaitSends says that the caller reports when each confirmed request
	// is written to its connection (Sent), as the worker does: the floor is
	// then kept between the requests as the origin receives them, not only
	// between their starts. While a request to an authority has been
	// confirmed but is neither written nor done, no other request to that
	// authority starts (its connection may still be dialling, shaking
	// hands or waiting on a proxy's CONNECT, and the next request, on a
	// pooled connection, would overtake it); the next starts one spacing
	// after the write. Without it, a Sent still spaces the next starts
	// from the write, but nothing waits for a write not yet reported. A
	// caller that sets it and never calls Sent gets one request written at
	// a time: each waits for the previous one's Done.
	AwaitSends bool
	// ColdHold bounds the cold hold: until an authority has answered
	// ColdAnswers requests or refused one, a request to it does not start
	// while the one started before it is unanswered (Done, or Heard with a
	// 2xx status), at most ColdHold after that one's start and at most
	// twice the round trip of the answers timed so far. Without it the
	// second of two requests in flight in a cold blast was the one that
	// arrived after the blast's refusal had been written (ADR 0029, the
	// fifteenth look). 0 means none, as for a pacer that does not pace
	// (grant.PacedLocal) and the tests of other rules; the worker's
	// pipeline sets DefaultColdHold. It is not scaled: the round trip it
	// covers is the network's, not the origin's.
	ColdHold time.Duration
}

// Pacer is the HostPacer. Create it with New; the zero value is not usable.
// A Pacer is safe for concurrent use.
type Pacer struct {
	shards    []shard
	mask      uint64
	seed      maphash.Seed
	policy    atomic.Pointer[Policy]   // replaced whole by SetPolicy
	left      atomic.Pointer[departed] // what the last change of groups left (group.go)
	quiet     int64
	rnd       func() float64
	onEvent   func(Event)
	rules     Rules
	shardMax  int
	sweepStep int

	// docs/contract.md section 3's constants times Options.Scale, in nanoseconds, so the
	// scale costs nothing per call.
	firstStep, maxInterval, fallbackMin, maxPause, probeWait, inFlightMinWait int64
	failMin, failMax                                                          int64 // FailureBackoffMin, MaxFailureBackoff
	// guard is Options.StartGuard (0 for none) unless guardAuto, when it is
	// derived from each authority's floor.
	guard      int64
	guardAuto  bool
	awaitSends bool  // Options.AwaitSends
	coldHold   int64 // Options.ColdHold (0: none)

	// changeMu guards changed, the channel the next SetPolicy closes
	// (Changed); nil until someone asks for it.
	changeMu sync.Mutex
	changed  chan struct{}
}

// Changed returns a channel that the next policy change (SetPolicy) closes:
// a caller holding a wait the pacer told it (a timer armed on a refusal)
// asks again when it closes, since a lowered floor shortens every wait told
// before it. Ask for a new channel after each close.
func (p *Pacer) Changed() <-chan struct{} {
	p.changeMu.Lock()
	defer p.changeMu.Unlock()
	if p.changed == nil {
		p.changed = make(chan struct{})
	}
	return p.changed
}

// changedNow closes the channel Changed gave out, if any.
func (p *Pacer) changedNow() {
	p.changeMu.Lock()
	defer p.changeMu.Unlock()
	if p.changed != nil {
		close(p.changed)
		p.changed = nil
	}
}

// shard is one lock and the entries it guards; the padding keeps two shards'
// locks off one cache line.
type shard struct {
	mu      sync.Mutex
	m       map[string]*entry
	seq     uint64 // last Permit.seq granted in this shard
	sweepAt int    // do not sweep again before len(m) reaches this
	_       [24]byte
}

// entry is one authority. Instants are Unix nanoseconds, 0 meaning none,
// which keeps an entry small.
type entry struct {
	floor    int64
	interval int64
	// lastStart is the latest start granted, reserved, moved by Confirm or
	// confirmed; the next slot is lastStart + interval + guard.
	lastStart int64
	// started is the latest actual start (Confirm, or Acquire granting a
	// start at now) and startedSeq the permit that made it; startedOther is
	// the latest actual start of any other permit, so that a permit confirmed
	// again is never spaced from itself.
	started      int64
	startedOther int64
	startedSeq   uint64
	decayRef     int64 // start of the current quiet window
	// Convergence (ADR 0029): escAt is the last escalation and answered
	// the answers without throttling since; resumed is when the probe
	// after it was answered and answeredOn the answers since (the probe's
	// included); pace is the spacing learned from the origin's admissions
	// (0: none); pubIv the interval last published, so a decay publishes a
	// fact only when it halves or reaches the floor; halvedAt when the
	// ramp (the halving toward a pace not yet learned) last halved: at
	// most once per rampHalving (reading.go).
	escAt      int64
	escSeq     uint64 // the shard's latest permit at escAt: granted before it
	halvedAt   int64
	resumed    int64
	pace       int64
	pubIv      int64
	answered   int32
	answeredOn int32
	decaySteps int32 // Limits.Decay (0: DefaultDecay)
	// blastFrom is how many answers came before the cold blast a first
	// refusal ends: 0 from a cold start, and the answered count at the
	// first start after the cold hold ended without a refusal (coldFrom
	// is then that start), whose full-speed burst is a blast of its own.
	blastFrom   int32
	firstStep   int64  // Limits.FirstStep (0: the pacer's scaled FirstStep)
	until       int64  // cooldown deadline; set and passed = awaiting a probe
	ceiling     int64  // fallback ceiling
	lastThrot   int64  // last throttling signal, for State
	probeSeq    uint64 // seq of the probe in flight, 0 if none
	paused      int64  // an operator's pause deadline (EventPaused); not capped
	pausedAt    int64  // when the latest pause was given, for EventResumed
	pauseReason string // the operator's words for the pause in force, for State
	inFlight    int32
	maxFlight   int32
	// unsent is the permit confirmed to start and not yet written (Sent)
	// nor done, 0 if none (Options.AwaitSends). There is at most one: no
	// other start is confirmed while it is out.
	unsent uint64
	// The failure backoff (backoff.go): consecutive failures, the instant
	// before which no request may start, and the latest failure or
	// recovery (for ordering facts from other pods).
	fails     int32
	failUntil int64
	failAt    int64
	// ans is what the authority answered lately, by URL (backoff.go), so
	// that one URL's failure and a limiter's 503 are not the origin's.
	ans answers
	// bud is the budget the origin announces (budget.go); nil until a
	// response announces one, so an authority without rate-limit headers
	// pays one pointer for it.
	bud *budget
	// rd reads the origin's rate from its admissions and refusals
	// (reading.go, ADR 0029); nil until the first throttling answer.
	rd *reading
	// cold is the request the cold hold waits on (coldLocked) and the
	// round trip of the answers timed so far, while rd is nil; coldFrom
	// is the first start under it, from which the first refusal times
	// the blast (reading.blastSpan).
	cold     opening
	coldFrom int64
	// rule is the state of Options.Rules that has no field above; nil
	// with the HostPacer's own rule.
	rule *ruled
	// members are the authorities served through a group's entry
	// (group.go), so that one leaving the group takes its state along;
	// nil for an authority's own entry.
	members map[string]struct{}
}

// New returns a Pacer. A nil o means the defaults: default policy (floor 1 s,
// in-flight cap 2), quiet window 30 min, real time, default start guard. New
// panics if o.Scale is outside [0, 1] or NaN.
func New(o *Options) *Pacer {
	if o == nil {
		o = &Options{}
	}
	scale := o.Scale
	if !(scale >= 0 && scale <= 1) {
		panic(fmt.Sprintf("pacer: Options.Scale %v outside [0, 1]", scale))
	}
	if scale == 0 {
		scale = 1
	}
	// Rounded, and never below 1 ns: a zero quiet window would divide by zero.
	scaled := func(d time.Duration) int64 { return max(1, int64(math.Round(float64(d)*scale))) }
	p := &Pacer{
		firstStep:       scaled(FirstStep),
		maxInterval:     scaled(MaxInterval),
		fallbackMin:     scaled(FallbackMin),
		maxPause:        scaled(MaxPause),
		probeWait:       scaled(ProbeWait),
		inFlightMinWait: scaled(InFlightMinWait),
		failMin:         scaled(FailureBackoffMin),
		failMax:         scaled(MaxFailureBackoff),
		guard:           max(0, int64(o.StartGuard)),
		guardAuto:       o.StartGuard == 0,
		seed:            maphash.MakeSeed(),
		quiet:           int64(o.QuietWindow),
		rnd:             o.Rand,
		onEvent:         o.OnEvent,
		rules:           o.Rules,
		awaitSends:      o.AwaitSends,
		coldHold:        max(0, int64(o.ColdHold)),
	}
	if o.Policy == nil {
		p.policy.Store(DefaultPolicy())
	} else {
		p.policy.Store(o.Policy)
	}
	if p.quiet == 0 {
		p.quiet = scaled(DefaultQuietWindow)
	}
	if p.rules != nil {
		p.quiet = -1   // decay is the rule's Relax
		p.coldHold = 0 // the HostPacer's own rule, as the crossing rule is
	}
	if p.rnd == nil {
		p.rnd = rand.Float64
	}
	switch {
	case o.FailureBackoffMin < 0:
		p.failMin = 0
	case o.FailureBackoffMin > 0:
		p.failMin = int64(o.FailureBackoffMin)
	}
	maxEntries := o.MaxEntries
	if maxEntries <= 0 {
		maxEntries = DefaultMaxEntries
	}
	// Shard only when each shard still holds many entries, so that a small
	// MaxEntries is enforced exactly.
	n := 1
	for n < 64 && maxEntries/(n*2) >= 4096 {
		n *= 2
	}
	p.shards = make([]shard, n)
	p.mask = uint64(n - 1)
	p.shardMax = (maxEntries + n - 1) / n
	p.sweepStep = max(1, p.shardMax/8)
	for i := range p.shards {
		p.shards[i].m = make(map[string]*entry)
		p.shards[i].sweepAt = p.shardMax
	}
	return p
}

func (p *Pacer) shardFor(auth string) *shard {
	if p.mask == 0 {
		return &p.shards[0]
	}
	return &p.shards[maphash.String(p.seed, auth)&p.mask]
}

// entryLocked returns the authority's entry, creating it (and evicting idle
// entries if the shard is full). s.mu must be held.
func (p *Pacer) entryLocked(s *shard, auth string, now int64) *entry {
	if e := s.m[auth]; e != nil {
		return e
	}
	if len(s.m) >= s.sweepAt {
		p.sweepLocked(s, now)
		s.sweepAt = max(p.shardMax, len(s.m)+p.sweepStep)
	}
	l := p.policy.Load().Limits(auth)
	e := &entry{
		floor:     int64(l.Floor),
		interval:  int64(l.Floor),
		ceiling:   p.fallbackMin,
		maxFlight: int32(max(1, min(l.MaxInFlight, MaxPolicyInFlight))),
	}
	e.tuneLocked(l)
	if p.rules != nil {
		e.rule = &ruled{}
	}
	p.departedLocked(e, auth, now)
	s.m[strings.Clone(auth)] = e
	return e
}

// sweepLocked evicts every entry that can be forgotten without making the
// pacer ruder. s.mu must be held.
func (p *Pacer) sweepLocked(s *shard, now int64) {
	for k, e := range s.m {
		if p.evictable(e, now) {
			delete(s.m, k)
		}
	}
}

func (p *Pacer) evictable(e *entry, now int64) bool {
	return e.until == 0 && e.inFlight == 0 && e.probeSeq == 0 && e.paused <= now &&
		e.fails == 0 && e.failUntil <= now &&
		e.ceiling == p.fallbackMin &&
		p.decayedInterval(e, now) <= e.floor &&
		(e.lastStart == 0 || e.lastStart+e.floor+p.guardFor(e) <= now) &&
		(e.bud == nil || e.bud.idle(now)) &&
		(e.rule == nil || e.rule.streak == 0)
}

// guardFor is the start guard of e's authority (Options.StartGuard).
func (p *Pacer) guardFor(e *entry) int64 {
	if p.guardAuto {
		return int64(StartGuardFor(time.Duration(e.floor)))
	}
	return p.guard
}

// tuneLocked takes the convergence settings of l. The entry's lock must be
// held (or the entry not yet shared).
func (e *entry) tuneLocked(l Limits) {
	e.firstStep = int64(l.FirstStep)
	e.decaySteps = int32(min(max(l.Decay, 0), MaxDecay))
}

// firstStepFor is e's first escalation step, the least interval an
// escalation followed by a cooldown of cool sets: the policy's, where an
// operator gave one; else, once a pace is learned from the origin's
// admissions, twice that pace, and at least what the bucket needs to drain
// after cool (its depth and the probe, at the pace; half of it without a
// cooldown), at most the
// contract's FirstStep; else the FirstStep (scaled). The 2 s step exists
// because twice a small interval says nothing: it is the step from an
// interval nothing has been learned about. Once the origin has shown its
// rate, lifted to 2 s it left a 10 r/s origin idle for a Retry-After and 2
// s more after each refusal (3.4 s of its capacity). The drain keeps the
// reading true: its upper bound counts from an instant the bucket was
// empty (reading.go), which a Retry-After of 2 s alone does not give a
// bucket of depth 6 at 2 r/s (ADR 0029, "The sixth look").
func (p *Pacer) firstStepFor(e *entry, cool int64) int64 {
	if e.firstStep > 0 {
		return e.firstStep
	}
	if e.pace <= 0 {
		return p.firstStep
	}
	step := 2 * e.pace
	if e.rd != nil && e.rd.burst > 0 {
		drain := int64(e.rd.burst+1) * e.pace
		if e.rd.lo > 0 {
			drain = max(drain, int64(float64(e.rd.burst+1)*1e9/float64(e.rd.lo)))
		}
		if cool <= 0 {
			// No cooldown (a limiter's 503 without Retry-After):
			// nothing follows the step to spend the drained depth
			// (no probe, no spend), so a whole bucket's drain was
			// that much of the origin's capacity left idle: 787 ms
			// after the ramp's refusal at 10 r/s, and with its
			// unused depth 0.8 s of the 4.2 s the drain lost to
			// the origin's best. Half of it keeps a runway for a
			// pace read
			// fast (at 5 r/s the pace after the ramp read 188 ms
			// for 200, and without the drain the short fill that
			// refused it read 208 ms for the rest of the run). ADR
			// 0029, the fourteenth look.
			drain /= 2
		}
		step = max(step, drain-cool)
	}
	return min(step, p.firstStep)
}

// decayedInterval is e.interval after the quiet windows elapsed by now,
// without changing e.
func (p *Pacer) decayedInterval(e *entry, now int64) int64 {
	iv, _ := p.decay(e, now)
	return iv
}

func (p *Pacer) decay(e *entry, now int64) (interval, ref int64) {
	if e.interval <= e.floor || p.quiet <= 0 || now-e.decayRef < p.quiet {
		return e.interval, e.decayRef
	}
	k := (now - e.decayRef) / p.quiet
	iv := e.interval
	for i := int64(0); i < k && iv > e.floor; i++ {
		iv /= 2
	}
	return max(iv, e.floor), e.decayRef + k*p.quiet
}

// decayLocked applies lazy decay and records the change. The entry's lock
// must be held.
func (p *Pacer) decayLocked(e *entry, auth string, now int64, fx *facts) {
	iv, ref := p.decay(e, now)
	if iv == e.interval {
		return
	}
	e.interval, e.decayRef = iv, ref
	fx.add(Event{Type: EventInterval, Authority: auth, At: time.Unix(0, ref), Interval: time.Duration(iv), Reason: "decay"})
}

// Acquire decides whether a request to auth ("host:port", as
// authority.Authority.String gives it) may start. It grants a Permit whose
// Start is now, or a reserved slot at most maxWait ahead; otherwise it
// refuses with a *RefusedError. Every Permit must be given back to Done
// exactly once.
//
// The order of the checks is docs/contract.md section 3's: cooling, probe, in-flight cap,
// spacing. The probe itself also respects the cap and the spacing. Spacing
// is the interval plus the start guard (Options.StartGuard) from the latest
// start granted or confirmed. A granted Permit, even one reserved for a
// future Start, holds an in-flight place from the grant. A Permit whose
// Start is now counts as started now; call Confirm immediately before every
// request start all the same (see Confirm), so that a cooldown learned in
// the meantime revokes a reservation and a late start moves the next ones.
// auth must already be normalised: the pacer compares it byte for byte.
func (p *Pacer) Acquire(now time.Time, auth string, maxWait time.Duration) (Permit, error) {
	if p.rules != nil {
		return p.acquireRules(now, auth, maxWait)
	}
	n := now.UnixNano()
	key := p.PaceKey(auth)
	s := p.shardFor(key)
	s.mu.Lock()
	e := p.entryLocked(s, key, n)
	if p.decayDue(e, n) {
		s.mu.Unlock()
		return p.acquireSlow(now, auth, maxWait)
	}
	pm, re := p.acquireLocked(s, e, auth, key, now, n, maxWait)
	s.mu.Unlock()
	if re != nil {
		return Permit{}, re
	}
	return pm, nil
}

// acquireSlow is Acquire when a decay is due and produces a fact; it keeps
// the facts buffer off the hot path.
func (p *Pacer) acquireSlow(now time.Time, auth string, maxWait time.Duration) (Permit, error) {
	n := now.UnixNano()
	var fx facts
	key := p.PaceKey(auth)
	s := p.shardFor(key)
	s.mu.Lock()
	e := p.entryLocked(s, key, n)
	p.decayLocked(e, key, n, &fx)
	pm, re := p.acquireLocked(s, e, auth, key, now, n, maxWait)
	s.mu.Unlock()
	p.publish(&fx)
	if re != nil {
		return Permit{}, re
	}
	return pm, nil
}

func (p *Pacer) decayDue(e *entry, n int64) bool {
	return e.interval > e.floor && p.quiet > 0 && n-e.decayRef >= p.quiet
}

// acquireLocked is Acquire for auth, whose pace key is key and entry e: the
// core's answer (decideLocked) for a request not yet granted, committed as
// a grant.
func (p *Pacer) acquireLocked(s *shard, e *entry, auth, key string, now time.Time, n int64, maxWait time.Duration) (Permit, *RefusedError) {
	noteMemberLocked(e, key, auth)
	d := p.decideLocked(e, n, ask{at: n, from: e.lastStart, maxWait: max(0, int64(maxWait))})
	if d.reason != "" {
		return Permit{}, d.refused(auth)
	}
	s.seq++
	if e.bud != nil {
		e.bud.granted(s.seq)
	}
	e.lastStart = d.start
	if d.start == n {
		// A start at now is an actual start; start >= e.started here, since
		// e.lastStart >= e.started always.
		e.startedOther, e.started, e.startedSeq = e.started, n, s.seq
	}
	e.inFlight++
	if d.probe {
		e.probeSeq = s.seq
	}
	if d.start == n {
		p.openedLocked(e, s.seq, n)
	}
	return Permit{Authority: auth, Start: now.Add(time.Duration(d.start - n)), Probe: d.probe, Interval: time.Duration(d.spacing), seq: s.seq, key: key}, nil
}

// ask is what a decision path asks the core (decideLocked), as
// golang.org/x/time/rate's reserveN is asked by Allow, Reserve and Wait:
// Acquire asks for a request not yet granted, Confirm for a granted permit
// about to start, ReadyIn for a request it will not make.
type ask struct {
	// seq is the permit asking (Confirm); 0 for a request not yet granted,
	// which needs an in-flight place of its own.
	seq uint64
	// at is the earliest start asked: the permit's Start, or now.
	at int64
	// from is the start the spacing counts from (0: none): the latest
	// start granted for a new request, the latest actual start of another
	// permit for a confirmed one (a permit is never spaced from itself).
	from int64
	// maxWait refuses a start further than this from now (ReasonSpacing);
	// negative: any start is answered (Confirm moves the permit's Start).
	maxWait int64
	// noCap leaves the in-flight cap and the announced budget aside
	// (ReadyIn: they free with a response, not with time).
	noCap bool
}

// decision is the core's answer: a refusal (reason set) or the earliest
// start the rules allow.
type decision struct {
	reason  Reason // why the request may not start; "" if it may, at start
	wait    int64  // a refusal's wait: until the authority could take it
	until   int64  // a pause's, cooldown's or backoff's deadline (0: none)
	probe   bool   // the request would be (or is) the cooldown's probe
	spacing int64  // the interval in force, or an announced policy's pace if slower
	start   int64  // the earliest start: at, spaced from from and from an unwritten request
}

// refused is d's refusal as Acquire and Confirm return it.
func (d decision) refused(auth string) *RefusedError {
	return &RefusedError{Authority: auth, Reason: d.reason, Wait: time.Duration(d.wait),
		Interval: time.Duration(d.spacing), Until: unixOrZero(d.until)}
}

// holdLocked is the first half of the core, the holds in docs/contract.md
// section 3's order: an operator's pause, a cooldown, the probe after it
// (one request, seq's if it is the probe already), the failure backoff. It
// reports a request that would be the probe even when the backoff holds
// it (State says probing). The entry's lock must be held.
func (p *Pacer) holdLocked(e *entry, n int64, seq uint64) decision {
	iv := p.decayedInterval(e, n)
	switch {
	case e.paused > n:
		return decision{reason: ReasonPaused, wait: e.paused - n, until: e.paused, spacing: iv}
	case e.until != 0 && n < e.until:
		return decision{reason: ReasonCooling, wait: e.until - n, until: e.until, spacing: iv}
	case e.until != 0 && e.probeSeq != 0 && e.probeSeq != seq:
		return decision{reason: ReasonProbing, wait: p.probeWait, spacing: iv}
	}
	d := decision{probe: e.until != 0, spacing: iv}
	if e.failUntil > n {
		d.reason, d.wait, d.until = ReasonBackoff, e.failUntil-n, e.failUntil
	}
	return d
}

// decideLocked is the one core every decision path calls (Acquire,
// Confirm, ReadyIn; State reads its holds): the holds (holdLocked), then
// the spacing (the interval, or an announced policy's pace when a quota is
// down to its last request, plus the start guard, from q.from and from a
// request confirmed but not yet written), then the in-flight cap and the
// announced budget, which only the next response frees, then q.maxWait.
// It changes nothing: each path commits the answer its own way. The
// entry's lock must be held.
func (p *Pacer) decideLocked(e *entry, n int64, q ask) decision {
	d := p.holdLocked(e, n, q.seq)
	if d.reason != "" {
		return d
	}
	if e.rd != nil && e.rd.spend > 0 {
		// The bucket a cooldown drained is spent back first (reading.go,
		// spendFor): the floor, not the interval, spaces these.
		d.spacing = min(d.spacing, e.floor)
	}
	over := false
	if e.bud != nil && !q.noCap {
		var pace int64
		over, pace = e.bud.limits(n, e.bud.sentAfter(e.bud.readSeq, q.seq))
		d.spacing = max(d.spacing, pace)
	}
	sp := d.spacing + p.guardFor(e)
	d.start = max(n, q.at)
	if q.from != 0 && (sp > 0 || q.seq == 0) {
		// A granted permit is spaced from the others' starts only when
		// there is spacing to keep: its reservation (q.at) holds the
		// rest, a fence's included.
		d.start = max(d.start, q.from+sp)
	}
	if e.unsent != 0 && e.unsent != q.seq {
		// A request not yet written (Options.AwaitSends): it is written at
		// now at the earliest, and this one waits one spacing from then.
		d.start = max(d.start, n+sp)
	}
	held := e.inFlight // a granted permit holds its place already
	if q.seq == 0 {
		held++
	}
	var cross int64
	if !q.noCap {
		// Once throttled, no request starts while the latest one is
		// unanswered and younger than two refusal round trips: it would
		// cross that one's refusal on its way, and arrive while the
		// origin had said wait (ADR 0029). Before, the cold hold
		// (coldLocked) keeps the blast one at a time. A granted permit
		// moves its start; a new request waits for the answer, which
		// frees it as a place in the cap does.
		cross = p.openUntilLocked(e, q.seq, n)
		if q.seq != 0 {
			d.start = max(d.start, cross)
		}
	}
	switch gap := d.start - n; {
	case !q.noCap && (held > e.maxFlight || over):
		// Over the announced budget, as at the cap (or a cap lowered
		// since the grant, SetPolicy), the next response frees a place.
		d.reason, d.wait = ReasonInFlight, max(gap, d.spacing, p.inFlightMinWait)
	case cross > d.start:
		d.reason, d.wait = ReasonInFlight, cross-n
	case q.maxWait >= 0 && gap > q.maxWait:
		d.reason, d.wait = ReasonSpacing, gap
	}
	return d
}

// Confirm re-checks a granted Permit immediately before its request starts,
// and records the start. Call it before every request start, reserved or not,
// in this loop:
//
//	for {
//		pm, err = p.Confirm(now, pm)
//		if err != nil { // revoked: give it back, defer the job
//			p.Done(now, pm, Response{Cancelled: true})
//			break
//		}
//		if !pm.Start.After(now) {
//			break // start the request now
//		}
//		wait until pm.Start; now = the clock
//	}
//
// Always continue with the Permit Confirm returns; Done is owed exactly once
// per grant, however many times it was confirmed.
//
// Revocation: a Permit reserved for a future Start can be overtaken by a
// lowered in-flight cap (SetPolicy): while the Permits held, started or
// reserved, outnumber the cap in force, Confirm refuses with ReasonInFlight,
// so the reservations given back bring the count down to the cap and no
// start exceeds it. It can be overtaken by a
// cooldown learned from another response in the meantime. While that
// cooldown is in force, Confirm refuses with a *RefusedError
// (ReasonCooling); once the deadline has passed and another request is the
// probe, with ReasonProbing. A probe confirmed during a cooldown learned
// after it was granted is refused too (ReasonCooling). If the deadline has
// passed and no probe is out, the Permit becomes the probe: Confirm returns
// it with Probe set.
//
// Spacing from actual starts: a request may wake after its Start (a late
// timer, a busy CPU) while the next one leaves on time. Confirm therefore
// spaces each request from the latest actual start of any other request to
// the authority, by the interval plus the start guard (Options.StartGuard).
// If now is closer than that, or before pm.Start, Confirm returns the
// Permit with a later Start and a nil error, and the caller waits and
// confirms again; the entry's next slot moves with it, so later grants keep
// their spacing. Otherwise the request may start now: Confirm returns the
// Permit unchanged (a Permit Acquire granted for now, confirmed at that
// instant, always is) and records now as its actual start, from which later
// grants and confirms are spaced. A Permit is never spaced from its own
// earlier Confirm.
func (p *Pacer) Confirm(now time.Time, pm Permit) (Permit, error) {
	n := now.UnixNano()
	key := pm.paceKey()
	if pm.seq != 0 && p.PaceKey(pm.Authority) != key {
		// A policy change moved the authority into or out of a group
		// since the grant: the permit belongs to a pace that no longer
		// serves it. Asked again, the authority's new pace decides.
		return pm, &RefusedError{Authority: pm.Authority, Reason: ReasonSpacing, Wait: MoveSettle, Interval: pm.Interval}
	}
	s := p.shardFor(key)
	s.mu.Lock()
	defer s.mu.Unlock()
	e := s.m[key]
	if e == nil || pm.seq == 0 {
		return pm, nil
	}
	p.spentLocked(e, n)
	other := e.started
	if pm.seq == e.startedSeq {
		other = e.startedOther
	}
	d := p.decideLocked(e, n, ask{seq: pm.seq, at: pm.Start.UnixNano(), from: other, maxWait: -1})
	if d.reason != "" {
		if d.reason == ReasonBackoff && pm.seq == e.probeSeq {
			// A failure learned since the grant: this request waits the
			// backoff out like every other, and is no longer the probe.
			e.probeSeq = 0
			pm.Probe = false
		}
		return pm, d.refused(pm.Authority)
	}
	if d.probe {
		e.probeSeq = pm.seq
		pm.Probe = true
	}
	if d.start > n {
		pm.Start = now.Add(time.Duration(d.start - n))
		e.lastStart = max(e.lastStart, d.start)
		return pm, nil
	}
	p.startedLocked(e, pm.seq, n)
	p.openedLocked(e, pm.seq, n)
	if p.awaitSends && d.spacing+p.guardFor(e) > 0 && !p.unspaced(pm) {
		e.unsent = pm.seq
	}
	return pm, nil
}

// unspaced says that pm was granted with no spacing at all (floor 0, no
// start guard): its write is neither awaited nor reported, which spares
// Sent the lock at floor 0. Should the floor be raised between its grant
// and its start, that one request is spaced by its start alone.
func (p *Pacer) unspaced(pm Permit) bool {
	return pm.Interval == 0 && (p.guardAuto || p.guard == 0)
}

// Sent reports that the request of pm, started after Confirm, was written
// to its connection at now: the instant the origin receives it, give or
// take the network. Call it when the request's headers are written (the
// worker calls it from net/http/httptrace's WroteRequest, and again once
// net/http's flush to the socket has returned: WroteRequest precedes the
// flush, ADR 0027); a request that failed before it was written is never
// reported, only given to Done.
// Later starts to the authority are spaced from the write by the interval
// plus the start guard, as from an actual start (Confirm); with
// Options.AwaitSends, a start waiting for this write is released. Calling
// Sent again for the same permit (a request retried on a new connection)
// moves its write later; calling it after Done still spaces the next starts
// from it. Sent publishes nothing.
func (p *Pacer) Sent(now time.Time, pm Permit) {
	if pm.seq == 0 || p.unspaced(pm) {
		return
	}
	n := now.UnixNano()
	key := pm.paceKey()
	s := p.shardFor(key)
	s.mu.Lock()
	if e := s.m[key]; e != nil {
		if e.unsent == pm.seq {
			e.unsent = 0
		}
		p.startedLocked(e, pm.seq, n)
		if e.rd != nil {
			e.rd.wrote(pm.seq, n)
		} else {
			e.cold.wrote(pm.seq, n)
		}
	}
	s.mu.Unlock()
}

// unsentDoneLocked ends permit seq's wait for its write (Options.AwaitSends)
// when it is done unreported: a request the origin answered (learn) was
// written by now, so the next starts are spaced from now; one that failed or
// was given back reached no origin and releases the wait alone. The entry's
// lock must be held.
func (p *Pacer) unsentDoneLocked(e *entry, seq uint64, n int64, learn bool) {
	if seq == 0 || e.unsent != seq {
		return
	}
	e.unsent = 0
	if learn {
		p.startedLocked(e, seq, n)
	}
}

// startedLocked records an actual start of permit seq at n. The entry's lock
// must be held.
func (p *Pacer) startedLocked(e *entry, seq uint64, n int64) {
	switch {
	case n >= e.started:
		if seq != e.startedSeq {
			e.startedOther = e.started
		}
		e.started, e.startedSeq = n, seq
	case seq != e.startedSeq:
		e.startedOther = max(e.startedOther, n)
	}
	e.lastStart = max(e.lastStart, n)
}

// Done reports what became of a granted request and returns the pacer's
// reading of it. It must be called exactly once per Permit. A cancelled
// request or a network error (Response.Cancelled, Response.Err, or Status 0)
// teaches nothing but frees the Permit's in-flight place and, for a probe,
// the probe slot.
func (p *Pacer) Done(now time.Time, pm Permit, r Response) Verdict {
	if p.rules != nil {
		return p.doneRules(now, pm, r)
	}
	learn := !r.Cancelled && r.Err == nil && r.Status != 0
	var fb Feedback
	if learn {
		fb = ParseFeedback(r.Status, r.Header, now)
	}
	oc := outcomeOf(r, &fb)
	if pm.Probe || fb.Throttled() || fb.Exhausted() || oc == outcomeFailed {
		return p.doneSlow(now, pm, learn, &fb, r)
	}
	// Nothing to learn but an announced budget: release the place and take
	// the reading, unless a decay is due. Parsed before the lock.
	var buf [MaxQuotas]Quota
	var qs []Quota
	if learn && fb.Announces {
		qs = ParseQuotas(r.Header, now, buf[:0])
	}
	n := now.UnixNano()
	u := p.urlKey(r.URL)
	key := pm.paceKey()
	s := p.shardFor(key)
	s.mu.Lock()
	e := s.m[key]
	if e == nil {
		s.mu.Unlock()
		return Verdict{}
	}
	// A copy made before Confirm promoted it is still the probe. An answer
	// to an escalated authority brings its interval down (ADR 0029).
	if p.decayDue(e, n) || (pm.seq != 0 && pm.seq == e.probeSeq) || (oc == outcomeOK && (e.fails != 0 || e.failUntil != 0)) ||
		(learn && e.interval > e.floor && e.until == 0) {
		s.mu.Unlock()
		return p.doneSlow(now, pm, learn, &fb, r)
	}
	if pm.seq != 0 && e.inFlight > 0 {
		e.inFlight--
	}
	if learn && oc == outcomeOK && e.answered < math.MaxInt32 {
		e.answered++
		e.answeredOn = min(e.answeredOn+1, math.MaxInt32)
	}
	if e.rd != nil && learn && oc == outcomeOK && e.rd.admitted(startOr(pm, n)) {
		p.blastGrewLocked(e)
	}
	p.closedLocked(e, pm, n, learn, false)
	p.unsentDoneLocked(e, pm.seq, n, learn)
	p.budgetLocked(s, e, pm.seq, n, qs)
	if oc == outcomeOK {
		e.ans.succeeded(n, u) // backoff.go
	}
	var v Verdict
	if e.until > n {
		v.Until = time.Unix(0, e.until)
	}
	s.mu.Unlock()
	return v
}

func (p *Pacer) doneSlow(now time.Time, pm Permit, learn bool, fb *Feedback, r Response) Verdict {
	hdr := r.Header
	oc := outcomeOf(r, fb)
	n := now.UnixNano()
	throttled, exhausted := fb.Throttled(), fb.Exhausted()
	var buf [MaxQuotas]Quota
	var qs []Quota
	if learn && fb.Announces {
		qs = ParseQuotas(hdr, now, buf[:0])
	}
	var fx facts
	key := pm.paceKey()
	s := p.shardFor(key)
	s.mu.Lock()
	e := s.m[key]
	if e == nil {
		if !throttled && !exhausted && oc != outcomeFailed {
			s.mu.Unlock()
			return Verdict{}
		}
		e = p.entryLocked(s, key, n)
	}
	if pm.seq != 0 && e.inFlight > 0 {
		e.inFlight--
	}
	p.unsentDoneLocked(e, pm.seq, n, learn)
	p.budgetLocked(s, e, pm.seq, n, qs)
	probe := pm.seq != 0 && pm.seq == e.probeSeq
	if probe {
		e.probeSeq = 0
	}
	p.decayLocked(e, key, n, &fx)
	// Whose failure it is (backoff.go): a limiter's 503 becomes throttling
	// without a cooldown, learned below as a 429 is; one URL's 5xx is no
	// step of the origin's backoff.
	oc = p.judgeLocked(e, pm, n, r, p.urlKey(r.URL), fb, oc)
	throttled = fb.Throttled()
	if learn {
		var started int64 // 0: a permit not made by Acquire, always news
		if pm.seq != 0 {
			started = pm.Start.UnixNano()
		}
		p.learnLocked(e, key, n, started, pm.seq, s.seq, probe, *fb, &fx)
	}
	// After learnLocked, which makes the reading at the first refusal:
	// that refusal's round trip is the first measured.
	p.closedLocked(e, pm, n, learn, learn && throttled)
	p.healthLocked(e, key, n, r, oc, &fx)
	v := Verdict{Throttled: throttled, Reason: fb.Reason()}
	if e.until > n {
		v.Until = time.Unix(0, e.until)
	}
	s.mu.Unlock()
	if to := p.PaceKey(pm.Authority); to != key {
		// Answered after a policy change moved the authority to another
		// pace: what this answer taught binds that pace too.
		p.carry(n, key, to)
	}
	p.publish(&fx)
	return v
}

// learnLocked reads the answer to a request that started at started (0:
// unknown, a permit not made by Acquire), permit seq (0: the same), while
// granted is the shard's latest permit. The entry's lock must be held.
func (p *Pacer) learnLocked(e *entry, auth string, n, started int64, seq, granted uint64, probe bool, fb Feedback, fx *facts) {
	throttled, exhausted := fb.Throttled(), fb.Exhausted()
	if probe && !throttled {
		e.until, e.ceiling = 0, p.fallbackMin
		e.resumed, e.answeredOn = n, 0
		fx.add(Event{Type: EventRecovered, Authority: auth, At: time.Unix(0, n), Status: fb.Status,
			Interval: time.Duration(e.interval), Ceiling: time.Duration(p.fallbackMin)})
	}
	if !throttled && !exhausted {
		if fb.Status < 500 {
			p.answeredLocked(e, auth, n, started, probe, fx)
		}
		return
	}
	e.lastThrot, e.decayRef = n, n
	if throttled {
		if probe {
			e.ceiling = min(2*e.ceiling, p.maxPause)
		}
		cool := int64(fb.Hint())
		if fb.Status == 429 && !(fb.RetryAfterValid && fb.RetryAfter > 0) {
			cool = max(cool, p.fallbackMin)
		}
		p.escalateLocked(e, auth, n, started, seq, granted, cool, fb.Status, fb.Reason(), fx)
	}
	// The pause: a positive Retry-After wins, else the longest exhausted
	// reset; a 429 without a positive Retry-After waits at least the fallback.
	pause := int64(fb.Hint())
	fallback := false
	if fb.Status == 429 && !(fb.RetryAfterValid && fb.RetryAfter > 0) {
		if f := p.fallbackLocked(e); f >= pause {
			pause, fallback = f, true
		}
	}
	var asked int64
	if pause > p.maxPause {
		asked, pause = pause, p.maxPause
	}
	prev := e.until
	if until := n + pause; pause > 0 && until > e.until {
		e.until = until
	}
	if throttled {
		fx.add(Event{Type: EventThrottle, Authority: auth, At: time.Unix(0, n), Status: fb.Status,
			Reason: fb.Reason(), Interval: time.Duration(e.interval), Until: unixOrZero(e.until), Ceiling: time.Duration(e.ceiling),
			AfterBlastStep: fb.limiterAgain})
	}
	if e.until != prev {
		fx.add(Event{Type: EventCooldown, Authority: auth, At: time.Unix(0, n), Status: fb.Status, Reason: fb.Reason(),
			Interval: time.Duration(e.interval), Until: time.Unix(0, e.until), Ceiling: time.Duration(e.ceiling),
			Extended: prev > n, Asked: time.Duration(asked), Pause: time.Duration(pause), Fallback: fallback, Family: fb.Family})
	} else if asked > 0 {
		// capped, but a longer pause was already in force: still worth a warning
		fx.add(Event{Type: EventCapped, Authority: auth, At: time.Unix(0, n), Status: fb.Status, Reason: fb.Reason(),
			Asked: time.Duration(asked), Pause: time.Duration(pause), Family: fb.Family})
	}
}

// escalateLocked raises e's interval for a throttling answer to a request
// that started at started (0: unknown), permit seq, with granted the
// shard's latest permit: ×2, at least the first step and the floor, at most
// MaxInterval or the floor. Once per signal: an answer to a request started
// before the last escalation was sent under the interval that escalation
// already doubled and carries no news, so it changes nothing and
// escalateLocked reports false. So is one started at the escalation's very
// instant but granted before it (escSeq): on a virtual clock, or a coarse
// one, the request that a blast's admission freed a place for starts at the
// instant its sibling's refusal comes back, before the pacer reads it, and
// its refusal doubled the depth-1 step of 2 s to 4 s (ADR 0029, the
// thirteenth look, "The crossing sibling"). An escalation also learns the
// pace the origin admitted since the one before it (the answers without
// throttling over the time between them, ADR 0029), which the interval then
// comes back to quickly, and below which it only creeps. It neither starts
// nor extends a cooldown: a signal that wants none (a limiter's 503) may
// call it alone. The entry's lock must be held.
func (p *Pacer) escalateLocked(e *entry, auth string, n, started int64, seq, granted uint64, cool int64, status int, reason string, fx *facts) bool {
	if started != 0 && (started < e.escAt || started == e.escAt && seq != 0 && seq <= e.escSeq) {
		return false
	}
	top := max(p.maxInterval, e.floor)
	if e.rd != nil {
		e.rd.blastEnd = 0 // a later escalation: the blast is counted
		// and its step is gone: nothing after assumes the drain.
		e.rd.blastCool, e.rd.blastQuiet = 0, false
	}
	first := e.rd == nil
	jitter := !first && p.jitterLocked(e, started)
	switch {
	case jitter:
		// A refusal at a depth-1 pace the reading held: the margin
		// widened, the pace with it, nothing read again.
	case first:
		// The first refusal: the admissions before it, from a cold
		// start, were what an empty bucket takes in a row (nginx's
		// burst and one more); one still in flight as it came back is
		// counted when answered (reading.admitted, blastEnd). So is
		// the blast's only admission when the refusal overtook it (none
		// answered yet: nginx without burst= answers the refused 503,
		// no body, before the admitted file); left uncounted, the depth
		// was unknown, the depth-1 pace's tick never applied, and a
		// pace 1 ms fast was refused and doubled for the rest of the
		// run (ADR 0029, the twelfth look).
		e.rd = &reading{}
		if k := e.answered - e.blastFrom; k <= maxBlast {
			// After a cold hold that ended with nothing refused
			// (blastFrom > 0), the requests at full speed from its
			// end are the blast: a limiter whose rate is the hold's
			// own (50 r/s at 20 ms answers) refuses nothing during
			// it and its burst after, and that refusal read no depth
			// and stepped 2 s (ADR 0029, the fifteenth look).
			e.rd.burst = k
			e.rd.blastEnd = n
			if p.coldHold > 0 && e.coldFrom != 0 && e.rd.burst > 1 {
				// The blast took time, one request a round trip
				// apart under the hold (or two at once after
				// it): the bucket leaked meanwhile, and the
				// count is deeper than the bucket by as much
				// (reading.unleak).
				e.rd.blastSpan = max(0, cmp.Or(started, n)-e.coldFrom)
			}
		}
	case e.escAt != 0 && e.answered >= minPaceAnswers && n > e.escAt:
		// Two readings of the answers since the last escalation, for a
		// leaky or token bucket full at both ends: over the time since
		// that escalation they count the pauses in which its bucket
		// drained empty (a pace too slow); since the probe after it,
		// the burst that drained (too fast). Their mean is the reading
		// of ADR 0029's first version; the bucket's own bounds
		// (reading.go) discount the idle capacity, which the mean
		// cannot. The pace is the faster of the two.
		slow := (n - e.escAt) / int64(e.answered)
		fast := slow
		if e.resumed > e.escAt && e.answeredOn >= minPaceAnswers && n > e.resumed {
			fast = (n - e.resumed) / int64(e.answeredOn)
		}
		pace := (slow + fast) / 2
		held := heldRefusalLocked(e, started)
		mean := true
		if r := e.rd.unleak(cmp.Or(started, n), held); r > 0 {
			if read := int64(1e9 / r); held > 0 && pace <= held {
				// The answers' mean is as fast as a pace the
				// origin has just refused: the bounds alone.
				pace, mean = read, false
			} else if read <= pace {
				pace, mean = read, false
			}
		}
		if e.rd.burst == 1 && e.rd.lo > 0 {
			// A bucket of depth 1 (nginx's limit_req without
			// burst=) absorbs no pace faster than its rate, and
			// a limiter counts in whole milliseconds: an admission
			// g apart proves a rate of 1/(g + 1 ms) at least, not
			// 1/g. The pace is the lower bound's spacing and that
			// tick, never faster (ADR 0029, the twelfth look), and
			// the arrivals' jitter that refusals at the pace have
			// shown (jitterLocked; the thirteenth look).
			pace = max(pace, int64(1e9/float64(e.rd.lo))+e.rd.marginOr())
		}
		e.pace = min(max(pace, e.floor), top)
		if (held == 0 || mean) && e.pace < e.rd.capIv {
			// The answers over time admitted more than the upper
			// bound: the depth read from the blast was too high (a
			// blast slower than 1/r), and so is its interval: it
			// neither stops the creep nor joins the next reading.
			e.rd.capIv, e.rd.up = 0, 0
		}
	}
	ramped := false
	if !first && e.pace <= 0 && e.firstStep <= 0 && e.escAt != 0 && e.answered > 0 && e.answered < minPaceAnswers {
		// The ramp's refusal before minPaceAnswers answers came back
		// since the last escalation (a slow origin: at 0.5 r/s the
		// ramp goes 2 s, 1 s, refused). The answers read no pace, but
		// the origin admitted the level above the refused one and
		// refused this one: that level is the pace. Without it, no
		// pace was ever learned where no cooldown gives the answers
		// time (a limiter's 503): the interval stepped to 2 s, halved
		// to 1 s at the next answer and was refused again, half the
		// requests of a run (ADR 0029, the twelfth look).
		e.pace = min(max(2*e.interval, e.floor), top)
		ramped = true
	}
	step := p.firstStepFor(e, cool)
	if (first || (e.answered == 0 && started == e.escAt)) && e.pace <= 0 && e.firstStep <= 0 && cool > 0 && e.rd.burst > 0 {
		// The cold blast's refusal (or one to a request started as it
		// came back, which crossed it): no pace is known, but the blast
		// read the bucket's depth and the refusal its cooldown. The
		// 2 s step left a 10 r/s origin idle for 2 s after the probe
		// and the ramp halved down from there (about 4 s of its
		// capacity). The step is instead the spacing at which a bucket
		// of that depth just drains within the cooldown: an origin at
		// least that fast is empty when the probe goes, and the ramp
		// starts from it; a slower one refuses the probe or the
		// requests soon after it, and that refusal steps 2 s as
		// before. ADR 0029, "The seventh look".
		step = min(cool/int64(e.rd.burst), step)
		if first {
			e.rd.blastCool, e.rd.blastBase = cool, max(2*e.interval, e.floor)
		}
	}
	if first && cool <= 0 && status == http.StatusServiceUnavailable && e.pace <= 0 && e.firstStep <= 0 && e.rd.burst > 1 {
		// The cold blast's refusal by a limiter's 503 (no Retry-After,
		// no cooldown): the step is the first step over the blast's
		// depth (333 ms for 6), as if the contract's 2 s were the
		// cooldown of the seventh look. The 2 s step left a 10 r/s
		// origin idle for 2 s and the ramp halved down from there
		// (about 2.9 s of the pods cell's 9%). An origin slower than
		// 1/step refuses the request after it (its bucket is still
		// full): that one refusal is still the limiter's
		// (answers.quiet, limiterAgainLocked) and steps the 2 s as
		// before. Nothing drained the bucket, so nothing is spent
		// (blastQuiet). ADR 0030, "The request after the cold blast's
		// short step".
		step = min(p.firstStep/int64(e.rd.burst), step)
		e.rd.blastCool, e.rd.blastBase, e.rd.blastQuiet = p.firstStep, max(2*e.interval, e.floor), true
	}
	iv := min(max(2*e.interval, step, e.floor), top)
	if e.rd.blastQuiet && iv < p.firstStep {
		e.ans.quiet, e.ans.quietSeq = n, 0
	}
	crept := !ramped && e.pace > 0 && e.interval < e.pace && !e.rd.tight && e.escAt != 0 &&
		e.answered > 0 && e.answered < minPaceAnswers && e.firstStep <= 0
	if crept {
		// Refused while the creep was below the pace, before the
		// answers could read anything: the origin admitted the pace
		// and refused the creep, so the pace holds and the creep
		// stops at it (or a little above the refused interval) for
		// Decay answers (reading.capFor). Doubling the pace here, as
		// below, sent a 0.5 r/s origin's 2 s pace to 4 s after every
		// creep's refusal, and the creep took 90 answers back (ADR
		// 0029, the twelfth look).
		e.rd.capIv, e.rd.capHeld = max(e.pace, int64(upperMargin*float64(e.interval))), 0
	}
	if !jitter && !ramped && !crept && e.pace > 0 && e.answered < minPaceAnswers && e.escAt != 0 && e.firstStep <= 0 {
		// Refused again before the answers since the last escalation
		// could read anything: the pace they came back to is too fast
		// (the origin's limit dropped). It doubles with the interval,
		// so that a stale pace still backs off ×2 per refusal and the
		// answers do not bring the interval straight back to it.
		e.pace = min(2*e.pace, top)
	}
	e.rd.reset(n)
	e.escAt, e.escSeq, e.answered = n, granted, 0
	if iv != e.interval {
		e.interval, e.pubIv = iv, iv
		fx.add(Event{Type: EventInterval, Authority: auth, At: time.Unix(0, n), Status: status,
			Reason: reason, Interval: time.Duration(iv)})
	}
	return true
}

// jitterLocked widens the margin of a depth-1 pace (nginx's limit_req
// without burst=) when the origin refused a request, started at started,
// sent at that pace, and reports whether it did. Such a bucket admits a
// request only 1/rate after the last admitted one, by the limiter's clock:
// its arrival, not the pod's start. Two starts a pace apart reach it
// closer together whenever the second is later on its way than the first
// (a goroutine's scheduling, a write, the origin's handler), and the pace
// held a tick above the rate was refused for it and doubled, then read
// again from admissions just as jittered (ADR 0029: with 2 to 10 ms of
// lag the twelfth look's grid drained in a median of 1.18x, up to 1.99x;
// the thirteenth look). The pace
// is right and the arrivals' spread is not covered: the margin above the
// lower bound's spacing goes to twice itself and a tick (1, 3, 7, 15 ms
// from limiterTick) and the pace moves by as much, while the margin stays
// within maxJitterMargin of the spacing; past it, the refusal is read as
// any other (the rate dropped). Only at the pace itself (the interval
// held there, no creep below it, no cooldown in force) and with no
// operator's first step; the escalation that follows is the contract's.
// The entry's lock must be held.
func (p *Pacer) jitterLocked(e *entry, started int64) bool {
	rd := e.rd
	if rd.burst != 1 || e.pace <= 0 || e.firstStep > 0 || e.until != 0 ||
		e.interval != e.pace || started == 0 || started <= e.escAt {
		return false
	}
	m := rd.marginOr()
	wider := 2*m + limiterTick
	if float64(wider) > maxJitterMargin*float64(e.pace-m) {
		return false
	}
	if rd.narrowed {
		// Refused before the narrowed margin held: the jitter is still
		// there, and the next narrowing waits twice as long.
		rd.hold = min(2*rd.holdOr(), marginHoldMax)
	}
	rd.margin, rd.calm, rd.narrowed, rd.spiked = wider, 0, false, true
	e.pace = min(e.pace+wider-m, max(p.maxInterval, e.floor))
	return true
}

// narrowLocked counts an answer to a request started at started, sent at a
// depth-1 pace whose margin a refusal widened (jitterLocked), and halves the
// margin back toward limiterTick (15, 7, 3, 1 ms, the widening's steps in
// reverse) once rd.holdOr() such answers came with no refusal; the pace
// and the interval move with it. A narrowing that held that long resets the
// wait to marginCalm. Back at the tick, one more calm spell loosens the
// reading once. Without it a spell of late arrivals left the pace up to
// maxJitterMargin slow for the authority's life in the pod (ADR 0029, the
// thirteenth look, "The margin narrows"). The entry's lock must be held.
func (p *Pacer) narrowLocked(e *entry, started int64) {
	rd := e.rd
	if rd.burst != 1 || e.pace <= 0 || e.firstStep > 0 ||
		e.until != 0 || e.interval != e.pace || started <= e.escAt {
		return
	}
	if rd.calm++; rd.calm < rd.holdOr() {
		return
	}
	if rd.narrowed {
		rd.hold, rd.narrowed = 0, false // the last narrowing held
	}
	rd.calm = 0
	var to int64
	switch m := rd.marginOr(); {
	case m > limiterTick:
		narrow := max((m-limiterTick)/2, limiterTick)
		to, rd.margin = e.pace-(m-narrow), narrow
	case rd.spiked:
		// The margin is back at the tick, but the reading the pace
		// came from may have been read from admissions as late as
		// the refusals that widened it (a spell from the start read
		// 9.69 r/s for 10, and held 104 ms for good). Once, the
		// reading is loosened: the creep goes below the pace, and
		// its refusal reads the rate again from the admissions
		// since, on time now.
		rd.spiked = false
		rd.tight, rd.capIv, rd.up = false, 0, 0
		return
	default:
		return
	}
	rd.narrowed = true
	e.pace = max(to, e.floor)
	e.interval = e.pace
}

// blastGrewLocked steps the interval from the blast's depth again when an
// admission of the cold blast was counted after its refusal came back
// (reading.admitted): the step was the cooldown over the depth counted by
// then (escalateLocked, the seventh look), one short, so 400 ms for a
// bucket of 6 at 2 s, and the ramp started from there (a pod that stepped
// 400 ms read its rate 9% fast from a ramp that went 400, 200, 100, 50 ms).
// Only while nothing else has moved the interval since, no pace is learned
// and no operator set a first step; no fact is published (one restored
// says the slower step). The entry's lock must be held.
func (p *Pacer) blastGrewLocked(e *entry) {
	rd := e.rd
	if rd.blastCool <= 0 || e.pace > 0 || e.firstStep > 0 || rd.burst < 2 {
		return
	}
	top := max(p.maxInterval, e.floor)
	was := min(max(rd.blastBase, min(rd.blastCool/int64(rd.burst-1), p.firstStep)), top)
	if e.interval != was {
		return
	}
	e.interval = min(max(rd.blastBase, min(rd.blastCool/int64(rd.burst), p.firstStep)), top)
}

// blastSpendLocked starts a spend of the bucket (reading.spend) at the
// answer to the probe after the cold blast's cooldown, when the blast's
// refusal stepped the interval to the cooldown over the depth it read
// (escalateLocked, the seventh look): that step starts the ramp from the
// spacing at which an origin drains a bucket of that depth within the
// cooldown, so it already assumes the bucket empty by the probe. Without
// a spend, the ramp's slow levels (333 and 167 ms at 10 r/s) left the
// drained depth unused until the ramp's refusal, about 0.4 s of a 10 r/s
// origin's capacity. It spends half of what a later cooldown's spend does
// (blastSpend): the ramp's refusal reads the rate that the pace holds for
// the rest of the run, from the bucket's last empty instant on, and the
// whole spend (depth - spendHeadroom) filled the bucket at the probe and
// moved that refusal to a phase of the ramp's last level where the lower
// bound was 4% short in every quiet pods run (a pace of 104 ms for 100);
// half of it is drained by the ramp's next level, and the reading is read
// as without it (ADR 0029, the sixteenth look). Once per escalation. The
// entry's lock must be held.
func (p *Pacer) blastSpendLocked(e *entry) {
	rd := e.rd
	if rd.blastCool <= 0 || rd.blastQuiet || rd.spent || e.firstStep > 0 {
		return
	}
	if rd.blastCool/int64(max(rd.burst, 1)) < max(rd.blastBase, e.floor) {
		// The step was the floor or twice the interval before, not
		// the cooldown over the depth: nothing assumed the drain.
		return
	}
	if n := blastSpend(rd.burst); n > 0 {
		rd.spend, rd.spent = n, true
	}
}

// blastSpend is how many answers the spend after the cold blast's probe
// lets go at the floor for a blast that read a depth of depth: half of
// those a later cooldown's spend does (spendFor), so 2 of a depth of 6.
func blastSpend(depth int32) int32 {
	return (depth - spendHeadroom) / 2
}

// heldRefusalLocked is the interval that a refused request, started at
// started, was sent at when the refusal came while the interval held a
// learned pace (or crept below it) well after the cooldown: the probe
// answered, the spend over, and at least twice the bucket's depth answered
// since the probe (the spend, the request at the escalated interval where
// the spend did not start at the probe's answer, then as many at the pace
// as the bucket is deep, and more). Such a refusal proves that the origin's rate is
// below 1/interval (reading.rate), where a refusal soon after a cooldown
// may be the bucket not yet drained. 0 for any other refusal. The entry's
// lock must be held.
func heldRefusalLocked(e *entry, started int64) int64 {
	rd := e.rd
	if rd == nil || e.pace <= 0 || e.until != 0 || e.interval > e.pace || rd.spend > 0 ||
		started == 0 || e.resumed <= e.escAt || started < e.resumed {
		return 0
	}
	if e.answeredOn < max(2*rd.burst+2, 2*minPaceAnswers) {
		return 0
	}
	return e.interval
}

// answeredLocked counts an answer without throttling and, once no cooldown
// is in force, brings an escalated interval back toward the floor: halved
// per answer down to the learned pace (the floor, with none), then by a
// Decay-th of a halving per answer (Limits.Decay), so that the pace settles
// just under the rate the origin admits and probes it from below. The
// probe's answer only ends the cooldown (docs/contract.md section 3: the
// interval is unchanged); the answers after it bring the interval down. The
// entry's lock must be held.
func (p *Pacer) answeredLocked(e *entry, auth string, n, started int64, probe bool, fx *facts) {
	if e.answered < math.MaxInt32 {
		e.answered++
	}
	if e.rd != nil {
		if e.rd.admitted(cmp.Or(started, n)) {
			p.blastGrewLocked(e)
		}
		if e.rd.spend > 0 && !probe {
			e.rd.spend--
		}
		if !probe {
			p.narrowLocked(e, started)
		}
	}
	if e.answeredOn < math.MaxInt32 {
		e.answeredOn++
	}
	if probe && e.until == 0 && e.pace <= 0 && e.rd != nil {
		// The probe after the cold blast's cooldown: its step assumed
		// an origin fast enough to drain the blast's bucket within the
		// cooldown, and under that assumption the bucket is empty now:
		// it is spent before the ramp (blastSpendLocked).
		p.blastSpendLocked(e)
	}
	if probe && e.until == 0 && e.pace > 0 && e.interval > e.pace {
		// The probe's answer leaves the interval as it is, but the
		// bucket the cooldown drained is spent from here (spendFor),
		// not from the answer to one request more at the escalated
		// interval: that request left twice the pace after the probe
		// (205 ms at 10 r/s) into a bucket already empty, and the
		// spend with it (ADR 0029, the thirteenth look).
		e.rd.spendFor(n, e.escAt, e.answered)
	}
	if probe || e.until != 0 || e.interval <= e.floor {
		return
	}
	iv, target := e.interval, max(e.pace, e.floor)
	if iv > target && e.pace > 0 {
		// A pace read from the origin's own refusals: straight to it.
		iv = target
		e.rd.spendFor(n, e.escAt, e.answered)
	} else if iv > target {
		// No pace learned yet: the ramp halves per answer, at most once
		// per rampHalving (reading.go), so that the refusal it ends in
		// reads the rate.
		if n-e.halvedAt >= rampHalving {
			iv, e.halvedAt = max(target, iv/2), n
		}
	} else if e.rd != nil && e.rd.tight {
		// A tight reading's pace is a quarter of its spread above its
		// lower bound (reading.go): a creep past it would buy at most
		// the rest of the spread for a refusal that costs a Retry-After
		// (a creep toward the upper bound took one or two more at
		// 10 r/s: ADR 0029, the eighth look).
		iv = max(target, iv)
	} else {
		steps := int64(e.decaySteps)
		if steps <= 0 {
			steps = DefaultDecay
		}
		hold := int32(min(steps, math.MaxInt32))
		if e.rd != nil && e.pace > 0 {
			// A loose reading (its bounds more than tightReading
			// apart) errs either way by up to half their spread: the
			// creep from it is faster, so that a slow one costs less
			// and a refusal comes soon to tighten it; it stops short
			// of the upper bound, a rate the origin refused, for as
			// many answers as the decay's halving (reading.capFor).
			steps = max(1, steps/looseCreep)
		}
		iv = max(min(iv, e.rd.capFor(iv, e.floor, hold)), int64(float64(iv)*math.Exp2(-1/float64(steps))))
	}
	if iv == e.interval {
		return
	}
	e.interval = iv
	if iv == e.floor || iv <= e.pubIv/2 || e.pubIv == 0 {
		e.pubIv = iv
		fx.add(Event{Type: EventInterval, Authority: auth, At: time.Unix(0, n), Interval: time.Duration(iv), Reason: "decay"})
	}
}

// budgetLocked gives permit seq's place in the budget back (its in-flight
// place is already given back) and takes qs, the quotas its response
// announced, as a reading (budget.go). s.mu must be held.
func (p *Pacer) budgetLocked(s *shard, e *entry, seq uint64, n int64, qs []Quota) {
	if seq != 0 && e.bud != nil {
		e.bud.release(seq)
	}
	if len(qs) > 0 {
		if e.bud == nil {
			e.bud = newBudget(s.seq, e.inFlight)
		}
		e.bud.read(n, seq, qs, p.maxPause)
	}
}

// fallbackLocked draws the fallback cooldown uniformly from [FallbackMin,
// ceiling] (both scaled).
func (p *Pacer) fallbackLocked(e *entry) int64 {
	span := e.ceiling - p.fallbackMin
	if span <= 0 {
		return p.fallbackMin
	}
	r := p.rnd()
	if !(r >= 0) { // also NaN
		r = 0
	}
	if r > 1 {
		r = 1
	}
	return p.fallbackMin + int64(r*float64(span))
}

func unixOrZero(ns int64) time.Time {
	if ns == 0 {
		return time.Time{}
	}
	return time.Unix(0, ns)
}

// facts collects the events to hand out once the lock is released; a fixed
// array keeps it off the heap.
type facts struct {
	n int
	f [5]Event
}

func (fx *facts) add(ev Event) {
	if fx.n < len(fx.f) {
		fx.f[fx.n] = ev
		fx.n++
	}
}

// publish hands out the facts (Options.OnEvent). No lock may be held.
func (p *Pacer) publish(fx *facts) {
	if p.onEvent == nil {
		return
	}
	for i := 0; i < fx.n; i++ {
		p.onEvent(fx.f[i])
	}
}

// Apply rebuilds state from a replayed fact (MIRROR_EVENTS after a cold
// start). It only ever makes the pacer as polite as the fact says or more:
// cooldowns are extended, never shortened (an expired one still wants its
// probe), intervals and ceilings are restored, and a recovery clears only a
// cooldown whose deadline it follows. Apply publishes nothing.
func (p *Pacer) Apply(now time.Time, ev Event) {
	if ev.Authority == "" || ev.Type == EventCapped {
		return
	}
	n := now.UnixNano()
	at := ev.At.UnixNano()
	if ev.At.IsZero() || at > n {
		at = n
	}
	if ev.Type == EventThrottle || ev.Type == EventCooldown {
		p.applyDeparted(now, at, ev)
	}
	// A fact about a member of a group binds the group's pace (it may
	// come from a pod that applied the policy change later than this one).
	key := p.PaceKey(ev.Authority)
	s := p.shardFor(key)
	s.mu.Lock()
	defer s.mu.Unlock()
	e := p.entryLocked(s, key, n)
	noteMemberLocked(e, key, ev.Authority)
	// A response arrived at ev.At: keep the spacing from there.
	if ev.Type == EventThrottle || ev.Type == EventCooldown {
		e.lastStart = max(e.lastStart, at)
		e.lastThrot = max(e.lastThrot, at)
	}
	switch ev.Type {
	case EventThrottle, EventCooldown, EventInterval:
		if ev.Interval > 0 {
			e.interval = min(max(int64(ev.Interval), e.floor), max(p.maxInterval, e.floor))
			e.decayRef = at
			e.pubIv = e.interval
		}
		if ev.Type != EventInterval {
			if u := ev.Until.UnixNano(); !ev.Until.IsZero() && u > e.until {
				e.until = min(u, n+p.maxPause)
			}
			if ev.Ceiling > 0 {
				e.ceiling = min(max(int64(ev.Ceiling), p.fallbackMin), p.maxPause)
			}
		}
	case EventRecovered:
		if e.until != 0 && e.until <= at {
			e.until = 0
			e.ceiling = p.fallbackMin
		}
	case EventBackoff, EventBackoffEnded:
		p.applyHealthLocked(e, ev, n, at)
	case EventPaused:
		// The longest pause wins, as for cooldowns; an operator's pause is
		// deliberate, so MaxPause does not cap it.
		if u := ev.Until.UnixNano(); u >= e.paused {
			e.paused, e.pauseReason = u, ev.Reason
		}
	case EventResumed:
		// A resume ends the pauses given before it, not a later one.
		if at >= e.pausedAt {
			e.paused, e.pauseReason = 0, ""
		}
	}
	if ev.Type == EventPaused {
		e.pausedAt = max(e.pausedAt, at)
	}
}

// applyDeparted applies a group's throttle or cooldown fact told before the
// last change of groups (at, the answer's instant) to the members that
// change took out of the group, as regroup carries the group's state: the
// wait was told to the group as it was then, and binds them where they
// went, though the fact reached this pod after it applied the change (a
// slow link; the cluster simulation's seed 18 at 03fc7aa). Members matched
// by a pattern are left to departedLocked. No lock may be held.
func (p *Pacer) applyDeparted(now time.Time, at int64, ev Event) {
	d := p.left.Load()
	if d == nil || !strings.HasPrefix(ev.Authority, GroupPrefix) || at >= d.at-int64(MoveSettle) {
		return
	}
	g, ok := d.old.Groups[strings.TrimPrefix(ev.Authority, GroupPrefix)]
	if !ok {
		return
	}
	for _, m := range g.Members {
		if strings.HasPrefix(m, "*.") || p.PaceKey(m) == ev.Authority {
			continue
		}
		mv := ev
		mv.Authority = m // not a group: Apply does not come back here
		p.Apply(now, mv)
	}
}

// ReadyIn returns how long from now until a request to auth could start, as
// far as pauses, cooldowns and spacing say (the in-flight cap aside), the
// spacing between starts in force (interval plus start guard), and the
// reason when the wait is not zero. A cooldown that is over but awaits its
// probe reports a zero wait with ReasonProbing: one request may go, the
// probe. ReadyIn changes nothing: the worker uses it to decide when to bring
// parked jobs back, never to start a request.
func (p *Pacer) ReadyIn(now time.Time, auth string) (wait, spacing time.Duration, reason Reason) {
	n := now.UnixNano()
	key := p.PaceKey(auth)
	s := p.shardFor(key)
	s.mu.Lock()
	defer s.mu.Unlock()
	e := s.m[key]
	if e == nil {
		return 0, 0, ""
	}
	p.spentLocked(e, n)
	d := p.decideLocked(e, n, ask{at: n, from: e.lastStart, noCap: true})
	sp := time.Duration(d.spacing + p.guardFor(e))
	switch {
	case d.reason != "":
		return time.Duration(d.wait), sp, d.reason
	case d.probe:
		return 0, sp, ReasonProbing
	}
	return 0, sp, ""
}

// Snapshot returns every tracked authority, sorted by authority, as
// /debug/pacer shows it. Lazy decay is reflected but not applied.
func (p *Pacer) Snapshot(now time.Time) []State {
	n := now.UnixNano()
	var out []State
	for i := range p.shards {
		s := &p.shards[i]
		s.mu.Lock()
		for k, e := range s.m {
			out = append(out, p.stateLocked(k, e, n))
		}
		s.mu.Unlock()
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Authority < out[j].Authority })
	return out
}

// Counts returns how many authorities are in each state (every state is
// present, zero included), for the pacer_authorities gauge.
func (p *Pacer) Counts(now time.Time) map[string]int {
	n := now.UnixNano()
	c := map[string]int{StateIdle: 0, StateActive: 0, StateEscalated: 0, StateCooling: 0, StateProbing: 0, StatePaused: 0, StateBackoff: 0}
	for i := range p.shards {
		s := &p.shards[i]
		s.mu.Lock()
		for _, e := range s.m {
			c[p.stateName(e, n)]++
		}
		s.mu.Unlock()
	}
	return c
}

func (p *Pacer) stateName(e *entry, n int64) string {
	iv := p.decayedInterval(e, n)
	switch h := p.holdLocked(e, n, 0); {
	case h.reason == ReasonPaused:
		return StatePaused
	case h.reason == ReasonCooling:
		return StateCooling
	case h.reason == ReasonProbing || h.probe:
		return StateProbing
	case h.reason == ReasonBackoff:
		return StateBackoff
	case iv > e.floor:
		return StateEscalated
	case e.inFlight > 0 || e.lastStart+iv+p.guardFor(e) > n:
		return StateActive
	}
	return StateIdle
}

func (p *Pacer) stateLocked(auth string, e *entry, n int64) State {
	iv := p.decayedInterval(e, n)
	st := State{
		Authority:    auth,
		State:        p.stateName(e, n),
		Floor:        time.Duration(e.floor),
		Interval:     time.Duration(iv),
		Ceiling:      time.Duration(e.ceiling),
		Probing:      e.probeSeq != 0,
		InFlight:     int(e.inFlight),
		MaxInFlight:  int(e.maxFlight),
		LastThrottle: unixOrZero(e.lastThrot),
		PolicySource: p.policy.Load().Limits(auth).Source,
		Bandwidth:    p.policy.Load().Limits(auth).Bandwidth,
		FirstStep:    Duration(p.firstStepFor(e, 0)),
		Decay:        int(e.decaySteps),
		Pace:         Duration(e.pace),
	}
	if st.Decay == 0 {
		st.Decay = DefaultDecay
	}
	if e.lastStart != 0 {
		st.NextSlot = time.Unix(0, max(e.lastStart+iv+p.guardFor(e), n))
	} else {
		st.NextSlot = time.Unix(0, n)
	}
	st.CooldownUntil = unixOrZero(e.until)
	if e.paused > n {
		st.PausedUntil, st.PauseReason = time.Unix(0, e.paused), e.pauseReason
	}
	st.Failures = int(e.fails)
	if e.failUntil > n {
		st.BackoffUntil = time.Unix(0, e.failUntil)
	}
	return st
}
