package replay

import (
	"fmt"
	"sync/atomic"

	"github.com/mirrorworker/mirrorworker/worker"
)

// Summary is what the replay's worker did, as worker.Options.OnOutcome
// reports it (the outcomes mirrorworker_jobs_total counts). A job deferred
// several times counts once per deferral; the other outcomes count jobs.
type Summary struct {
	Stored       int64 // fetched and written
	Unchanged    int64 // the origin answered 304: nothing written
	Deferred     int64 // deferrals (authority cooling, spacing or throttling)
	Retried      int64 // transient failures retried
	DeadLettered int64
}

// Tally counts a replay's outcomes: give its Add to worker.Options.OnOutcome
// and read Summary at the end. The zero value is ready; safe for concurrent
// use.
type Tally struct {
	stored, unchanged, deferred, retried, deadLettered atomic.Int64
}

// Add counts one outcome (a worker.Outcome* constant); others are ignored.
func (t *Tally) Add(outcome string) {
	switch outcome {
	case worker.OutcomeStored:
		t.stored.Add(1)
	case worker.OutcomeUnchanged:
		t.unchanged.Add(1)
	case worker.OutcomeDeferred:
		t.deferred.Add(1)
	case worker.OutcomeRetried:
		t.retried.Add(1)
	case worker.OutcomeDeadLettered:
		t.deadLettered.Add(1)
	}
}

// Summary returns the counts so far.
func (t *Tally) Summary() Summary {
	return Summary{
		Stored:       t.stored.Load(),
		Unchanged:    t.unchanged.Load(),
		Deferred:     t.deferred.Load(),
		Retried:      t.retried.Load(),
		DeadLettered: t.deadLettered.Load(),
	}
}

// String renders the summary line's counts.
func (s Summary) String() string {
	return fmt.Sprintf("%d stored, %d unchanged, %d deferred, %d retried, %d dead-lettered",
		s.Stored, s.Unchanged, s.Deferred, s.Retried, s.DeadLettered)
}
