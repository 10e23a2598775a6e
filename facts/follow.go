package facts

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/mirrorworker/mirrorworker/clock"
	"github.com/mirrorworker/mirrorworker/jobs"
	"github.com/mirrorworker/mirrorworker/pacer"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"
)

// Follow applies to p, as they are published, the pacer facts of every
// other pod and every operator command (pause, resume) on MIRROR_EVENTS,
// skipping those published by self (jobs.HeaderPod), at clk's instant (nil:
// the wall clock). It reads with an ordered consumer from the newest message
// on, so it starts before the cold-start Restore and nothing falls between
// the two; a fact applied twice is harmless. The returned run returns when
// ctx ends; err says Follow could not start.
func Follow(ctx context.Context, js jetstream.JetStream, p Applier, self string, clk clock.Clock, log zerolog.Logger) (run func() error, err error) {
	if clk == nil {
		clk = clock.Real{}
	}
	c, err := js.OrderedConsumer(ctx, jobs.EventsStream, jetstream.OrderedConsumerConfig{
		FilterSubjects: []string{jobs.PacerEventPrefix + ">"},
		DeliverPolicy:  jetstream.DeliverNewPolicy,
	})
	if err != nil {
		return nil, fmt.Errorf("follow %s: %w", jobs.EventsStream, err)
	}
	it, err := c.Messages()
	if err != nil {
		return nil, fmt.Errorf("follow %s: %w", jobs.EventsStream, err)
	}
	return func() error {
		go func() { <-ctx.Done(); it.Stop() }()
		for {
			m, err := it.Next()
			if err != nil {
				if ctx.Err() != nil || errors.Is(err, jetstream.ErrMsgIteratorClosed) {
					return nil
				}
				log.Warn().Err(err).Msg("follow pacer facts")
				continue
			}
			if m.Headers().Get(jobs.HeaderPod) == self && self != "" {
				continue
			}
			var ev pacer.Event
			if err := json.Unmarshal(m.Data(), &ev); err != nil || ev.Authority == "" {
				continue
			}
			p.Apply(clk.Now(), ev)
			if ev.Type == pacer.EventPaused || ev.Type == pacer.EventResumed {
				log.Info().Str("authority", ev.Authority).Str("event", string(ev.Type)).
					Time("until", ev.Until).Str("reason", ev.Reason).Msg("operator " + string(ev.Type) + " authority")
			}
		}
	}, nil
}
