package jobs

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/nats-io/nats.go/jetstream"
)

// Drained reports whether the consumer whose info is ci holds nothing: no
// delivery awaits its ack, and every message of stream its filters select
// has been delivered. Where something is left it costs no lookups; an
// empty-looking consumer costs one per filter.
//
// A consumer's NumPending alone cannot say this. The server counts a
// newly stored message into a consumer's pending asynchronously, after it
// has acknowledged the publish, so a consumer of a burst just stored reads
// 0 pending and 0 ack pending for as long as the signal queue lags (on a
// loaded machine, a load test saw all 108 jobs of ten partitions missing
// from it). The last message a filter selects is read from the stream's
// store, which the publish's acknowledgement already includes.
func Drained(ctx context.Context, stream jetstream.Stream, ci *jetstream.ConsumerInfo) (bool, error) {
	if ci.NumAckPending > 0 || ci.NumPending > 0 {
		return false, nil
	}
	last, err := lastSelected(ctx, stream, ci.Config)
	if err != nil {
		return false, fmt.Errorf("consumer %s: %w", ci.Name, err)
	}
	return last <= ci.Delivered.Stream, nil
}

// lastSelected returns the sequence of the newest message of stream that
// cfg's filters select (the whole stream without one); 0 when none is
// stored.
func lastSelected(ctx context.Context, stream jetstream.Stream, cfg jetstream.ConsumerConfig) (uint64, error) {
	filters := cfg.FilterSubjects
	if cfg.FilterSubject != "" {
		filters = append([]string{cfg.FilterSubject}, filters...)
	}
	if len(filters) == 0 {
		filters = []string{">"}
	}
	var last uint64
	for _, f := range filters {
		m, err := stream.GetLastMsgForSubject(ctx, f)
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			continue
		}
		if err != nil {
			return 0, fmt.Errorf("last message of %s: %w", f, err)
		}
		last = max(last, m.Sequence)
	}
	return last, nil
}

// Unsignalled returns how many of the consumers in infos read empty (0
// pending, 0 ack pending) while a job is stored for them: the server has
// not counted it yet (Drained). A queue's readers call it only once its
// counts sum to nothing, so a busy queue costs no lookups. Catch-up
// consumers are not looked up: every job they hold was stored before
// they were created, which counts from the store (docs/adr/0028), and
// their filters may list 2,000 subjects.
func Unsignalled(ctx context.Context, stream jetstream.Stream, infos []*jetstream.ConsumerInfo) (int, error) {
	n := 0
	for _, ci := range infos {
		if ci.NumPending > 0 || ci.NumAckPending > 0 || strings.HasPrefix(ci.Name, CatchupConsumerPrefix) {
			continue
		}
		drained, err := Drained(ctx, stream, ci)
		if err != nil {
			return n, err
		}
		if !drained {
			n++
		}
	}
	return n, nil
}
