package facts_test

import (
	"context"

	"github.com/mirrorworker/mirrorworker/facts"
	"github.com/mirrorworker/mirrorworker/pacer"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"
)

// The worker restores its pacer before it takes its first job.
func ExampleRestore() {
	var js jetstream.JetStream // connected to the deployment's NATS
	ctx := context.Background()
	p := pacer.New(nil)
	res, err := facts.Restore(ctx, js, p, facts.RestoreOptions{Logger: zerolog.Nop()})
	if err != nil {
		return // cannot read MIRROR_EVENTS: do not start ruder than before
	}
	_ = res.Facts // facts applied; Restore also logs them
	// ... start the worker with p
}
