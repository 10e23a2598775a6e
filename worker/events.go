package worker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/mirrorworker/mirrorworker/authority"
	"github.com/mirrorworker/mirrorworker/jobs"
	"github.com/mirrorworker/mirrorworker/pacer"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"
)

// DefaultEventBuffer is how many pacer events wait for publication.
const DefaultEventBuffer = 4096

// EventPublisher is the subset of jetstream.JetStream the EventSink needs.
type EventPublisher interface {
	PublishMsg(ctx context.Context, m *nats.Msg, opts ...jetstream.PublishOpt) (*jetstream.PubAck, error)
}

var _ EventPublisher = (jetstream.JetStream)(nil)

// EventSink turns pacer facts into metrics (cooldowns_total), log lines and
// MIRROR_EVENTS publications. Handle is meant for pacer.Options.OnEvent: it
// never blocks, and drops (counting events_dropped_total) when its buffer is
// full; Run publishes. Safe for concurrent use.
type EventSink struct {
	js  EventPublisher
	log zerolog.Logger
	m   *Metrics
	ch  chan pacer.Event
	pod string // jobs.HeaderPod of every fact; set before Run
}

// SetPod names the pod in every fact the sink publishes, so that the pods
// following MIRROR_EVENTS (FollowEvents) skip their own. Call it before Run.
func (s *EventSink) SetPod(id string) { s.pod = id }

// NewEventSink returns a sink publishing with js (nil: metrics and logs
// only). m may be nil (metrics are then kept in a private registry).
func NewEventSink(js EventPublisher, log zerolog.Logger, m *Metrics) *EventSink {
	if m == nil {
		m, _ = NewMetrics(nil, 0) // a private registry cannot clash
	}
	return &EventSink{js: js, log: log, m: m, ch: make(chan pacer.Event, DefaultEventBuffer)}
}

// Handle records ev. It never blocks.
func (s *EventSink) Handle(ev pacer.Event) {
	host, port := authority.Split(ev.Authority)
	s.logEvent(host, port, ev)
	if ev.Type == pacer.EventCooldown {
		s.m.CountCooldown(host, port, ev.Reason)
	}
	if s.js == nil || ev.Type == pacer.EventCapped {
		return
	}
	select {
	case s.ch <- ev:
	default:
		s.m.EventsDropped.Inc()
	}
}

// logEvent writes the log lines of a pacer fact: a pause capped at
// pacer.MaxPause, a cooldown entered or extended, a recovery.
func (s *EventSink) logEvent(host, port string, ev pacer.Event) {
	if ev.Asked > 0 {
		s.log.Warn().Str("upstream_host", host).Str("upstream_port", port).
			Dur("asked", ev.Asked).Dur("capped_to", ev.Pause).Str("family", ev.Family).
			Msg("pacer: upstream pause capped")
	}
	switch ev.Type {
	case pacer.EventCooldown:
		msg := "pacer: cooldown entered"
		if ev.Extended {
			msg = "pacer: cooldown extended"
		}
		s.log.Warn().Str("upstream_host", host).Str("upstream_port", port).
			Int("status", ev.Status).Str("reason", ev.Reason).Time("until", ev.Until).
			Dur("pause", ev.Pause).Bool("fallback", ev.Fallback).Str("family", ev.Family).
			Dur("interval", ev.Interval).Dur("fallback_ceiling", ev.Ceiling).Msg(msg)
	case pacer.EventRecovered:
		s.log.Info().Str("upstream_host", host).Str("upstream_port", port).
			Int("status", ev.Status).Dur("interval", ev.Interval).Msg("pacer: cooldown recovered")
	}
}

// Run publishes buffered events until ctx is done, then publishes what is
// left for at most a few seconds. It returns nil.
func (s *EventSink) Run(ctx context.Context) error {
	// A fact taken in is published even if ctx ends meanwhile (each publish
	// has its own timeout): when both are ready, select may take the fact
	// first, and a stop must not drop what the worker learned while
	// stopping.
	pub := context.WithoutCancel(ctx)
	for {
		select {
		case ev := <-s.ch:
			s.publish(pub, ev)
		case <-ctx.Done():
			fin, cancel := context.WithTimeout(pub, 3*time.Second)
			defer cancel()
			for {
				select {
				case ev := <-s.ch:
					s.publish(fin, ev)
				default:
					return nil
				}
			}
		}
	}
}

func (s *EventSink) publish(ctx context.Context, ev pacer.Event) {
	if ctx.Err() != nil {
		s.m.EventsDropped.Inc()
		return
	}
	b, err := json.Marshal(ev)
	if err != nil {
		s.m.EventsDropped.Inc()
		return
	}
	pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	m := nats.NewMsg(jobs.EventSubject(authority.KeyOf(ev.Authority)))
	m.Data = b
	if s.pod != "" {
		m.Header.Set(jobs.HeaderPod, s.pod)
	}
	if _, err := s.js.PublishMsg(pctx, m); err != nil {
		s.m.EventsDropped.Inc()
		s.log.Warn().Err(err).Str("authority", ev.Authority).Str("event", string(ev.Type)).Msg("publish pacer event")
	}
}

// Applier is what FollowEvents feeds: *pacer.Pacer is one.
type Applier interface {
	Apply(now time.Time, ev pacer.Event)
}

// FollowEvents applies to p, as they are published, the pacer facts of
// every other pod and every operator command (pause, resume) on
// MIRROR_EVENTS, skipping those published by self (jobs.HeaderPod). It reads
// with an ordered consumer from the newest message on, so it starts before
// the cold-start restore (replay.RestorePacer) and nothing falls between
// the two; a fact applied twice is harmless. It returns when ctx ends, or
// an error when it cannot start.
func FollowEvents(ctx context.Context, js jetstream.JetStream, p Applier, self string, log zerolog.Logger) (run func() error, err error) {
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
			p.Apply(time.Now(), ev)
			if ev.Type == pacer.EventPaused || ev.Type == pacer.EventResumed {
				log.Info().Str("authority", ev.Authority).Str("event", string(ev.Type)).
					Time("until", ev.Until).Str("reason", ev.Reason).Msg("operator " + string(ev.Type) + " authority")
			}
		}
	}, nil
}
