package worker

import (
	"context"
	"errors"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/mirrorworker/mirrorworker/clock"
	"github.com/mirrorworker/mirrorworker/jobs"
)

// parking moves the jobs of an authority that cannot take them for a long
// while out of the consumer, into MIRROR_PARKED, where they hold no
// ack-pending slot, no memory and are not redelivered; and brings them back
// into the authority's partition of MIRROR_JOBS (marked as a copy, which
// replay skips), a few at a time, when the pacer says the
// authority can take requests again (docs/adr/0007). Only in partitioned
// mode; otherwise every method is a no-op. Safe for concurrent use.
type parking struct {
	d      parkDeps
	stream jetstream.Stream // MIRROR_PARKED; nil: parking is off

	mu    sync.Mutex
	auths map[string]*parkedAuth // by authority, for the partitions served
	naks  map[string][]time.Time // due times of NAK deferrals not yet due

	pending sync.WaitGroup // parks published, not yet settled
	kick    chan struct{}
	started atomic.Int64 // parks begun, for the intake's pacing
}

// parkedAuth is what the worker knows of one authority's parked jobs.
type parkedAuth struct {
	part int
	akey string
	// n is how many are parked (a hint: the stream is the truth; n is
	// corrected whenever a read finds none).
	n      int64
	cursor uint64 // next stream sequence to look at
	// transit counts jobs brought back but not yet delivered here again.
	transit   int
	transitAt time.Time
}

// parkDeps are what parking needs, and nothing of the Worker: the stream,
// a read-only view of the scheduler, which authorities have a lane, the
// pacer's readiness, the partitions served, and where a park's outcome is
// reported.
type parkDeps struct {
	js         jetstream.JetStream
	clk        clock.Clock
	log        zerolog.Logger
	m          *Metrics
	sched      *scheduler // deliveries and jobs on the way of an authority
	lanes      *laneSet   // which authorities have a lane (their parked jobs go to it)
	readyIn    readyInFunc
	parts      *servedParts // the partitions served, and whether each is still this pod's
	fault      faultHook
	holdMax    time.Duration
	maxPerAuth int
	// parked reports a park's outcome: err is nil once MIRROR_PARKED has
	// stored the job (the caller acks the delivery and counts the
	// deferral), else the publish's error (the caller defers the job by
	// NAK instead).
	parked func(d deferral, err error)
}

func newParking(d parkDeps) *parking {
	return &parking{d: d, auths: map[string]*parkedAuth{}, naks: map[string][]time.Time{}, kick: make(chan struct{}, 1)}
}

// open binds MIRROR_PARKED (partitioned mode).
func (p *parking) open(ctx context.Context) error {
	s, err := p.d.js.Stream(ctx, jobs.ParkStream)
	if err != nil {
		return errors.Join(errors.New("worker: stream "+jobs.ParkStream), err)
	}
	p.stream = s
	return nil
}

// on reports whether parking is open (partitioned mode).
func (p *parking) on() bool { return p != nil && p.stream != nil }

// outstanding returns how many NAK deferrals of auth are not yet due (0
// when parking is off).
func (p *parking) outstanding(auth string) int {
	if !p.on() {
		return 0
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.outstandingLocked(auth, p.d.clk.Now())
}

// nakked records a NAK deferral of auth due after delay.
func (p *parking) nakked(auth string, delay time.Duration) {
	if p == nil || p.stream == nil {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.outstandingLocked(auth, p.d.clk.Now())
	p.naks[auth] = append(p.naks[auth], p.d.clk.Now().Add(delay))
}

// outstandingLocked trims auth's NAK deferrals that are due and returns
// how many are left (each holds an ack-pending slot until redelivered).
func (p *parking) outstandingLocked(auth string, now time.Time) int {
	ds := p.naks[auth]
	k := 0
	for _, t := range ds {
		if t.After(now) {
			ds[k] = t
			k++
		}
	}
	if k == 0 {
		delete(p.naks, auth)
		return 0
	}
	p.naks[auth] = ds[:k]
	return k
}

// park publishes the job to MIRROR_PARKED and acks its delivery once the
// stream has stored it; if the publish fails, the job is NAKed with the
// deferral's delay instead. Never lost: a crash before the ack redelivers
// the job, which may then be parked twice (a duplicate is harmless, since
// writes are idempotent).
func (p *parking) park(d deferral) {
	w := p.d
	j := d.job
	akey := j.job.Authority.Key()
	m := nats.NewMsg(jobs.ParkSubject(j.part, j.job.Tenant, akey))
	m.Data = j.data
	m.Header.Set(jobs.HeaderDeliveries, strconv.FormatUint(w.sched.deliveries(j), 10))
	m.Header.Set(jobs.HeaderParkedAt, w.clk.Now().UTC().Format(time.RFC3339Nano))
	if j.seq < 1<<63 {
		m.Header.Set(jobs.HeaderSeq, strconv.FormatUint(j.seq, 10))
	}
	setContinuation(m.Header, j)
	jobs.SetEnqueued(m.Header, enqueuedOf(w.sched.msgOf(j)))
	p.started.Add(1)
	fut, err := w.js.PublishMsgAsync(m)
	if err != nil {
		p.parkFailed(d, err)
		return
	}
	p.pending.Add(1)
	go func() {
		defer p.pending.Done()
		select {
		case <-fut.Ok():
		case err := <-fut.Err():
			p.parkFailed(d, err)
			return
		}
		w.fault.reached("parked-before-ack")
		w.parked(d, nil) // acked and counted by the caller
		p.mu.Lock()
		pa := p.authLocked(j.auth, j.part, akey)
		pa.n++
		p.mu.Unlock()
		w.m.Parks.WithLabelValues("parked").Inc()
		w.m.ParkedJobs.WithLabelValues(w.m.hostPort(j.auth)).Inc()
		w.log.Debug().Str("job", j.job.ID).Str("authority", j.auth).Str("reason", string(d.reason)).
			Dur("wait", d.delay).Msg("job parked")
	}()
}

func (p *parking) parkFailed(d deferral, err error) {
	p.d.log.Warn().Err(err).Str("job", d.job.job.ID).Str("authority", d.job.auth).
		Msg("park job failed; deferring it by NAK instead")
	p.d.parked(d, err)
}

// wait returns once every park in progress is settled.
func (p *parking) wait() {
	if p != nil {
		p.pending.Wait()
	}
}

func (p *parking) authLocked(auth string, part int, akey string) *parkedAuth {
	pa := p.auths[auth]
	if pa == nil {
		pa = &parkedAuth{part: part, akey: akey, cursor: 1}
		p.auths[auth] = pa
	}
	return pa
}

// arrived notes that a job brought back for auth was delivered.
func (p *parking) arrived(auth string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if pa := p.auths[auth]; pa != nil && pa.transit > 0 {
		pa.transit--
	}
}

// partitionAdded learns the parked jobs of a partition taken over.
func (p *parking) partitionAdded(part int) {
	if p.stream == nil {
		return
	}
	p.rescan(part)
	p.poke()
}

// partitionRemoved forgets a partition given up: its new owner brings its
// parked jobs back.
func (p *parking) partitionRemoved(part int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for auth, pa := range p.auths {
		if pa.part == part {
			p.d.m.ParkedJobs.WithLabelValues(p.d.m.hostPort(auth)).Sub(float64(pa.n))
			delete(p.auths, auth)
		}
	}
}

// rescan reads how many jobs each authority of a partition has parked.
func (p *parking) rescan(part int) {
	w := p.d
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	info, err := p.stream.Info(ctx, jetstream.WithSubjectFilter(jobs.ParkFilter(part, "")))
	if err != nil {
		w.log.Warn().Err(err).Int("partition", part).Msg("read parked jobs")
		return
	}
	byKey := map[string]int64{}
	for subj, n := range info.State.Subjects {
		if _, _, akey, err := jobs.ParsePartitionSubject(subj); err == nil {
			byKey[akey] += int64(n)
		}
	}
	for akey, n := range byKey {
		// The authority's name is in its jobs, not in its key.
		rm, err := p.stream.GetMsg(ctx, 1, jetstream.WithGetMsgSubject(jobs.ParkFilter(part, akey)))
		if err != nil {
			continue
		}
		job, err := jobs.Parse(rm.Data)
		if err != nil {
			continue
		}
		auth := job.Authority.String()
		p.mu.Lock()
		pa := p.authLocked(auth, part, akey)
		if n > pa.n {
			w.m.ParkedJobs.WithLabelValues(w.m.hostPort(auth)).Add(float64(n - pa.n))
			pa.n = n
		}
		p.mu.Unlock()
	}
}

func (p *parking) poke() {
	select {
	case p.kick <- struct{}{}:
	default:
	}
}

// run brings parked jobs back while ctx lasts.
func (p *parking) run(ctx context.Context) {
	const period = 100 * time.Millisecond
	rescanEvery := 30 * time.Second
	lastScan := p.d.clk.Now()
	for {
		t := p.d.clk.NewTimer(period)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-p.kick:
		case <-t.C():
		}
		t.Stop()
		p.unparkReady(ctx)
		if now := p.d.clk.Now(); now.Sub(lastScan) >= rescanEvery {
			lastScan = now
			for _, part := range p.d.parts.list() {
				p.rescan(part)
			}
		}
	}
}

// unparkReady brings back jobs of every authority that can take requests
// within HoldMax and has room in memory: at most half its queue cap in
// memory or on the way, and only the probe while its cooldown awaits one,
// so that parked jobs never return as a burst.
func (p *parking) unparkReady(ctx context.Context) {
	w := p.d
	now := w.clk.Now()
	want := max(1, w.maxPerAuth/2)
	type move struct {
		auth  string
		pa    *parkedAuth
		k     int
		laned bool
	}
	var moves []move
	p.mu.Lock()
	for auth, pa := range p.auths {
		if !w.parts.owns(pa.part) {
			continue
		}
		if w.lanes.hasLane(pa.part, pa.akey) {
			// The authority has a lane: its parked jobs go back into their
			// partition, where the lane (which the pacer paces) takes them,
			// or are dropped when the lane has them already.
			moves = append(moves, move{auth: auth, pa: pa, k: 64, laned: true})
			continue
		}
		if pa.transit > 0 && now.Sub(pa.transitAt) > 30*time.Second {
			pa.transit = 0 // delivered elsewhere or lost in transit: recount
		}
		room, ok := startable(w.readyIn, w.holdMax, now, auth, want)
		if !ok {
			continue
		}
		k := room - pa.transit
		if k <= 0 {
			continue
		}
		moves = append(moves, move{auth: auth, pa: pa, k: k})
	}
	p.mu.Unlock()
	for _, mv := range moves {
		k := mv.k
		if !mv.laned {
			k -= w.sched.pipeline(mv.auth)
		}
		for i := 0; i < min(k, 64) && ctx.Err() == nil; i++ {
			if !p.unparkOne(ctx, mv.auth, mv.pa, !mv.laned) {
				break
			}
		}
	}
}

// unparkOne moves the oldest parked job of auth back into its partition.
// It publishes before it deletes: a crash in between leaves a duplicate,
// never a loss.
// With counted, the copy counts in the authority's transit until it is
// delivered; an authority with a lane takes its copies through the lane,
// which the pacer paces, so they are not counted.
func (p *parking) unparkOne(ctx context.Context, auth string, pa *parkedAuth, counted bool) bool {
	// Parked copies that a lane covers are dropped on the way, without
	// using up the authority's room (at most a bounded number per call).
	for range 1024 {
		if moved, dropped := p.unparkNext(ctx, auth, pa, counted); !dropped {
			return moved
		}
	}
	return true
}

// unparkNext moves the oldest parked job of auth back, or drops it when a
// lane has it as well (dropped).
func (p *parking) unparkNext(ctx context.Context, auth string, pa *parkedAuth, counted bool) (moved, dropped bool) {
	w := p.d
	p.mu.Lock()
	part, akey, cursor := pa.part, pa.akey, pa.cursor
	p.mu.Unlock()
	rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	rm, err := p.stream.GetMsg(rctx, max(cursor, 1), jetstream.WithGetMsgSubject(jobs.ParkFilter(part, akey)))
	if err != nil {
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			p.mu.Lock()
			w.m.ParkedJobs.WithLabelValues(w.m.hostPort(auth)).Sub(float64(pa.n))
			if p.auths[auth] == pa {
				delete(p.auths, auth)
			}
			p.mu.Unlock()
		} else {
			w.log.Warn().Err(err).Str("authority", auth).Msg("read parked job")
		}
		return false, false
	}
	if seq, err := strconv.ParseUint(rm.Header.Get(jobs.HeaderSeq), 10, 64); err == nil && w.lanes.laneFor(part, akey, seq) != nil {
		// A lane has this job as well: drop the parked copy.
		if err := p.stream.DeleteMsg(rctx, rm.Sequence); err != nil && !errors.Is(err, jetstream.ErrMsgNotFound) {
			w.log.Warn().Err(err).Uint64("seq", rm.Sequence).Msg("delete parked job a lane covers")
			return false, false
		}
		p.taken(pa, auth, rm.Sequence)
		return false, true
	}
	_, tenant, _, err := jobs.ParsePartitionSubject(rm.Subject)
	if err != nil {
		tenant = jobs.InvalidToken
	}
	m := nats.NewMsg(jobs.PartitionedSubject(part, tenant, akey))
	m.Data = rm.Data
	for _, k := range []string{jobs.HeaderDeliveries, jobs.HeaderContinues, jobs.HeaderHops, jobs.HeaderEnqueued} {
		if v := rm.Header.Get(k); v != "" {
			m.Header.Set(k, v)
		}
	}
	jobs.CopyReplayHeaders(m.Header, rm.Header)
	m.Header.Set(jobs.HeaderUnparked, "parked")
	// Counted in transit before the publish: the job can be delivered (and
	// counted as arrived) before PublishMsg returns.
	if counted {
		p.mu.Lock()
		pa.transit++
		pa.transitAt = w.clk.Now()
		p.mu.Unlock()
	}
	if _, err := w.js.PublishMsg(rctx, m); err != nil {
		w.log.Warn().Err(err).Str("authority", auth).Msg("bring parked job back")
		if counted {
			p.mu.Lock()
			pa.transit = max(pa.transit-1, 0)
			p.mu.Unlock()
		}
		return false, false
	}
	w.fault.reached("unparked-before-delete")
	if err := p.stream.DeleteMsg(rctx, rm.Sequence); err != nil && !errors.Is(err, jetstream.ErrMsgNotFound) {
		w.log.Warn().Err(err).Uint64("seq", rm.Sequence).Msg("delete parked job (it may come back once more)")
	}
	p.taken(pa, auth, rm.Sequence)
	w.m.Parks.WithLabelValues("unparked").Inc()
	return true, false
}

// taken moves auth's cursor past the parked message at seq, which is gone.
func (p *parking) taken(pa *parkedAuth, auth string, seq uint64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	pa.cursor = seq + 1
	if pa.n > 0 {
		pa.n--
		p.d.m.ParkedJobs.WithLabelValues(p.d.m.hostPort(auth)).Dec()
	}
}

// counts returns the parked jobs per authority (a hint, see parkedAuth.n).
func (p *parking) parkedCounts() map[string]int64 {
	if p == nil {
		return nil
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make(map[string]int64, len(p.auths))
	for auth, pa := range p.auths {
		if pa.n > 0 {
			out[auth] = pa.n
		}
	}
	return out
}
