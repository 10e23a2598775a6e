package replay

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/mirrorworker/mirrorworker/authority"
	"github.com/mirrorworker/mirrorworker/clock"
	"github.com/mirrorworker/mirrorworker/fetch"
	"github.com/mirrorworker/mirrorworker/jobs"
	"github.com/mirrorworker/mirrorworker/worker"
)

// LoneGrace is how long the fetches in flight of a replay that paces its
// own requests may finish when it stops or hands its jobs to the pods
// (its worker's Options.ShutdownGrace), well within the 30 s a starting pod
// waits for that hand-over.
const LoneGrace = 10 * time.Second

// A replay that finds no live pod does the work itself, with a pacer of its
// own (docs/adr/0025). It stays one pace with any pod that starts while it
// runs: its entry in jobs.ReplaysBucket says it paces alone; a pod that
// starts announces itself in jobs.PodsBucket and then waits until no entry
// says so; the replay, polling the pods, stops starting requests as soon as
// one appears, lets its requests in flight end, writes when it stopped and
// its last request starts, from which the pods space their first requests,
// and goes on in the pods' pace (Handover: its starts granted by them,
// docs/adr/0031).
//
// Replays that find no pod pace one at a time: one whose entry came later
// (jobs.ReplayRun.Order) waits, its entry saying Alone, while an earlier
// one paces alone, then spaces its first requests from that one's last
// starts; a pod that appears meanwhile gets the work of both.

// DefaultPodPoll is the default of AloneOptions.Poll.
const DefaultPodPoll = 500 * time.Millisecond

// EntryRefresh is how often a running replay rewrites its entry in
// jobs.ReplaysBucket: a fifth of jobs.ReplaysTTL, so that a live replay's
// entry survives four missed writes, while a killed one's expires (and a
// starting pod stops waiting for it) within the TTL.
const EntryRefresh = 2 * time.Second

// readWarnEvery spaces the warnings of a replay that cannot read the other
// replays' entries: it asks again every poll, and one line every ten
// seconds says enough.
const readWarnEvery = 10 * time.Second

// kvTimeout bounds one write, delete or flush to NATS. It is a context
// deadline, wall-clock time by nature (the server does not run on the
// replay's Clock), long beside a healthy round trip.
const kvTimeout = 5 * time.Second

// RecentStarts bounds the LastStarts a replay's entry carries: the most
// recent ones, within RecentStartsWindow. An older start binds no pod's
// request (the interval in force since has long passed).
const (
	RecentStarts       = 1000
	RecentStartsWindow = 10 * time.Minute
)

// AloneOptions configure Alone. Run, Local, Pods and Handover are required.
type AloneOptions struct {
	// Run names the replay run; Target is its target's canonical spec.
	Run, Target string
	// Local is the replay's own worker on the consumer: it runs until its
	// context ends, then lets its requests in flight end and hands back
	// the jobs it holds (worker.Worker.Run does).
	Local Work
	// Pods returns the live pods and the replay targets each takes
	// (LivePods); it is asked every Poll (DefaultPodPoll).
	Pods func(ctx context.Context) (map[string][]string, error)
	Poll time.Duration
	// Starts records the local worker's request starts (Starts.Wrap).
	Starts *Starts
	// Flush, if set, publishes the pacer facts the local worker learned
	// (facts.Sink.Flush) before the replay says it has stopped.
	Flush func(ctx context.Context) error
	// Done, if set, is how many jobs are finished, for the entry.
	Done func() int64
	// Handover returns the work that does the rest beside the pods, each
	// request's start granted by the pod that owns its authority (grant,
	// docs/adr/0031), given the entry that says the replay no longer paces
	// alone (AloneUntil and LastStarts set); the replay keeps that entry
	// while the work runs and deletes it when the work ends. An error ends
	// the replay with it.
	Handover func(pods map[string][]string, base jobs.ReplayRun) (Work, error)
	// Fence, if set, is the hand-over's fence (pacer.Pacer.FenceAll): it
	// spaces the local worker's first request to each authority from the
	// previous holder's last start there (the replays it waited for, or
	// the owners' last grants) and returns how many it fenced. Sync, if
	// set, returns once the pacer facts they published are applied
	// (pipeline.Parts.SyncFacts).
	Fence func(lasts ...map[string]time.Time) int
	Sync  func(ctx context.Context) error
	// Waiting, if set, is told once of each replay this one waits for.
	Waiting func(earlier jobs.ReplayRun)

	// Beside pods, a replay whose pods have all gone paces alone again
	// (docs/adr/0031): once none has run for GoneAfter (Running false on
	// every poll) and no owner has answered its asks since none ran
	// (Unanswered), it stops the hand-over's work, fences its own pacer
	// from its last granted starts (Fence, from Starts), applies the
	// facts (Sync), says so (Orphaned, with since when no pod ran) and
	// goes on as it began, alone, until a pod appears. Without
	// Unanswered it waits for the pods, however long.
	//
	// Running reports whether a pod runs; nil means Pods returns one.
	// Unanswered reports whether no owner has answered an ask or a report
	// since the instant given (grant.Paced.LastAnswer), read on Clock.
	Running    func(ctx context.Context) (bool, error)
	Unanswered func(since time.Time) bool
	Orphaned   func(since time.Time)
	Logger     zerolog.Logger
	// Clock times the polls, the entry's refreshes and its instants
	// (Started, Updated, AloneUntil), and GoneAfter; nil means the wall
	// clock. Starts has its own (Starts.Clock): it is the workers'.
	Clock clock.Clock
}

// GoneAfter is how long no pod must run, and no owner answer, before a
// replay beside pods paces alone again: longer than a poll (a pod between
// lease rounds is still seen by its leases), short beside the entry's TTL
// a killed pod takes to disappear (jobs.DefaultLeaseTTL).
const GoneAfter = time.Second

// Lone is a replay that paces its own requests until a pod appears (see
// above): Await, then Work.
type Lone struct{ a *alone }

// Alone returns the replay run o.Run that found no live pod; kv is
// jobs.ReplaysBucket of js.
func Alone(js jetstream.JetStream, kv jetstream.KeyValue, o AloneOptions) *Lone {
	if o.Poll <= 0 {
		o.Poll = DefaultPodPoll
	}
	if o.Clock == nil {
		o.Clock = clock.Real{}
	}
	if o.Starts == nil {
		o.Starts = &Starts{Clock: o.Clock}
	}
	return &Lone{&alone{js: js, kv: kv, o: o, entry: jobs.ReplayRun{Run: o.Run, Target: o.Target, Started: o.Clock.Now().UTC(), Alone: true}}}
}

// Await writes the run's entry and returns once no replay whose entry
// came first paces alone (or a pod has appeared): Options.Await, so that a
// replay that waits holds no consumer meanwhile. It fails only when ctx
// ends.
func (l *Lone) Await(ctx context.Context) error {
	a := l.a
	if err := a.announce(ctx); err != nil {
		return err
	}
	pods, err := a.awaitEarlier(ctx)
	if err != nil {
		a.end(ctx)
		return err
	}
	// Returned for a pod, it has not seen the earlier replays end: Work
	// waits again if the pod is gone by then.
	a.awaited = len(pods) == 0
	return nil
}

// Work is the replay's Work on its consumer c: its own worker until a pod
// appears, then the hand-over.
func (l *Lone) Work(ctx context.Context, c jetstream.Consumer) error {
	if l.a.set = jobsOf(c); l.a.set != nil {
		l.a.entry.Jobs, _ = l.a.set.counts()
	} else if ci := c.CachedInfo(); ci != nil {
		l.a.entry.Jobs = int64(ci.NumPending)
	}
	return l.a.run(ctx, c)
}

type alone struct {
	js      jetstream.JetStream
	kv      jetstream.KeyValue
	o       AloneOptions
	entry   jobs.ReplayRun
	awaited bool    // Await found no earlier replay pacing alone
	set     *jobSet // Run's jobs (nil on another consumer): the entry's Done
}

// announce writes the entry: the entry first, then the pods, since a pod
// announces itself first, then reads the entries, so that one of the two
// sees the other. Its first version gives the replay its order.
func (a *alone) announce(ctx context.Context) error {
	if err := a.put(ctx); err != nil {
		return fmt.Errorf("replay: write the run's entry in %s: %w", jobs.ReplaysBucket, err)
	}
	return nil
}

func (a *alone) run(ctx context.Context, c jetstream.Consumer) error {
	if err := a.announce(ctx); err != nil {
		return err
	}
	pods, err := a.o.Pods(ctx)
	if err != nil {
		a.o.Logger.Warn().Err(err).Msg("replay: list the live pods")
	}
	if len(pods) == 0 && !a.awaited {
		// A Work run without Await still paces after earlier replays.
		if pods, err = a.awaitEarlier(ctx); err != nil {
			a.end(ctx)
			return err
		}
	}
	for {
		gone, err := a.handOver(ctx, c, pods)
		if gone.IsZero() {
			return err
		}
		if pods, err = a.orphaned(ctx, gone); err != nil {
			a.end(ctx)
			return err
		}
	}
}

// handOver paces alone while pods is empty, until a pod appears, then
// hands the rest to the pods' pace (granted). It returns since when no pod
// ran if they have all gone meanwhile (the replay paces alone again), else
// zero and the end of the replay.
func (a *alone) handOver(ctx context.Context, c jetstream.Consumer, pods map[string][]string) (time.Time, error) {
	lctx, stopLocal := context.WithCancel(ctx)
	defer stopLocal()
	local := make(chan error, 1)
	var err error
	if len(pods) == 0 {
		go func() { local <- a.o.Local(lctx, c) }()
		if pods, err = a.watch(ctx, local); pods == nil {
			a.end(ctx)
			return time.Time{}, err
		}
	} else {
		local <- nil
	}
	// A pod started: no request of the replay's starts from now on.
	a.o.Logger.Info().Int("pods", len(pods)).Msg("replay: pods started; stopping the replay's own requests to hand the rest to them")
	stopLocal()
	err = a.wait(ctx, local)
	if ctx.Err() != nil {
		a.end(ctx)
		return time.Time{}, ctx.Err()
	}
	if err != nil {
		a.end(ctx)
		return time.Time{}, err
	}
	if a.o.Flush != nil {
		fctx, cancel := context.WithTimeout(ctx, kvTimeout)
		if err := a.o.Flush(fctx); err != nil {
			a.o.Logger.Warn().Err(err).Msg("replay: pacer facts not all published before the hand-over")
		}
		cancel()
	}
	base := a.stopped()
	work, err := a.o.Handover(pods, base)
	if err != nil {
		a.end(ctx)
		return time.Time{}, err
	}
	a.entry = base
	return a.granted(ctx, c, work)
}

// granted runs work, the replay's requests granted by the pods
// (AloneOptions.Handover), keeping the run's entry fresh meanwhile (no
// longer Alone: the pods take work beside it), and deletes the entry when
// it ends. If the pods all go (see AloneOptions.Unanswered) it stops work,
// lets it end, keeps the entry and returns since when no pod ran.
func (a *alone) granted(ctx context.Context, c jetstream.Consumer, work Work) (time.Time, error) {
	if err := a.put(ctx); err != nil && ctx.Err() == nil {
		a.o.Logger.Warn().Err(err).Msg("replay: refresh the run's entry")
	}
	wctx, stopWork := context.WithCancel(ctx)
	defer stopWork()
	done := make(chan error, 1)
	go func() { done <- work(wctx, c) }()
	gone, err := a.watchPods(ctx, done)
	if !gone.IsZero() {
		a.o.Logger.Info().Time("since", gone).Msg("replay: no pod runs and none answers its asks; stopping the granted requests to pace alone")
		stopWork()
		err = a.wait(ctx, done)
		if ctx.Err() == nil && (err == nil || errors.Is(err, context.Canceled)) {
			return gone, nil
		}
		if ctx.Err() != nil {
			err = ctx.Err()
		}
	}
	dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), kvTimeout)
	defer cancel()
	if derr := a.kv.Delete(dctx, a.o.Run); derr != nil {
		a.o.Logger.Warn().Err(derr).Msg("replay: delete the run's entry (it expires by itself)")
	}
	return time.Time{}, err
}

// watchPods refreshes the entry until the granted work ends (zero, and its
// error) or the pods have all gone and none answers (since when no pod
// ran).
func (a *alone) watchPods(ctx context.Context, done <-chan error) (time.Time, error) {
	clk := a.o.Clock
	refresh := clk.NewTimer(EntryRefresh)
	defer refresh.Stop()
	var (
		pollT clock.Timer
		poll  <-chan time.Time // nil, never ready, without Unanswered
	)
	if a.o.Unanswered != nil {
		pollT = clk.NewTimer(a.o.Poll)
		defer pollT.Stop()
		poll = pollT.C()
	}
	var none time.Time // since when no pod ran, as polled
	for {
		select {
		case err := <-done:
			return time.Time{}, err
		case <-refresh.C():
			refresh.Reset(EntryRefresh)
			a.entry.Done = a.done()
			if err := a.put(ctx); err != nil && ctx.Err() == nil {
				a.o.Logger.Warn().Err(err).Msg("replay: refresh the run's entry")
			}
		case <-poll:
			pollT.Reset(a.o.Poll)
			running, err := a.running(ctx)
			switch {
			case err != nil:
				if ctx.Err() == nil {
					a.o.Logger.Debug().Err(err).Msg("replay: list the live pods")
				}
			case running:
				none = time.Time{}
			case none.IsZero():
				none = clk.Now()
			case clk.Now().Sub(none) >= GoneAfter && a.o.Unanswered(none):
				return none, nil
			}
		}
	}
}

// running reports whether a pod runs (AloneOptions.Running).
func (a *alone) running(ctx context.Context) (bool, error) {
	if a.o.Running != nil {
		return a.o.Running(ctx)
	}
	pods, err := a.o.Pods(ctx)
	return len(pods) > 0, err
}

// orphaned takes the replay back to pacing alone after its pods have all
// gone (no pod ran since gone): its own pacer fenced from the starts the
// owners granted last (a start granted at T means none before T plus the
// interval), the facts applied, its entry Alone again; then, as at its
// start, it waits while an earlier replay paces alone. It returns the
// pods if one appears meanwhile; it fails only when ctx ends.
func (a *alone) orphaned(ctx context.Context, gone time.Time) (map[string][]string, error) {
	if a.o.Sync != nil {
		if err := a.o.Sync(ctx); err != nil {
			if ctx.Err() != nil {
				return nil, ctx.Err()
			}
			a.o.Logger.Warn().Err(err).Msg("replay: apply the pacer facts the pods published")
		}
	}
	n := 0
	if a.o.Fence != nil {
		n = a.o.Fence(a.o.Starts.Recent(a.o.Clock.Now()))
	}
	a.entry.Alone, a.entry.PodsGone = true, gone.UTC()
	a.entry.AloneUntil, a.entry.WaitingFor = time.Time{}, ""
	if err := a.put(ctx); err != nil && ctx.Err() == nil {
		a.o.Logger.Warn().Err(err).Msg("replay: refresh the run's entry")
	}
	a.o.Logger.Info().Int("fenced", n).Time("pods_gone", gone).Msg("replay: the pods have gone; pacing alone, its first requests spaced from the last starts they granted")
	if a.o.Orphaned != nil {
		a.o.Orphaned(gone)
	}
	// The entry first, then the pods (see announce): a pod that started
	// since the last poll and did not see the entry Alone is seen here,
	// before the replay starts a request of its own.
	if pods, err := a.o.Pods(ctx); err == nil && len(pods) > 0 {
		return pods, nil
	} else if err != nil && ctx.Err() == nil {
		a.o.Logger.Warn().Err(err).Msg("replay: list the live pods")
	}
	return a.awaitEarlier(ctx)
}

// others are the other replays' entries, each with its order
// (jobs.ReplayRun.Order: an entry's first version is read by its revision).
func (a *alone) others(ctx context.Context) ([]jobs.ReplayRun, error) {
	es, err := jobs.Revisions[jobs.ReplayRun](ctx, a.js, a.kv)
	if err != nil {
		return nil, err
	}
	var out []jobs.ReplayRun
	for _, e := range es {
		if e.Key == a.o.Run {
			continue
		}
		if e.Value.Order == 0 {
			e.Value.Order = e.Revision
		}
		out = append(out, e.Value)
	}
	return out, nil
}

// earliest is the replay of runs that paces alone (or waits to) with the
// lowest order below the replay's own, if any.
func (a *alone) earliest(runs []jobs.ReplayRun) (jobs.ReplayRun, bool) {
	var first jobs.ReplayRun
	for _, r := range runs {
		if r.Alone && r.Ended.IsZero() && r.Order < a.entry.Order && (first.Run == "" || r.Order < first.Order) {
			first = r
		}
	}
	return first, first.Run != ""
}

// awaitEarlier waits while a replay whose entry came first paces alone,
// refreshing the entry and asking for pods meanwhile. It returns the pods
// once one appears, or nil once no earlier replay paces alone, having
// applied their facts (Sync) and spaced the first requests from their
// last starts (Fence). It fails only when ctx ends.
func (a *alone) awaitEarlier(ctx context.Context) (map[string][]string, error) {
	clk := a.o.Clock
	poll := clk.NewTimer(a.o.Poll)
	defer poll.Stop()
	lastPut, waited, warned := clk.Now(), false, time.Time{}
	for {
		runs, err := a.others(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return nil, ctx.Err()
			}
			if now := clk.Now(); now.Sub(warned) > readWarnEvery {
				warned = now
				a.o.Logger.Warn().Err(err).Msg("replay: read the other replays (" + jobs.ReplaysBucket + "); asking again before the first request")
			}
		} else if first, ok := a.earliest(runs); !ok {
			return nil, a.follow(ctx, runs, waited)
		} else if a.entry.WaitingFor != first.Run {
			a.entry.WaitingFor = first.Run
			a.o.Logger.Info().Str("replay", first.Run).Str("into", first.Target).
				Msg("replay: waiting for another replay that paces its own requests to end (replays with no pod run one at a time; a pod that starts does the work of both)")
			if a.o.Waiting != nil {
				a.o.Waiting(first)
			}
			waited, lastPut = true, time.Time{}
		}
		if now := clk.Now(); now.Sub(lastPut) >= EntryRefresh {
			lastPut = now
			if err := a.put(ctx); err != nil && ctx.Err() == nil {
				a.o.Logger.Warn().Err(err).Msg("replay: refresh the run's entry")
			}
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-poll.C():
			poll.Reset(a.o.Poll)
		}
		pods, err := a.o.Pods(ctx)
		if err != nil && ctx.Err() == nil {
			a.o.Logger.Debug().Err(err).Msg("replay: list the live pods")
		}
		if len(pods) > 0 {
			a.entry.WaitingFor = ""
			return pods, nil
		}
	}
}

// follow takes up the pace the replays of runs left: their facts applied,
// the first requests spaced from their last starts. waited says whether
// the replay waited for one of them (and logs that it goes on).
func (a *alone) follow(ctx context.Context, runs []jobs.ReplayRun, waited bool) error {
	if a.o.Sync != nil && waited {
		if err := a.o.Sync(ctx); err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			a.o.Logger.Warn().Err(err).Msg("replay: apply the pacer facts the replay it waited for published")
		}
	}
	n := 0
	if a.o.Fence != nil {
		n = a.o.Fence(jobs.LastStartsOf(runs)...)
	}
	if waited {
		a.entry.WaitingFor = ""
		if err := a.put(ctx); err != nil && ctx.Err() == nil {
			a.o.Logger.Warn().Err(err).Msg("replay: refresh the run's entry")
		}
		a.o.Logger.Info().Int("fenced", n).Msg("replay: the replay it waited for has ended; its first requests are spaced from that one's last starts")
	}
	return nil
}

// watch refreshes the entry and asks for pods until the local worker ends
// (nil pods, and its error) or a pod appears.
func (a *alone) watch(ctx context.Context, local <-chan error) (map[string][]string, error) {
	poll := a.o.Clock.NewTimer(a.o.Poll)
	defer poll.Stop()
	refresh := a.o.Clock.NewTimer(EntryRefresh)
	defer refresh.Stop()
	for {
		select {
		case err := <-local:
			return nil, err
		case <-refresh.C():
			refresh.Reset(EntryRefresh)
			if err := a.put(ctx); err != nil && ctx.Err() == nil {
				a.o.Logger.Warn().Err(err).Msg("replay: refresh the run's entry")
			}
		case <-poll.C():
			poll.Reset(a.o.Poll)
			pods, err := a.o.Pods(ctx)
			if err != nil && ctx.Err() == nil {
				a.o.Logger.Debug().Err(err).Msg("replay: list the live pods")
			}
			if len(pods) > 0 {
				return pods, nil
			}
		}
	}
}

// wait returns the local worker's result once it has stopped, refreshing
// the entry meanwhile: the pods wait for it to say the replay stopped.
func (a *alone) wait(ctx context.Context, local <-chan error) error {
	refresh := a.o.Clock.NewTimer(EntryRefresh)
	defer refresh.Stop()
	for {
		select {
		case err := <-local:
			return err
		case <-refresh.C():
			refresh.Reset(EntryRefresh)
			if err := a.put(ctx); err != nil && ctx.Err() == nil {
				a.o.Logger.Warn().Err(err).Msg("replay: refresh the run's entry")
			}
		}
	}
}

// stopped is the entry once the replay's own requests have ended.
func (a *alone) stopped() jobs.ReplayRun {
	e := a.entry
	e.Alone, e.AloneUntil, e.PodsGone = false, a.o.Clock.Now().UTC(), time.Time{}
	e.LastStarts = a.o.Starts.Recent(e.AloneUntil)
	e.Done = a.done()
	return e
}

// end leaves the entry of a replay that paced alone and is over to expire,
// saying so: a pod that starts within jobs.ReplaysTTL spaces its first
// requests from the replay's last starts.
func (a *alone) end(ctx context.Context) {
	if a.o.Flush != nil {
		// Before the entry says it ended: a replay waiting for this one
		// applies its facts once it has.
		fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), kvTimeout)
		if err := a.o.Flush(fctx); err != nil {
			a.o.Logger.Warn().Err(err).Msg("replay: pacer facts not all published before the end")
		}
		cancel()
	}
	a.entry = a.stopped()
	a.entry.Ended = a.entry.AloneUntil
	pctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), kvTimeout)
	defer cancel()
	if err := a.put(pctx); err != nil {
		a.o.Logger.Warn().Err(err).Msg("replay: write the run's last entry (it expires by itself)")
	}
}

// done is how many of the replay's jobs are done: Run's count, else
// AloneOptions.Done's.
func (a *alone) done() int64 {
	if a.set != nil {
		_, d := a.set.counts()
		return d
	}
	if a.o.Done != nil {
		return a.o.Done()
	}
	return a.entry.Done
}

func (a *alone) put(ctx context.Context) error {
	e := a.entry
	e.Updated = a.o.Clock.Now().UTC()
	if e.Alone {
		e.LastStarts = a.o.Starts.Recent(e.Updated)
		e.Done = a.done()
	}
	pctx, cancel := context.WithTimeout(ctx, kvTimeout)
	defer cancel()
	rev, err := a.kv.Put(pctx, a.o.Run, e.Encode())
	if err == nil && a.entry.Order == 0 {
		a.entry.Order = rev
	}
	return err
}

// Starts records when a worker's requests start, per authority. The zero
// value is ready; safe for concurrent use.
type Starts struct {
	// Clock reads the instant a request was admitted: the wrapped
	// worker's (worker.Options.Clock), whose pacer admitted it. Nil means
	// the wall clock. Set it before Wrap.
	Clock clock.Clock

	mu sync.Mutex
	m  map[string]time.Time
}

// Wrap makes the worker of d record each request it sends (every hop),
// at the moment its pacer admitted it: no earlier than the start the pacer
// confirmed, so a pod that spaces from it is at least as polite.
func (s *Starts) Wrap(d *worker.Deps) {
	clk := s.Clock
	if clk == nil {
		clk = clock.Real{}
	}
	d.Fetcher = startsFetcher{f: d.Fetcher, s: s, clk: clk}
}

func (s *Starts) add(auth string, at time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.m == nil {
		s.m = map[string]time.Time{}
	}
	if at.After(s.m[auth]) {
		s.m[auth] = at
	}
}

// Recent returns the last start of each authority started within
// RecentStartsWindow before now, at most RecentStarts of them (the most
// recent); nil when there are none.
func (s *Starts) Recent(now time.Time) map[string]time.Time {
	s.mu.Lock()
	type st struct {
		auth string
		at   time.Time
	}
	var all []st
	for a, at := range s.m {
		if now.Sub(at) <= RecentStartsWindow {
			all = append(all, st{a, at})
		}
	}
	s.mu.Unlock()
	if len(all) == 0 {
		return nil
	}
	sort.Slice(all, func(i, j int) bool { return all[i].at.After(all[j].at) })
	out := map[string]time.Time{}
	for _, x := range all[:min(len(all), RecentStarts)] {
		out[x.auth] = x.at.UTC()
	}
	return out
}

type startsFetcher struct {
	f   worker.Fetcher
	s   *Starts
	clk clock.Clock
}

func (f startsFetcher) Do(ctx context.Context, req fetch.Request, g fetch.Gate) (*fetch.Response, error) {
	return f.f.Do(ctx, req, g.Admitted(func(a authority.Authority) { f.s.add(a.String(), f.clk.Now()) }))
}
