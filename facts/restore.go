package facts

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/mirrorworker/mirrorworker/clock"
	"github.com/mirrorworker/mirrorworker/jobs"
	"github.com/mirrorworker/mirrorworker/pacer"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"
)

// DefaultWindow is how far back Restore reads by default: the longer of
// the longest pause a worker can still owe (pacer.MaxPause, 600 s) and the
// quiet window after which an escalated interval decays (30 min). Facts
// older than that are read too, but only the newest of each authority that
// is silent within the window (see docs/adr/0004).
const DefaultWindow = max(pacer.MaxPause, pacer.DefaultQuietWindow)

// RestoreOptions configure Restore. The zero value of every field is
// its default.
type RestoreOptions struct {
	// Window is how far back to replay every fact; 0 means DefaultWindow. A
	// pacer with a longer quiet window needs a longer Window.
	Window time.Duration
	// Clock gives the instant facts are applied at; nil means the wall clock.
	Clock clock.Clock
	// Logger gets the summary line and one line per unreadable message; the
	// zero Logger discards.
	Logger zerolog.Logger
}

// RestoreResult says what Restore did.
type RestoreResult struct {
	Facts       int // facts applied
	Authorities int // distinct authorities among them
	Skipped     int // messages that were not pacer facts
}

// Restore rebuilds pacer state at a cold start from the facts on
// mirror.events.pacer.> in MIRROR_EVENTS, and says how many facts it
// applied. Call it after Follow has started and before the worker takes its
// first job, so that no fact falls between the two.
//
// It applies, in stream order, first the newest fact of every subject with
// no fact within the window (an escalated interval decays slowly, and the
// pacer decays it from the fact's time; an operator's pause is not capped),
// then every fact within the window. Applying a pacer fact only ever makes
// the pacer as polite as the fact says or more, so a restart never makes the
// worker ruder; an operator's pause and resume are restored as the operator
// gave them, the newest word last. Replaying a fact twice is harmless. A message that is not a pacer fact is logged and skipped. The
// error is about reading the stream (the stream missing included).
func Restore(ctx context.Context, js jetstream.JetStream, p Applier, o RestoreOptions) (RestoreResult, error) {
	window := o.Window
	if window <= 0 {
		window = DefaultWindow
	}
	clk := o.Clock
	if clk == nil {
		clk = clock.Real{}
	}
	log := o.Logger
	began := clk.Now()
	from := began.Add(-window)
	filter := []string{jobs.PacerEventPrefix + ">"}

	var res RestoreResult
	seen := map[string]bool{}  // authorities with a fact applied
	paced := map[string]bool{} // authorities with a pacer fact (not an operator's) applied
	decode := func(m jetstream.Msg, md *jetstream.MsgMetadata) (pacer.Event, bool) {
		var ev pacer.Event
		err := json.Unmarshal(m.Data(), &ev)
		if err == nil {
			err = checkEvent(ev)
		}
		if err != nil {
			res.Skipped++
			log.Warn().Str("subject", m.Subject()).Uint64("seq", md.Sequence.Stream).Err(err).
				Msg("restore pacer: skipping a message that is not a pacer fact")
			return ev, false
		}
		return ev, true
	}
	apply := func(ev pacer.Event) {
		if !paced[ev.Authority] && ev.Type == pacer.EventRecovered && ev.Interval > 0 {
			// Apply reads no interval from a recovery, but when it is the
			// first fact we have of an authority, it is the only record of
			// the interval escalated before the cooldown. Restoring it from
			// the recovery's time decays it later than the original
			// escalation would: stricter, never ruder.
			p.Apply(clk.Now(), pacer.Event{Type: pacer.EventInterval, Authority: ev.Authority, At: ev.At, Interval: ev.Interval, Reason: "restored"})
		}
		p.Apply(clk.Now(), ev)
		seen[ev.Authority] = true
		if !isOperatorFact(ev.Type) {
			paced[ev.Authority] = true
		}
		res.Facts++
	}

	// Authorities silent within the window: their newest fact only. It is
	// the last word on their interval (every fact carries it) and on their
	// cooldown, which has long expired (at most MaxPause after the fact)
	// but may still want its probe. An operator's facts have a subject of
	// their own (jobs.OperatorEventSubject), so the newest of them comes
	// too: the last word on a pause, which no cap keeps within the window.
	var old []pacer.Event
	err := jobs.Scan(ctx, js, jobs.EventsStream, jetstream.OrderedConsumerConfig{
		FilterSubjects: filter,
		DeliverPolicy:  jetstream.DeliverLastPerSubjectPolicy,
	}, func(m jetstream.Msg, md *jetstream.MsgMetadata) error {
		if !md.Timestamp.Before(from) {
			return nil // within the window: read below, with its history
		}
		if ev, ok := decode(m, md); ok {
			old = append(old, ev)
		}
		return nil
	})
	if err != nil {
		return res, fmt.Errorf("restore pacer: %w", err)
	}
	for _, ev := range old {
		apply(ev)
	}

	err = jobs.Scan(ctx, js, jobs.EventsStream, jetstream.OrderedConsumerConfig{
		FilterSubjects: filter,
		DeliverPolicy:  jetstream.DeliverByStartTimePolicy,
		OptStartTime:   &from,
	}, func(m jetstream.Msg, md *jetstream.MsgMetadata) error {
		if ev, ok := decode(m, md); ok {
			apply(ev)
		}
		return nil
	})
	res.Authorities = len(seen)
	if err != nil {
		return res, fmt.Errorf("restore pacer: %w", err)
	}
	log.Info().Int("facts", res.Facts).Int("authorities", res.Authorities).Int("skipped", res.Skipped).
		Str("window", window.String()).Str("took", clk.Now().Sub(began).Round(time.Millisecond).String()).
		Msg("restore pacer: replayed pacer facts from " + jobs.EventsStream)
	return res, nil
}

// checkEvent refuses a message that decoded but is no pacer fact.
func checkEvent(ev pacer.Event) error {
	switch ev.Type {
	case pacer.EventThrottle, pacer.EventCooldown, pacer.EventRecovered, pacer.EventInterval,
		pacer.EventPaused, pacer.EventResumed, pacer.EventBackoff, pacer.EventBackoffEnded:
	default:
		return fmt.Errorf("unknown fact type %q", ev.Type)
	}
	if ev.Authority == "" {
		return fmt.Errorf("%s fact without an authority", ev.Type)
	}
	return nil
}
