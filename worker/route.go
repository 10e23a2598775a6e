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
	// redirectPrefix + a pacer reason: a redirect hop's authority refused.
	redirectPrefix = "redirect_"
)

// pacerReasons are the refusals a pacer gives, as reasons.
var pacerReasons = []reason{reasonCooling, reasonProbing, reasonInFlight, reasonSpacing, reasonPaused, reasonBackoff}

// redirectReason is the reason of a job deferred because a redirect hop's
// authority refused it with r.
func redirectReason(r pacer.Reason) reason { return redirectPrefix + reason(r) }

// reasonOf is the reason of a pacer's refusal.
func reasonOf(r pacer.Reason) reason { return reason(r) }

// route is what becomes of a job that leaves memory without being fetched
// (a deferral): one of routeNak, routePark, routeParkAndLane, routeHandBack.
// Whether a job waits in memory instead (held) is the scheduler's rule
// (sched.go: admit and next), which the table in docs/architecture.md
// places.
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
	case f.reason == reasonHandover:
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
