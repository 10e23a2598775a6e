package replay_test

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/mirrorworker/mirrorworker/authority"
	"github.com/mirrorworker/mirrorworker/broker/brokertest"
	"github.com/mirrorworker/mirrorworker/clock"
	"github.com/mirrorworker/mirrorworker/fetch"
	"github.com/mirrorworker/mirrorworker/jobs"
	"github.com/mirrorworker/mirrorworker/replay"
	"github.com/mirrorworker/mirrorworker/worker"
)

// gateFetcher sends nothing: it asks the gate for one hop to a.example.
type gateFetcher struct{}

func (gateFetcher) Do(ctx context.Context, r fetch.Request, g fetch.Gate) (*fetch.Response, error) {
	done, err := g(ctx, 0, authority.Authority{Host: "a.example", Port: "443"})
	if err != nil {
		return nil, err
	}
	done(fetch.Result{})
	return nil, nil
}

func readRun(t *testing.T, kv jetstream.KeyValue, run string) (jobs.ReplayRun, bool) {
	t.Helper()
	e, err := kv.Get(brokertest.Context(t), run)
	if err != nil {
		return jobs.ReplayRun{}, false
	}
	var r jobs.ReplayRun
	if err := json.Unmarshal(e.Value(), &r); err != nil {
		t.Fatal(err)
	}
	return r, true
}

// TestAloneHandsOverWhenAPodAppears: a replay pacing alone says so in its
// entry, with its last starts; once a pod appears its own work is stopped
// (and returns) before the hand-over begins, which gets the entry with
// AloneUntil after that stop and the last start recorded; the jobs the
// local work handed back are the hand-over's. The lone replay runs on a
// fake clock: its entry's refresh (EntryRefresh, which writes the last
// starts) and its poll of the pods come when the test advances it, not
// after 2 s of wall time.
func TestAloneHandsOverWhenAPodAppears(t *testing.T) {
	js, _ := brokertest.Streams(t)
	ctx := brokertest.Context(t)
	const n = 6
	for i := range n {
		publishJobs(t, js, jobs.Job{URL: fmt.Sprintf("https://a.example/%d", i)})
	}
	kv, err := replay.EnsureReplaysBucket(ctx, js, 0)
	if err != nil {
		t.Fatal(err)
	}
	t0 := time.Date(2026, 12, 4, 10, 0, 0, 0, time.UTC)
	clk := clock.NewFake(t0)
	const poll = 20 * time.Millisecond
	starts := &replay.Starts{Clock: clk}
	d := &worker.Deps{Fetcher: gateFetcher{}}
	starts.Wrap(d)
	var (
		appear                atomic.Bool
		localDone, handedAt   atomic.Int64 // on clk
		started               time.Time
		base                  jobs.ReplayRun
		localAcked, handAcked atomic.Int64
	)
	local := func(ctx context.Context, c jetstream.Consumer) error {
		defer func() {
			// The clock moves on as the local work ends: what is read
			// afterwards (AloneUntil, the hand-over) is later.
			localDone.Store(clk.Now().UnixNano())
			clk.Advance(time.Millisecond)
		}()
		var held []jetstream.Msg
		for len(held) < n && ctx.Err() == nil {
			b, err := c.Fetch(n-len(held), jetstream.FetchMaxWait(200*time.Millisecond))
			if err != nil {
				continue
			}
			for m := range b.Messages() {
				held = append(held, m)
			}
		}
		for _, m := range held[:2] {
			if _, err := d.Fetcher.Do(ctx, fetch.Request{}, func(context.Context, int, authority.Authority) (func(fetch.Result), error) {
				started = clk.Now()
				return func(fetch.Result) {}, nil
			}); err != nil {
				t.Error(err)
			}
			m.Ack()
			localAcked.Add(1)
		}
		<-ctx.Done()
		for _, m := range held[2:] {
			m.Nak() // handed back, as a worker does when it stops
		}
		return nil
	}
	work := replay.Alone(js, kv, replay.AloneOptions{
		Run: "r1", Target: "file:///new", Local: local, Starts: starts, Poll: poll, Clock: clk,
		Done: func() int64 { return localAcked.Load() },
		Pods: func(context.Context) (map[string][]string, error) {
			if appear.Load() {
				return map[string][]string{"pod-1": {"file:///new"}}, nil
			}
			return nil, nil
		},
		Handover: func(pods map[string][]string, b jobs.ReplayRun) (replay.Work, error) {
			handedAt.Store(clk.Now().UnixNano())
			base = b
			return ackAll(&handAcked), nil
		},
	})
	type result struct {
		res replay.Result
		err error
	}
	done := make(chan result, 1)
	go func() {
		res, err := replay.Run(ctx, js, work.Work, &replay.Options{Poll: 20 * time.Millisecond})
		done <- result{res, err}
	}()
	// Two requests made alone, the replay watching for pods: its entry's
	// refresh is due, then writes the last starts.
	waitUntil(t, "two jobs done alone", func() bool { return localAcked.Load() == 2 })
	waitUntil(t, "the entry's refresh armed", func() bool { return slices.Contains(clk.Deadlines(), t0.Add(replay.EntryRefresh)) })
	clk.Advance(replay.EntryRefresh)
	waitUntil(t, "the entry with the last start", func() bool {
		r, ok := readRun(t, kv, "r1")
		return ok && r.Alone && !r.LastStarts["a.example:443"].IsZero()
	})
	// A pod appears; the next poll sees it.
	waitUntil(t, "the poll for pods armed", func() bool { return slices.Contains(clk.Deadlines(), clk.Now().Add(poll)) })
	appear.Store(true)
	clk.Advance(poll)
	r := <-done
	res, err := r.res, r.err
	if err != nil {
		t.Fatal(err)
	}
	if res.Jobs != n || localAcked.Load() != 2 || handAcked.Load() != n-2 {
		t.Errorf("jobs %d: %d done alone, %d handed over; want 2 and %d", res.Jobs, localAcked.Load(), handAcked.Load(), n-2)
	}
	if handedAt.Load() == 0 || localDone.Load() == 0 || handedAt.Load() <= localDone.Load() {
		t.Fatalf("the hand-over began at %d, the local work ended at %d: want it after", handedAt.Load(), localDone.Load())
	}
	if base.Alone || base.AloneUntil.UnixNano() <= localDone.Load() || base.Done != 2 || base.Run != "r1" {
		t.Errorf("hand-over's entry %+v: want Alone false, AloneUntil after the local work ended, Done 2", base)
	}
	if got := base.LastStarts["a.example:443"]; got.Before(started) || got.Sub(started) > time.Second {
		t.Errorf("last start of a.example:443 %s, the request started at %s", got, started)
	}
}

// TestAloneEndsWithItsEntryLeftToExpire: a replay that paced alone to its
// end leaves its entry, marked Ended with its last starts, to expire.
func TestAloneEndsWithItsEntryLeftToExpire(t *testing.T) {
	js, _ := brokertest.Streams(t)
	ctx := brokertest.Context(t)
	publishJobs(t, js, jobs.Job{URL: "https://a.example/0"})
	kv, err := replay.EnsureReplaysBucket(ctx, js, 0)
	if err != nil {
		t.Fatal(err)
	}
	starts := &replay.Starts{}
	d := &worker.Deps{Fetcher: gateFetcher{}}
	starts.Wrap(d)
	local := func(ctx context.Context, c jetstream.Consumer) error {
		for ctx.Err() == nil {
			b, err := c.Fetch(1, jetstream.FetchMaxWait(100*time.Millisecond))
			if err != nil {
				continue
			}
			for m := range b.Messages() {
				d.Fetcher.Do(ctx, fetch.Request{}, func(context.Context, int, authority.Authority) (func(fetch.Result), error) {
					return func(fetch.Result) {}, nil
				})
				m.Ack()
			}
		}
		return nil
	}
	work := replay.Alone(js, kv, replay.AloneOptions{Run: "r2", Target: "file:///new", Local: local, Starts: starts,
		Pods: func(context.Context) (map[string][]string, error) { return nil, nil },
		Handover: func(map[string][]string, jobs.ReplayRun) (replay.Work, error) {
			t.Error("handed over without pods")
			return nil, fmt.Errorf("no")
		},
	})
	if _, err := replay.Run(ctx, js, work.Work, &replay.Options{Poll: 20 * time.Millisecond}); err != nil {
		t.Fatal(err)
	}
	r, ok := readRun(t, kv, "r2")
	if !ok || r.Alone || r.Ended.IsZero() || r.LastStarts["a.example:443"].IsZero() {
		t.Errorf("entry after the end: %+v (found %v); want Ended, not Alone, with the last start of a.example:443", r, ok)
	}
}

// lone is a lone replay over the consumer for the tests below: its local
// work asks the gate for one hop to a.example per job, acks the job only
// once release is closed, and records when it first ran.
type lone struct {
	run     string
	release chan struct{}
	clk     clock.Clock // the replay's and its starts'
	starts  *replay.Starts
	ran     atomic.Int64 // unix nanoseconds of the local work's first request, on clk
	mu      sync.Mutex   // guards fenced and waited
	fenced  map[string]time.Time
	waited  []string
}

func newLone(run string) *lone { return newLoneOn(run, clock.Real{}) }

// newLoneOn is newLone on clk.
func newLoneOn(run string, clk clock.Clock) *lone {
	return &lone{run: run, release: make(chan struct{}), clk: clk, starts: &replay.Starts{Clock: clk}, fenced: map[string]time.Time{}}
}

// stepUntil moves a lone replay on clk until cond holds: each time the
// replay waits for its next poll (a timer armed poll from now), the clock
// advances by step.
func stepUntil(t *testing.T, clk *clock.Fake, poll, step time.Duration, what string, cond func() bool) {
	t.Helper()
	waitUntil(t, what, func() bool {
		if cond() {
			return true
		}
		if slices.Contains(clk.Deadlines(), clk.Now().Add(poll)) {
			clk.Advance(step)
		}
		return false
	})
}

// ackAll is a hand-over's work that acks every job it is given, counting
// them in acked if set.
func ackAll(acked *atomic.Int64) replay.Work {
	return func(ctx context.Context, c jetstream.Consumer) error {
		for ctx.Err() == nil {
			b, err := c.Fetch(8, jetstream.FetchMaxWait(100*time.Millisecond))
			if err != nil {
				continue
			}
			for m := range b.Messages() {
				m.Ack()
				if acked != nil {
					acked.Add(1)
				}
			}
		}
		return nil
	}
}

// lonePoll is the lone replays' Poll in these tests.
const lonePoll = 20 * time.Millisecond

func (l *lone) options(t *testing.T, pods func() map[string][]string, handover func(jobs.ReplayRun)) replay.AloneOptions {
	d := &worker.Deps{Fetcher: gateFetcher{}}
	l.starts.Wrap(d)
	return replay.AloneOptions{
		Run: l.run, Target: "file:///" + l.run, Starts: l.starts, Poll: lonePoll, Clock: l.clk,
		Local: func(ctx context.Context, c jetstream.Consumer) error {
			for ctx.Err() == nil {
				b, err := c.Fetch(1, jetstream.FetchMaxWait(100*time.Millisecond))
				if err != nil {
					continue
				}
				for m := range b.Messages() {
					l.ran.CompareAndSwap(0, l.clk.Now().UnixNano())
					if _, err := d.Fetcher.Do(ctx, fetch.Request{}, func(context.Context, int, authority.Authority) (func(fetch.Result), error) {
						return func(fetch.Result) {}, nil
					}); err != nil {
						t.Error(err)
					}
					select {
					case <-l.release:
						m.Ack()
					case <-ctx.Done():
						m.Nak()
					}
				}
			}
			return nil
		},
		Pods: func(context.Context) (map[string][]string, error) { return pods(), nil },
		Handover: func(_ map[string][]string, base jobs.ReplayRun) (replay.Work, error) {
			handover(base)
			return ackAll(nil), nil
		},
		Fence: func(lasts ...map[string]time.Time) int {
			l.mu.Lock()
			defer l.mu.Unlock()
			n := 0
			for _, set := range lasts {
				for auth, at := range set {
					if at.After(l.fenced[auth]) {
						l.fenced[auth] = at
					}
					n++
				}
			}
			return n
		},
		Waiting: func(e jobs.ReplayRun) {
			l.mu.Lock()
			defer l.mu.Unlock()
			l.waited = append(l.waited, e.Run)
		},
	}
}

// TestLoneReplaysPaceOneAtATime: of two replays that find no pod, the one
// whose entry came second waits (its entry Alone, WaitingFor the first)
// until the first has ended, holding no consumer meanwhile; its first
// request comes after the first replay's end, and is fenced from the
// first one's last start.
func TestLoneReplaysPaceOneAtATime(t *testing.T) {
	js, _ := brokertest.Streams(t)
	ctx := brokertest.Context(t)
	publishJobs(t, js, jobs.Job{URL: "https://a.example/0"})
	kv, err := replay.EnsureReplaysBucket(ctx, js, 0)
	if err != nil {
		t.Fatal(err)
	}
	none := func() map[string][]string { return nil }
	noHandover := func(jobs.ReplayRun) { t.Error("handed over without pods") }
	first, second := newLone("r1"), newLone("r2")
	w1 := replay.Alone(js, kv, first.options(t, none, noHandover))
	done1 := make(chan error, 1)
	var ended1 atomic.Int64
	go func() {
		_, err := replay.Run(ctx, js, w1.Work, &replay.Options{Await: w1.Await, Poll: 20 * time.Millisecond})
		ended1.Store(time.Now().UnixNano())
		done1 <- err
	}()
	waitUntil(t, "the first replay's request", func() bool { return first.ran.Load() != 0 })

	w2 := replay.Alone(js, kv, second.options(t, none, noHandover))
	done2 := make(chan error, 1)
	var res2 replay.Result
	go func() {
		var err error
		res2, err = replay.Run(ctx, js, w2.Work, &replay.Options{Await: w2.Await, Poll: 20 * time.Millisecond})
		done2 <- err
	}()
	waitUntil(t, "the second replay waiting for the first", func() bool {
		r, ok := readRun(t, kv, "r2")
		return ok && r.Alone && r.WaitingFor == "r1"
	})
	// Waiting, it holds no consumer (its first request is checked against
	// the first replay's end below).
	if n := consumers(t, js); n != 1 {
		t.Errorf("%d consumers while the second replay waits: want the first's only", n)
	}
	close(first.release)
	if err := <-done1; err != nil {
		t.Fatal(err)
	}
	close(second.release)
	if err := <-done2; err != nil {
		t.Fatal(err)
	}
	if res2.Jobs != 1 {
		t.Errorf("the second replay did %d jobs, want 1", res2.Jobs)
	}
	// The first replay's end is when its own requests had ended, as its
	// entry says (AloneUntil, which the second waits for), not when Run
	// returned to this test's goroutine: on a loaded machine that came
	// 0.8 ms after the second's first request.
	ended := ended1.Load()
	if r, ok := readRun(t, kv, "r1"); ok && !r.AloneUntil.IsZero() {
		ended = r.AloneUntil.UnixNano()
	}
	if got := second.ran.Load(); got < ended {
		t.Errorf("the second replay's first request %s before the first replay ended", time.Duration(ended-got))
	}
	last := first.starts.Recent(time.Now())["a.example:443"]
	if got := second.fenced["a.example:443"]; last.IsZero() || !got.Equal(last) {
		t.Errorf("the second replay fenced a.example:443 from %s: want the first one's last start %s", got, last)
	}
	if len(second.waited) != 1 || second.waited[0] != "r1" {
		t.Errorf("the second replay said it waited for %v: want [r1]", second.waited)
	}
	if r, _ := readRun(t, kv, "r2"); r.WaitingFor != "" || r.Ended.IsZero() {
		t.Errorf("the second replay's last entry %+v: want ended, waiting for nothing", r)
	}
}

// TestALoneReplayWaitingHandsOverToAPod: a replay that waits for another
// hands all its jobs to a pod that appears meanwhile, starting none itself.
func TestALoneReplayWaitingHandsOverToAPod(t *testing.T) {
	js, _ := brokertest.Streams(t)
	ctx := brokertest.Context(t)
	publishJobs(t, js, jobs.Job{URL: "https://a.example/0"}, jobs.Job{URL: "https://a.example/1"})
	kv, err := replay.EnsureReplaysBucket(ctx, js, 0)
	if err != nil {
		t.Fatal(err)
	}
	// The first replay's entry says it paces alone and is refreshed by
	// nobody: as one that has not yet seen the pod.
	if _, err := kv.Put(ctx, "r0", jobs.ReplayRun{Run: "r0", Target: "file:///r0", Alone: true, Updated: time.Now()}.Encode()); err != nil {
		t.Fatal(err)
	}
	var appear atomic.Bool
	pods := func() map[string][]string {
		if appear.Load() {
			return map[string][]string{"pod-1": {"file:///r2"}}
		}
		return nil
	}
	var base atomic.Pointer[jobs.ReplayRun]
	second := newLone("r2")
	close(second.release)
	w := replay.Alone(js, kv, second.options(t, pods, func(b jobs.ReplayRun) { base.Store(&b) }))
	done := make(chan error, 1)
	go func() {
		_, err := replay.Run(ctx, js, w.Work, &replay.Options{Await: w.Await, Poll: 20 * time.Millisecond})
		done <- err
	}()
	waitUntil(t, "the replay waiting for r0", func() bool {
		r, ok := readRun(t, kv, "r2")
		return ok && r.Alone && r.WaitingFor == "r0"
	})
	appear.Store(true)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if second.ran.Load() != 0 {
		t.Error("the waiting replay started a request of its own")
	}
	if b := base.Load(); b == nil || b.Alone || b.Done != 0 || len(b.LastStarts) != 0 {
		t.Errorf("hand-over's entry %+v: want not Alone, nothing done, no last starts", b)
	}
}

func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func consumers(t *testing.T, js jetstream.JetStream) int {
	t.Helper()
	st, err := js.Stream(brokertest.Context(t), jobs.JobsStream)
	if err != nil {
		t.Fatal(err)
	}
	info, err := st.Info(brokertest.Context(t))
	if err != nil {
		t.Fatal(err)
	}
	return info.State.Consumers
}

// TestAloneBesidePodsThatGoPacesAloneAgain: a replay beside pods keeps
// the pods' pace while none runs but an owner still answers; once none
// answers either, it stops the granted work, fences its own pacer from the
// last start the pods granted, writes its entry Alone with PodsGone, says
// so, and does the rest of the jobs itself. The replay runs on a fake
// clock: GoneAfter passes when the test advances it, not in wall time.
func TestAloneBesidePodsThatGoPacesAloneAgain(t *testing.T) {
	js, _ := brokertest.Streams(t)
	ctx := brokertest.Context(t)
	const n = 4
	for i := range n {
		publishJobs(t, js, jobs.Job{URL: fmt.Sprintf("https://a.example/%d", i)})
	}
	kv, err := replay.EnsureReplaysBucket(ctx, js, 0)
	if err != nil {
		t.Fatal(err)
	}
	var (
		running, silent  atomic.Bool // a pod runs; no owner answers
		asked            atomic.Int32
		grantedAcked     atomic.Int64
		grantedAt        atomic.Int64 // unix nanoseconds of the granted request's start, on clk
		orphaned         atomic.Int32
		duringAlone      atomic.Pointer[jobs.ReplayRun]
		localAckedBefore atomic.Int64
	)
	running.Store(true)
	clk := clock.NewFake(time.Date(2026, 12, 4, 10, 0, 0, 0, time.UTC))
	l := newLoneOn("r3", clk)
	close(l.release)
	o := l.options(t, func() map[string][]string {
		if running.Load() {
			return map[string][]string{"pod-1": nil}
		}
		return nil
	}, func(jobs.ReplayRun) {})
	granted := &worker.Deps{Fetcher: gateFetcher{}}
	l.starts.Wrap(granted) // as the replay's granted worker records its starts
	o.Handover = func(map[string][]string, jobs.ReplayRun) (replay.Work, error) {
		return func(ctx context.Context, c jetstream.Consumer) error {
			// One job granted and done; then the pods go, and the rest waits
			// for grants nobody gives, until the work is stopped.
			for grantedAcked.Load() == 0 && ctx.Err() == nil {
				b, err := c.Fetch(1, jetstream.FetchMaxWait(100*time.Millisecond))
				if err != nil {
					continue
				}
				for m := range b.Messages() {
					if _, err := granted.Fetcher.Do(ctx, fetch.Request{}, func(context.Context, int, authority.Authority) (func(fetch.Result), error) {
						grantedAt.Store(clk.Now().UnixNano())
						return func(fetch.Result) {}, nil
					}); err != nil {
						t.Error(err)
					}
					m.Ack()
					grantedAcked.Add(1)
				}
			}
			running.Store(false)
			<-ctx.Done()
			return ctx.Err()
		}, nil
	}
	o.Running = func(context.Context) (bool, error) { return running.Load(), nil }
	o.Unanswered = func(time.Time) bool { asked.Add(1); return silent.Load() }
	o.Orphaned = func(time.Time) { orphaned.Add(1) }
	local := o.Local
	o.Local = func(ctx context.Context, c jetstream.Consumer) error {
		if r, ok := readRun(t, kv, "r3"); ok {
			duringAlone.Store(&r)
		}
		localAckedBefore.Store(grantedAcked.Load())
		return local(ctx, c)
	}
	w := replay.Alone(js, kv, o)
	done := make(chan error, 1)
	go func() {
		_, err := replay.Run(ctx, js, w.Work, &replay.Options{Await: w.Await, Poll: 20 * time.Millisecond})
		done <- err
	}()
	// No pod runs, but an owner still answers (a pod between lease rounds
	// that still grants): the replay keeps the pods' pace. Each step is
	// GoneAfter: from the second poll on, it asks.
	waitUntil(t, "the granted request, then the pods gone", func() bool { return !running.Load() })
	stepUntil(t, clk, lonePoll, replay.GoneAfter, "the replay asking whether the owners answer", func() bool { return asked.Load() >= 3 })
	if r, ok := readRun(t, kv, "r3"); !ok || r.Alone || l.ran.Load() != 0 {
		t.Fatalf("the replay paced alone while an owner answered: entry %+v, own request at %d", r, l.ran.Load())
	}
	silent.Store(true)
	stepUntil(t, clk, lonePoll, lonePoll, "the replay's end", func() bool { return len(done) > 0 })
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if orphaned.Load() != 1 || l.ran.Load() == 0 || grantedAcked.Load() != 1 || localAckedBefore.Load() != 1 {
		t.Fatalf("told %d times, own requests from %d, %d granted before: want told once, the rest done alone after 1 granted",
			orphaned.Load(), l.ran.Load(), localAckedBefore.Load())
	}
	if r := duringAlone.Load(); r == nil || !r.Alone || r.PodsGone.IsZero() || !r.AloneUntil.IsZero() {
		t.Errorf("entry while pacing alone again: %+v; want Alone, PodsGone set, no AloneUntil", r)
	}
	l.mu.Lock()
	fenced := l.fenced["a.example:443"]
	l.mu.Unlock()
	if g := time.Unix(0, grantedAt.Load()); fenced.Before(g) || fenced.Sub(g) > time.Second {
		t.Errorf("fenced a.example:443 from %s, the granted request started at %s: want from it", fenced, g)
	}
	if r, ok := readRun(t, kv, "r3"); !ok || r.Ended.IsZero() {
		t.Errorf("entry after the end: %+v (found %v); want it Ended, left to expire, as a lone replay's", r, ok)
	}
}

// TestAloneGoesBackToThePodsWhenOneReturns: a replay that paces alone
// again because its pods went hands the rest over once a pod returns, as
// one that began alone: its own request stopped first, the entry handed
// over with its last start and no PodsGone. The replay runs on a fake
// clock, as above.
func TestAloneGoesBackToThePodsWhenOneReturns(t *testing.T) {
	js, _ := brokertest.Streams(t)
	ctx := brokertest.Context(t)
	const n = 3
	for i := range n {
		publishJobs(t, js, jobs.Job{URL: fmt.Sprintf("https://a.example/%d", i)})
	}
	kv, err := replay.EnsureReplaysBucket(ctx, js, 0)
	if err != nil {
		t.Fatal(err)
	}
	var (
		running   atomic.Bool
		handovers atomic.Int32
		second    atomic.Pointer[jobs.ReplayRun]
		acked     atomic.Int64
	)
	running.Store(true)
	clk := clock.NewFake(time.Date(2026, 12, 4, 10, 0, 0, 0, time.UTC))
	l := newLoneOn("r4", clk) // its local work holds its job until stopped
	o := l.options(t, func() map[string][]string {
		if running.Load() {
			return map[string][]string{"pod-1": nil}
		}
		return nil
	}, func(jobs.ReplayRun) {})
	o.Handover = func(_ map[string][]string, base jobs.ReplayRun) (replay.Work, error) {
		if handovers.Add(1) == 2 {
			second.Store(&base)
			return ackAll(&acked), nil
		}
		return func(ctx context.Context, c jetstream.Consumer) error {
			running.Store(false) // the pods go before granting anything
			<-ctx.Done()
			return ctx.Err()
		}, nil
	}
	o.Running = func(context.Context) (bool, error) { return running.Load(), nil }
	o.Unanswered = func(time.Time) bool { return true }
	w := replay.Alone(js, kv, o)
	done := make(chan error, 1)
	go func() {
		_, err := replay.Run(ctx, js, w.Work, &replay.Options{Await: w.Await, Poll: 20 * time.Millisecond})
		done <- err
	}()
	stepUntil(t, clk, lonePoll, replay.GoneAfter, "the replay's own request after the pods went", func() bool { return l.ran.Load() != 0 })
	running.Store(true) // a pod returns
	stepUntil(t, clk, lonePoll, lonePoll, "the replay's end", func() bool { return len(done) > 0 })
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	b := second.Load()
	if handovers.Load() != 2 || b == nil || acked.Load() != n {
		t.Fatalf("%d hand-overs, the second's entry %+v, %d acked after it: want 2, and all %d jobs done in the pods' pace", handovers.Load(), b, acked.Load(), n)
	}
	if b.Alone || !b.PodsGone.IsZero() || b.AloneUntil.Before(time.Unix(0, l.ran.Load())) || b.LastStarts["a.example:443"].IsZero() {
		t.Errorf("the second hand-over's entry %+v: want not Alone, no PodsGone, AloneUntil after its own request, that request's start", b)
	}
	if _, ok := readRun(t, kv, "r4"); ok {
		t.Error("the entry outlived a replay that ended in the pods' pace")
	}
}
