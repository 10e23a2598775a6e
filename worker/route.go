package worker

import (
	"time"

	"github.com/mirrorworker/mirrorworker/pacer"
)

// reason says why a job waits or leaves memory without being fetched: the
// pacer's refusal, or the worker's own cause. Every reason is a constant
// here (docs/contract.md, "Deferral reasons", is checked against them).
type reason string

const (
	reasonCooling  = reason(pacer.ReasonCooling)  // a cooldown is in force
	reasonProbing  = reason(pacer.ReasonProbing)  // the probe after a cooldown is out
	reasonInFlight = reason(pacer.ReasonInFlight) // the authority's in-flight cap is reached
	reasonSpacing  = reason(pacer.ReasonSpacing)  // the next slot is further than HoldMax
	reasonPaused   = reason(pacer.ReasonPaused)   // an operator paused the authority
	reasonBackoff  = reason(pacer.ReasonBackoff)  // the authority is failing and backed off
	// reasonOverflow: the authority's queue holds its share of memory
	// (MaxHeldPerAuthority) and is not served soon (docs/adr/0014).
	reasonOverflow reason = "overflow"
	// reasonHandover: the job's partition is no longer served here; it is
	// handed back at once for the pod that serves it now.
	reasonHandover reason = "handover"
	// reasonHandoff: a redirect's continuation could not be published
	// (handoff.go); the whole job is tried again later.
	reasonHandoff reason = "handoff"
	// reasonAuthHold: the authority refuses its credential and is held
	// (authfail.go); the job waits for the hold to end.
	reasonAuthHold reason = "auth_hold"
	// reasonRegrouped: a policy change moved the job's authority into or
	// out of a politeness group, whose partition is another: queued jobs
	// are handed back at once (the intake moves them into the new pace's
	// partition), and a moved job that finds its authority's queue still
	// busy with the old pace's requests comes back after regroupDelay.
	reasonRegrouped reason = "regrouped"
	// reasonDeleteLimit: the pod's delete limit is reached
	// (Options.MaxDeletesPerMinute); the delete waits in the stream.
	reasonDeleteLimit reason = "delete_limit"
	// redirectPrefix + a pacer reason: a redirect hop's authority refused.
	redirectPrefix = "redirect_"
)

// regroupDelay is how long a moved job waits for its authority's queue to
// finish the old pace's requests (reasonRegrouped).
const regroupDelay = pacer.MoveSettle

// pacerReasons are the refusals a pacer gives, as reasons.
var pacerReasons = []reason{reasonCooling, reasonProbing, reasonInFlight, reasonSpacing, reasonPaused, reasonBackoff}

// redirectReason is the reason of a job deferred because a redirect hop's
// authority refused it with r.
func redirectReason(r pacer.Reason) reason { return redirectPrefix + reason(r) }

// reasonOf is the reason of a pacer's refusal.
func reasonOf(r pacer.Reason) reason { return reason(r) }

// hold is whether a job waits in memory for its authority, and how; when
// it does not, it is deferred and decideRoute says where it goes. The
// scheduler gathers the facts (sched.go: admit, next) and does what
// decideHold says.
type hold uint8

const (
	// holdQueue: the job waits in its authority's queue; the authority
	// can take a request within HoldMax (a timer may be armed for it).
	holdQueue hold = iota + 1
	// holdTimer: a refused authority can take a request within HoldMax:
	// its queue waits for the timer.
	holdTimer
	// holdRelease: a refused authority is at its in-flight cap: its queue
	// waits until one of its requests ends.
	holdRelease
	// holdOver: the job queues past the authority's share of memory
	// (MaxHeldPerAuthority) because the authority serves its queue soon;
	// its partition's intake pauses meanwhile (docs/adr/0014).
	holdOver
	// holdDefer: the job leaves memory (decideRoute, with the reason).
	holdDefer
)

var holdNames = [...]string{holdQueue: "queue", holdTimer: "timer", holdRelease: "release", holdOver: "over", holdDefer: "defer"}

func (h hold) String() string { return holdNames[h] }

// holdFacts are what decideHold decides from: the pacer's live answers (at
// admission and when parked or laned jobs come back, ReadyIn; at dispatch
// and for a redirect hop, Acquire's refusal) and the scheduler's own state.
type holdFacts struct {
	gone      bool // the job's partition is no longer this pod's (its lease is gone or being given back)
	regrouped bool // the authority's pace is now another partition's (a politeness group changed)
	// settling: the job was moved into its authority's new pace's
	// partition (admission only), and the authority's queue still holds
	// or runs requests of the old pace: the job comes back after
	// regroupDelay, when they have ended.
	settling bool
	wait     time.Duration // until the authority can take a request (0: now)
	release  bool          // the wait ends when one of its requests ends (the in-flight cap), not at a time
	reason   reason        // why it waits (the pacer's refusal)
	// full: the job would queue past the authority's share of memory
	// (admission only); drainIn is how long the queue ahead takes to be
	// served, and drains that the authority makes progress and has not
	// held over for too long (docs/adr/0014).
	full    bool
	drainIn time.Duration
	drains  bool

	holdMax     time.Duration // Options.HoldMax
	overHorizon time.Duration // how long a queue past its share may take: max(HoldMax, ParkAfter)
}

// decideHold is the one rule of whether a job waits in memory (or, for a
// redirect hop, in its fetch slot; for parked and laned jobs, whether they
// come back): not when its partition is another pod's now (handed over at
// once), nor while its authority's queue settles a regroup; not when its
// authority cannot take a request within HoldMax (unless only a request in
// flight holds it: a completion may come any moment); past the authority's
// share only while the queue ahead is served within the horizon, else it
// is deferred as overflow; otherwise it queues, behind a timer or a
// completion when the pacer refused.
func decideHold(f holdFacts) (hold, reason) {
	switch {
	case f.gone:
		return holdDefer, reasonHandover
	case f.regrouped, f.settling:
		return holdDefer, reasonRegrouped
	case !f.release && f.wait > f.holdMax:
		return holdDefer, f.reason
	case f.full && f.drainIn <= f.overHorizon && f.drains:
		return holdOver, ""
	case f.full:
		return holdDefer, reasonOverflow
	case f.release:
		return holdRelease, f.reason
	case f.wait > 0:
		return holdTimer, f.reason
	}
	return holdQueue, ""
}

// route is what becomes of a job that leaves memory without being fetched
// (a deferral, decideHold's holdDefer): one of routeNak, routePark,
// routeParkAndLane, routeHandBack. The table in docs/architecture.md
// places both rules.
type route uint8

const (
	// routeNak: NAK with the calendar's delay; the job keeps its
	// ack-pending slot until then.
	routeNak route = iota + 1
	// routePark: published to MIRROR_PARKED and acked (park.go); it comes
	// back when the pacer says the authority can take it.
	routePark
	// routeParkAndLane: parked, and the authority's backlog in its
	// partition considered for a lane (lane.go), which opens one when the
	// partition consumer has at least LaneBacklog jobs ahead.
	routeParkAndLane
	// routeHandBack: returned for immediate redelivery (NAK without
	// delay), for the pod that serves its partition now.
	routeHandBack
)

var routeNames = [...]string{routeNak: "nak", routePark: "park", routeParkAndLane: "park_and_lane", routeHandBack: "hand_back"}

func (r route) String() string { return routeNames[r] }

// routeFacts are what a deferral's route is decided from.
type routeFacts struct {
	reason   reason
	delay    time.Duration // the NAK delay the calendar gave the job
	fromLane bool          // delivered by a lane: it waits in the lane
	parkOn   bool          // parking is on (partitioned mode)
	nakked   int           // the authority's NAK deferrals not yet due (each holds an ack-pending slot)

	parkAfter time.Duration // Options.ParkAfter
	parkShare int           // Options.ParkShare
}

// decideRoute is the one rule of where a deferred job goes: a job whose
// partition is gone is handed back; a lane's job waits in its lane (a lane
// is pulled only when its authority is ready); without parking every
// deferral is a NAK; a long wait parks the job, and opens a lane unless the
// wait is only a full queue (overflow: the authority itself is not slow);
// an authority with its share of NAK deferrals outstanding parks the rest,
// so that it cannot take all of the consumer's ack-pending slots.
func decideRoute(f routeFacts) route {
	switch {
	case f.reason == reasonHandover, f.reason == reasonRegrouped && f.delay == 0:
		return routeHandBack
	case f.fromLane, !f.parkOn:
		return routeNak
	case f.delay >= f.parkAfter && f.reason != reasonOverflow:
		return routeParkAndLane
	case f.delay >= f.parkAfter, f.nakked >= f.parkShare:
		return routePark
	}
	return routeNak
}
