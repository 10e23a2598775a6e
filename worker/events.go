package worker

import (
	"context"
	"encoding/json"
	"net"
	"time"

	"github.com/mirrorworker/mirrorworker/authority"
	"github.com/mirrorworker/mirrorworker/jobs"
	"github.com/mirrorworker/mirrorworker/pacer"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"
)

// DefaultEventBuffer is how many pacer events wait for publication.
const DefaultEventBuffer = 4096

// EventPublisher is the subset of jetstream.JetStream the EventSink needs.
type EventPublisher interface {
	Publish(ctx context.Context, subject string, data []byte, opts ...jetstream.PublishOpt) (*jetstream.PubAck, error)
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
}

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
	host, port, err := net.SplitHostPort(ev.Authority)
	if err != nil {
		host, port = ev.Authority, ""
	}
	// The pacer logs cooldown entry and recovery itself; the sink counts.
	if ev.Type == pacer.EventCooldown {
		s.m.CountCooldown(host, port, ev.Reason)
	}
	if s.js == nil {
		return
	}
	select {
	case s.ch <- ev:
	default:
		s.m.EventsDropped.Inc()
	}
}

// Run publishes buffered events until ctx is done, then publishes what is
// left for at most a few seconds. It returns nil.
func (s *EventSink) Run(ctx context.Context) error {
	for {
		select {
		case ev := <-s.ch:
			s.publish(ctx, ev)
		case <-ctx.Done():
			fin, cancel := context.WithTimeout(context.WithoutCancel(ctx), 3*time.Second)
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
	if _, err := s.js.Publish(pctx, jobs.EventSubject(authority.KeyOf(ev.Authority)), b); err != nil {
		s.m.EventsDropped.Inc()
		s.log.Warn().Err(err).Str("authority", ev.Authority).Str("event", string(ev.Type)).Msg("publish pacer event")
	}
}
