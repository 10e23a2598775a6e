//go:build e2e

package worker_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/mirrorworker/mirrorworker/jobs"
	"github.com/mirrorworker/mirrorworker/worker"
)

// TestHeldJobsOutliveTheAckWait is about the server's ack wait, which runs
// on the wall clock: on a fake clock the worker would hold the jobs for
// seconds of its own time in milliseconds of the server's, and the test
// would pass without a single in-progress ack. So it is in the e2e tier
// (ADR 0024).
func TestHeldJobsOutliveTheAckWait(t *testing.T) {
	t.Parallel()
	// Six jobs 700 ms apart on one authority take over 3 s in memory; the
	// ack wait is 1.5 s. In-progress acks keep every job on its first
	// delivery.
	const ackWait = 1500 * time.Millisecond
	e := newEnv(t, ackWait)
	o := newOrigin(t)
	r := e.start(testPacer(700*time.Millisecond, 1, nil, 0, nil), worker.Options{AckWait: ackWait, HoldMax: time.Minute})
	var js []jobs.Job
	for i := range 6 {
		js = append(js, jobs.Job{ID: fmt.Sprint("hb", i), URL: o.url(fmt.Sprint("/hb/", i)), Target: fmt.Sprint("hb/", i)})
	}
	e.publish(js...)
	r.f.waitFor(t, len(js), isOutcome(worker.OutcomeStored), 30*time.Second)
	for _, f := range r.f.snapshot() {
		if f.Deliveries != 1 {
			t.Errorf("%s stored at delivery %d: its ack wait ran out while held", f.JobID, f.Deliveries)
		}
	}
	if n := len(o.log()); n != len(js) {
		t.Errorf("origin saw %d requests for %d jobs", n, len(js))
	}
}
