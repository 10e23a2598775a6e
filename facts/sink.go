package facts

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
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

// PublishTimeout bounds the first attempt to publish a fact; each attempt
// after it may take twice as long as the one before, up to
// PublishTimeoutMax, so that a link slower than the first deadline (whose
// attempts all land, only too late) is still answered in time. A fact not
// stored is tried again (RetryMax apart at most) until it is, however long
// the link is down. StopWindow is how long a stopping Sink keeps trying.
const (
	PublishTimeout    = 2 * time.Second
	PublishTimeoutMax = 16 * time.Second
	RetryMax          = time.Second
	StopWindow        = 3 * time.Second
)

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
	// CountEventDropped counts one fact not published (a full buffer, or
	// still not stored when a stopping sink gives up).
	CountEventDropped()
}

type noMetrics struct{}

func (noMetrics) CountCooldown(string, string, string) {}
func (noMetrics) CountEventDropped()                   {}

// Sink turns pacer facts into metrics, log lines and MIRROR_EVENTS
// publications. Handle is meant for pacer.Options.OnEvent: it never blocks,
// and drops (counting it) when its buffer is full; Run publishes, in the
// order the facts were handled, each until MIRROR_EVENTS has stored it
// (docs/adr/0007: a wait learned by one pod binds the next sender), with a
// Nats-Msg-Id so that an attempt that timed out here but landed there is
// stored once. Pending and Flush say what is not stored yet. Safe for
// concurrent use; SetPod before Run.
type Sink struct {
	js   Publisher
	log  zerolog.Logger
	m    Metrics
	ch   chan outFact
	pod  string // jobs.HeaderPod of every fact; set before Run
	boot string // this sink's part of every Nats-Msg-Id

	mu       sync.Mutex
	queued   uint64        // facts accepted by Handle, numbered from 1
	stored   uint64        // facts stored (or given up at a stop), in order
	progress chan struct{} // closed and replaced when stored moves
}

// outFact is a fact waiting in the outbox, with its number.
type outFact struct {
	ev  pacer.Event
	seq uint64
}

// NewSink returns a sink publishing with js (nil: metrics and logs only).
// m may be nil (nothing is counted).
func NewSink(js Publisher, log zerolog.Logger, m Metrics) *Sink {
	if m == nil {
		m = noMetrics{}
	}
	return &Sink{js: js, log: log, m: m, ch: make(chan outFact, DefaultBuffer),
		boot: fmt.Sprintf("%x", time.Now().UnixNano()), progress: make(chan struct{})}
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
	s.mu.Lock()
	defer s.mu.Unlock()
	select {
	case s.ch <- outFact{ev: ev, seq: s.queued + 1}:
		s.queued++
	default:
		s.m.CountEventDropped()
	}
}

// Pending is how many facts handled are not stored yet.
func (s *Sink) Pending() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return int(s.queued - s.stored)
}

// Flush waits until every fact handled before it was called is stored on
// MIRROR_EVENTS (or given up by a stopping sink), or ctx ends: what a pod
// giving a partition back waits for before it lets the lease go, so that
// the next owner finds every wait this pod learned.
func (s *Sink) Flush(ctx context.Context) error {
	s.mu.Lock()
	target := s.queued
	s.mu.Unlock()
	for {
		s.mu.Lock()
		stored, progress := s.stored, s.progress
		s.mu.Unlock()
		if stored >= target {
			return nil
		}
		select {
		case <-progress:
		case <-ctx.Done():
			return fmt.Errorf("flush pacer facts: %d not stored: %w", target-stored, ctx.Err())
		}
	}
}

func (s *Sink) done(seq uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.stored = max(s.stored, seq)
	close(s.progress)
	s.progress = make(chan struct{})
}

// logEvent writes the log lines of a pacer fact: a pause capped at
// pacer.MaxPause, a cooldown entered or extended, a limiter's refusal, a
// recovery.
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
	case pacer.EventThrottle:
		if ev.Reason != "limiter" {
			return // a 429's or a 503's with Retry-After: its cooldown line says it
		}
		// A limiter's 503 starts no cooldown, so without this line the
		// log said nothing of how the pod read it (ADR 0030).
		msg := "pacer: 503 read as a limiter's refusal (throttling, no cooldown)"
		if ev.AfterBlastStep {
			msg = "pacer: 503 to the request after the cold blast's short step read as the limiter's (throttling, no cooldown)"
		}
		s.log.Info().Str("upstream_host", host).Str("upstream_port", port).
			Int("status", ev.Status).Str("reason", ev.Reason).Dur("interval", ev.Interval).
			Bool("after_blast_step", ev.AfterBlastStep).Msg(msg)
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

// Run publishes the facts in order, each until it is stored, until ctx is
// done; then it keeps publishing what is left for StopWindow. It returns
// nil.
func (s *Sink) Run(ctx context.Context) error {
	// A fact taken in is published even if ctx ends meanwhile: when both
	// are ready, select may take the fact first, and a stop must not drop
	// what the worker learned while stopping.
	stop := newStopWindow(ctx)
	for {
		select {
		case f := <-s.ch:
			s.publishUntilStored(stop, f)
		case <-ctx.Done():
			for {
				select {
				case f := <-s.ch:
					s.publishUntilStored(stop, f)
				default:
					return nil
				}
			}
		}
	}
}

// stopWindow is the context a stopping Sink publishes under: it ends
// StopWindow after the Run context does.
func newStopWindow(ctx context.Context) context.Context {
	stop, cancel := context.WithCancel(context.WithoutCancel(ctx))
	context.AfterFunc(ctx, func() { time.AfterFunc(StopWindow, cancel) })
	return stop
}

// publishUntilStored publishes f, again and again (with a growing pause,
// RetryMax at most) until MIRROR_EVENTS stores it or stop ends. Every
// attempt carries the same Nats-Msg-Id, so attempts that all land (a black
// hole delivers them late) are stored once.
func (s *Sink) publishUntilStored(stop context.Context, f outFact) {
	id := fmt.Sprintf("%s.%s.%d", s.pod, s.boot, f.seq)
	pause, timeout := 50*time.Millisecond, PublishTimeout
	for attempt := 1; ; attempt++ {
		pctx, cancel := context.WithTimeout(stop, timeout)
		err := publish(pctx, s.js, f.ev, s.pod, id)
		cancel()
		switch {
		case err == nil:
			if attempt > 1 {
				s.log.Info().Str("authority", f.ev.Authority).Str("event", string(f.ev.Type)).Int("attempts", attempt).Msg("pacer fact published")
			}
			s.done(f.seq)
			return
		case stop.Err() != nil:
			s.m.CountEventDropped()
			s.log.Warn().Err(err).Str("authority", f.ev.Authority).Str("event", string(f.ev.Type)).Msg("pacer fact not published before the stop")
			s.done(f.seq)
			return
		case attempt == 1:
			s.log.Warn().Err(err).Str("authority", f.ev.Authority).Str("event", string(f.ev.Type)).Msg("publish pacer fact failed; retrying until it is stored")
		}
		select {
		case <-time.After(pause):
		case <-stop.Done():
		}
		pause, timeout = min(2*pause, RetryMax), min(2*timeout, PublishTimeoutMax)
	}
}

// publish is the one way a fact goes onto MIRROR_EVENTS: JSON on the
// authority's subject (an operator's fact on the authority's operator
// subject), the publisher named in jobs.HeaderPod, id (if any) its
// Nats-Msg-Id.
func publish(ctx context.Context, js Publisher, ev pacer.Event, pod, id string) error {
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
	if id != "" {
		m.Header.Set(nats.MsgIdHdr, id)
	}
	_, err = js.PublishMsg(ctx, m)
	return err
}
