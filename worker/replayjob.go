package worker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"

	"github.com/nats-io/nats.go"

	"github.com/mirrorworker/mirrorworker/jobs"
)

// A replay beside live pods hands its jobs to the pods (docs/adr/0025): a
// replay job is a copy of a submitted job marked with jobs.HeaderReplay,
// stored into the replay's target rather than the pod's, queued behind the
// authority's live jobs (background, below), and reported to the replay on
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

// setReplay copies a replay job's headers onto another copy of it (parked,
// or a redirect's continuation), so that the copy stays a replay job.
func setReplay(h nats.Header, j *heldJob) {
	if r := j.replay; r != nil {
		h.Set(jobs.HeaderReplay, r.run)
		h.Set(jobs.HeaderReplayTarget, r.target)
		h.Set(jobs.HeaderReplayOf, strconv.FormatUint(r.of, 10))
	}
}

// replayRun is the run of a replay job, "" for a live one.
func (j *heldJob) replayRun() string {
	if j.replay == nil {
		return ""
	}
	return j.replay.run
}

// targetOf is where j is stored: its replay's target, or the worker's.
func (w *Worker) targetOf(j *heldJob) Target {
	if j.replay != nil && j.replay.to != nil {
		return j.replay.to
	}
	return w.d.Target
}

// openReplay opens a replay job's target (Deps.ReplayTarget). It reports
// false when it settled the job instead: dropped, its run being over, or
// dead-lettered (into the replays' stream, jobs.ReplayDLQStream) when the
// target is not one this pod may write.
func (w *Worker) openReplay(ctx context.Context, j *heldJob) bool {
	r := j.replay
	if r == nil {
		return true
	}
	var err error
	switch {
	case !jobs.ValidReplayRun(r.run):
		err = fmt.Errorf("replay run %q is not a run name", jobs.Truncate(r.run, 80))
	case w.d.ReplayTarget == nil:
		err = errors.New("this worker takes no replay jobs")
	default:
		r.to, err = w.d.ReplayTarget(ctx, r.run, r.target)
	}
	switch {
	case err == nil:
		return true
	case errors.Is(err, ErrReplayOver):
		if err := w.settler.settle(j, Msg.Ack); err != nil {
			w.log.Debug().Err(err).Str("job", j.job.ID).Msg("ack a job of a replay that is over")
		}
		w.settler.count(OutcomeDropped)
		w.log.Debug().Str("job", j.job.ID).Str("replay", r.run).Msg("replay job dropped: its run is over")
		return false
	}
	w.settler.deadLetter(ctx, j, jobs.ReasonReplayTarget, err.Error(), 0, nil)
	return false
}

// replayDone reports a replay job's end to its replay, on the run's core
// NATS subject. A continuation's end is reported by the pod that finishes
// it.
func (s *settler) replayDone(j *heldJob, outcome, reason string) {
	if j.replay == nil || outcome == OutcomeHandedOff || s.js == nil {
		return
	}
	nc := s.js.Conn()
	if nc == nil {
		return
	}
	b, _ := json.Marshal(jobs.ReplayDone{Of: j.replay.of, JobID: j.job.ID, Authority: j.auth,
		Outcome: outcome, Reason: reason, Pod: s.o.WorkerID})
	if err := nc.Publish(jobs.ReplayDoneSubject(j.replay.run), b); err != nil {
		// The replay's message comes back after its AckWait and is asked
		// again, answered from what is stored.
		s.log.Debug().Err(err).Str("job", j.job.ID).Msg("report a replay job's end")
	}
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

// jobClass is the class label of j: live or replay.
func jobClass(j *heldJob) string {
	if j.replay != nil {
		return "replay"
	}
	return "live"
}
