package worker

import (
	"testing"
	"time"
)

// TestDecideRoute is the table of where a deferred job goes.
func TestDecideRoute(t *testing.T) {
	const parkAfter, share = 30 * time.Second, 16
	base := routeFacts{parkOn: true, parkAfter: parkAfter, parkShare: share}
	with := func(f func(*routeFacts)) routeFacts { r := base; f(&r); return r }
	for _, c := range []struct {
		name string
		f    routeFacts
		want route
	}{
		{"a short wait is a NAK", with(func(r *routeFacts) { r.reason, r.delay = reasonSpacing, 5*time.Second }), routeNak},
		{"a long cooldown parks and considers a lane", with(func(r *routeFacts) { r.reason, r.delay = reasonCooling, parkAfter }), routeParkAndLane},
		{"a long pause parks and considers a lane", with(func(r *routeFacts) { r.reason, r.delay = reasonPaused, time.Hour }), routeParkAndLane},
		{"a long redirect refusal parks and considers a lane", with(func(r *routeFacts) { r.reason, r.delay = redirectReason("cooling"), time.Hour }), routeParkAndLane},
		{"a long overflow parks, no lane: the authority is not slow", with(func(r *routeFacts) { r.reason, r.delay = reasonOverflow, time.Hour }), routePark},
		{"a short wait with the authority's share of NAKs out parks", with(func(r *routeFacts) { r.reason, r.delay, r.nakked = reasonSpacing, time.Second, share }), routePark},
		{"one NAK short of the share is a NAK", with(func(r *routeFacts) { r.reason, r.delay, r.nakked = reasonSpacing, time.Second, share-1 }), routeNak},
		{"a lane's job waits in its lane however long", with(func(r *routeFacts) { r.reason, r.delay, r.fromLane, r.nakked = reasonCooling, time.Hour, true, 99 }), routeNak},
		{"without parking a long wait is a NAK", with(func(r *routeFacts) { r.reason, r.delay, r.parkOn, r.nakked = reasonCooling, time.Hour, false, 99 }), routeNak},
		{"a handover is handed back", with(func(r *routeFacts) { r.reason = reasonHandover }), routeHandBack},
		{"a handover is handed back even without parking", routeFacts{reason: reasonHandover}, routeHandBack},
		{"a handover from a lane is handed back", with(func(r *routeFacts) { r.reason, r.fromLane = reasonHandover, true }), routeHandBack},
		{"a failed hand-off waits its 2 s by NAK", with(func(r *routeFacts) { r.reason, r.delay = reasonHandoff, 2*time.Second }), routeNak},
		{"a regrouped queue is handed back for the intake to move", with(func(r *routeFacts) { r.reason = reasonRegrouped }), routeHandBack},
		{"a regrouped queue from a lane is handed back", with(func(r *routeFacts) { r.reason, r.fromLane = reasonRegrouped, true }), routeHandBack},
		{"a moved job behind the old pace's requests waits by NAK", with(func(r *routeFacts) { r.reason, r.delay = reasonRegrouped, regroupDelay }), routeNak},
	} {
		t.Run(c.name, func(t *testing.T) {
			if got := decideRoute(c.f); got != c.want {
				t.Errorf("decideRoute(%+v) = %v, want %v", c.f, got, c.want)
			}
		})
	}
}

// TestDecideHold is the table of whether a job waits in memory.
func TestDecideHold(t *testing.T) {
	const holdMax, horizon = 2 * time.Second, 10 * time.Second
	base := holdFacts{holdMax: holdMax, overHorizon: horizon}
	with := func(f func(*holdFacts)) holdFacts { h := base; f(&h); return h }
	for _, c := range []struct {
		name string
		f    holdFacts
		want hold
		why  reason
	}{
		{"an authority ready now queues the job", base, holdQueue, ""},
		{"a job of a partition served elsewhere now is handed over", with(func(h *holdFacts) { h.gone = true }), holdDefer, reasonHandover},
		{"a handover comes before any wait", with(func(h *holdFacts) { h.gone, h.release, h.wait = true, true, time.Hour }), holdDefer, reasonHandover},
		{"a queue whose authority changed pace partition is regrouped", with(func(h *holdFacts) { h.regrouped, h.release = true, true }), holdDefer, reasonRegrouped},
		{"a handover comes before a regroup", with(func(h *holdFacts) { h.gone, h.regrouped = true, true }), holdDefer, reasonHandover},
		{"a moved job waits while its queue settles the old pace", with(func(h *holdFacts) { h.settling = true }), holdDefer, reasonRegrouped},
		{"a wait within HoldMax waits for its timer", with(func(h *holdFacts) { h.wait, h.reason = holdMax, reasonSpacing }), holdTimer, reasonSpacing},
		{"a wait past HoldMax defers with the pacer's reason", with(func(h *holdFacts) { h.wait, h.reason = holdMax+1, reasonCooling }), holdDefer, reasonCooling},
		{"the in-flight cap waits for a completion however long", with(func(h *holdFacts) { h.wait, h.release, h.reason = time.Hour, true, reasonInFlight }), holdRelease, reasonInFlight},
		{"past the share, a queue served within the horizon holds over", with(func(h *holdFacts) { h.full, h.drainIn, h.drains = true, horizon, true }), holdOver, ""},
		{"past the share, a queue served later is overflow", with(func(h *holdFacts) { h.full, h.drainIn, h.drains = true, horizon+1, true }), holdDefer, reasonOverflow},
		{"past the share, a stalled authority is overflow", with(func(h *holdFacts) { h.full, h.drainIn = true, time.Second }), holdDefer, reasonOverflow},
		{"past the share behind the in-flight cap, the queue decides", with(func(h *holdFacts) { h.release, h.full, h.drainIn = true, true, time.Hour }), holdDefer, reasonOverflow},
		{"a long wait defers before the share is looked at", with(func(h *holdFacts) { h.wait, h.reason, h.full, h.drains = time.Hour, reasonPaused, true, true }), holdDefer, reasonPaused},
	} {
		t.Run(c.name, func(t *testing.T) {
			if got, why := decideHold(c.f); got != c.want || why != c.why {
				t.Errorf("decideHold(%+v) = %v, %q; want %v, %q", c.f, got, why, c.want, c.why)
			}
		})
	}
}
