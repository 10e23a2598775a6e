//go:build e2e

package worker_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/mirrorworker/mirrorworker/jobs"
	"github.com/mirrorworker/mirrorworker/worker"
)

// TestFloorHoldsAtTheOrigin: jobs of two origins, floor 200 ms; each
// origin's kernel-stamped arrivals are a floor apart (checkFloor's slack).
// It judges the gaps as the origin timed them, on the wall clock, so it is
// in the e2e tier and serial (ADR 0024); TestFloorOnTheFakeClock checks
// the same spacing exactly on the worker's clock.
func TestFloorHoldsAtTheOrigin(t *testing.T) {
	const floor = 200 * time.Millisecond
	e := newEnv(t, 30*time.Second)
	a, b := newOrigin(t), newOrigin(t)
	r := e.start(testPacer(floor, 2, nil, 0, nil), worker.Options{Concurrency: 8})
	const per = 10
	var js []jobs.Job
	for i := range per {
		for k, o := range []*origin{a, b} {
			js = append(js, jobs.Job{ID: fmt.Sprint(k, "-", i), URL: o.url(fmt.Sprint("/f/", i)), Target: fmt.Sprint(k, "/", i)})
		}
	}
	e.publish(js...)
	r.f.waitFor(t, 2*per, isOutcome(worker.OutcomeStored), 30*time.Second)
	for k, o := range []*origin{a, b} {
		log := o.log()
		if len(log) != per {
			t.Fatalf("origin %d saw %d requests, want %d", k, len(log), per)
		}
		checkFloor(t, fmt.Sprint("origin ", k), log, floor)
	}
}
