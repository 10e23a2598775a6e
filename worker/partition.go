package worker

import (
	"context"
	"errors"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/mirrorworker/mirrorworker/clock"
	"github.com/mirrorworker/mirrorworker/jobs"
)

// DefaultParkAfter, DefaultParkShare and DefaultLaneBacklog are the defaults
// of Options.ParkAfter, Options.ParkShare and Options.LaneBacklog
// (docs/adr/0007).
const (
	DefaultParkAfter   = 10 * time.Second
	DefaultParkShare   = 1000
	DefaultLaneBacklog = 2000
)

// partition is one partition of MIRROR_JOBS this worker serves.
type partition struct {
	ictx        context.Context    // its intake's context
	stop        context.CancelFunc // ends its intake
	done        chan struct{}      // closed when its intake has returned
	fctx        context.Context    // its fetches' context
	cancelFetch context.CancelFunc
}

// AddPartition starts serving partition p from consumer c (partitioned
// mode). since is when this worker took the partition over: the first
// request to each of its authorities is spaced from it by the interval in
// force, so that no origin sees this pod's first request closer to the
// previous owner's last one than the pacer allows. Run must be running.
func (w *Worker) AddPartition(p int, c jetstream.Consumer, since time.Time) error {
	w.pmu.Lock()
	defer w.pmu.Unlock()
	if w.runCtx == nil || w.runCtx.Err() != nil {
		return errors.New("worker: not running")
	}
	if _, ok := w.parts[p]; ok {
		return nil
	}
	w.sched.takeOver(p, since)
	ictx, stop := context.WithCancel(w.runCtx)
	fctx, cancelFetch := context.WithCancel(w.fetchCt)
	pt := &partition{ictx: ictx, stop: stop, done: make(chan struct{}), fctx: fctx, cancelFetch: cancelFetch}
	w.parts[p] = pt
	w.intakes.Add(1)
	go func() {
		defer w.intakes.Done()
		defer close(pt.done)
		if p == 0 && w.d.Legacy != nil {
			go w.moveLegacy(ictx, w.d.Legacy)
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
	w.pmu.Lock()
	pt := w.parts[p]
	delete(w.parts, p)
	w.pmu.Unlock()
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

// owns reports whether requests of partition p may start.
func (w *Worker) owns(p int) bool {
	return w.d.Owns == nil || w.d.Owns(p)
}

// fetchContext returns the context for a fetch of partition p: the worker's
// own, or the partition's when it is served (so giving p up can cancel it).
func (w *Worker) fetchContext(fctx context.Context, p int) context.Context {
	if w.o.Partitions <= 0 {
		return fctx
	}
	w.pmu.Lock()
	defer w.pmu.Unlock()
	if pt := w.parts[p]; pt != nil {
		return pt.fctx
	}
	return fctx
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

// runCtxOr returns the context Run was given, or a background one before
// Run.
func (w *Worker) runCtxOr() context.Context {
	w.pmu.Lock()
	defer w.pmu.Unlock()
	if w.runCtx != nil {
		return w.runCtx
	}
	return context.Background()
}

// Parked returns how many jobs each authority of the partitions this worker
// serves has parked (a hint kept in memory, see parkedAuth.n).
func (w *Worker) Parked() map[string]int64 {
	out := w.parking.counts()
	if out == nil {
		out = map[string]int64{}
	}
	w.lanes.counts(out)
	return out
}

// fault calls the test fault hook at a named point, if one is set.
func (w *Worker) fault(point string) {
	if w.o.FaultHook != nil {
		w.o.FaultHook(point)
	}
}

// served returns the partitions this worker serves now.
func (w *Worker) served() []int {
	w.pmu.Lock()
	defer w.pmu.Unlock()
	parts := make([]int, 0, len(w.parts))
	for part := range w.parts {
		parts = append(parts, part)
	}
	return parts
}
