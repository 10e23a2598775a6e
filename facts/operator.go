package facts

import (
	"context"
	"fmt"

	"github.com/mirrorworker/mirrorworker/jobs"
	"github.com/mirrorworker/mirrorworker/pacer"
)

// PublishOperator publishes an operator's fact (pacer.EventPaused or
// pacer.EventResumed) for every worker: the live ones apply it through
// Follow, and a worker starting later through Restore.
func PublishOperator(ctx context.Context, js Publisher, ev pacer.Event) error {
	if !isOperatorFact(ev.Type) {
		return fmt.Errorf("publish operator fact: %q is not an operator's fact", ev.Type)
	}
	if ev.Authority == "" {
		return fmt.Errorf("publish operator fact: %s without an authority", ev.Type)
	}
	if ev.Type == pacer.EventPaused && !ev.Until.After(ev.At) {
		return fmt.Errorf("publish operator fact: a pause of %s must end after it is given", ev.Authority)
	}
	if err := publish(ctx, js, ev, OperatorPod, ""); err != nil {
		return fmt.Errorf("publish %s of %s: %w (is stream %s there? start 'mirrorworker run' once)", ev.Type, ev.Authority, err, jobs.EventsStream)
	}
	return nil
}

// isOperatorFact says t is an operator's fact (pause, resume), which the
// pacer applies but never emits.
func isOperatorFact(t pacer.EventType) bool {
	return t == pacer.EventPaused || t == pacer.EventResumed
}
