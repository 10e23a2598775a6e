package worker

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/mirrorworker/mirrorworker/authority"
	"github.com/mirrorworker/mirrorworker/fetch"
	"github.com/mirrorworker/mirrorworker/jobs"
)

// A redirect to an authority of a partition another pod serves is not
// followed here (and neither is one its authority cannot take soon, see
// continuesRefused): this pod's pacer for that authority is not the one the
// origin's other requests go through, so the two pods together could
// break its floor or its in-flight cap. The job is handed over instead: a
// continuation, the same job with the hop's URL, goes to the hop
// authority's partition, where its owner fetches it paced with everything
// else it sends there, and the job here is acked once the continuation is
// stored. A crash in between redelivers the job, and the continuation's
// message id makes its second copy a duplicate the stream drops.

// continuesRefused reports whether a redirect hop that its authority's
// pacer refuses (a cooldown, a long spacing wait, the in-flight cap past
// HoldMax) goes on as a continuation in that authority's queue rather than
// deferring the whole job, which would ask the first hop again. Only with
// partitions, where the continuation has a partition to wait in, and not
// in a replay, which skips continuations.
func (h *handoffs) continuesRefused() bool {
	return h.partitions > 0 && !h.skipCopies
}

// handoffs publishes the continuations of redirects.
type handoffs struct {
	js         jetstream.JetStream
	partitions int  // Options.Partitions
	skipCopies bool // Options.SkipCopies: a replay
	log        zerolog.Logger
	sched      *scheduler
	settler    *settler
}

// handOff publishes j's continuation at the hop ge and acks j. why is for
// the log: other_pod, or the pacer's reason for refusing the hop.
func (h *handoffs) handOff(ctx context.Context, j *heldJob, ge *fetch.GateError, why string) {
	cj := j.job
	cj.URL = ge.URL
	m, nj, err := jobs.NewMsg(cj)
	if err != nil {
		// A redirect to a URL no job may hold (too long, say).
		err = fmt.Errorf("redirect to %s: %v: %w", ge.Authority, err, fetch.ErrInvalidURL)
		h.settler.deadLetter(ctx, j, fetch.ReasonCode(err, 0), err.Error(), 0, nil)
		return
	}
	akey := nj.Authority.Key()
	m.Subject = jobs.PartitionedSubject(h.sched.partitionOf(nj.Authority.String()), nj.Tenant, akey)
	// One id per delivered job and hop: a redelivery hands over again, and
	// the stream drops that copy within its duplicate window.
	m.Header.Set(jetstream.MsgIDHeader, nj.ID+"~"+strconv.FormatUint(j.seq, 10)+"~"+strconv.Itoa(ge.Hop))
	m.Header.Set(jobs.HeaderContinues, authority.StripUserinfo(cmp.Or(j.origin, j.job.URL)))
	m.Header.Set(jobs.HeaderHops, strconv.Itoa(ge.Hop))
	m.Header.Set(jobs.HeaderDeliveries, strconv.FormatUint(h.sched.deliveries(j), 10))
	jobs.SetEnqueued(m.Header, enqueuedOf(h.sched.msgOf(j)))
	j.replay.copyTo(m.Header)
	pctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	_, err = h.js.PublishMsg(pctx, m)
	cancel()
	if err != nil {
		h.log.Warn().Err(err).Str("job", j.job.ID).Str("authority", ge.Authority.String()).Msg("publish a redirect's continuation; the job comes back")
		h.settler.deferJob(deferral{job: j, delay: 2 * time.Second, reason: reasonHandoff})
		return
	}
	if err := h.settler.settle(j, h.settler.doneAck); err != nil {
		// The job comes back and is handed over again: a duplicate the
		// stream drops.
		h.log.Warn().Err(err).Str("job", j.job.ID).Msg("ack a handed-over job")
	}
	h.log.Debug().Str("job", j.job.ID).Str("authority", ge.Authority.String()).Int("hop", ge.Hop).Str("reason", why).Msg("redirect continued in its authority's queue")
	h.settler.final(j, OutcomeHandedOff, "")
}

// move publishes a copy of j, delivered in partition from, into the
// partition of its pace (j.part: its politeness group's, or its own
// authority's), and acks j once the copy is stored. The copy keeps every
// header (a parked job, a continuation, a replay job stay what they are)
// and is marked moved, which replay skips; its message id makes a
// redelivery's second copy a duplicate the stream drops. A failed publish
// defers j, which is moved when it comes back.
func (h *handoffs) move(ctx context.Context, j *heldJob, m Msg, from int) {
	cp := nats.NewMsg(jobs.PartitionedSubject(j.part, j.job.Tenant, j.job.Authority.Key()))
	cp.Data = m.Data()
	for k, v := range m.Headers() {
		cp.Header[k] = slices.Clone(v)
	}
	if cp.Header.Get(jobs.HeaderUnparked) == "" {
		cp.Header.Set(jobs.HeaderUnparked, "moved")
	}
	jobs.SetEnqueued(cp.Header, enqueuedOf(m))
	cp.Header.Set(jobs.HeaderDeliveries, strconv.FormatUint(j.prior+j.delivered, 10))
	cp.Header.Set(jetstream.MsgIDHeader, "move:"+strconv.FormatUint(j.seq, 10)+":"+strconv.Itoa(j.part))
	pctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	_, err := h.js.PublishMsg(pctx, cp)
	cancel()
	if err != nil {
		h.log.Warn().Err(err).Str("job", j.job.ID).Str("authority", j.auth).Int("partition", j.part).
			Msg("move a job into its pace's partition; it comes back")
		h.settler.deferJob(deferral{job: j, delay: 2 * time.Second, reason: reasonHandoff})
		return
	}
	if err := h.settler.settle(j, h.settler.doneAck); err != nil {
		h.log.Warn().Err(err).Str("job", j.job.ID).Msg("ack a moved job (its copy is a duplicate the stream drops)")
	}
	h.log.Debug().Str("job", j.job.ID).Str("authority", j.auth).Int("from", from).Int("to", j.part).
		Msg("job moved into its pace's partition")
	h.settler.final(j, OutcomeMoved, "")
}
