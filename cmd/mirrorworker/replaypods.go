package main

import (
	"context"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nuid"
	"github.com/rs/zerolog"

	"github.com/mirrorworker/mirrorworker/jobs"
	"github.com/mirrorworker/mirrorworker/pipeline"
	"github.com/mirrorworker/mirrorworker/replay"
)

// replayThroughPods is a replay beside live pods (docs/adr/0025): it fetches
// nothing itself. Its jobs go to the pods that own their authorities, as
// replay jobs into the replay's target, a few per authority at a time, and
// the pods report each one's end; its progress is theirs.
func replayThroughPods(ctx context.Context, js jetstream.JetStream, c *replayConfig, plan replayPlan, target storeTarget,
	pods map[string][]string, log zerolog.Logger, stdout, stderr io.Writer) error {
	spec := pipeline.TargetSpec(target.Root())
	if err := replay.CheckPods(pods, spec); err != nil {
		return fmt.Errorf("replay into %s beside %d live %s: %w", spec, len(pods), plural(len(pods), "pod", "pods"), err)
	}
	kv, err := replay.EnsureReplaysBucket(ctx, js, c.streamReplicas)
	if err != nil {
		return replicasHint(err, c.streamReplicas)
	}
	run := strings.ToLower(nuid.Next())
	fmt.Fprintf(stderr, "replay %s: the live pods do its jobs (%d), after their live ones; 'mirrorworker status' shows it\n", run, len(pods))
	notePacingFlags(c, stderr)
	var tally replay.Tally
	work := replay.Handover(js, kv, replay.HandoverOptions{
		Run: run, Target: spec, AckWait: c.ackWait, Logger: log,
		OnDone: func(d jobs.ReplayDone) { tally.Add(d.Outcome) },
	})
	began := time.Now()
	res, err := replay.Run(ctx, js, work, &replay.Options{
		Start:    plan.start,
		Subjects: plan.subjects,
		Consumer: &jobs.ConsumerOptions{AckWait: c.ackWait, MaxAckPending: c.maxAckPending, Replicas: c.streamReplicas},
		Progress: newProgress(c.progress, stderr),
		Waits:    replay.PodWaits(js),
		Logger:   log,
	})
	return replayEnd(ctx, js, c, plan, target, res, tally.Summary(), err, began, run, stdout)
}
