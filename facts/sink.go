package facts

import (
	"context"
	"encoding/json"
	"time"

	"github.com/mirrorworker/mirrorworker/authority"
	"github.com/mirrorworker/mirrorworker/jobs"
	"github.com/mirrorworker/mirrorworker/pacer"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"
)

// DefaultBuffer is how many pacer facts wait for publication in a Sink.
const DefaultBuffer = 4096

// Publisher is the subset of jetstream.JetStream that publishing facts
// needs.
type Publisher interface {
	PublishMsg(ctx context.Context, m *nats.Msg, opts ...jetstream.PublishOpt) (*jetstream.PubAck, error)
}

var _ Publisher = (jetstream.JetStream)(nil)

// Metrics is what a Sink counts; *worker.Metrics is one.
type Metrics interface {
	// CountCooldown counts one cooldown entered or extended.
	CountCooldown(host, port, reason string)
	// CountEventDropped counts one fact not published (full buffer, a
	// failed publish, a stop).
	CountEventDropped()
}

type noMetrics struct{}

func (noMetrics) CountCooldown(string, string, string) {}
func (noMetrics) CountEventDropped()                   {}

// Sink turns pacer facts into metrics, log lines and MIRROR_EVENTS
// publications. Handle is meant for pacer.Options.OnEvent: it never blocks,
// and drops (counting it) when its buffer is full; Run publishes. Safe for
// concurrent use; SetPod before Run.
type Sink struct {
	js  Publisher
	log zerolog.Logger
	m   Metrics
	ch  chan pacer.Event
	pod string // jobs.HeaderPod of every fact; set before Run
}

// NewSink returns a sink publishing with js (nil: metrics and logs only).
// m may be nil (nothing is counted).
func NewSink(js Publisher, log zerolog.Logger, m Metrics) *Sink {
	if m == nil {
		m = noMetrics{}
	}
	return &Sink{js: js, log: log, m: m, ch: make(chan pacer.Event, DefaultBuffer)}
}

// SetPod names the pod in every fact the sink publishes, so that the pods
// following MIRROR_EVENTS (Follow) skip their own. Call it before Run.
func (s *Sink) SetPod(id string) { s.pod = id }

// Handle records ev. It never blocks.
func (s *Sink) Handle(ev pacer.Event) {
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
		s.m.CountEventDropped()
	}
}

// logEvent writes the log lines of a pacer fact: a pause capped at
// pacer.MaxPause, a cooldown entered or extended, a recovery.
func (s *Sink) logEvent(host, port string, ev pacer.Event) {
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
	case pacer.EventBackoff:
		s.log.Warn().Str("upstream_host", host).Str("upstream_port", port).
			Int("status", ev.Status).Str("reason", ev.Reason).Int("failures", ev.Failures).Time("until", ev.Until).
			Msg("pacer: origin failing, backed off (no request to it before until)")
	case pacer.EventBackoffEnded:
		s.log.Info().Str("upstream_host", host).Str("upstream_port", port).
			Int("status", ev.Status).Int("failures", ev.Failures).Msg("pacer: origin answering again, backoff ended")
	}
}

// Run publishes buffered facts until ctx is done, then publishes what is
// left for at most a few seconds. It returns nil.
func (s *Sink) Run(ctx context.Context) error {
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

func (s *Sink) publish(ctx context.Context, ev pacer.Event) {
	if ctx.Err() != nil {
		s.m.CountEventDropped()
		return
	}
	pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if err := publish(pctx, s.js, ev, s.pod); err != nil {
		s.m.CountEventDropped()
		s.log.Warn().Err(err).Str("authority", ev.Authority).Str("event", string(ev.Type)).Msg("publish pacer event")
	}
}

// publish is the one way a fact goes onto MIRROR_EVENTS: JSON on the
// authority's subject (an operator's fact on the authority's operator
// subject), the publisher named in jobs.HeaderPod.
func publish(ctx context.Context, js Publisher, ev pacer.Event, pod string) error {
	b, err := json.Marshal(ev)
	if err != nil {
		return err
	}
	subject := jobs.EventSubject(authority.KeyOf(ev.Authority))
	if isOperatorFact(ev.Type) {
		subject = jobs.OperatorEventSubject(authority.KeyOf(ev.Authority))
	}
	m := nats.NewMsg(subject)
	m.Data = b
	if pod != "" {
		m.Header.Set(jobs.HeaderPod, pod)
	}
	_, err = js.PublishMsg(ctx, m)
	return err
}
