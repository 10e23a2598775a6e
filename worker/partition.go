package worker

import (
	"context"
	"errors"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/mirrorworker/mirrorworker/clock"
)

// DefaultParkAfter and DefaultParkShare are the defaults of Options.ParkAfter
// and Options.ParkShare (docs/adr/0007).
const (
	DefaultParkAfter = 10 * time.Second
	DefaultParkShare = 1000
)

// partition is one partition of MIRROR_WORK this worker serves.
type partition struct {
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
	pt := &partition{stop: stop, done: make(chan struct{}), fctx: fctx, cancelFetch: cancelFetch}
	w.parts[p] = pt
	w.intakes.Add(1)
	go func() {
		defer w.intakes.Done()
		defer close(pt.done)
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
	for _, j := range w.sched.drainPartition(p) {
		w.handBack(j)
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
		w.handBack(j)
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
