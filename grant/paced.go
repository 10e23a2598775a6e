package grant

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/mirrorworker/mirrorworker/clock"
	"github.com/mirrorworker/mirrorworker/pacer"
)

// Local is the pacer a Paced wraps: the one a worker takes
// (worker.Pacer); *pacer.Pacer is one.
type Local interface {
	Acquire(now time.Time, auth string, maxWait time.Duration) (pacer.Permit, error)
	Confirm(now time.Time, pm pacer.Permit) (pacer.Permit, error)
	Sent(now time.Time, pm pacer.Permit)
	Heard(now time.Time, pm pacer.Permit, status int) bool
	Done(now time.Time, pm pacer.Permit, r pacer.Response) pacer.Verdict
	ReadyIn(now time.Time, auth string) (wait, spacing time.Duration, reason pacer.Reason)
	Fence(now time.Time, auth string, at time.Time)
	Apply(now time.Time, ev pacer.Event)
	PaceKey(auth string) string
	Changed() <-chan struct{}
}

var _ Local = (*pacer.Pacer)(nil)

// DefaultHold is the longest wait an owner's answer may carry for the
// request to wait in its slot (PacedOptions.Hold): a longer one (a
// cooldown, a backoff, a pause) is a refusal, so that the worker defers
// the job as for its own pacer's, and the authority is not asked again
// until the wait is over.
const DefaultHold = 2 * time.Second

// PacedLocal returns the local pacer a Paced is meant to wrap: no floor
// (the owner's pace is the one that counts) and at most inFlight asks in
// flight per authority, which bounds how many of the worker's slots one
// authority's owner holds.
func PacedLocal(inFlight int) *pacer.Pacer {
	// No cold hold either (pacer.Options.ColdHold): the owner's pacer holds
	// its cold blast, and this one learns no answer to end its own.
	return pacer.New(&pacer.Options{Policy: &pacer.Policy{Default: pacer.Limits{Floor: 0, MaxInFlight: max(inFlight, 1)}}})
}

// DefaultAsksInFlight is the asks a replay keeps in flight per authority
// (the local pacer's cap, PacedLocal): more than a pod's default in-flight
// cap (pacer.DefaultMaxInFlight), so that the owner's cap, not the
// replay's, is what binds.
const DefaultAsksInFlight = 4

// PacedOptions configure a Paced. A nil *PacedOptions and every zero field
// mean the defaults.
type PacedOptions struct {
	// Hold is DefaultHold.
	Hold time.Duration
	// OnWait, if set, is told each wait an owner answered (and each
	// no-owner wait), before it is waited out or refused. It must be quick
	// and safe for concurrent use.
	OnWait func(auth string, a Answer)
	// OnUnreported, if set, is told each answer the owner did not learn (a
	// report lost, or a grant revoked by a partition move): the local
	// pacer learned it instead.
	OnUnreported func(auth string, err error)
	// OnLearned, if set, is told the verdict the local pacer reached on
	// each such answer, so that a caller that keeps a pacer of its own
	// besides (a replay that paces alone again when its pods all go,
	// docs/adr/0031) learns a cooldown the owner never heard of. It must be
	// quick and safe for concurrent use.
	OnLearned func(now time.Time, auth string, v pacer.Verdict)
	Clock     clock.Clock
}

// Paced is a worker's pacer whose every start is granted by the pod that
// owns the authority (docs/contract.md, "Grants"): Acquire and the rest
// are the local pacer's, Confirm asks the owner for the start once the
// local pacer allows it, and Done reports the answer to the owner. So a
// program that runs the project's worker elsewhere (a replay into a
// target only it reaches) starts its requests in the pods' one pace: their
// floor, in-flight cap, cooldown, probe, and live jobs first.
//
// The local pacer bounds the asks in flight per authority (PacedLocal) and
// frees each permit's place; it learns an answer only when the owner did
// not (a lost report), since the owner's facts reach every pod. An
// owner's wait up to Hold is waited in the slot; a longer one refuses the
// permit and every Acquire for the authority until it is over.
//
// Safe for concurrent use.
type Paced struct {
	Local
	ctx context.Context // the asks end with it
	c   *Client
	o   PacedOptions

	mu       sync.Mutex
	grants   map[pacer.Permit]Answer // by the permit Confirm returned with the grant
	waits    map[string]pacer.RefusedError
	answered time.Time // the last answer an owner gave (to an ask or a report)
}

// NewPaced returns local paced by the owners, asking them through c until
// ctx ends.
func NewPaced(ctx context.Context, local Local, c *Client, o *PacedOptions) *Paced {
	var r PacedOptions
	if o != nil {
		r = *o
	}
	if r.Hold <= 0 {
		r.Hold = DefaultHold
	}
	if r.Clock == nil {
		r.Clock = clock.Real{}
	}
	// Paced reports every granted request's write (Sent): its owner waits
	// for it before the next start, as for its own requests.
	return &Paced{Local: local, ctx: ctx, c: c.ReportingWrites(), o: r, grants: map[pacer.Permit]Answer{}, waits: map[string]pacer.RefusedError{}}
}

// Acquire refuses while the owner said the authority waits longer than
// Hold; otherwise it is the local pacer's.
func (p *Paced) Acquire(now time.Time, auth string, maxWait time.Duration) (pacer.Permit, error) {
	if re := p.waiting(now, auth); re != nil {
		return pacer.Permit{}, re
	}
	return p.Local.Acquire(now, auth, maxWait)
}

// ReadyIn counts the owner's long wait too, so that parked or deferred
// jobs come back when it ends.
func (p *Paced) ReadyIn(now time.Time, auth string) (time.Duration, time.Duration, pacer.Reason) {
	if re := p.waiting(now, auth); re != nil {
		return re.Wait, re.Interval, re.Reason
	}
	return p.Local.ReadyIn(now, auth)
}

// Changed is the local pacer's: the owner's waits come with its answers,
// and a held job asks again when its refusal's wait ends.
func (p *Paced) Changed() <-chan struct{} { return p.Local.Changed() }

// waiting is the refusal of the owner's wait in force for auth, if any.
func (p *Paced) waiting(now time.Time, auth string) *pacer.RefusedError {
	p.mu.Lock()
	defer p.mu.Unlock()
	re, ok := p.waits[auth]
	if !ok {
		return nil
	}
	if !now.Before(re.Until) {
		delete(p.waits, auth)
		return nil
	}
	re.Wait = re.Until.Sub(now)
	return &re
}

// Confirm asks the owner for the start once the local pacer allows it: a
// grant confirms the permit (start now); a wait moves its start later,
// or, past Hold, refuses it.
func (p *Paced) Confirm(now time.Time, pm pacer.Permit) (pacer.Permit, error) {
	p.mu.Lock()
	_, granted := p.grants[pm]
	p.mu.Unlock()
	if granted {
		// Confirmed again by pacer.Wait (its start, the grant's arrival, is
		// after the instant Wait read before asking): the request starts.
		return pm, nil
	}
	if re := p.waiting(now, pm.Authority); re != nil {
		return pm, re
	}
	cpm, err := p.Local.Confirm(now, pm)
	if err != nil || cpm.Start.After(now) {
		return cpm, err
	}
	a, err := p.c.Ask(p.ctx, pm.Authority)
	if err == nil {
		p.heard()
	}
	switch {
	case err == nil && a.Granted():
		// The request starts when the grant arrives, not when the local
		// pacer allowed the ask: a caller that times its starts from the
		// confirm (the load test's departure log) sees the real one.
		cpm.Start = p.o.Clock.Now()
		p.mu.Lock()
		p.grants[cpm] = a
		p.mu.Unlock()
		return cpm, nil
	case errors.Is(err, ErrNoOwner):
		a = Answer{Wait: time.Second, Reason: "no_owner"}
	case err != nil:
		return cpm, err
	}
	if p.o.OnWait != nil {
		p.o.OnWait(pm.Authority, a)
	}
	after := p.o.Clock.Now()
	wait := max(a.Wait, time.Millisecond)
	if wait <= p.o.Hold {
		cpm.Start = after.Add(wait)
		return cpm, nil
	}
	re := pacer.RefusedError{Authority: pm.Authority, Reason: pacer.Reason(a.Reason), Wait: wait, Interval: cpm.Interval, Until: after.Add(wait)}
	if !a.Until.IsZero() {
		re.Until = a.Until
	}
	p.mu.Lock()
	p.waits[pm.Authority] = re
	p.mu.Unlock()
	return cpm, &re
}

// Sent tells the owner when a granted request was written (Client.Sent),
// so that its next start is spaced from the write as from its own
// requests'; the local pacer is told too.
func (p *Paced) Sent(now time.Time, pm pacer.Permit) {
	p.Local.Sent(now, pm)
	p.mu.Lock()
	g, ok := p.grants[pm]
	p.mu.Unlock()
	if ok {
		_ = p.c.Sent(pm.Authority, g) // best effort: the owner spaced from its answer already
	}
}

// Heard tells the local pacer that an answer's headers are in; the owner
// is not told (it learns the answer with Done, and its cold hold waits
// for that at most Options.ColdHold).
func (p *Paced) Heard(now time.Time, pm pacer.Permit, status int) bool {
	return p.Local.Heard(now, pm, status)
}

// Done reports the answer of a granted request to its owner and returns
// the owner's verdict; the local pacer frees the permit's place, learning
// the answer only when the owner did not.
func (p *Paced) Done(now time.Time, pm pacer.Permit, r pacer.Response) pacer.Verdict {
	p.mu.Lock()
	g, ok := p.grants[pm]
	delete(p.grants, pm)
	p.mu.Unlock()
	if !ok {
		return p.Local.Done(now, pm, r)
	}
	// The report outlives a cancelled fetch: the owner must learn of it.
	rctx, cancel := context.WithTimeout(context.WithoutCancel(p.ctx), p.c.timeout)
	defer cancel()
	v, err := p.c.Report(rctx, pm.Authority, g, r)
	if err == nil {
		p.heard()
	}
	if err == nil && v.Unknown {
		err = errUnknown
	}
	if err != nil {
		if p.o.OnUnreported != nil {
			p.o.OnUnreported(pm.Authority, err)
		}
		at := p.o.Clock.Now()
		v := p.Local.Done(at, pm, r)
		if p.o.OnLearned != nil {
			p.o.OnLearned(at, pm.Authority, v)
		}
		return v
	}
	p.Local.Done(p.o.Clock.Now(), pm, pacer.Response{Cancelled: true})
	if v.Throttled && v.Until.After(now) {
		// The authority's later jobs wait for the cooldown here, asking
		// nothing of the owner until it ends.
		p.mu.Lock()
		p.waits[pm.Authority] = pacer.RefusedError{Authority: pm.Authority, Reason: pacer.ReasonCooling, Wait: v.Until.Sub(now), Interval: pm.Interval, Until: v.Until}
		p.mu.Unlock()
	}
	return pacer.Verdict{Throttled: v.Throttled, Reason: v.Reason, Until: v.Until}
}

// errUnknown is a report the owner answered Unknown: the grant lapsed or
// was revoked (its partition moved).
var errUnknown = errors.New("grant: the owner no longer held the grant (lapsed, or its partition moved)")

// heard notes that an owner answered.
func (p *Paced) heard() {
	now := p.o.Clock.Now()
	p.mu.Lock()
	defer p.mu.Unlock()
	if now.After(p.answered) {
		p.answered = now
	}
}

// LastAnswer returns when an owner last answered an ask or a report (a
// grant, a wait or a verdict; zero if none ever did). An ask that no
// server answered (ErrNoOwner) does not count: a replay whose owners have
// all gone, and whose asks have gone unanswered since, paces alone again
// (docs/adr/0031).
func (p *Paced) LastAnswer() time.Time {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.answered
}

// Outstanding returns the grants out, not yet reported.
func (p *Paced) Outstanding() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.grants)
}
