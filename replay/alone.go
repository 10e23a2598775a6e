package replay

import (
	"context"
	"fmt"
	"sort"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/mirrorworker/mirrorworker/authority"
	"github.com/mirrorworker/mirrorworker/fetch"
	"github.com/mirrorworker/mirrorworker/jobs"
	"github.com/mirrorworker/mirrorworker/worker"
)

// A replay that finds no live pod does the work itself, with a pacer of its
// own (docs/adr/0025). It stays one pace with any pod that starts while it
// runs: its entry in jobs.ReplaysBucket says it paces alone; a pod that
// starts announces itself in jobs.PodsBucket and then waits until no entry
// says so; the replay, polling the pods, stops starting requests as soon as
// one appears, lets its requests in flight end, and hands the rest of its
// jobs to the pods (Handover) after writing when it stopped and its last
// request starts, from which the pods space their first requests.

// DefaultPodPoll is the default of AloneOptions.Poll.
const DefaultPodPoll = 500 * time.Millisecond

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
	// Handover returns the work that hands the rest to pods, with the
	// entry it must keep (Alone false, AloneUntil and LastStarts set);
	// an error (the pods do not take Target) ends the replay with it.
	Handover func(pods map[string][]string, base jobs.ReplayRun) (Work, error)
	Logger   zerolog.Logger
}

// Alone returns the Work of a replay that paces its own requests until a
// pod appears (see above); kv is jobs.ReplaysBucket.
func Alone(kv jetstream.KeyValue, o AloneOptions) Work {
	if o.Poll <= 0 {
		o.Poll = DefaultPodPoll
	}
	if o.Starts == nil {
		o.Starts = &Starts{}
	}
	return func(ctx context.Context, c jetstream.Consumer) error {
		a := &alone{kv: kv, o: o, entry: jobs.ReplayRun{Run: o.Run, Target: o.Target, Started: time.Now().UTC(), Alone: true}}
		if ci := c.CachedInfo(); ci != nil {
			a.entry.Jobs = int64(ci.NumPending)
		}
		return a.run(ctx, c)
	}
}

type alone struct {
	kv    jetstream.KeyValue
	o     AloneOptions
	entry jobs.ReplayRun
}

func (a *alone) run(ctx context.Context, c jetstream.Consumer) error {
	// The entry first, then the pods: a pod announces itself first, then
	// reads the entries, so that one of the two sees the other.
	if err := a.put(ctx); err != nil {
		return fmt.Errorf("replay: write the run's entry in %s: %w", jobs.ReplaysBucket, err)
	}
	pods, err := a.o.Pods(ctx)
	if err != nil {
		a.o.Logger.Warn().Err(err).Msg("replay: list the live pods")
	}
	lctx, stopLocal := context.WithCancel(ctx)
	defer stopLocal()
	local := make(chan error, 1)
	if len(pods) == 0 {
		go func() { local <- a.o.Local(lctx, c) }()
		if pods, err = a.watch(ctx, local); pods == nil {
			a.end(ctx)
			return err
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
		return ctx.Err()
	}
	if err != nil {
		a.end(ctx)
		return err
	}
	if a.o.Flush != nil {
		fctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		if err := a.o.Flush(fctx); err != nil {
			a.o.Logger.Warn().Err(err).Msg("replay: pacer facts not all published before the hand-over")
		}
		cancel()
	}
	base := a.stopped()
	work, err := a.o.Handover(pods, base)
	if err != nil {
		a.end(ctx)
		return err
	}
	return work(ctx, c)
}

// watch refreshes the entry and asks for pods until the local worker ends
// (nil pods, and its error) or a pod appears.
func (a *alone) watch(ctx context.Context, local <-chan error) (map[string][]string, error) {
	poll := time.NewTicker(a.o.Poll)
	defer poll.Stop()
	refresh := time.NewTicker(2 * time.Second)
	defer refresh.Stop()
	for {
		select {
		case err := <-local:
			return nil, err
		case <-refresh.C:
			if err := a.put(ctx); err != nil && ctx.Err() == nil {
				a.o.Logger.Warn().Err(err).Msg("replay: refresh the run's entry")
			}
		case <-poll.C:
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
	refresh := time.NewTicker(2 * time.Second)
	defer refresh.Stop()
	for {
		select {
		case err := <-local:
			return err
		case <-refresh.C:
			if err := a.put(ctx); err != nil && ctx.Err() == nil {
				a.o.Logger.Warn().Err(err).Msg("replay: refresh the run's entry")
			}
		}
	}
}

// stopped is the entry once the replay's own requests have ended.
func (a *alone) stopped() jobs.ReplayRun {
	e := a.entry
	e.Alone, e.AloneUntil = false, time.Now().UTC()
	e.LastStarts = a.o.Starts.Recent(e.AloneUntil)
	if a.o.Done != nil {
		e.Done = a.o.Done()
	}
	return e
}

// end leaves the entry of a replay that paced alone and is over to expire,
// saying so: a pod that starts within jobs.ReplaysTTL spaces its first
// requests from the replay's last starts.
func (a *alone) end(ctx context.Context) {
	a.entry = a.stopped()
	a.entry.Ended = a.entry.AloneUntil
	pctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	if err := a.put(pctx); err != nil {
		a.o.Logger.Warn().Err(err).Msg("replay: write the run's last entry (it expires by itself)")
	}
}

func (a *alone) put(ctx context.Context) error {
	e := a.entry
	e.Updated = time.Now().UTC()
	if e.Alone {
		e.LastStarts = a.o.Starts.Recent(e.Updated)
		if a.o.Done != nil {
			e.Done = a.o.Done()
		}
	}
	pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	_, err := a.kv.Put(pctx, a.o.Run, e.Encode())
	return err
}

// Starts records when a worker's requests start, per authority. The zero
// value is ready; safe for concurrent use.
type Starts struct {
	mu sync.Mutex
	m  map[string]time.Time
}

// Wrap makes the worker of d record each request it sends (every hop),
// at the moment its pacer admitted it: no earlier than the start the pacer
// confirmed, so a pod that spaces from it is at least as polite.
func (s *Starts) Wrap(d *worker.Deps) { d.Fetcher = startsFetcher{f: d.Fetcher, s: s} }

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
	f worker.Fetcher
	s *Starts
}

func (f startsFetcher) Do(ctx context.Context, req fetch.Request, g fetch.Gate) (*fetch.Response, error) {
	return f.f.Do(ctx, req, g.Admitted(func(a authority.Authority) { f.s.add(a.String(), time.Now()) }))
}
