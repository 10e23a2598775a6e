// Package worker is mirrorworker's consume loop and scheduler: it pulls jobs
// from the durable JetStream consumer, holds them in per-authority queues,
// hands them to a fixed number of fetch slots in the order the pacer can
// serve them (round robin between authorities, and between tenants within
// one), stores what it fetched, and acks, retries, defers or dead-letters
// each job (docs/contract.md section 5; docs/adr/0001 for the deferral design).
//
// It defines the small interfaces it needs (Fetcher, Target, Pacer, Msg)
// and knows nothing of the concrete fetch, mirror and pacer types. It does
// not parse flags, serve HTTP or create streams.
package worker

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptrace"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/mirrorworker/mirrorworker/authority"
	"github.com/mirrorworker/mirrorworker/clock"
	"github.com/mirrorworker/mirrorworker/fetch"
	"github.com/mirrorworker/mirrorworker/jobs"
	"github.com/mirrorworker/mirrorworker/lifecycle"
	"github.com/mirrorworker/mirrorworker/mirror"
	"github.com/mirrorworker/mirrorworker/pacer"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
)

// confirm waits until pm may start, confirming it just before the request
// (pacer.Wait owns that loop): it returns the permit to run the request
// with, or, the permit given back, the refusal or ctx's error.
func (w *Worker) confirm(ctx context.Context, pm pacer.Permit) (pacer.Permit, error) {
	return pacer.Wait(ctx, w.clk, w.d.Pacer, pm)
}

// Worker consumes jobs. Create it with New and call Run once. Ready is safe
// for concurrent use.
type Worker struct {
	d     Deps
	o     Options
	log   zerolog.Logger
	clk   clock.Clock
	m     *Metrics
	sched *scheduler

	hops     hopDeps      // what every fetch's hops are admitted with (hops.go)
	handoffs *handoffs    // redirect continuations (handoff.go)
	health   targetHealth // whether the mirror target takes writes (targethealth.go)
	auth     authGuard    // 401/403 per authority (authfail.go)
	classes  classCounts  // requests started in the last minute, by class (classcount.go)
	// transfers are the fetches in flight, with their bytes so far
	// (transfers.go).
	transfers transfers
	copies    copies // jobs stored by a copy within the target (copied.go)

	kick  chan struct{} // wakes the dispatcher
	space chan struct{} // wakes the intake when held jobs drop
	slots sync.WaitGroup

	state   atomic.Int32  // a runState
	started chan struct{} // closed when the worker first pulls (Pulling)
	pullOne sync.Once
	anon    atomic.Uint64

	// Partitioned mode: the partitions being served, and the intakes of
	// their consumers (Run waits for them).
	parts   *servedParts
	intakes sync.WaitGroup
	// pulling is the room reserved by pulls in progress, so that several
	// partitions' intakes together stay within MaxHeld.
	pulling atomic.Int64
	// lowWater is the least room an intake pulls into (it waits in
	// awaitRoom below it); it only ever falls, as partitions are added.
	// wakeIntake reads it to wake no intake that would wait again.
	lowWater atomic.Int64
	parking  *parking
	lanes    *laneSet
	settler  *settler

	deletes *deletes // delete jobs, and the order of a key's stores and deletes (delete.go)
}

// checkDeps reports the first dependency that d lacks for o, or an option
// no Worker can run with, before any part is built.
func checkDeps(d Deps, o *Options) error {
	switch {
	case d.JS == nil:
		return errors.New("worker: Deps.JS is nil")
	case d.Consumer == nil && (o == nil || o.Partitions <= 0):
		return errors.New("worker: Deps.Consumer is nil")
	case o != nil && o.Partitions > 0 && d.Owns == nil:
		return errors.New("worker: Deps.Owns is nil in partitioned mode")
	case d.Fetcher == nil:
		return errors.New("worker: Deps.Fetcher is nil")
	case d.Target == nil:
		return errors.New("worker: Deps.Target is nil")
	case d.Pacer == nil:
		return errors.New("worker: Deps.Pacer is nil")
	case o != nil && o.Replay != "" && !jobs.ValidReplayRun(o.Replay):
		return fmt.Errorf("worker: Options.Replay %q is not a run name", o.Replay)
	}
	return nil
}

// New checks d and returns a Worker; nil o means the defaults.
func New(d Deps, o *Options) (*Worker, error) {
	if err := checkDeps(d, o); err != nil {
		return nil, err
	}
	r := o.withDefaults()
	m := r.Metrics
	if m == nil {
		var err error
		if m, err = NewMetrics(r.Registerer, r.HostLabelLimit); err != nil {
			return nil, fmt.Errorf("worker: %w", err)
		}
	}
	w := &Worker{
		d: d, o: r, log: r.Logger, clk: r.Clock, m: m,
		kick:    make(chan struct{}, 1),
		space:   make(chan struct{}, 1),
		started: make(chan struct{}),
	}
	// Pull in batches: when memory is full, an intake waits until a fair
	// share of it is free rather than pulling one message per round trip.
	w.lowWater.Store(int64(max(1, min(r.PullBatch, r.MaxHeld/8))))
	w.sched = newScheduler(d.Pacer, schedOptions{
		slots:   r.Concurrency,
		holdMax: r.HoldMax,
		// A wait within ParkAfter would be a NAK (a delivery more for
		// nothing); a longer one parks anyway.
		overHorizon: max(r.HoldMax, r.ParkAfter),
		reserve:     min(r.HoldMax, 5*time.Millisecond),
		maxHeld:     r.MaxHeld,
		maxPerAuth:  r.MaxHeldPerAuthority,
		spread:      r.DeferSpread,
		partitions:  r.Partitions,
		owns:        d.Owns,
	})
	w.sched.onCounts = m.setHeld
	w.parts = newServedParts(r.Partitions > 0, d.Owns)
	w.lanes = newLanes(laneDeps{
		js: d.JS, clk: w.clk, log: w.log, m: m, sched: w.sched, parts: w.parts,
		readyIn: d.Pacer.ReadyIn, fault: r.FaultHook,
		backlog: r.LaneBacklog, holdMax: r.HoldMax, maxPerAuth: r.MaxHeldPerAuthority,
		deliver: w.intake, pull: w.intakeLoop, loops: &w.intakes,
	})
	w.settler = &settler{js: d.JS, sched: w.sched, lanes: w.lanes, m: m, o: &w.o,
		clk: w.clk, log: w.log,
		stored: &storedLog{log: w.log, clk: w.clk, every: storedSummaryEvery}, copies: &w.copies,
		acks: newAcks(d.JS, w.clk, w.log, r.AckBatch)}
	w.parking = newParking(parkDeps{
		js: d.JS, clk: w.clk, log: w.log, m: m, sched: w.sched, lanes: w.lanes,
		readyIn: d.Pacer.ReadyIn, parts: w.parts, fault: r.FaultHook,
		holdMax: r.HoldMax, maxPerAuth: r.MaxHeldPerAuthority,
		parked: w.settler.parked,
	})
	w.settler.parking = w.parking
	w.hops = hopDeps{pacer: d.Pacer, clk: w.clk, m: m, sched: w.sched, auth: &w.auth,
		partitions: r.Partitions, holdMax: r.HoldMax, wake: w.poke}
	w.handoffs = &handoffs{js: d.JS, partitions: r.Partitions, skipCopies: r.SkipCopies, log: w.log, sched: w.sched, settler: w.settler}
	w.health.d = healthDeps{target: d.Target, pacer: d.Pacer, clk: w.clk, log: w.log, m: m, settler: w.settler,
		probeFirst: r.TargetProbeInitial, probeMax: r.TargetProbeMax, resume: w.wakeIntake}
	w.deletes = &deletes{clk: w.clk, log: w.log, m: m, sched: w.sched, settler: w.settler, health: &w.health,
		slots: &w.slots, target: w.targetOf, inProgress: w.inProgress, ackWait: r.AckWait}
	w.deletes.limit.max = max(r.MaxDeletesPerMinute, 0)
	w.auth.d = authDeps{rule: r.Auth, pacer: d.Pacer, clk: w.clk, log: w.log, settler: w.settler}
	return w, nil
}

// CredentialsChanged is told the authorities whose credential changed
// (credentials.Store.OnChange): their failures are forgotten and a hold
// the worker took on them ends now, so that the new credential is tried
// at once. An operator's pause is left alone.
func (w *Worker) CredentialsChanged(changed func(authority.Authority) bool) {
	w.auth.credentialsChanged(changed)
	w.poke()
}

// Metrics returns the worker's metrics.
func (w *Worker) Metrics() *Metrics { return w.m }

// Pulling is closed once the worker is bound to its consumers and pulls
// (in partitioned mode: ready to serve the partitions it is given), so that
// a part which must wait for it (the lease manager) need not poll Ready.
func (w *Worker) Pulling() <-chan struct{} { return w.started }

func (w *Worker) setPulling() {
	w.state.Store(int32(statePulling))
	w.pullOne.Do(func() { close(w.started) })
}

// runState is where a Worker is in its life (Worker.state).
type runState int32

const (
	stateNew      runState = iota // made by New, Run not called
	stateStarting                 // Run called, not pulling yet (or the consumer cannot be pulled)
	statePulling                  // bound to its consumers and pulling: Ready
	stateStopped                  // Run returned
)

// Ready reports nil once the worker is bound to the consumer and pulling,
// and the cause while the mirror target fails (it pulls nothing then).
func (w *Worker) Ready() error {
	switch runState(w.state.Load()) {
	case statePulling:
		return w.health.err(w.clk.Now())
	case stateStopped:
		return errors.New("worker: stopped")
	}
	return errors.New("worker: not pulling yet")
}

func (w *Worker) poke() {
	select {
	case w.kick <- struct{}{}:
	default:
	}
	w.wakeIntake()
}

// wakeIntake tells the intake that held jobs may have dropped below its
// low water mark. Every path that takes jobs out of memory outside the
// intake itself must call it (directly or through poke): the intake waits
// for it when memory is full, and a deferral with no fetch in flight is
// the only event that frees memory then.
//
// It wakes no intake while the room is below the low water mark: the
// intake would look and wait again (in the throughput benchmark that was
// 2.9 wake-ups, timers and scheduler reads a job, ADR 0036's tenth
// pass). No wake-up is lost by it: the room is read after the change that
// freed it, and a wake-up sent while an intake is between its look and
// its wait stays in the channel.
func (w *Worker) wakeIntake() {
	if w.room() < int(w.lowWater.Load()) {
		return
	}
	select {
	case w.space <- struct{}{}:
	default:
	}
}

// Run consumes until ctx is cancelled, then stops pulling, lets in-flight
// fetches finish within ShutdownGrace (then cancels them), hands every held
// job back with a NAK without delay, and returns nil. It returns an error
// only when it cannot start; stopped while starting (ctx cancelled), it
// returns nil too.
func (w *Worker) Run(ctx context.Context) error {
	if !w.state.CompareAndSwap(int32(stateNew), int32(stateStarting)) {
		return errors.New("worker: Run called twice")
	}
	defer w.state.Store(int32(stateStopped))
	if err := w.open(ctx); err != nil {
		if ctx.Err() != nil && errors.Is(err, context.Canceled) {
			return nil // the stop asked for, not a failure
		}
		return err
	}
	// Fetches outlive ctx by the grace period: the drain cuts them (at the
	// grace's end or a second signal), and no later.
	fctx, cancelFetch := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelFetch()
	if w.o.Partitions > 0 {
		w.parts.begin(ctx, fctx)
		w.setPulling() // ready: partitions come and go with the leases
	}
	var handedBefore int64
	_ = w.actors(fctx, cancelFetch, &handedBefore).Run(ctx) // every part returns nil
	w.flushAcks()
	w.log.Info().Int64("handed_back", w.settler.handedBack.Load()-handedBefore).Msg("worker stopped")
	return nil
}

// open gets what Run needs before any of its parts starts: the attempts
// bucket and, partitioned, the parking lot's and the lanes' streams.
func (w *Worker) open(ctx context.Context) error {
	kv, err := w.d.JS.KeyValue(ctx, jobs.AttemptsBucket)
	if err != nil {
		return fmt.Errorf("worker: bucket %s: %w", jobs.AttemptsBucket, err)
	}
	w.settler.kv = kv
	w.settler.acks.refresh(ctx)
	if w.o.Partitions == 0 {
		return nil
	}
	if err := w.parking.open(ctx); err != nil {
		return err
	}
	return w.lanes.open(ctx)
}

// actors returns the worker's long-running parts in the order of its stop,
// its part of the process's work stage (pipeline.StageWork):
//
//	stage   parts                                told when          waits for before returning
//	intake  intake (partitioned: parking and     ctx ends           nothing: no job is pulled or granted from here
//	        lanes; partition intakes are the
//	        lease manager's), dispatch loop
//	drain   the stop's grace                     intake returned    the partitions' intakes; queued jobs handed back;
//	                                                                fetches up to ShutdownGrace (its end or StopNow
//	                                                                cancels fctx); parks and lanes settled
//	upkeep  heartbeats, target probe,            drain returned     nothing: in-progress acks go out until every held
//	        stored-objects log, acks (mode, batch)                  job is settled; batched acks sent
//
// The drain stores in handedBefore how many jobs had been handed back
// before it began, for Run's last log line.
func (w *Worker) actors(fctx context.Context, cancelFetch context.CancelFunc, handedBefore *int64) *lifecycle.Group {
	g := lifecycle.New(w.log, stageIntake, "intake", "drain", "upkeep")
	loop := func(f func(context.Context)) func(context.Context) error {
		return func(ctx context.Context) error { f(ctx); return nil }
	}
	if w.o.Partitions > 0 {
		g.Add(stageIntake, "parking", loop(w.parking.run))
		g.Add(stageIntake, "lanes", loop(w.lanes.run))
	} else {
		g.Add(stageIntake, "intake", loop(func(ctx context.Context) { w.intakeLoop(ctx, w.d.Consumer, 0) }))
	}
	g.Add(stageIntake, "dispatch", loop(func(ctx context.Context) { w.dispatchLoop(ctx, fctx) }))
	g.Add(stageDrain, "drain", func(ctx context.Context) error {
		<-ctx.Done()
		*handedBefore = w.drain(cancelFetch)
		return nil
	})
	g.Add(stageUpkeep, "heartbeats", loop(w.heartbeatLoop))
	g.Add(stageUpkeep, "target probe", loop(w.health.probeLoop))
	g.Add(stageUpkeep, "stored log", loop(w.settler.stored.run))
	g.Add(stageUpkeep, "acks", loop(w.settler.acks.upkeep))
	return g
}

// flushAcks waits (up to 5 s) until the acks and NAKs of the stop are on
// the server: the connection may close right after Run returns.
func (w *Worker) flushAcks() {
	w.settler.acks.flush() // any batched since the upkeep's last (none, as a rule)
	nc := w.d.JS.Conn()
	if nc == nil {
		return
	}
	if err := nc.FlushTimeout(5 * time.Second); err != nil {
		w.log.Warn().Err(err).Msg("flush acks at shutdown")
	}
}

// The stages of a worker's stop (Run).
const (
	stageIntake lifecycle.Stage = iota
	stageDrain
	stageUpkeep
)

// drain is the stop once nothing is pulled or granted any more: it hands
// back the queued jobs, waits for the fetches in flight within the grace
// (awaitFetches, which may cancel them with cancelFetch), hands back what
// was requeued meanwhile, and waits for parks and lanes to settle. It
// returns the hand-backs counted before it began.
func (w *Worker) drain(cancelFetch context.CancelFunc) (handedBefore int64) {
	w.intakes.Wait()
	w.log.Info().Msg("worker stopping: handing back held jobs")
	// Every job handed back from here counts: the queued ones, and those
	// whose fetch the end of the grace or a second signal cancels.
	handedBefore = w.settler.handedBack.Load()
	w.handBackQueued()
	slotsDone := make(chan struct{})
	go func() { w.slots.Wait(); close(slotsDone) }()
	w.awaitFetches(slotsDone, cancelFetch)
	w.handBackQueued() // throttled jobs requeued during the grace period
	w.parking.wait()   // parks in progress end with an ack or a NAK
	w.lanes.wait()
	return handedBefore
}

// awaitFetches is the stop's grace: it waits until done (every slot has
// returned), saying at once and then every ShutdownReportEvery what it
// waits for and how long it still may; it cancels the fetches (cancel)
// when the grace runs out or when Options.StopNow closes (a second
// signal), whose jobs are then handed back at once by their slots.
func (w *Worker) awaitFetches(done <-chan struct{}, cancel context.CancelFunc) {
	deadline := w.clk.Now().Add(w.o.ShutdownGrace)
	for {
		left := deadline.Sub(w.clk.Now())
		if left <= 0 {
			w.log.Warn().Str("grace", w.o.ShutdownGrace.String()).Msg("in-flight fetches cancelled at the end of the grace period; their jobs are handed back")
			cancel()
			<-done
			return
		}
		if n, what := w.transfers.describe(w.clk.Now()); n > 0 {
			w.log.Info().Int("in_flight", n).Str("grace_left", left.Round(time.Second).String()).
				Msgf("waiting up to %s for %d %s in flight: %s (a second Ctrl-C or SIGTERM cancels %s and hands %s back now)",
					left.Round(time.Second), n, plural(n, "fetch", "fetches"), what, plural(n, "it", "them"), plural(n, "its job", "their jobs"))
		}
		t := w.clk.NewTimer(min(left, ShutdownReportEvery))
		select {
		case <-done:
			t.Stop()
			return
		case <-w.o.StopNow:
			t.Stop()
			n, _ := w.transfers.describe(w.clk.Now())
			w.log.Warn().Int("in_flight", n).Msg("stopping now: in-flight fetches cancelled; their jobs are handed back")
			cancel()
			<-done
			return
		case <-t.C():
		}
	}
}

func (w *Worker) handBackQueued() {
	for _, j := range w.sched.drain() {
		w.settler.handBack(j)
	}
}

// intakeLoop pulls c while fewer than MaxHeld jobs are held (across every
// partition's intake).
func (w *Worker) intakeLoop(ctx context.Context, c jetstream.Consumer, part int) {
	failures := 0
	for ctx.Err() == nil {
		if !w.health.waitUp(ctx) { // targethealth.go: no pulling while the target fails
			return
		}
		batchMax := w.o.PullBatch
		if w.o.Partitions > 0 {
			batchMax = w.partitionBatch()
			// Only whole pulls: each pull's deliveries change the
			// partition consumer's state, which nats-server rewrites
			// (a file created, written and renamed) at most every
			// 100 ms after a change: the largest cost the worker's
			// server has beyond raw's. Pulls into the few places a
			// finished job or two freed made half again as many
			// rewrites a job (ADR 0036, fourteenth pass).
			w.lowerLowWater(batchMax)
		}
		free := w.room()
		saturated := w.sched.saturated(w.clk.Now(), part)
		if free < int(w.lowWater.Load()) || saturated {
			if !w.awaitRoom(ctx, saturated) {
				return
			}
			continue
		}
		want := min(free, batchMax)
		w.pulling.Add(int64(want))
		batch, err := c.Fetch(want, jetstream.FetchMaxWait(w.o.PullWait))
		if err != nil {
			w.pulling.Add(-int64(want))
			failures++
			if !w.pullFailed(ctx, err, failures, part) {
				return
			}
			continue
		}
		failures = 0
		if w.state.CompareAndSwap(int32(stateStarting), int32(statePulling)) {
			w.pullOne.Do(func() { close(w.started) })
		}
		w.intakeBatch(ctx, batch, want)
	}
}

// room is how many more jobs the intakes may pull now: MaxHeld less the
// jobs held and the room reserved by pulls in progress.
func (w *Worker) room() int {
	return w.o.MaxHeld - w.sched.held() - int(w.pulling.Load())
}

// lowerLowWater lowers the intakes' low water mark to lw if it is higher.
func (w *Worker) lowerLowWater(lw int) {
	for {
		cur := w.lowWater.Load()
		if int64(lw) >= cur || w.lowWater.CompareAndSwap(cur, int64(lw)) {
			return
		}
	}
}

// partitionBatch is the most one partition's pull asks for. A pull holds
// its room for up to PullWait while it waits for messages: each partition
// gets a fair share of MaxHeld, so that empty partitions cannot starve
// busy ones. The share is of every partition the pod may come to serve,
// not of those it serves now: a pull sized while the lease manager was
// still adding partitions (256, 250, 166, ... of 1000 for the first ones
// of 32) kept that room until it expired, and the partitions added after
// it found none: their jobs waited a whole PullWait in the stream at each
// pod's start and take-over (0.93 s in the politeness benchmark, ADR 0029).
func (w *Worker) partitionBatch() int {
	n := max(w.o.Partitions, w.parts.count(), 1)
	return max(1, min(w.o.PullBatch, w.o.MaxHeld/(2*n)))
}

// awaitRoom waits until jobs leave memory, or a while. It reports false
// when ctx is done.
func (w *Worker) awaitRoom(ctx context.Context, saturated bool) bool {
	// Woken when jobs leave memory; the timeout is a safety net
	// against a missed wake-up, which would otherwise stall pulling
	// for good (deferred jobs only come back through a pull). A
	// saturated partition looks again soon: its authority drains
	// fast, and the wake-up may have gone to another intake.
	wait := w.o.PullWait
	if saturated {
		wait = min(wait, 20*time.Millisecond)
	}
	t := w.clk.NewTimer(wait)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-w.space:
	case <-t.C():
	}
	return true
}

// pullFailed logs the failures-th failed pull in a row and backs off
// before the next. It reports false when ctx is done.
func (w *Worker) pullFailed(ctx context.Context, err error, failures, part int) bool {
	if w.o.Partitions <= 0 {
		w.state.CompareAndSwap(int32(statePulling), int32(stateStarting)) // not ready while the consumer cannot be pulled
	}
	w.log.Warn().Err(err).Int("failures", failures).Int("partition", part).Msg("pull from consumer")
	return clock.Sleep(w.clk, min(time.Duration(failures)*200*time.Millisecond, 5*time.Second), ctx.Done())
}

// intakeBatch takes each message of a pull of want, then gives the pull's
// room back.
func (w *Worker) intakeBatch(ctx context.Context, batch jetstream.MessageBatch, want int) {
	// Drain the whole batch even after ctx is done: a message the server
	// already sent must be handed back, not left to its ack wait.
	got, parks0, t0 := 0, w.parking.started.Load(), w.clk.Now()
	for m := range batch.Messages() {
		got++
		if ctx.Err() != nil {
			w.settler.handBackMsg(m)
			continue
		}
		w.intake(ctx, m)
	}
	w.pulling.Add(-int64(want))
	if w.o.Partitions > 0 {
		// The pull's room is free again: another partition's intake may
		// be waiting for it. Its timer is only a safety net (on the
		// tests' fake clock it never fires), and a pull that expires
		// empty frees no held job, so nothing else would wake it.
		w.wakeIntake()
	}
	if err := batch.Error(); err != nil && !errors.Is(err, context.Canceled) {
		w.log.Debug().Err(err).Msg("pull ended")
	}
	w.yieldToOthers(ctx, got, int(w.parking.started.Load()-parks0), w.clk.Now().Sub(t0))
}

// yieldToOthers paces a partition whose deliveries all went to the parking
// lot (a cooling authority's backlog) while other jobs are held: parking
// costs CPU and NATS operations that the healthy authorities need, and the
// backlog waits anyway. Such a partition then spends at most a tenth of
// its time pulling and parking; alone, it parks at full speed.
func (w *Worker) yieldToOthers(ctx context.Context, got, parked int, took time.Duration) {
	if w.o.Partitions <= 0 || got == 0 || parked*10 < got*9 || w.sched.held() == 0 {
		return
	}
	clock.Sleep(w.clk, min(9*took, w.o.PullWait), ctx.Done())
}

// intake validates one delivery and queues or defers it. Nothing here may
// panic or block on a bad message.
func (w *Worker) intake(ctx context.Context, m Msg) {
	now := w.clk.Now()
	j := &heldJob{msg: m, data: m.Data(), received: now, delivered: 1}
	h := m.Headers()
	if h != nil && w.o.SkipCopies && jobs.IsCopy(h) {
		// A replay: the submitted job itself is in the stream too.
		w.settler.settle(j, Msg.Ack)
		return
	}
	if readHeaders(j, h) {
		// Deferred: the authority is known only once the job is parsed.
		defer func() { w.parking.arrived(j.auth) }()
	}
	if !w.readDelivery(j, m) {
		return
	}
	if w.sched.redelivered(j.seq, j.delivered, m, now) {
		return
	}
	if !w.parseJob(ctx, j, m) {
		return
	}
	if w.moveToPacePartition(ctx, j, m) {
		return
	}
	if !w.openReplay(ctx, j) {
		return
	}
	if j.job.IsDelete() {
		// A delete asks nothing of the origin: no pacer, no queue.
		w.deletes.start(ctx, j)
		return
	}
	w.queue(ctx, j, now)
}

// readHeaders takes what earlier hands wrote into the message's headers
// (deliveries before a move, a redirect's continuation, a replay). It
// reports whether the job comes back from the parking lot.
func readHeaders(j *heldJob, h nats.Header) (unparked bool) {
	if h == nil {
		return false
	}
	j.prior, _ = strconv.ParseUint(h.Get(jobs.HeaderDeliveries), 10, 64)
	if c := h.Get(jobs.HeaderContinues); c != "" {
		j.origin = c
		j.hops, _ = strconv.Atoi(h.Get(jobs.HeaderHops))
	}
	j.replay = replayOf(h)
	return h.Get(jobs.HeaderUnparked) != ""
}

// readDelivery takes j's stream sequence and delivery count. It reports
// false when it acked the message instead: another consumer serves it.
func (w *Worker) readDelivery(j *heldJob, m Msg) bool {
	md, err := m.Metadata()
	if err != nil {
		// Not a JetStream delivery (never from a real consumer): a private
		// key keeps it apart from every other held job.
		j.seq = 1<<63 + w.anon.Add(1)
		return true
	}
	j.seq, j.delivered = md.Sequence.Stream, md.NumDelivered
	if w.lanes.covered(md.Consumer, j.seq, m.Subject()) {
		// Served by a lane or by the partition consumer (lane.go).
		if err := w.settler.settle(j, Msg.Ack); err != nil {
			w.log.Debug().Err(err).Msg("ack a job served by another consumer")
		}
		return false
	}
	j.laned = isLane(md.Consumer)
	return true
}

// parseJob decodes and checks j's job. It reports false when it
// dead-lettered the message instead, with as much of the job as could be
// read so that its tenant can find it.
func (w *Worker) parseJob(ctx context.Context, j *heldJob, m Msg) bool {
	job, err := jobs.Parse(j.data)
	if err == nil {
		err = jobs.CheckSubject(job, m.Subject())
	}
	if err == nil {
		j.job, j.auth = job, job.Authority.String()
		return true
	}
	reason := jobs.ReasonInvalidJob
	var ie *jobs.InvalidError
	if errors.As(err, &ie) && ie.Code != "" {
		reason = ie.Code
	}
	j.job.Tenant, j.job.ID = job.Tenant, job.ID
	if !job.Authority.IsZero() {
		j.auth = job.Authority.String()
	}
	w.settler.deadLetter(ctx, j, reason, err.Error(), 0, nil)
	return false
}

// moveToPacePartition sets j's partition, and moves j there (reporting
// true) when it arrived in another: served here, it would be paced by a
// pod that does not own its pace. That happens to a member of a politeness
// group, which arrives in its own authority's partition, after a policy
// change, and to a job published straight onto a stored subject.
func (w *Worker) moveToPacePartition(ctx context.Context, j *heldJob, m Msg) bool {
	if w.o.Partitions <= 0 {
		return false
	}
	j.part = w.sched.partitionOf(j.auth)
	if p, _, _, err := jobs.ParsePartitionSubject(m.Subject()); err == nil && p != j.part {
		w.handoffs.move(ctx, j, m, p)
		return true
	}
	return false
}

// queue hands a valid fetch job to the scheduler, or defers it, unless a
// copy within the target settles it first.
func (w *Worker) queue(ctx context.Context, j *heldJob, now time.Time) {
	// Stat before queueing, not between the pacer's grant and the request:
	// the pacer spaces grants, so the request must follow its grant at once.
	// A job that names a sha256 is looked at before its deferral is
	// considered, since a copy may settle it at once.
	if j.job.SHA256 != "" {
		// Another job fetching these bytes is waited for before the index
		// is read: it settles only once its entry is there, so this job
		// sees either that job or the entry (copied.go).
		if w.waitSameBytes(j) {
			return
		}
		if w.statTarget(ctx, j) {
			return
		}
	}
	if d, deferred := w.sched.tryDefer(now, j); deferred {
		w.settler.deferJob(d)
		return
	}
	if j.job.SHA256 == "" {
		w.statTarget(ctx, j)
	}
	if d, deferred := w.sched.admit(now, j); deferred {
		w.settler.deferJob(d)
		return
	}
	w.poke()
}

// statTarget reads what j's key holds now, for a conditional fetch, and
// reports whether a copy within the target stored and settled j instead.
func (w *Worker) statTarget(ctx context.Context, j *heldJob) (copied bool) {
	meta, err := w.targetOf(j).Stat(ctx, j.job.Target)
	if err == nil {
		j.etag, j.lastMo = meta.ETag, meta.LastModified
	} else if !errors.Is(err, mirror.ErrNotFound) {
		w.log.Warn().Err(err).Str("job", j.job.ID).Msg("stat target; fetching unconditionally")
	}
	// Bytes the target holds under another key are copied before the
	// job is queued, even while its authority cools down: a copy takes
	// nothing from the pacer (copied.go).
	return w.copyKnown(ctx, j, meta, err == nil)
}

// dispatchLoop runs the scheduler: on every event (a job queued, a fetch
// done, a timer) it hands ready jobs to free slots and defers what cannot
// be served soon.
func (w *Worker) dispatchLoop(ctx, fctx context.Context) {
	t := w.clk.NewTimer(time.Hour)
	t.Stop()
	defer t.Stop()
	// Asked for once and again only after it closed, so that a change
	// while the scheduler runs is seen by the select below.
	changed := w.d.Pacer.Changed()
	for {
		grants, defers, wake := w.sched.next(w.clk.Now())
		for _, g := range grants {
			w.slots.Add(1)
			go w.runSlot(ctx, fctx, g)
		}
		for _, d := range defers {
			w.settler.deferJob(d)
		}
		if len(defers) > 0 {
			// Memory was freed without a fetch completing: the intake may
			// be waiting for exactly this (a full memory all deferred).
			w.wakeIntake()
		}
		var tc <-chan time.Time
		if !wake.IsZero() {
			d := wake.Sub(w.clk.Now())
			if d <= 0 && len(grants)+len(defers) > 0 {
				continue
			}
			t.Reset(max(d, time.Millisecond))
			tc = t.C()
		}
		select {
		case <-ctx.Done():
			return
		case <-w.kick:
		case <-changed:
			// A policy change: the queues waiting on a refusal's timer
			// ask again, since a lowered floor shortens their waits. The
			// next change closes the channel asked for first.
			changed = w.d.Pacer.Changed()
			w.sched.repace(w.clk.Now())
		case <-tc:
		}
	}
}

// heartbeatLoop sends in-progress acks for held jobs so that their ack wait
// never runs out while they wait in memory or fetch.
func (w *Worker) heartbeatLoop(ctx context.Context) {
	period := max(w.o.AckWait/6, 10*time.Millisecond)
	for clock.Sleep(w.clk, period, ctx.Done()) {
		now := w.clk.Now()
		for _, j := range w.sched.touchDue(now, now.Add(-w.o.AckWait/4)) {
			w.inProgress(j)
		}
	}
}

// inProgress sends an in-progress ack for j unless j was settled (acked,
// NAKed, terminated) in the meantime: an in-progress ack after a NAK with
// a delay would reset the message's timer and push its redelivery out to
// a full AckWait.
func (w *Worker) inProgress(j *heldJob) {
	j.ackMu.Lock()
	defer j.ackMu.Unlock()
	if j.settled {
		return
	}
	if err := w.sched.msgOf(j).InProgress(); err != nil && !errors.Is(err, jetstream.ErrMsgAlreadyAckd) {
		w.log.Debug().Err(err).Msg("in-progress ack")
	}
}

// runSlot is one fetch slot working on a granted job.
func (w *Worker) runSlot(ctx, fctx context.Context, g grant) {
	defer w.slots.Done()
	j := g.job
	pm, err := w.confirm(ctx, g.permit)
	if err != nil {
		if ctx.Err() != nil {
			// Shut down before the request started: hand it back untouched.
			w.settler.handBack(j)
			w.finish(j, 0, false)
			return
		}
		// A cooldown arrived between the grant and now: back to the queue,
		// where the pacer's refusal defers it.
		w.finish(j, 0, true)
		return
	}
	if w.health.skipWhileDown(j, pm) { // targethealth.go
		w.finish(j, 0, false)
		return
	}
	if !w.parts.owns(j.part) {
		// The partition was lost between the grant and now: its new owner
		// serves the job, and this pod sends nothing more to the authority.
		w.d.Pacer.Done(w.clk.Now(), pm, pacer.Response{Cancelled: true})
		w.settler.handBack(j)
		w.finish(j, 0, false)
		return
	}
	start := w.clk.Now()
	w.m.ClassRequests.WithLabelValues(jobClass(j)).Inc()
	w.classes.add(start, j.replay != nil)
	w.m.PacerWait.Observe(start.Sub(j.queuedAt).Seconds())
	w.sched.fetching(j)
	requeue := w.process(w.parts.fetchContext(fctx, j.part), j, pm)
	w.finish(j, w.clk.Now().Sub(start), requeue)
}

func (w *Worker) finish(j *heldJob, took time.Duration, requeue bool) {
	w.sched.finished(w.clk.Now(), j, took, requeue)
	w.poke()
}

// process fetches and stores one job and settles it on the queue. It
// returns true when the job must go back to its authority's queue (a
// throttled answer: the pacer now knows when the next request may go).
func (w *Worker) process(ctx context.Context, j *heldJob, pm pacer.Permit) (requeue bool) {
	began := w.clk.Now()
	tr := w.transfers.start(j, began)
	defer w.transfers.end(tr)
	hops := &hopSet{d: &w.hops, first: pm, kind: j.job.Kind, part: j.part, url: j.job.URL}
	defer hops.close()
	req := fetchRequest(j)
	kept := keptFor(ctx, w.targetOf(j), j, w.log) // resume.go
	if kept != nil {
		p := kept.Partial()
		req.From, req.IfRange = p.Size, p.IfRange()
	}
	defer func() {
		if kept != nil { // this attempt got no body: the next may resume
			kept.Release()
		}
	}()
	resp, err := w.d.Fetcher.Do(httptrace.WithClientTrace(ctx, hops.trace()), req, hops.gate)
	if err != nil {
		w.fetchFailed(ctx, j, err, hops, &kept)
		return false
	}
	if resp.Body != nil {
		hops.heard(resp.Status) // a 2xx: its Done waits for the body
	}
	v := hops.lastVerdict()
	class := fetch.Classify(resp.Status)
	if v.Throttled || class == fetch.ClassThrottled {
		w.throttled(j, resp, v)
		return true
	}
	if kept != nil {
		var unsatisfiable bool
		if class, unsatisfiable = resumeClass(w.m, resp, class, &kept); unsatisfiable { // resume.go
			w.settler.transient(ctx, j, jobs.HTTPReason(resp.Status), resp.Status, "the kept start of the body was dropped")
			return false
		}
	}
	w.settleAnswer(ctx, j, resp, class, began, tr, &kept)
	return false
}

// fetchRequest is the request j's job asks for, conditional on what the
// target held at intake.
func fetchRequest(j *heldJob) fetch.Request {
	req := fetch.Request{URL: j.job.URL, ETag: j.etag, LastModified: j.lastMo, Hops: j.hops}
	if j.job.Size != nil {
		req.Size, req.HasSize = *j.job.Size, true
	}
	if len(j.job.Headers) > 0 {
		req.Header = http.Header{}
		for k, v := range j.job.Headers {
			req.Header.Set(k, v)
		}
	}
	return req
}

// fetchFailed settles j, whose fetch got no answer to store: a hop handed
// to another queue or pod, a refusal, a shutdown, or a failed request.
// *kept is the start of the body an earlier attempt kept, if any.
func (w *Worker) fetchFailed(ctx context.Context, j *heldJob, err error, hops *hopSet, kept *mirror.Kept) {
	if *kept != nil && errors.Is(err, fetch.ErrRangeMismatch) {
		// Not the rest of the body kept: dropped, the retry asks for it whole.
		countResume(w.m, ResumeRangeMismatch, nil)
		(*kept).Discard()
		*kept = nil
	}
	var re *pacer.RefusedError
	var ge *fetch.GateError
	switch {
	case errors.Is(err, errHandOff) && errors.As(err, &ge):
		// The hop's authority is another pod's: it fetches the rest.
		w.handoffs.handOff(ctx, j, ge, "other_pod")
	case errors.As(err, &re) && errors.As(err, &ge) && w.handoffs.continuesRefused():
		// The hop's authority cannot take it soon: the rest waits in
		// that authority's queue, and the first hop is not asked again.
		w.handoffs.handOff(ctx, j, ge, string(re.Reason))
	case errors.As(err, &re):
		// A redirect hop's authority cannot take it soon: defer on
		// that authority's calendar, without using the budget.
		delay := w.sched.deferFor(w.clk.Now(), re.Authority, re.Wait, re.Interval)
		w.settler.deferJob(deferral{job: j, delay: delay, reason: redirectReason(re.Reason)})
	case ctx.Err() != nil:
		w.settler.handBack(j)
	case errors.Is(err, fetch.ErrSizeMismatch):
		// A Content-Length other than the job's size: not one body byte
		// was read.
		w.settler.transient(ctx, j, fetch.ReasonCode(err, 0), hops.lastStatus(), err.Error())
	case fetch.IsPermanent(err):
		dropKept(kept) // no attempt follows a dead letter
		w.settler.deadLetter(ctx, j, fetch.ReasonCode(err, 0), err.Error(), hops.lastStatus(), nil)
	default:
		w.settler.transient(ctx, j, fetch.ReasonCode(err, 0), 0, err.Error())
	}
}

// throttled closes a throttling answer's body and records it on j, which
// goes back to its authority's queue: the pacer now knows when the next
// request may go.
func (w *Worker) throttled(j *heldJob, resp *fetch.Response, v pacer.Verdict) {
	if resp.Body != nil {
		resp.Body.Close()
	}
	j.throttles = append(j.throttles, jobs.Attempt{
		Time: w.clk.Now(), Reason: jobs.ThrottledReason(resp.Status), Status: resp.Status,
		Detail: throttleDetail(v, resp.Header),
	})
}

// settleAnswer settles j by the class of its origin's answer: stored,
// unchanged, retried or dead-lettered. *kept, if not nil, is the start of
// the body resp's goes on from; store takes it over.
func (w *Worker) settleAnswer(ctx context.Context, j *heldJob, resp *fetch.Response, class fetch.Class, began time.Time, tr *transfer, kept *mirror.Kept) {
	switch class {
	case fetch.ClassSuccess:
		w.store(ctx, j, resp, began, tr, *kept)
		*kept = nil // store's now
	case fetch.ClassNotModified:
		w.settler.complete(j, OutcomeUnchanged)
		w.settler.stored.add(j, resp.Status, 0, began)
	case fetch.ClassTransient:
		w.settler.transient(ctx, j, jobs.HTTPReason(resp.Status), resp.Status, "")
	case fetch.ClassAuthFailed:
		w.auth.refused(ctx, j, resp) // authfail.go
	default:
		dropKept(kept) // no attempt follows a dead letter
		w.settler.deadLetter(ctx, j, jobs.HTTPReason(resp.Status), "", resp.Status, nil)
	}
}

// throttleDetail keeps the headers that explain a throttling answer.
func throttleDetail(v pacer.Verdict, h http.Header) string {
	s := "pacer=" + v.Reason
	if !v.Until.IsZero() {
		s += " until=" + v.Until.UTC().Format(time.RFC3339)
	}
	for _, k := range pacer.ThrottleHeaders() {
		if val := h.Get(k); val != "" {
			s += " " + k + "=" + val
		}
	}
	return s
}

// store writes a 2xx body to the target and acks once it is durable.
// began is when the fetch started, for the retry delay of a slow transfer;
// tr is its entry among the fetches in flight.
// kept, if not nil, is the start of the body an earlier attempt kept,
// which resp's body goes on from (resp.Offset) or replaces.
func (w *Worker) store(ctx context.Context, j *heldJob, resp *fetch.Response, began time.Time, tr *transfer, kept mirror.Kept) {
	want := expectOf(j)
	size := int64(-1)
	if want.HasSize {
		size = want.Size
	}
	tr.body(w.clk.Now(), resp.Header.Get("Content-Length"), size)
	enq := enqueuedOf(w.sched.msgOf(j))
	guard, superseded, err := w.deletes.guardStore(ctx, j, enq)
	switch {
	case superseded:
		w.deletes.supersededStore(j, resp, kept) // delete.go
		return
	case err != nil:
		w.deletes.unguarded(ctx, j, resp, kept, err) // delete.go
		return
	}
	meta := storeMeta(j, resp, enq, w.clk.Now())
	body := &countingReader{r: resp.Body, tr: tr, fetched: w.m.FetchedBytes}
	src, done := readAhead(body)
	if kept != nil {
		_, err = w.targetOf(j).(Resumer).PutResume(ctx, j.job.Target, kept, resp.Offset, src, want, meta)
	} else {
		_, err = w.targetOf(j).Put(ctx, j.job.Target, src, want, meta)
	}
	guard.done(ctx, err == nil)
	done()
	resp.Body.Close()
	if err == nil {
		w.m.BodyReadBytes.WithLabelValues("stored").Observe(float64(body.n))
		w.settler.complete(j, OutcomeStored)
		w.settler.stored.add(j, resp.Status, body.n, began)
		return
	}
	w.m.BodyReadBytes.WithLabelValues("discarded").Observe(float64(body.n))
	w.storeFailed(ctx, j, resp.Status, body.err, err, began)
}

// expectOf is what j's job says its bytes must be, for the target to
// check as it stores them.
func expectOf(j *heldJob) mirror.Expect {
	want := mirror.Expect{SHA256: j.job.SHA256}
	if j.job.Size != nil {
		want.Size, want.HasSize = *j.job.Size, true
	}
	return want
}

// storeMeta is what the target records beside j's object, fetched at now.
func storeMeta(j *heldJob, resp *fetch.Response, enq, now time.Time) mirror.Meta {
	return mirror.Meta{
		Enqueued:     enq,
		Key:          j.job.Target,
		URL:          jobURL(j),
		ETag:         resp.Header.Get("ETag"),
		LastModified: resp.Header.Get("Last-Modified"),
		ContentType:  resp.Header.Get("Content-Type"),
		FetchedAt:    now.UTC(),
		JobID:        j.job.ID,
	}
}

// storeFailed settles j, whose body was not stored (err, the target's
// error). readErr is the body's own failure, if any: the cause of err, so
// it decides first. status is the origin's.
func (w *Worker) storeFailed(ctx context.Context, j *heldJob, status int, readErr, err error, began time.Time) {
	switch {
	case ctx.Err() != nil:
		w.settler.handBack(j)
	case readErr != nil && errors.Is(readErr, fetch.ErrSizeMismatch):
		w.settler.transient(ctx, j, fetch.ReasonCode(readErr, 0), status, readErr.Error())
	case readErr != nil && fetch.IsPermanent(readErr):
		w.settler.deadLetter(ctx, j, fetch.ReasonCode(readErr, 0), readErr.Error(), status, nil)
	case readErr != nil && errors.Is(readErr, fetch.ErrTooSlow):
		// A trickle held a fetch slot all this time: it waits SlowRetryFactor
		// times as long before it may hold one again.
		held := w.clk.Now().Sub(began)
		w.settler.retry(ctx, j, fetch.ReasonCode(readErr, 0), status, readErr.Error(), SlowRetryFactor*held)
	case readErr != nil:
		w.settler.transient(ctx, j, fetch.ReasonCode(readErr, 0), status, readErr.Error())
	case mirror.FailureCode(err) != "":
		// The target itself failed (full, read-only, broken): the worker's
		// problem, not the job's (targethealth.go).
		w.health.writeFailed(j, mirror.FailureCode(err), err)
	case errors.Is(err, mirror.ErrDigestMismatch):
		w.settler.transient(ctx, j, jobs.ReasonDigestMismatch, status, err.Error())
	case errors.Is(err, mirror.ErrSizeMismatch):
		w.settler.transient(ctx, j, jobs.ReasonSizeMismatch, status, err.Error())
	case errors.Is(err, mirror.ErrInvalidKey):
		w.settler.deadLetter(ctx, j, jobs.ReasonInvalidTarget, err.Error(), status, nil)
	case errors.Is(err, mirror.ErrKeyConflict):
		// An object already stands where this key needs a directory (or the
		// reverse): no retry can succeed until an operator resolves it.
		w.settler.deadLetter(ctx, j, jobs.ReasonTargetConflict, err.Error(), status, nil)
	default:
		w.settler.transient(ctx, j, jobs.ReasonTargetWrite, status, err.Error())
	}
}

// ReadAheadSize is how much of a body store reads into memory before the
// target sees a byte. A body this small is read whole, so its request is
// done, and stops counting against the authority's in-flight cap, before
// the target creates a file: the origin never waits on our disk.
const ReadAheadSize = 64 << 10

var readAheadBufs = sync.Pool{New: func() any { b := make([]byte, ReadAheadSize); return &b }}

// readAhead reads up to ReadAheadSize bytes of r and returns a reader of
// all of r: those bytes, then the rest (or r's error). done gives the
// buffer back; the returned reader must not be used after it.
func readAhead(r io.Reader) (io.Reader, func()) {
	bufp := readAheadBufs.Get().(*[]byte)
	done := func() { readAheadBufs.Put(bufp) }
	// Not io.ReadFull: it would turn a body's own io.ErrUnexpectedEOF (a
	// truncated transfer) into a short, complete-looking read.
	buf, n := *bufp, 0
	var err error
	for n < len(buf) && err == nil {
		var m int
		m, err = r.Read(buf[n:])
		n += m
	}
	head := bytes.NewReader(buf[:n])
	switch err {
	case nil: // more may follow
		return io.MultiReader(head, r), done
	case io.EOF: // the whole body
		return head, done
	}
	return io.MultiReader(head, failingReader{err}), done
}

// failingReader returns its error: the rest of a body whose read failed.
type failingReader struct{ err error }

func (f failingReader) Read([]byte) (int, error) { return 0, f.err }

// countingReader counts body bytes and remembers the body's own read error,
// to tell a failing origin from a failing target. It closes the body at its
// end, so the request stops counting against the authority's in-flight cap
// while the target syncs to disk (the target is never paced). Every read
// also counts in the fetch's transfer and in fetched_bytes_total, so that
// a long body shows its progress while it streams, not only at its end
// (two atomic adds per read of up to 32 KiB: nothing beside the copy).
type countingReader struct {
	r       io.ReadCloser
	tr      *transfer
	fetched prometheus.Counter
	n       int64
	err     error
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += int64(n)
	if n > 0 && c.tr != nil {
		c.tr.bytes.Add(int64(n))
	}
	if n > 0 && c.fetched != nil {
		c.fetched.Add(float64(n))
	}
	switch {
	case err == io.EOF:
		c.r.Close()
	case err != nil:
		c.err = err
	}
	return n, err
}

// SlowRetryFactor: a job whose transfer was cut as too slow (fetch.ErrTooSlow)
// is retried no sooner than this many times the time its attempt held a
// fetch slot (within BackoffMax), so that a trickling job spends at most
// about a tenth of its time in a slot, and healthy origins keep flowing
// beside trickling ones.
const SlowRetryFactor = 9

// copyKnown stores j, whose job names a sha256, by a copy within its
// target when the target holds those bytes under another key, and settles
// it (OutcomeCopied). It reports whether it did; false: the job goes on to
// its fetch, as if there were no index. It runs at intake, before the job
// is queued: a copied job never takes a grant from the pacer nor counts
// as a request. stat is what the job's own key holds (ok false: nothing
// with metadata).
func (w *Worker) copyKnown(ctx context.Context, j *heldJob, stat mirror.Meta, ok bool) bool {
	if j.job.SHA256 == "" || j.replay != nil || (ok && strings.EqualFold(stat.SHA256, j.job.SHA256)) {
		// No digest to look up; a replay job, whose outcomes its replay
		// tallies as fetches; or the key holds those bytes already, and its
		// own conditional fetch (a 304) settles it.
		return false
	}
	c, isCopier := w.targetOf(j).(Copier)
	if !isCopier {
		return false
	}
	want := expectOf(j)
	// A copy is a store of the key: it waits for the key's delete and is
	// superseded by one enqueued after it (delete.go), as a fetch's is.
	enq := enqueuedOf(w.sched.msgOf(j))
	guard, superseded, err := w.deletes.guardStore(ctx, j, enq)
	switch {
	case superseded:
		w.deletes.superseded(j, "a delete enqueued after the job removed the key")
		return true
	case err != nil:
		return false
	}
	began := w.clk.Now()
	meta := mirror.Meta{
		Enqueued:  enq,
		Key:       j.job.Target,
		URL:       jobURL(j),
		FetchedAt: began.UTC(),
		JobID:     j.job.ID,
	}
	from, stored, err := c.CopyKnown(ctx, j.job.Target, want, meta)
	guard.done(ctx, err == nil)
	if err != nil {
		if !errors.Is(err, mirror.ErrNotFound) && ctx.Err() == nil {
			w.log.Warn().Err(err).Str("job", j.job.ID).Str("key", j.job.Target).Msg("copy within the target failed; fetching instead")
		}
		return false
	}
	w.copies.n.Add(1)
	w.settler.complete(j, OutcomeCopied)
	w.settler.stored.copied(j, from, stored.Size, began)
	return true
}

// waitSameBytes defers j, whose bytes another job of this worker is
// fetching, if there is one (it reports true then); otherwise j becomes
// that job until it is settled (stored, copied, deferred or failed). No
// failure budget is used, and nothing asked of the pacer.
func (w *Worker) waitSameBytes(j *heldJob) bool {
	if j.job.SHA256 == "" || j.replay != nil {
		return false
	}
	if _, ok := w.targetOf(j).(Copier); !ok || w.copies.lead(j) {
		return false
	}
	shift := min(max(int(j.delivered)-1, 0), 8)
	delay := min(sameBytesWait<<shift, sameBytesWaitMax)
	w.settler.deferJob(deferral{job: j, delay: delay, reason: reasonSameBytes})
	return true
}

// targetOf is where j is stored: its replay's target, or the worker's.
func (w *Worker) targetOf(j *heldJob) Target {
	if j.replay != nil && j.replay.to != nil {
		return j.replay.to
	}
	return w.d.Target
}

// openReplay opens a replay job's target (Deps.ReplayTarget). It reports
// false when it settled the job instead: dropped, its run being over, or
// dead-lettered (into the replays' stream, jobs.ReplayDLQStream) when the
// target is not one this pod may write.
func (w *Worker) openReplay(ctx context.Context, j *heldJob) bool {
	r := j.replay
	if r == nil {
		return true
	}
	var err error
	switch {
	case !jobs.ValidReplayRun(r.run):
		err = fmt.Errorf("replay run %q is not a run name", jobs.Truncate(r.run, 80))
	case w.d.ReplayTarget == nil:
		err = errors.New("this worker takes no replay jobs")
	default:
		r.to, err = w.d.ReplayTarget(ctx, r.run, r.target)
	}
	switch {
	case err == nil:
		return true
	case errors.Is(err, ErrReplayOver):
		if err := w.settler.settle(j, Msg.Ack); err != nil {
			w.log.Debug().Err(err).Str("job", j.job.ID).Msg("ack a job of a replay that is over")
		}
		w.settler.count(OutcomeDropped)
		w.log.Debug().Str("job", j.job.ID).Str("replay", r.run).Msg("replay job dropped: its run is over")
		return false
	}
	w.settler.deadLetter(ctx, j, jobs.ReasonReplayTarget, err.Error(), 0, nil)
	return false
}

// jobClass is the class label of j: live or replay.
func jobClass(j *heldJob) string {
	if j.replay != nil {
		return "replay"
	}
	return "live"
}
