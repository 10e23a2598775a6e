package worker

import (
	"context"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/mirrorworker/mirrorworker/clock"
	"github.com/mirrorworker/mirrorworker/jobs"
)

// AddPartition starts serving partition p from consumer c (partitioned
// mode). since is when this worker took the partition over: the first
// request to each of its authorities is spaced from it by the interval in
// force, so that no origin sees this pod's first request closer to the
// previous owner's last one than the pacer allows. Run must be running.
func (w *Worker) AddPartition(p int, c jetstream.Consumer, since time.Time) error {
	pt, err := w.parts.add(p)
	if pt == nil {
		return err // not running, or p served already
	}
	w.sched.takeOver(p, since)
	ictx := pt.ictx
	w.intakes.Add(1)
	go func() {
		defer w.intakes.Done()
		defer close(pt.done)
		if p == 0 && w.d.Legacy != nil {
			// Owned by partition 0's intake: its copies are published and
			// acked before the partition counts as stopped.
			legacyDone := make(chan struct{})
			go func() { defer close(legacyDone); w.moveLegacy(ictx, w.d.Legacy) }()
			defer func() { <-legacyDone }()
		}
		w.lanes.partitionAdded(ictx, p) // before the first pull: lanes' jobs are acked unread
		w.intakeLoop(ictx, c, p)
	}()
	w.parking.partitionAdded(p)
	w.m.Partitions.Inc()
	return nil
}

// RemovePartition stops serving partition p: it stops pulling p, hands its
// queued jobs back for immediate redelivery, and waits until no request of
// p is in flight. When ctx ends first, p's fetches are cancelled (and their
// jobs handed back). The caller (the lease manager) has already stopped new
// requests of p from starting: Deps.Owns(p) is false.
func (w *Worker) RemovePartition(ctx context.Context, p int) {
	pt := w.parts.remove(p)
	if pt == nil {
		return
	}
	w.m.Partitions.Dec()
	pt.stop()
	<-pt.done
	w.lanes.partitionRemoved(p)
	for _, j := range w.sched.drainPartition(p) {
		w.settler.handBack(j)
	}
	w.parking.partitionRemoved(p)
	w.poke()
	for w.sched.busyIn(p) > 0 {
		if !clock.Sleep(w.clk, 10*time.Millisecond, ctx.Done()) {
			pt.cancelFetch()
			for w.sched.busyIn(p) > 0 {
				clock.Sleep(w.clk, 10*time.Millisecond, nil)
			}
			break
		}
	}
	pt.cancelFetch()
	// Jobs requeued by a throttled answer while we waited.
	for _, j := range w.sched.drainPartition(p) {
		w.settler.handBack(j)
	}
}

// moveLegacy moves the jobs an earlier version stored without a partition
// token (and that its consumer had not acked) into their partitions, as
// copies marked "moved" that replay skips, acking each original once its
// copy is stored. It runs while this worker serves partition 0, and stops
// once the legacy consumer has nothing left.
func (w *Worker) moveLegacy(ctx context.Context, c jetstream.Consumer) {
	moved := 0
	for ctx.Err() == nil {
		batch, err := c.Fetch(256, jetstream.FetchMaxWait(w.o.PullWait))
		if err != nil {
			if !clock.Sleep(w.clk, time.Second, ctx.Done()) {
				return
			}
			continue
		}
		n := 0
		for m := range batch.Messages() {
			n++
			tenant, akey, err := jobs.ParseSubject(m.Subject())
			if err != nil {
				tenant, akey = jobs.InvalidToken, jobs.InvalidToken // dead-lettered as invalid where it lands
			}
			cp := nats.NewMsg(jobs.PartitionedSubject(jobs.Partition(akey, w.o.Partitions), tenant, akey))
			cp.Data = m.Data()
			cp.Header.Set(jobs.HeaderUnparked, "moved")
			if md, err := m.Metadata(); err == nil {
				cp.Header.Set(jobs.HeaderDeliveries, strconv.FormatUint(md.NumDelivered, 10))
				jobs.SetEnqueued(cp.Header, md.Timestamp)
			}
			pctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
			_, err = w.d.JS.PublishMsg(pctx, cp)
			cancel()
			if err != nil {
				w.log.Warn().Err(err).Str("subject", m.Subject()).Msg("move an unpartitioned job; it comes back after its ack wait")
				continue
			}
			if err := m.Ack(); err != nil {
				w.log.Debug().Err(err).Msg("ack moved job (a duplicate at worst)")
			}
			moved++
		}
		if n > 0 {
			continue
		}
		ictx, cancel := context.WithTimeout(ctx, 5*time.Second)
		info, err := c.Info(ictx)
		cancel()
		if err == nil && info.NumPending == 0 && info.NumAckPending == 0 {
			if moved > 0 {
				w.log.Info().Int("jobs", moved).Msg("moved the jobs stored without a partition into their partitions")
			}
			return
		}
	}
}

// Parked returns how many jobs each authority of the partitions this worker
// serves has parked (a hint kept in memory, see parkedAuth.n).
func (w *Worker) Parked() map[string]int64 {
	out := w.parking.parkedCounts()
	if out == nil {
		out = map[string]int64{}
	}
	w.lanes.addCounts(out)
	return out
}

// GrantOwns reports whether this worker serves auth's partition now (with
// the shared consumer: always), so that its pacer may grant a start to
// another program (grant.Server, issue 37), and returns the partition. An
// owned partition taken over from another pod fences auth first, as the
// worker's own first request is fenced: a granted start is spaced from the
// previous owner's last start (its own and its grants') like this pod's.
func (w *Worker) GrantOwns(now time.Time, auth string) (int, bool) {
	s := w.sched
	p := s.partitionOf(auth)
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.ownsLocked(p) {
		return p, false
	}
	if s.o.partitions > 0 && !s.takeOvers.Has(p) {
		return p, false // leased, not yet served (its fence is not known yet)
	}
	s.takeOvers.Fence(now, p, auth)
	return p, true
}

// PartitionOf returns the partition auth's jobs (and grants) are served in
// under the policy in force (0 with the shared consumer).
func (w *Worker) PartitionOf(auth string) int { return w.sched.partitionOf(auth) }

// GrantLiveFirst returns how long a grant for auth must wait so that live
// jobs go first (0: it may go now): while live jobs of auth wait here, a
// grant goes only after LiveFirstRun of them have started since the last
// grant, as a replay job does (docs/adr/0025), so grants take at most one
// start in LiveFirstRun+1. The wait is the spacing in force (at least
// 50 ms): ask again after the next start.
func (w *Worker) GrantLiveFirst(now time.Time, auth string) time.Duration {
	s := w.sched
	s.mu.Lock()
	defer s.mu.Unlock()
	a := s.auths[auth]
	if a == nil {
		return 0
	}
	if a.n-len(a.bg.q.jobs) > 0 && a.liveSinceGrant < LiveFirstRun {
		_, spacing, _ := s.pacer.ReadyIn(now, auth)
		return max(spacing, 50*time.Millisecond)
	}
	a.liveSinceGrant = 0
	return 0
}
