package worker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"sync/atomic"
	"time"

	"github.com/cenkalti/backoff/v4"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/mirrorworker/mirrorworker/clock"
	"github.com/mirrorworker/mirrorworker/jobs"
)

// settler carries out what the worker decided for a delivery: ack it
// (stored or unchanged), defer it (NAK with a delay, park it, leave it in
// its lane), retry it against the failure budget, dead-letter it, or hand
// it back; and it counts each outcome. The loops (intake, dispatch, fetch
// slots) only decide which; every acknowledgement goes through here.
type settler struct {
	js      jetstream.JetStream
	kv      KV // the attempts bucket, set by Run
	sched   *scheduler
	parking *parking
	lanes   *laneSet
	m       *Metrics
	o       *Options
	clk     clock.Clock
	log     zerolog.Logger
	onFinal func(Final) // test hook: every job's final outcome
	stored  *storedLog  // the log of stored objects (stored.go)
	copies  *copies     // the digests being fetched (copied.go)
	acks    *acks       // how a done job's ack is kept from being lost (acks.go)
	// handedBack counts the deliveries handed back (NAK without delay),
	// for the stop's handed_back.
	handedBack atomic.Int64
}

// ackRetryFor bounds how long a stored job's ack is retried: long enough
// for a replicated consumer to elect a new leader after losing a server.
const ackRetryFor = 30 * time.Second

// handBack returns a held job to the stream for immediate redelivery.
func (s *settler) handBack(j *heldJob) {
	s.handedBack.Add(1)
	s.settle(j, func(m Msg) error { s.handBackMsg(m); return nil })
}

// handBackMsg returns a delivery to the stream for immediate redelivery.
func (s *settler) handBackMsg(m Msg) {
	if err := m.Nak(); err != nil {
		s.log.Warn().Err(err).Msg("nak at shutdown")
	}
}

// settle sends j's final acknowledgement of this delivery (ack, NAK, term)
// with op, after which no in-progress ack is sent for it.
func (s *settler) settle(j *heldJob, op func(Msg) error) error {
	j.ackMu.Lock()
	defer j.ackMu.Unlock()
	j.settled = true
	if s.copies != nil {
		defer s.copies.settled(j) // after the ack: its bytes are stored (copied.go)
	}
	return op(s.sched.msgOf(j))
}

// doneAck acks a job whose work is done (stored, unchanged, handed over,
// moved): confirmed on a replicated jobs stream, else plain and sent again
// if the connection drops (acks.go).
func (s *settler) doneAck(m Msg) error {
	if s.acks == nil || s.acks.confirmed() {
		return s.confirmedAck(m)
	}
	return s.acks.plain(m)
}

// confirmedAck acks m and waits for the server to confirm it, retrying
// while no consumer leader answers (a NATS server lost, a leader election).
// A plain ack sent then is lost silently, and the job, already stored, is
// redelivered after AckWait and costs the origin a second request.
func (s *settler) confirmedAck(m Msg) error {
	deadline := s.clk.Now().Add(ackRetryFor)
	for attempt := 1; ; attempt++ {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		err := m.DoubleAck(ctx)
		cancel()
		if err == nil || errors.Is(err, jetstream.ErrMsgAlreadyAckd) || !s.clk.Now().Before(deadline) {
			return err
		}
		clock.Sleep(s.clk, min(time.Duration(attempt)*100*time.Millisecond, time.Second), nil)
	}
}

// deferJob carries out a deferral's route (decideRoute): a NAK with the
// calendar's delay, a park (and a lane considered), or a hand-back; no
// failure budget is used.
func (s *settler) deferJob(d deferral) {
	r := decideRoute(routeFacts{
		reason: d.reason, delay: d.delay, fromLane: d.job.laned,
		parkOn: s.parking.on(), nakked: s.parking.outstanding(d.job.auth),
		parkAfter: s.o.ParkAfter, parkShare: s.o.ParkShare,
	})
	switch r {
	case routeHandBack:
		s.handBack(d.job)
	case routeParkAndLane:
		s.lanes.consider(d.job.part, d.job.auth, d.job.job.Authority.Key())
		s.parking.park(d)
	case routePark:
		s.parking.park(d)
	case routeNak:
		if d.job.laned {
			s.nakDeferred(d) // it waits in its lane, holding only the lane's slots
			return
		}
		s.parking.nakked(d.job.auth, d.delay)
		s.nakDeferred(d)
		s.log.Debug().Str("job", d.job.job.ID).Str("authority", d.job.auth).Str("reason", string(d.reason)).
			Str("delay", d.delay.String()).Msg("job deferred")
	}
}

// parked carries out a park's outcome (parking reports it): a job stored
// in MIRROR_PARKED is acked and counted as deferred; one whose publish
// failed is deferred by NAK instead.
func (s *settler) parked(d deferral, err error) {
	if err != nil {
		s.nakDeferred(d)
		return
	}
	if err := s.settle(d.job, Msg.Ack); err != nil {
		// Redelivered and parked again, or served: a duplicate at worst.
		s.log.Warn().Err(err).Str("job", d.job.job.ID).Msg("ack parked job")
	}
	s.count(OutcomeDeferred)
}

// nakDeferred NAKs a deferred job with its delay and counts the deferral.
func (s *settler) nakDeferred(d deferral) {
	if err := s.settle(d.job, func(m Msg) error { return m.NakWithDelay(d.delay) }); err != nil {
		s.log.Warn().Err(err).Str("job", d.job.job.ID).Msg("nak deferred job")
	}
	s.count(OutcomeDeferred)
}

// complete acks a job that is stored or unchanged.
func (s *settler) complete(j *heldJob, outcome string) {
	if err := s.settle(j, s.doneAck); err != nil {
		// The job will be redelivered and answered with a 304: no loss.
		s.log.Warn().Err(err).Str("job", j.job.ID).Msg("ack")
	}
	if s.sched.deliveries(j) > 1 && s.kv != nil {
		// Only a redelivered job can have a failure counter.
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		if err := s.kv.Delete(ctx, attemptsKey(s.runOf(j), j.job.ID)); err != nil && !errors.Is(err, jetstream.ErrKeyNotFound) {
			s.log.Debug().Err(err).Str("job", j.job.ID).Msg("clear attempts")
		}
		cancel()
	}
	s.final(j, outcome, "")
}

// runOf is the replay run j is done for: a replay copy's (a pod's replay
// job), else the worker's own (Options.Replay: a replay pacing its own
// requests), else "" (a live job). Its failed attempts are counted under it.
func (s *settler) runOf(j *heldJob) string {
	if r := j.replay.runName(); r != "" {
		return r
	}
	return s.o.Replay
}

// count records one outcome of a job (mirrorworker_jobs_total and
// Options.OnOutcome).
func (s *settler) count(outcome string) {
	s.m.Jobs.WithLabelValues(outcome).Inc()
	if s.o.OnOutcome != nil {
		s.o.OnOutcome(outcome)
	}
}

func (s *settler) final(j *heldJob, outcome, reason string) {
	s.count(outcome)
	s.replayDone(j, outcome, reason)
	s.m.JobDuration.WithLabelValues(outcome).Observe(s.clk.Now().Sub(j.received).Seconds())
	d := s.sched.deliveries(j)
	s.m.DeliveriesPerJob.Observe(float64(d))
	if s.onFinal != nil {
		s.onFinal(Final{JobID: j.job.ID, Authority: j.auth, Outcome: outcome, Reason: reason, Deliveries: d})
	}
}

// transient records a failed attempt against the job's budget and retries
// it with backoff, or dead-letters it when the budget is spent. A content
// mismatch (reason size_mismatch or digest_mismatch: the origin answered
// with other bytes than the job expects) is such a failure too, and the
// MaxContentMismatches-th one dead-letters the job content_mismatch.
func (s *settler) transient(ctx context.Context, j *heldJob, reason string, status int, detail string) {
	s.retry(ctx, j, reason, status, detail, 0)
}

// retry is transient with a least retry delay (within BackoffMax).
func (s *settler) retry(ctx context.Context, j *heldJob, reason string, status int, detail string, least time.Duration) {
	kctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	a := jobs.Attempt{Time: s.clk.Now().UTC(), Reason: reason, Status: status, Detail: jobs.Truncate(detail, 512)}
	rec, err := addAttempt(kctx, s.kv, s.runOf(j), j.job.ID, a)
	if err != nil {
		// Without the counter the budget cannot be judged: retry later and
		// count again then. The job is not lost.
		s.log.Warn().Err(err).Str("job", j.job.ID).Msg("record failed attempt")
		rec = attemptRecord{Count: 1, Attempts: []jobs.Attempt{a}}
	}
	if mismatchReasons[reason] {
		n := 0
		for _, a := range rec.Attempts {
			if mismatchReasons[a.Reason] {
				n++
			}
		}
		if n >= MaxContentMismatches {
			s.deadLetter(ctx, j, jobs.ReasonContentMismatch,
				fmt.Sprintf("%d answers with other bytes than the job expects, last: %s", n, detail), status, rec.Attempts)
			return
		}
	}
	if reason == jobs.ReasonAuthFailed && countReason(rec.Attempts, reason) >= s.o.Auth.Attempts {
		s.deadLetter(ctx, j, reason, detail, status, rec.Attempts) // authfail.go
		return
	}
	if rec.Count >= s.o.FailureBudget {
		s.deadLetter(ctx, j, jobs.ReasonBudgetExhausted,
			fmt.Sprintf("%d failed attempts, last %s: %s", rec.Count, reason, detail), status, rec.Attempts)
		return
	}
	delay := max(s.backoff(rec.Count), min(least, s.o.BackoffMax))
	if err := s.settle(j, func(m Msg) error { return m.NakWithDelay(delay) }); err != nil {
		s.log.Warn().Err(err).Str("job", j.job.ID).Msg("nak failed job")
	}
	s.count(OutcomeRetried)
	ev := s.log.Info().Str("job", j.job.ID).Str("url", logURL(j.job.URL)).Str("authority", j.auth).Str("reason", reason)
	if status != 0 {
		ev = ev.Int("status", status)
	}
	if detail != "" {
		ev = ev.Str("error", detail)
	}
	ev.Int("attempt", rec.Count).Int("failure_budget", s.o.FailureBudget).Str("retry_in", delay.Round(time.Millisecond).String()).
		Msg("job failed, retrying")
}

// deadLetter publishes the job's dead-letter record and terminates it. If
// the record cannot be published the job is retried later instead: it never
// leaves without its record.
func (s *settler) deadLetter(ctx context.Context, j *heldJob, reason, detail string, status int, attempts []jobs.Attempt) {
	now := s.clk.Now().UTC()
	m := s.sched.msgOf(j)
	dl := jobs.DeadLetter{
		JobID:      j.job.ID,
		Tenant:     j.job.Tenant,
		Authority:  j.auth,
		Subject:    m.Subject(),
		StreamSeq:  j.seq,
		Reason:     reason,
		Detail:     jobs.Truncate(detail, 1024),
		LastStatus: status,
		Attempts:   append(append([]jobs.Attempt(nil), attempts...), j.throttles...),
		First:      j.received.UTC(),
		Last:       now,
		Worker:     s.o.WorkerID,
		Replay:     j.replay.runName(),
	}
	if len(attempts) > 0 && attempts[0].Time.Before(dl.First) {
		dl.First = attempts[0].Time
	}
	dl.SetJob(j.data)
	pctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	if _, err := jobs.PublishDeadLetter(pctx, s.js, dl); err != nil {
		s.log.Error().Err(err).Str("job", j.job.ID).Str("reason", reason).Msg("publish dead letter; will retry the job")
		if err := s.settle(j, func(m Msg) error { return m.NakWithDelay(s.backoff(1)) }); err != nil {
			s.log.Warn().Err(err).Msg("nak")
		}
		return
	}
	if err := s.settle(j, func(m Msg) error { return m.TermWithReason(reason) }); err != nil {
		s.log.Warn().Err(err).Str("job", j.job.ID).Msg("term")
	}
	if len(attempts) > 0 && s.kv != nil {
		if err := s.kv.Delete(pctx, attemptsKey(s.runOf(j), j.job.ID)); err != nil {
			s.log.Debug().Err(err).Str("job", j.job.ID).Msg("clear attempts")
		}
	}
	s.m.DeadLetters.WithLabelValues(reason).Inc()
	ev := s.log.Warn().Str("job", j.job.ID).Str("authority", j.auth).Str("reason", reason).Int("status", status)
	if j.job.URL != "" {
		ev = ev.Str("url", logURL(j.job.URL))
	}
	if detail != "" {
		ev = ev.Str("error", jobs.Truncate(detail, 1024))
	}
	ev.Msg("job dead-lettered")
	s.final(j, OutcomeDeadLettered, reason)
}

// Final describes a job leaving the worker for good in one delivery.
type Final struct {
	JobID      string
	Authority  string
	Outcome    string // stored, unchanged, dead_lettered
	Reason     string // the dead-letter reason
	Deliveries uint64
}

// MaxContentMismatches is how many answers with other bytes than the job's
// size or sha256 a job takes before it is dead-lettered content_mismatch:
// one retry, in case the origin changed the object in between
// (docs/contract.md section 5).
const MaxContentMismatches = 2

// mismatchReasons are the attempt reasons that count as content mismatches.
var mismatchReasons = map[string]bool{jobs.ReasonSizeMismatch: true, jobs.ReasonDigestMismatch: true}

// backoff returns the retry delay after the n-th failed attempt:
// exponential from BackoffInitial, capped at BackoffMax, ±50% jitter.
func (s *settler) backoff(n int) time.Duration {
	b := backoff.NewExponentialBackOff(
		backoff.WithInitialInterval(s.o.BackoffInitial),
		backoff.WithMaxInterval(s.o.BackoffMax),
		backoff.WithMultiplier(2),
		backoff.WithRandomizationFactor(0.5),
		backoff.WithMaxElapsedTime(0),
	)
	d := b.NextBackOff()
	for i := 1; i < n; i++ {
		d = b.NextBackOff()
	}
	return d
}

// logURL returns rawURL fit for a log line (docs/contract.md, logging): without
// credentials, query string or fragment.
func logURL(rawURL string) string {
	u, err := url.Parse(rawURL)
	if err != nil {
		return ""
	}
	u.User, u.RawQuery, u.ForceQuery, u.Fragment, u.RawFragment = nil, "", false, "", ""
	return u.String()
}

// replayDone reports a replay job's end to its replay, on the run's core
// NATS subject. A continuation's end, and a moved job's, is reported by
// the pod that finishes it.
func (s *settler) replayDone(j *heldJob, outcome, reason string) {
	if j.replay == nil || outcome == OutcomeHandedOff || outcome == OutcomeMoved || s.js == nil {
		return
	}
	nc := s.js.Conn()
	if nc == nil {
		return
	}
	b, _ := json.Marshal(jobs.ReplayDone{Of: j.replay.of, JobID: j.job.ID, Authority: j.auth,
		Outcome: outcome, Reason: reason, Pod: s.o.WorkerID})
	if err := nc.Publish(jobs.ReplayDoneSubject(j.replay.run), b); err != nil {
		// The replay's message comes back after its AckWait and is asked
		// again, answered from what is stored.
		s.log.Debug().Err(err).Str("job", j.job.ID).Msg("report a replay job's end")
	}
}
