package worker

import (
	"errors"
	"strconv"

	"github.com/nats-io/nats.go"

	"github.com/mirrorworker/mirrorworker/jobs"
)

// A replay beside live pods hands its jobs to the pods (docs/adr/0025): a
// replay job is a copy of a submitted job marked with jobs.HeaderReplay,
// stored into the replay's target rather than the pod's (Worker.openReplay),
// queued behind the authority's live jobs (sched.go: background), and reported to the replay on
// its run's subject once it is done.

// ErrReplayOver is what Deps.ReplayTarget returns (wrapped) for a replay job
// whose run is over: interrupted, or gone. The job is acked and dropped:
// nothing of an interrupted replay stays queued as live work.
var ErrReplayOver = errors.New("the replay run is over")

// OutcomeDropped is the outcome of a replay job whose run was over.
const OutcomeDropped = "dropped"

// replayJob is what a replay copy carries.
type replayJob struct {
	run    string // jobs.HeaderReplay
	target string // jobs.HeaderReplayTarget
	of     uint64 // jobs.HeaderReplayOf
	to     Target // opened by Deps.ReplayTarget at intake
}

// replayOf reads a delivery's replay headers; nil for a live job.
func replayOf(h nats.Header) *replayJob {
	run := h.Get(jobs.HeaderReplay)
	if run == "" {
		return nil
	}
	of, _ := strconv.ParseUint(h.Get(jobs.HeaderReplayOf), 10, 64)
	return &replayJob{run: run, target: h.Get(jobs.HeaderReplayTarget), of: of}
}

// copyTo copies a replay job's headers onto another copy of it (parked,
// or a redirect's continuation), so that the copy stays a replay job; a
// nil r (a live job) copies nothing.
func (r *replayJob) copyTo(h nats.Header) {
	if r != nil {
		h.Set(jobs.HeaderReplay, r.run)
		h.Set(jobs.HeaderReplayTarget, r.target)
		h.Set(jobs.HeaderReplayOf, strconv.FormatUint(r.of, 10))
	}
}

// runName is the run of a replay job, "" for a live one (a nil r).
func (r *replayJob) runName() string {
	if r == nil {
		return ""
	}
	return r.run
}
