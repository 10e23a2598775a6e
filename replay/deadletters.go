package replay

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/mirrorworker/mirrorworker/jobs"
)

// A replay's dead letters are kept apart from the live pipeline's: a replay
// runs with settings of its own (another target, perhaps without
// --allow-private-networks) and its failures must not read as the live
// worker's, nor be counted by the next dry run as the jobs' fate. They go
// to DeadLetterStream, under DeadLetterPrefix instead of
// jobs.DLQSubjectPrefix, as the same records (whose Worker names the
// replay); `mirrorworker dlq --replays` reads them.
const (
	DeadLetterStream = jobs.ReplayDLQStream
	DeadLetterPrefix = jobs.ReplayDLQPrefix
)

// DeadLetterStreamConfig is DeadLetterStream's configuration: MIRROR_DLQ's
// limits (30 days, duplicates window), with replicas replicas (0: 1).
func DeadLetterStreamConfig(replicas int) jetstream.StreamConfig {
	return jetstream.StreamConfig{
		Name:        DeadLetterStream,
		Description: "mirrorworker dead-letter records of replays",
		Subjects:    []string{DeadLetterPrefix + ">"},
		Retention:   jetstream.LimitsPolicy,
		Storage:     jetstream.FileStorage,
		MaxAge:      jobs.DefaultDLQMaxAge,
		MaxMsgs:     -1,
		MaxBytes:    -1,
		Duplicates:  jobs.DefaultDLQDuplicates,
		Discard:     jetstream.DiscardNew,
		Replicas:    max(replicas, 1),
	}
}

// EnsureDeadLetterStream creates DeadLetterStream when it is missing; an
// existing one is kept as it is (replicas are only raised).
func EnsureDeadLetterStream(ctx context.Context, js jetstream.JetStream, replicas int) error {
	cfg := DeadLetterStreamConfig(replicas)
	s, err := js.Stream(ctx, DeadLetterStream)
	switch {
	case errors.Is(err, jetstream.ErrStreamNotFound):
		if _, err := js.CreateStream(ctx, cfg); err != nil && !errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) {
			return fmt.Errorf("create stream %s: %w", DeadLetterStream, err)
		}
		return nil
	case err != nil:
		return fmt.Errorf("stream %s: %w", DeadLetterStream, err)
	}
	if have := s.CachedInfo().Config; have.Replicas < cfg.Replicas {
		have.Replicas = cfg.Replicas
		if _, err := js.UpdateStream(ctx, have); err != nil {
			return fmt.Errorf("update stream %s: %w", DeadLetterStream, err)
		}
	}
	return nil
}

// SeparateDeadLetters returns js with every message published to a
// jobs.DLQSubjectPrefix subject (the worker's dead letters) moved to the
// same subject under DeadLetterPrefix, into DeadLetterStream. Everything
// else goes through js unchanged. Safe for concurrent use as js is.
func SeparateDeadLetters(js jetstream.JetStream) jetstream.JetStream {
	return separateDLQ{js}
}

type separateDLQ struct{ jetstream.JetStream }

func (s separateDLQ) PublishMsg(ctx context.Context, m *nats.Msg, opts ...jetstream.PublishOpt) (*jetstream.PubAck, error) {
	return s.JetStream.PublishMsg(ctx, moveDLQ(m), opts...)
}

func (s separateDLQ) Publish(ctx context.Context, subj string, data []byte, opts ...jetstream.PublishOpt) (*jetstream.PubAck, error) {
	if rest, ok := strings.CutPrefix(subj, jobs.DLQSubjectPrefix); ok {
		subj = DeadLetterPrefix + rest
	}
	return s.JetStream.Publish(ctx, subj, data, opts...)
}

func (s separateDLQ) PublishMsgAsync(m *nats.Msg, opts ...jetstream.PublishOpt) (jetstream.PubAckFuture, error) {
	return s.JetStream.PublishMsgAsync(moveDLQ(m), opts...)
}

// moveDLQ returns m, or a copy on the replay's subject when m is a dead
// letter.
func moveDLQ(m *nats.Msg) *nats.Msg {
	rest, ok := strings.CutPrefix(m.Subject, jobs.DLQSubjectPrefix)
	if !ok {
		return m
	}
	moved := nats.NewMsg(DeadLetterPrefix + rest)
	moved.Header, moved.Data, moved.Reply = m.Header, m.Data, m.Reply
	return moved
}
