package replay

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/mirrorworker/mirrorworker/jobs"
)

// A replay beside live pods hands its jobs to them (docs/adr/0025): the pod
// that owns an authority's partition decides when each of its requests
// starts, live jobs first, so the origin sees one pace whoever asked. The
// replay keeps the backlog itself (its consumer's messages, held and not
// acked) and has at most Window jobs of each authority in the pods' queues
// at once: a live job never waits behind a replay's backlog in the stream,
// only behind the few replay jobs its authority holds, which it overtakes.

// DefaultWindow is the default of HandoverOptions.Window.
const DefaultWindow = 4

// HandoverOptions configure Handover. Zero fields are the defaults.
type HandoverOptions struct {
	// Run names the replay run (jobs.ValidReplayRun); Target is the
	// canonical spec of the target the pods store its jobs into.
	Run, Target string
	// Window is how many jobs of one authority are in the pods' queues at
	// once; DefaultWindow.
	Window int
	// AckWait is the replay consumer's; held messages are kept in progress
	// at a third of it. Patience is how long a handed-over job may take
	// before it is handed over again (its report lost, say); 10 min.
	AckWait, Patience time.Duration
	// OnDone is told every pod's report (the replay's summary counts them).
	OnDone func(jobs.ReplayDone)
	// Batch is how many messages a pull asks for; 256.
	Batch int
	// Base, if set, is the entry of a replay that paced alone until now
	// (Alone): its start, counts, AloneUntil and LastStarts are kept.
	Base   *jobs.ReplayRun
	Logger zerolog.Logger
}

// ErrNoPodTakes is returned by CheckPods when no live pod takes replay jobs
// into the target.
var ErrNoPodTakes = errors.New("no live pod takes replay jobs into this target")

// LivePods returns the pods announced in jobs.PodsBucket and the replay
// targets each takes (its status's replay_targets); none when the bucket
// does not exist.
func LivePods(ctx context.Context, js jetstream.JetStream) (map[string][]string, error) {
	kv, err := js.KeyValue(ctx, jobs.PodsBucket)
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		return nil, nil
	} else if err != nil {
		return nil, fmt.Errorf("bucket %s: %w", jobs.PodsBucket, err)
	}
	// The part of a worker.PodStatus a replay reads.
	type podStatus struct {
		Pod           string   `json:"pod"`
		ReplayTargets []string `json:"replay_targets"`
	}
	pods, err := jobs.Entries[podStatus](ctx, kv)
	if err != nil {
		return nil, fmt.Errorf("list pods: %w", err)
	}
	out := map[string][]string{}
	for _, st := range pods {
		if st.Pod != "" {
			out[st.Pod] = st.ReplayTargets
		}
	}
	return out, nil
}

// CheckPods returns an error wrapping ErrNoPodTakes, naming the pods, when
// any live pod does not take replay jobs into target: every pod may own an
// authority of the replay.
func CheckPods(pods map[string][]string, target string) error {
	var refuse []string
	for p, ts := range pods {
		ok := false
		for _, t := range ts {
			ok = ok || t == target
		}
		if !ok {
			refuse = append(refuse, p)
		}
	}
	if len(refuse) == 0 {
		return nil
	}
	sort.Strings(refuse)
	return fmt.Errorf("%w: pods %v do not (restart them with --replay-target %s, or stop them and the replay does the work itself)", ErrNoPodTakes, refuse, target)
}

// EnsureReplaysBucket creates jobs.ReplaysBucket when it is missing.
func EnsureReplaysBucket(ctx context.Context, js jetstream.JetStream, replicas int) (jetstream.KeyValue, error) {
	kv, err := js.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: jobs.ReplaysBucket,
		Description: "mirrorworker replays handing their jobs to the pods", History: 1, TTL: jobs.ReplaysTTL,
		Storage: jetstream.FileStorage, Replicas: max(replicas, 1)})
	if err != nil {
		return nil, fmt.Errorf("create or update bucket %s: %w", jobs.ReplaysBucket, err)
	}
	return kv, nil
}

// handover is one run's state, owned by the goroutine of its run loop
// (pull only feeds it messages): no lock.
type handover struct {
	js  jetstream.JetStream
	kv  jetstream.KeyValue
	o   HandoverOptions
	log zerolog.Logger

	auths   map[string]*handAuth
	dirty   map[*handAuth]bool // authorities that may have room and jobs held
	held    map[uint64]bool    // stream sequences held, not yet handed over
	pending map[uint64]*handed // by stream sequence of the replay's message
	entry   jobs.ReplayRun
	set     *jobSet // Run's jobs (nil on another consumer): the entry's Done

	lastDone int64     // the entry's Done when it last grew
	moved    time.Time // when that was: a stalled replay shows no ETA
}

type handAuth struct {
	name          string
	held          []jetstream.Msg // delivered, not yet handed over
	out           int             // handed over, not reported
	done          int64
	lastHandedOut time.Time
}

type handed struct {
	m    jetstream.Msg
	auth *handAuth
	at   time.Time
}

// Handover returns the Work of a replay that hands its jobs to the live
// pods, into target o.Target; kv is jobs.ReplaysBucket. The run's entry
// there is written at once, refreshed while the work runs and deleted when
// it returns: the pods drop the copies of a run without an entry, so an
// interrupted replay leaves nothing in their queues (a SIGKILLed one, once
// the entry expires after jobs.ReplaysTTL).
func Handover(js jetstream.JetStream, kv jetstream.KeyValue, o HandoverOptions) Work {
	if o.Window <= 0 {
		o.Window = DefaultWindow
	}
	if o.AckWait <= 0 {
		o.AckWait = 30 * time.Second
	}
	if o.Patience <= 0 {
		o.Patience = 10 * time.Minute
	}
	if o.Batch <= 0 {
		o.Batch = 256
	}
	return func(ctx context.Context, c jetstream.Consumer) error {
		h := &handover{js: js, kv: kv, o: o, log: o.Logger, auths: map[string]*handAuth{}, pending: map[uint64]*handed{}, dirty: map[*handAuth]bool{}, held: map[uint64]bool{},
			entry: jobs.ReplayRun{Run: o.Run, Target: o.Target, Started: time.Now().UTC()}}
		if o.Base != nil {
			h.entry = *o.Base
			h.entry.Run, h.entry.Target, h.entry.Alone, h.entry.Ended = o.Run, o.Target, false, time.Time{}
		}
		if h.set = jobsOf(c); h.set != nil {
			h.entry.Jobs, _ = h.set.counts()
		} else if ci := c.CachedInfo(); ci != nil && h.entry.Jobs == 0 {
			h.entry.Jobs = int64(ci.NumPending)
		}
		return h.run(ctx, c)
	}
}

func (h *handover) run(ctx context.Context, c jetstream.Consumer) error {
	if err := h.publishEntry(ctx); err != nil {
		return err
	}
	defer func() {
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		if err := h.kv.Delete(dctx, h.o.Run); err != nil {
			h.log.Warn().Err(err).Str("run", h.o.Run).Msg("replay: delete the run's entry (it expires by itself)")
		}
	}()
	// A report dropped because this buffer is full lapses after Patience
	// and its job is handed over again; the window bounds how many are out.
	reports := make(chan *nats.Msg, 1<<14)
	sub, err := h.js.Conn().ChanSubscribe(jobs.ReplayDoneSubject(h.o.Run), reports)
	if err != nil {
		return fmt.Errorf("replay: subscribe to the pods' reports: %w", err)
	}
	defer sub.Unsubscribe()
	if err := h.js.Conn().FlushTimeout(5 * time.Second); err != nil {
		return fmt.Errorf("replay: subscribe to the pods' reports: %w", err)
	}
	pulled := make(chan jetstream.Msg, h.o.Batch)
	go h.pull(ctx, c, pulled)
	tick := time.NewTicker(max(h.o.AckWait/3, 100*time.Millisecond))
	defer tick.Stop()
	refresh := time.NewTicker(2 * time.Second)
	defer refresh.Stop()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case m := <-pulled:
			h.take(m)
		case r := <-reports:
			h.report(r.Data)
		case <-tick.C:
			h.keepInProgress()
			for _, a := range h.auths {
				h.dirty[a] = true // a publish that failed is tried again
			}
		case <-refresh.C:
			if err := h.publishEntry(ctx); err != nil && ctx.Err() == nil {
				h.log.Warn().Err(err).Msg("replay: refresh the run's entry")
			}
		}
		h.handOut(ctx)
	}
}

// pull feeds the consumer's messages to out until ctx is done.
func (h *handover) pull(ctx context.Context, c jetstream.Consumer, out chan<- jetstream.Msg) {
	for ctx.Err() == nil {
		batch, err := c.Fetch(h.o.Batch, jetstream.FetchMaxWait(time.Second))
		if err != nil {
			if ctx.Err() == nil {
				h.log.Debug().Err(err).Msg("replay: pull")
				select {
				case <-ctx.Done():
				case <-time.After(200 * time.Millisecond):
				}
			}
			continue
		}
		for m := range batch.Messages() {
			select {
			case out <- m:
			case <-ctx.Done():
				_ = m.Nak()
			}
		}
	}
}

// take holds a delivered message, or acks one that is not a submitted job
// (a copy) or whose job is already handed over (a redelivery).
func (h *handover) take(m jetstream.Msg) {
	md, err := m.Metadata()
	if err != nil {
		_ = m.Ack()
		return
	}
	if jobs.IsCopy(m.Headers()) {
		_ = m.Ack()
		return
	}
	if p := h.pending[md.Sequence.Stream]; p != nil {
		p.m = m // acks go to the live delivery
		return
	}
	_, akey, err := jobs.ParseSubject(m.Subject())
	auth := akey
	if j, perr := jobs.Parse(m.Data()); perr == nil {
		auth = j.Authority.String()
	} else if err != nil {
		auth = jobs.InvalidToken
	}
	a := h.auths[auth]
	if a == nil {
		a = &handAuth{name: auth}
		h.auths[auth] = a
	}
	if h.held[md.Sequence.Stream] {
		return // a redelivery of one still held (kept in progress): the one held is acked
	}
	h.held[md.Sequence.Stream] = true
	a.held = append(a.held, m)
	h.dirty[a] = true
}

// handOut hands over held jobs while their authority has room in its
// window.
func (h *handover) handOut(ctx context.Context) {
	for a := range h.dirty {
		delete(h.dirty, a)
		for len(a.held) > 0 && a.out < h.o.Window {
			m := a.held[0]
			if err := h.publishCopy(ctx, m); err != nil {
				if ctx.Err() == nil {
					h.log.Warn().Err(err).Str("authority", a.name).Msg("replay: hand a job to the pods; tried again")
				}
				return
			}
			a.held = a.held[1:]
			a.out++
			md, _ := m.Metadata()
			delete(h.held, md.Sequence.Stream)
			h.pending[md.Sequence.Stream] = &handed{m: m, auth: a, at: time.Now()}
		}
	}
}

// publishCopy publishes m's job as a replay job on its own subject, so in
// its authority's partition. The message id makes a second publish of one
// delivery a duplicate the stream drops.
func (h *handover) publishCopy(ctx context.Context, m jetstream.Msg) error {
	md, err := m.Metadata()
	if err != nil {
		return err
	}
	cp := nats.NewMsg(m.Subject())
	cp.Data = m.Data()
	seq := strconv.FormatUint(md.Sequence.Stream, 10)
	cp.Header.Set(jetstream.MsgIDHeader, "replay:"+h.o.Run+":"+seq+":"+strconv.FormatUint(md.NumDelivered, 10))
	cp.Header.Set(jobs.HeaderReplay, h.o.Run)
	cp.Header.Set(jobs.HeaderReplayTarget, h.o.Target)
	cp.Header.Set(jobs.HeaderReplayOf, seq)
	// The replayed job's own enqueue instant, so that a replayed fetch
	// never undoes a delete enqueued after the job it replays.
	jobs.SetEnqueued(cp.Header, jobs.EnqueuedOf(m.Headers(), md.Timestamp))
	pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	_, err = h.js.PublishMsg(pctx, cp)
	return err
}

// report handles a pod's report: the replay's message is acked, its
// authority's window has room again.
func (h *handover) report(data []byte) {
	var r jobs.ReplayDone
	if json.Unmarshal(data, &r) != nil {
		return
	}
	p := h.pending[r.Of]
	if p != nil {
		delete(h.pending, r.Of)
		p.auth.out--
		p.auth.done++
		h.entry.Done++
		h.dirty[p.auth] = true
	}
	if p == nil {
		return // a second report (a job handed over twice)
	}
	if err := p.m.Ack(); err != nil {
		h.log.Debug().Err(err).Msg("replay: ack a job the pods did")
	}
	if h.o.OnDone != nil {
		h.o.OnDone(r)
	}
}

// keepInProgress keeps the held and handed-over messages from being
// redelivered, except a handed-over one past Patience: it comes back and is
// handed over again.
func (h *handover) keepInProgress() {
	var ms []jetstream.Msg
	for _, a := range h.auths {
		ms = append(ms, a.held...)
	}
	now := time.Now()
	for seq, p := range h.pending {
		if now.Sub(p.at) < h.o.Patience {
			ms = append(ms, p.m)
			continue
		}
		delete(h.pending, seq)
		p.auth.out--
		h.dirty[p.auth] = true
	}
	for _, m := range ms {
		_ = m.InProgress()
	}
}

// publishEntry writes the run's entry in jobs.ReplaysBucket.
func (h *handover) publishEntry(ctx context.Context) error {
	e := h.entry
	e.Updated = time.Now().UTC()
	if h.set != nil {
		_, e.Done = h.set.counts()
	}
	e.Waiting, e.Authorities = 0, nil
	for _, a := range h.auths {
		e.Waiting += int64(a.out)
		e.Authorities = append(e.Authorities, jobs.ReplayAuthority{Authority: a.name, Done: a.done, Waiting: int64(a.out), Held: int64(len(a.held))})
	}
	sort.Slice(e.Authorities, func(i, j int) bool {
		a, b := e.Authorities[i], e.Authorities[j]
		if wa, wb := a.Held+a.Waiting, b.Held+b.Waiting; wa != wb {
			return wa > wb
		}
		return a.Authority < b.Authority
	})
	if e.Done > h.lastDone {
		h.lastDone, h.moved = e.Done, e.Updated
	}
	if h.moved.IsZero() {
		h.moved = e.Updated
	}
	e.ETA = ETA(e.Done, e.Jobs, e.Updated.Sub(e.Started), e.Updated.Sub(h.moved)).Round(time.Second)
	pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	_, err := h.kv.Put(pctx, h.o.Run, e.Encode())
	return err
}

// WaitForPods is LivePods, except that while partitions of MIRROR_JOBS are
// leased (jobs.LeasesBucket) but no pod is announced (a pod whose lease
// round failed withdraws its announcement until one succeeds) it asks again
// for up to patience: a replay must not take itself for alone beside a pod.
func WaitForPods(ctx context.Context, js jetstream.JetStream, patience time.Duration) (map[string][]string, error) {
	deadline := time.Now().Add(patience)
	for {
		pods, err := LivePods(ctx, js)
		if err != nil || len(pods) > 0 || !leased(ctx, js) {
			return pods, err
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("partitions of %s are leased but no pod is announced in %s: a pod is running and cannot reach NATS; try again", jobs.JobsStream, jobs.PodsBucket)
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// leased reports whether any partition lease is held.
func leased(ctx context.Context, js jetstream.JetStream) bool {
	kv, err := js.KeyValue(ctx, jobs.LeasesBucket)
	if err != nil {
		return false
	}
	lister, err := kv.ListKeys(ctx)
	if err != nil {
		return false
	}
	for range lister.Keys() {
		_ = lister.Stop()
		return true
	}
	return false
}
