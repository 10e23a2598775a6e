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
	} {
		t.Run(c.name, func(t *testing.T) {
			if got := decideRoute(c.f); got != c.want {
				t.Errorf("decideRoute(%+v) = %v, want %v", c.f, got, c.want)
			}
		})
	}
}
