// Package facts is the one home of the pacer's facts on MIRROR_EVENTS: the
// Sink that logs, counts and publishes what a pacer learns (Sink.Handle is
// pacer.Options.OnEvent), Follow that applies other pods' facts as they are
// published, Restore that rebuilds a pacer from them at a cold start, and
// PublishOperator for an operator's pause and resume. Follow and Restore
// feed one Applier (*pacer.Pacer is one) on an injected clock.
//
// It does not decide anything about politeness (package pacer does; a fact
// is applied by pacer.Apply), create the stream (package jobs does), or run
// the pipeline (package pipeline starts the sink and the follower). Like
// every package in this module it is not a stable public API.
package facts

import (
	"time"

	"github.com/mirrorworker/mirrorworker/pacer"
)

// Applier takes pacer facts, followed or restored; *pacer.Pacer is one.
type Applier interface {
	Apply(now time.Time, ev pacer.Event)
}

var _ Applier = (*pacer.Pacer)(nil)

// OperatorPod is the jobs.HeaderPod of the facts an operator publishes
// (mirrorworker pause, resume): no pod is named so, so every pod applies
// them.
const OperatorPod = "operator"
