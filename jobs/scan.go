package jobs

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// scanIdle bounds the wait for the next message of a Scan. Every message a
// scan waits for was stored before it began, so only a message removed
// meanwhile (MaxAge, MaxBytes, a purge) can keep it waiting.
const scanIdle = 10 * time.Second

// Scan calls fn, in stream order, for every message of stream that cfg
// selects, up to the last such message stored when Scan begins; messages
// stored later are left for the live path. It reads with an ordered
// consumer (no acks, no server state left behind) and returns fn's first
// error. Replay's counts and the pacer's cold-start restore (package facts)
// read with it.
func Scan(ctx context.Context, js jetstream.JetStream, stream string, cfg jetstream.OrderedConsumerConfig,
	fn func(jetstream.Msg, *jetstream.MsgMetadata) error) error {
	st, err := js.Stream(ctx, stream)
	if err != nil {
		return fmt.Errorf("stream %s: %w", stream, err)
	}
	filters := cfg.FilterSubjects
	if len(filters) == 0 {
		filters = st.CachedInfo().Config.Subjects
	}
	// The end: the newest message any filter selects. Looking it up first
	// also tells an empty selection apart without waiting for a timeout.
	var end uint64
	var endTime time.Time
	for _, f := range filters {
		m, err := st.GetLastMsgForSubject(ctx, f)
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			continue
		}
		if err != nil {
			return fmt.Errorf("last message of %s: %w", f, err)
		}
		if m.Sequence > end {
			end, endTime = m.Sequence, m.Time
		}
	}
	switch {
	case end == 0,
		cfg.DeliverPolicy == jetstream.DeliverByStartSequencePolicy && end < cfg.OptStartSeq,
		cfg.DeliverPolicy == jetstream.DeliverByStartTimePolicy && endTime.Before(*cfg.OptStartTime):
		return nil
	}

	c, err := js.OrderedConsumer(ctx, stream, cfg)
	if err != nil {
		return fmt.Errorf("ordered consumer on %s: %w", stream, err)
	}
	it, err := c.Messages()
	if err != nil {
		return fmt.Errorf("read %s: %w", stream, err)
	}
	defer func() {
		it.Stop()
		// Delete the consumer rather than leave it to its inactive
		// threshold (5 min): a replay scans before it starts, and nothing
		// of the scan should be left beside the replay's own consumer.
		if ci := c.CachedInfo(); ci != nil {
			dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
			_ = js.DeleteConsumer(dctx, stream, ci.Name)
			cancel()
		}
	}()
	for {
		nctx, cancel := context.WithTimeout(ctx, scanIdle)
		m, err := it.Next(jetstream.NextContext(nctx))
		cancel()
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			return fmt.Errorf("read %s up to sequence %d: %w", stream, end, err)
		}
		md, err := m.Metadata()
		if err != nil {
			return fmt.Errorf("read %s: message metadata: %w", stream, err)
		}
		if err := fn(m, md); err != nil {
			return err
		}
		if md.Sequence.Stream >= end || md.NumPending == 0 {
			return nil
		}
	}
}
