package replay

import (
	"fmt"

	"github.com/mirrorworker/mirrorworker/worker"
	"github.com/prometheus/client_golang/prometheus"
)

// Summary is what the replay's worker did, from its jobs_total counter. A
// job deferred several times counts once per deferral; the other outcomes
// count jobs.
type Summary struct {
	Stored       int64 // fetched and written
	Unchanged    int64 // the origin answered 304: nothing written
	Deferred     int64 // deferrals (authority cooling, spacing or throttling)
	Retried      int64 // transient failures retried
	DeadLettered int64
}

// jobsMetric is the worker's jobs_total counter.
const jobsMetric = "mirrorworker_jobs_total"

// SummaryFrom reads a Summary from the registry the replay's worker
// registered its metrics on. Give the replay a registry of its own: a
// shared one would mix in other jobs.
func SummaryFrom(g prometheus.Gatherer) (Summary, error) {
	mfs, err := g.Gather()
	if err != nil {
		return Summary{}, fmt.Errorf("gather metrics: %w", err)
	}
	var s Summary
	for _, mf := range mfs {
		if mf.GetName() != jobsMetric {
			continue
		}
		for _, m := range mf.GetMetric() {
			var outcome string
			for _, l := range m.GetLabel() {
				if l.GetName() == "outcome" {
					outcome = l.GetValue()
				}
			}
			n := int64(m.GetCounter().GetValue())
			switch outcome {
			case worker.OutcomeStored:
				s.Stored += n
			case worker.OutcomeUnchanged:
				s.Unchanged += n
			case worker.OutcomeDeferred:
				s.Deferred += n
			case worker.OutcomeRetried:
				s.Retried += n
			case worker.OutcomeDeadLettered:
				s.DeadLettered += n
			}
		}
	}
	return s, nil
}

// String renders the summary line's counts.
func (s Summary) String() string {
	return fmt.Sprintf("%d stored, %d unchanged, %d deferred, %d retried, %d dead-lettered",
		s.Stored, s.Unchanged, s.Deferred, s.Retried, s.DeadLettered)
}
