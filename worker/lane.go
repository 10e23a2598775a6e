package worker

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/mirrorworker/mirrorworker/clock"
	"github.com/mirrorworker/mirrorworker/jobs"
)

// Lanes: skipping a cooling authority's backlog (docs/adr/0007, "Lanes").
//
// A partition consumer delivers in stream order, so the jobs of a healthy
// authority that shares a partition with a cooling authority's large
// backlog would wait until that backlog had been read and parked, one job
// at a time. When the partition's consumer has a large backlog ahead and
// one of its authorities must wait longer than ParkAfter, the owner moves
// that backlog out of the consumer's way without reading it:
//
//  1. a lane: a durable consumer of that authority's subjects alone,
//     starting at the partition consumer's ack floor, which is pulled only
//     when the pacer says the authority can take requests;
//  2. a catch-up consumer of every other subject the partition holds up to
//     the stream's last sequence L, from the same floor (the server skips
//     the lane's jobs for it);
//  3. the partition consumer is reset to L+1.
//
// Each step covers its jobs before the next one skips them: a crash
// between steps leaves duplicates (harmless: writes are idempotent), never
// a loss. From then on the partition consumer acks the lane's authority's
// jobs without serving them (the lane has them), and the catch-up consumer
// acks what is past L (the partition consumer has it) and is deleted once
// everything up to L is acked. While jobs of a lane's authority keep
// arriving, the skip (steps 2 and 3) is repeated as soon as the partition
// consumer is an eighth of the lane threshold behind, at most every
// laneRetry. A lane is deleted when it is empty and its authority can take
// requests again.

// Lane limits.
const (
	// maxLanesPerPartition bounds the consumers a partition's cooling
	// authorities can take; beyond it their jobs are parked one by one.
	maxLanesPerPartition = 4
	// maxCatchups bounds the catch-up consumers of one partition at once.
	maxCatchups = 16
	// maxCatchupSubjects bounds the filter of a catch-up consumer: a
	// partition holding more subjects (tenant and authority pairs) than
	// this is not skipped, and its cooling backlog is parked job by job.
	maxCatchupSubjects = 2000
	// laneRetry spaces attempts to open a lane or skip in one partition.
	laneRetry = 100 * time.Millisecond
)

type laneSet struct {
	d      laneDeps
	stream jetstream.Stream // MIRROR_JOBS; nil: lanes are off

	mu       sync.Mutex
	byKey    map[laneKey]*authLane // lanes of the partitions served
	catchups map[string]*catchup   // by consumer name
	tried    map[int]time.Time     // last skip attempt, per partition
	busy     map[int]bool          // a skip under way, per partition
	opening  sync.WaitGroup
	// active is len(byKey)+len(catchups), read without the lock by covered.
	active atomic.Int32
}

// countLocked updates active after byKey or catchups changed.
func (l *laneSet) countLocked() { l.active.Store(int32(len(l.byKey) + len(l.catchups))) }

type laneKey struct {
	part int
	akey string
}

// lane is one authority's skipped backlog in one partition.
type authLane struct {
	part  int
	auth  string
	akey  string
	start uint64 // the first stream sequence it covers
	cons  jetstream.Consumer
	n     int64 // jobs waiting in it (a hint, refreshed from its info)
}

// catchup serves the other authorities' jobs a partition consumer skipped.
type catchup struct {
	part  int
	until uint64
	cons  jetstream.Consumer
	stop  context.CancelFunc
	done  chan struct{}
}

// laneDeps are what the lanes work with.
type laneDeps struct {
	js         jetstream.JetStream
	clk        clock.Clock
	log        zerolog.Logger
	m          *Metrics
	sched      *scheduler
	parts      *servedParts
	readyIn    readyInFunc // Pacer.ReadyIn
	fault      faultHook
	backlog    int // Options.LaneBacklog; negative: no lanes
	holdMax    time.Duration
	maxPerAuth int // Options.MaxHeldPerAuthority
	// deliver takes one delivery from a lane (the worker's intake); pull
	// serves a catch-up consumer of a partition until ctx ends (the
	// worker's intake loop), counted in loops, which Run waits for.
	deliver func(ctx context.Context, m Msg)
	pull    func(ctx context.Context, c jetstream.Consumer, part int)
	loops   *sync.WaitGroup
}

func newLanes(d laneDeps) *laneSet {
	return &laneSet{d: d, byKey: map[laneKey]*authLane{}, catchups: map[string]*catchup{},
		tried: map[int]time.Time{}, busy: map[int]bool{}}
}

// open binds MIRROR_JOBS (partitioned mode). Lanes stay off on a server
// that cannot reset a consumer (jobs.LaneServerVersion).
func (l *laneSet) open(ctx context.Context) error {
	if l.d.backlog < 0 {
		return nil
	}
	if nc := l.d.js.Conn(); nc != nil && !jobs.CanSkip(nc) {
		l.d.log.Info().Str("server", nc.ConnectedServerVersion()).Str("needs", jobs.LaneServerVersion).
			Msg("no lanes on this nats-server: a cooling authority's backlog is parked job by job")
		return nil
	}
	s, err := l.d.js.Stream(ctx, jobs.JobsStream)
	if err != nil {
		return errors.Join(errors.New("worker: stream "+jobs.JobsStream), err)
	}
	l.stream = s
	return nil
}

// covered reports whether a delivery from a consumer of partition part is
// served elsewhere and is to be acked without work: a partition consumer's
// job of an authority with a lane, or a catch-up consumer's job past the
// sequence it covers.
func (l *laneSet) covered(consumer string, seq uint64, subject string) bool {
	if l == nil || l.stream == nil || l.active.Load() == 0 {
		return false // the common case: no lane, no catch-up
	}
	part, _, akey, err := jobs.ParsePartitionSubject(subject)
	if err != nil {
		return false
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if consumer == jobs.PartitionConsumer(part) {
		ln := l.byKey[laneKey{part, akey}]
		if ln != nil && seq >= ln.start {
			l.skipSoonLocked(part)
			return true
		}
		return false
	}
	if c := l.catchups[consumer]; c != nil {
		return seq > c.until
	}
	return false
}

// isLane reports whether a consumer name is a lane's.
func isLane(consumer string) bool { return strings.HasPrefix(consumer, jobs.LaneConsumerPrefix) }

// run pulls the lanes whose authority is ready, and refreshes what the
// lanes hold, while ctx lasts (partitioned mode; Worker.Run starts it).
func (l *laneSet) run(ctx context.Context) {
	const period = 100 * time.Millisecond
	lastRefresh := l.d.clk.Now()
	for {
		t := l.d.clk.NewTimer(period)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C():
		}
		l.serveReady(ctx)
		if now := l.d.clk.Now(); now.Sub(lastRefresh) >= 2*time.Second {
			lastRefresh = now
			l.refresh() // one consumer info per lane
		}
	}
}

// consider opens a lane for auth in partition part, in the background,
// when the partition's consumer has a large backlog ahead: called when a
// job of auth must wait longer than ParkAfter.
func (l *laneSet) consider(part int, auth, akey string) {
	if l == nil || l.stream == nil || !l.d.parts.owns(part) { // no stream: lanes are off
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.byKey[laneKey{part, akey}] != nil {
		l.skipSoonLocked(part)
		return
	}
	n := 0
	for k := range l.byKey {
		if k.part == part {
			n++
		}
	}
	if n >= maxLanesPerPartition {
		return
	}
	l.startLocked(part, func(ctx context.Context) error {
		if err := l.openLane(ctx, part, auth, akey); err != nil {
			return err
		}
		return l.skipPast(ctx, part)
	})
}

// skipSoonLocked repeats the skip of a partition with lanes when its
// consumer has fallen behind again.
func (l *laneSet) skipSoonLocked(part int) {
	l.startLocked(part, func(ctx context.Context) error { return l.skipPast(ctx, part) })
}

// startLocked runs a skip step of a partition in the background, one at a
// time and at most once per laneRetry.
func (l *laneSet) startLocked(part int, f func(ctx context.Context) error) {
	now := l.d.clk.Now()
	if l.busy[part] || now.Sub(l.tried[part]) < laneRetry {
		return
	}
	l.busy[part], l.tried[part] = true, now
	l.opening.Add(1)
	go func() {
		defer l.opening.Done()
		defer func() {
			l.mu.Lock()
			delete(l.busy, part)
			l.mu.Unlock()
		}()
		ctx, cancel := context.WithTimeout(l.d.parts.lifetime(), 30*time.Second)
		defer cancel()
		if err := f(ctx); err != nil {
			l.d.log.Warn().Err(err).Int("partition", part).
				Msg("skip a cooling authority's backlog; the partition consumer reads through it instead")
		}
	}()
}

// backlogAhead returns partition part's consumer info and how many jobs
// are ahead of it (pending and ack pending).
func (l *laneSet) backlogAhead(ctx context.Context, part int) (*jetstream.ConsumerInfo, uint64, error) {
	main, err := l.d.js.Consumer(ctx, jobs.JobsStream, jobs.PartitionConsumer(part))
	if err != nil {
		return nil, 0, err
	}
	mi := main.CachedInfo() // fetched by Consumer just now
	return mi, mi.NumPending + uint64(mi.NumAckPending), nil
}

// laneConfig returns the configuration of a lane or catch-up consumer: the
// partition consumer's, from stream sequence start, with its own filter.
func laneConfig(base jetstream.ConsumerConfig, name, desc string, start uint64, meta map[string]string) jetstream.ConsumerConfig {
	c := base
	c.Name, c.Durable, c.Description = name, name, desc
	c.FilterSubject, c.FilterSubjects = "", nil
	c.DeliverPolicy, c.OptStartSeq, c.OptStartTime = jetstream.DeliverByStartSequencePolicy, start, nil
	c.Metadata = meta
	return c
}

// openLane creates the lane of auth in partition part (step 1), from the
// partition consumer's ack floor on.
func (l *laneSet) openLane(ctx context.Context, part int, auth, akey string) error {
	mi, ahead, err := l.backlogAhead(ctx, part)
	if err != nil || ahead < uint64(l.d.backlog) {
		return err // little ahead: parking one by one is cheap enough
	}
	floor := mi.AckFloor.Stream
	lc := laneConfig(mi.Config, jobs.LaneConsumer(part, akey), fmt.Sprintf("mirrorworker: backlog of cooling %s in partition %d", auth, part),
		floor+1, map[string]string{jobs.MetaAuthority: auth, jobs.MetaAkey: akey})
	lc.FilterSubject = jobs.LaneFilter(part, akey)
	lcons, err := l.d.js.CreateConsumer(ctx, jobs.JobsStream, lc)
	if err != nil {
		return fmt.Errorf("create lane: %w", err)
	}
	if l.addLane(&authLane{part: part, auth: auth, akey: akey, start: floor + 1, cons: lcons}) {
		l.d.m.Parks.WithLabelValues("lane").Inc()
		l.d.log.Info().Int("partition", part).Str("authority", auth).Uint64("from", floor+1).
			Msg("cooling authority's backlog moved to a lane: it waits there, unread, until the authority can take requests")
	}
	return nil
}

// skipPast runs steps 2 and 3 for partition part: a catch-up consumer for the
// jobs of its authorities without a lane up to the stream's last sequence,
// then the partition consumer reset past it.
func (l *laneSet) skipPast(ctx context.Context, part int) error {
	l.mu.Lock()
	laned := map[string]bool{}
	for k := range l.byKey {
		if k.part == part {
			laned[k.akey] = true
		}
	}
	active := 0
	for _, c := range l.catchups {
		if c.part == part {
			active++
		}
	}
	l.mu.Unlock()
	if len(laned) == 0 {
		return nil // no lane (none opened, or closed since): nothing to skip
	}
	// Why a skip was not done, for an operator asking why a partition
	// consumer still reads through a lane's backlog (debug: a partition
	// with lanes may look every laneRetry).
	notSkipped := func(reason string) *zerolog.Event {
		return l.d.log.Debug().Int("partition", part).Str("reason", reason)
	}
	if active >= maxCatchups {
		notSkipped("catch-up consumers at their bound").Int("catchups", active).Msg("partition consumer not skipped")
		return nil
	}
	// Once a lane exists, skipping is cheap: skip again as soon as the
	// consumer is a little behind (an eighth of the lane threshold).
	mi, ahead, err := l.backlogAhead(ctx, part)
	if err != nil {
		return err
	}
	if threshold := max(l.d.backlog/8, 1); ahead < uint64(threshold) {
		notSkipped("little ahead").Uint64("ahead", ahead).Int("threshold", threshold).Msg("partition consumer not skipped")
		return nil
	}
	floor := mi.AckFloor.Stream
	// The last sequence first, then the subjects: every message up to it
	// has its subject in the list.
	si, err := l.stream.Info(ctx)
	if err != nil {
		return err
	}
	last := si.State.LastSeq
	if last <= floor {
		notSkipped("nothing past the ack floor").Uint64("ack_floor", floor).Uint64("last", last).Msg("partition consumer not skipped")
		return nil
	}
	si, err = l.stream.Info(ctx, jetstream.WithSubjectFilter(jobs.PartitionFilter(part)))
	if err != nil {
		return err
	}
	var others []string
	for subj := range si.State.Subjects {
		if _, _, k, err := jobs.ParsePartitionSubject(subj); err == nil && laned[k] {
			continue
		}
		others = append(others, subj)
	}
	if len(others) > maxCatchupSubjects {
		return fmt.Errorf("partition %d holds %d subjects, more than a catch-up consumer takes (%d)", part, len(others), maxCatchupSubjects)
	}
	// 2. The others, up to last.
	if len(others) > 0 {
		name := jobs.CatchupConsumer(part, last)
		cc := laneConfig(mi.Config, name, fmt.Sprintf("mirrorworker: jobs of partition %d up to sequence %d, skipped with its lanes", part, last),
			floor+1, map[string]string{jobs.MetaUntil: strconv.FormatUint(last, 10)})
		if len(others) == 1 {
			cc.FilterSubject = others[0]
		} else {
			cc.FilterSubjects = others
		}
		ccons, err := l.d.js.CreateConsumer(ctx, jobs.JobsStream, cc)
		if err != nil {
			return fmt.Errorf("create catch-up consumer: %w", err)
		}
		if !l.startCatchup(part, ccons, last) {
			// The partition was given up: its new owner serves it.
			notSkipped("partition given up").Msg("partition consumer not skipped")
			return nil
		}
	}
	// 3. Skip: only while this pod still owns the partition.
	if !l.d.parts.owns(part) {
		notSkipped("partition given up").Msg("partition consumer not skipped")
		return nil
	}
	l.d.fault.reached("lane-before-reset")
	if _, err := l.d.js.ResetConsumerToSequence(ctx, jobs.JobsStream, jobs.PartitionConsumer(part), last+1); err != nil {
		// An older server: the lanes still take their authorities' jobs off
		// the partition consumer (acked unread), without the skip.
		return fmt.Errorf("reset the partition consumer past the backlog (needs nats-server 2.14 or later): %w", err)
	}
	l.d.m.Parks.WithLabelValues("skip").Inc()
	l.d.log.Info().Int("partition", part).Uint64("from", floor+1).Uint64("to", last).Int("other_subjects", len(others)).
		Msg("partition consumer skipped its lanes' backlog")
	return nil
}

// addLane registers a lane of a partition served; false when it is not.
func (l *laneSet) addLane(ln *authLane) bool {
	if l.d.parts.lookup(ln.part) == nil {
		return false
	}
	k := laneKey{ln.part, ln.akey}
	l.mu.Lock()
	if old := l.byKey[k]; old != nil {
		l.d.m.ParkedJobs.WithLabelValues(l.d.m.hostPort(old.auth)).Sub(float64(old.n))
	}
	l.byKey[k] = ln
	l.countLocked()
	l.mu.Unlock()
	l.setCount(ln, ln.cons.CachedInfo()) // just created or looked up
	return true
}

// refreshOne reads how many jobs wait in a lane.
func (l *laneSet) refreshOne(ln *authLane) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	info, err := ln.cons.Info(ctx)
	if err != nil {
		return
	}
	l.setCount(ln, info)
}

// setCount records how many jobs wait in a lane, from its consumer's info.
func (l *laneSet) setCount(ln *authLane, info *jetstream.ConsumerInfo) {
	if info == nil {
		return
	}
	n := int64(info.NumPending) + int64(info.NumAckPending)
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.byKey[laneKey{ln.part, ln.akey}] == ln {
		l.d.m.ParkedJobs.WithLabelValues(l.d.m.hostPort(ln.auth)).Add(float64(n - ln.n))
		ln.n = n
	}
}

// startCatchup serves a catch-up consumer until everything it holds up to
// until is acked, then deletes it; false when the partition is not served.
func (l *laneSet) startCatchup(part int, c jetstream.Consumer, until uint64) bool {
	pt := l.d.parts.lookup(part)
	if pt == nil {
		return false
	}
	ctx, stop := context.WithCancel(pt.ictx)
	name := c.CachedInfo().Name
	cu := &catchup{part: part, until: until, cons: c, stop: stop, done: make(chan struct{})}
	l.mu.Lock()
	if l.catchups[name] != nil {
		l.mu.Unlock()
		stop()
		return true
	}
	l.catchups[name] = cu
	l.countLocked()
	l.mu.Unlock()
	l.d.loops.Add(1)
	go func() {
		defer l.d.loops.Done()
		defer close(cu.done)
		intake := make(chan struct{})
		go func() { defer close(intake); l.d.pull(ctx, c, part) }()
		for clock.Sleep(l.d.clk, 250*time.Millisecond, ctx.Done()) {
			ictx, cancel := context.WithTimeout(ctx, 5*time.Second)
			info, err := c.Info(ictx)
			cancel()
			// Done when nothing up to until is left: all of it delivered
			// (or none left to deliver) and acked. The pending count is
			// exact for that range: every job up to until was stored
			// before the consumer was created, which counts from the
			// store; only jobs stored later are counted late (ADR 0028).
			if err != nil || info.NumAckPending > 0 || (info.NumPending > 0 && info.Delivered.Stream < until) {
				continue
			}
			stop()
			<-intake
			dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
			if err := l.d.js.DeleteConsumer(dctx, jobs.JobsStream, name); err != nil && !errors.Is(err, jetstream.ErrConsumerNotFound) {
				l.d.log.Warn().Err(err).Int("partition", part).Msg("delete a finished catch-up consumer")
			}
			cancel()
			l.mu.Lock()
			if l.catchups[name] == cu {
				delete(l.catchups, name)
				l.countLocked()
			}
			l.mu.Unlock()
			l.d.log.Info().Int("partition", part).Uint64("until", until).Msg("caught up with the jobs skipped along with a lane")
			return
		}
		stop()
		<-intake
	}()
	return true
}

// partitionAdded finds the lanes and the catch-up consumer of a partition
// taken over, before its consumer is pulled.
func (l *laneSet) partitionAdded(ctx context.Context, part int) {
	if l == nil || l.stream == nil {
		return
	}
	lp, cp := jobs.LanePrefix(part), jobs.CatchupPrefix(part)
	names := l.stream.ConsumerNames(ctx)
	var found []string
	for name := range names.Name() {
		if strings.HasPrefix(name, lp) || strings.HasPrefix(name, cp) {
			found = append(found, name)
		}
	}
	if err := names.Err(); err != nil {
		l.d.log.Warn().Err(err).Int("partition", part).Msg("list the partition's lanes; their authorities' jobs may be served twice")
	}
	for _, name := range found {
		c, err := l.stream.Consumer(ctx, name)
		if err != nil {
			continue
		}
		cfg := c.CachedInfo().Config
		if strings.HasPrefix(name, cp) {
			until, err := strconv.ParseUint(cfg.Metadata[jobs.MetaUntil], 10, 64)
			if err == nil {
				l.startCatchup(part, c, until)
			}
			continue
		}
		auth, akey := cfg.Metadata[jobs.MetaAuthority], cfg.Metadata[jobs.MetaAkey]
		if auth == "" || akey == "" {
			continue
		}
		l.addLane(&authLane{part: part, auth: auth, akey: akey, start: max(cfg.OptStartSeq, 1), cons: c})
	}
}

// partitionRemoved forgets a partition given up (its intake has stopped):
// its new owner serves its lanes and catch-up.
func (l *laneSet) partitionRemoved(part int) {
	if l == nil {
		return
	}
	l.mu.Lock()
	var cus []*catchup
	for name, cu := range l.catchups {
		if cu.part == part {
			cus = append(cus, cu)
			delete(l.catchups, name)
			l.countLocked()
		}
	}
	for k, ln := range l.byKey {
		if k.part == part {
			l.d.m.ParkedJobs.WithLabelValues(l.d.m.hostPort(ln.auth)).Sub(float64(ln.n))
			delete(l.byKey, k)
			l.countLocked()
		}
	}
	l.mu.Unlock()
	for _, cu := range cus {
		cu.stop()
		<-cu.done
	}
}

// serveReady pulls from the lane of every authority that can take
// requests within HoldMax as many jobs as it can start in that time (the
// probe alone while one is due), and deletes the lanes that are empty.
func (l *laneSet) serveReady(ctx context.Context) {
	if l == nil || l.stream == nil {
		return
	}
	now := l.d.clk.Now()
	type pull struct {
		ln *authLane
		k  int
	}
	var pulls []pull
	l.mu.Lock()
	for _, ln := range l.byKey {
		if !l.d.parts.owns(ln.part) {
			continue
		}
		k, ok := startable(l.d.readyIn, l.d.holdMax, now, ln.auth, max(1, l.d.maxPerAuth/2))
		if !ok {
			continue
		}
		pulls = append(pulls, pull{ln, k})
	}
	l.mu.Unlock()
	for _, p := range pulls {
		k := min(p.k-l.d.sched.pipeline(p.ln.auth), 256)
		if k <= 0 {
			continue
		}
		batch, err := p.ln.cons.Fetch(k, jetstream.FetchMaxWait(100*time.Millisecond))
		if err != nil {
			l.d.log.Debug().Err(err).Str("authority", p.ln.auth).Msg("pull from a lane")
			continue
		}
		got := 0
		for m := range batch.Messages() {
			got++
			l.d.deliver(ctx, m)
		}
		l.mu.Lock()
		if got > 0 {
			l.d.m.ParkedJobs.WithLabelValues(l.d.m.hostPort(p.ln.auth)).Sub(float64(min(int64(got), p.ln.n)))
			p.ln.n = max(p.ln.n-int64(got), 0)
			l.mu.Unlock()
			continue
		}
		l.mu.Unlock()
		l.closeIfEmpty(ctx, p.ln)
	}
}

// closeIfEmpty deletes a lane that holds nothing: first the partition
// consumer serves the authority again, then the lane goes. A job that
// arrives in between may be served by both (a duplicate, never a loss).
// Empty is read from the stream's store (jobs.Drained), not from the
// lane's pending count alone: a job just stored that the partition
// consumer has already skipped may not be counted in the lane yet.
func (l *laneSet) closeIfEmpty(ctx context.Context, ln *authLane) {
	empty := func() bool {
		ictx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		info, err := ln.cons.Info(ictx)
		if err != nil {
			return false
		}
		drained, err := jobs.Drained(ictx, l.stream, info)
		return err == nil && drained
	}
	if !empty() {
		return
	}
	k := laneKey{ln.part, ln.akey}
	l.mu.Lock()
	if l.byKey[k] != ln {
		l.mu.Unlock()
		return
	}
	delete(l.byKey, k)
	l.countLocked()
	l.d.m.ParkedJobs.WithLabelValues(l.d.m.hostPort(ln.auth)).Sub(float64(ln.n))
	l.mu.Unlock()
	if !empty() {
		l.mu.Lock()
		if l.byKey[k] == nil {
			l.byKey[k] = ln
			l.countLocked()
			ln.n = 0
		}
		l.mu.Unlock()
		return
	}
	dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	if err := l.d.js.DeleteConsumer(dctx, jobs.JobsStream, ln.cons.CachedInfo().Name); err != nil && !errors.Is(err, jetstream.ErrConsumerNotFound) {
		l.d.log.Warn().Err(err).Str("authority", ln.auth).Msg("delete an empty lane")
		return
	}
	l.d.log.Info().Int("partition", ln.part).Str("authority", ln.auth).Msg("lane drained; the partition consumer serves the authority again")
}

// has reports whether auth has a lane in partition part.
func (l *laneSet) hasLane(part int, akey string) bool {
	if l == nil {
		return false
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.byKey[laneKey{part, akey}] != nil
}

// laneFor returns the lane covering a job of partition part, authority key
// akey at stream sequence seq, if any.
func (l *laneSet) laneFor(part int, akey string, seq uint64) *authLane {
	if l == nil {
		return nil
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if ln := l.byKey[laneKey{part, akey}]; ln != nil && seq >= ln.start {
		return ln
	}
	return nil
}

// refresh re-reads the lanes' sizes (for status and the metrics).
func (l *laneSet) refresh() {
	if l == nil {
		return
	}
	l.mu.Lock()
	all := make([]*authLane, 0, len(l.byKey))
	for _, ln := range l.byKey {
		all = append(all, ln)
	}
	l.mu.Unlock()
	for _, ln := range all {
		l.refreshOne(ln)
	}
}

// counts adds the jobs waiting in lanes per authority to out.
func (l *laneSet) addCounts(out map[string]int64) {
	if l == nil {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, ln := range l.byKey {
		if ln.n > 0 {
			out[ln.auth] += ln.n
		}
	}
}

// wait returns once no lane is being opened.
func (l *laneSet) wait() {
	if l != nil {
		l.opening.Wait()
	}
}
