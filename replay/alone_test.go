package replay_test

import (
	"context"
	"encoding/json"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/mirrorworker/mirrorworker/authority"
	"github.com/mirrorworker/mirrorworker/broker/brokertest"
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
// local work handed back are the hand-over's.
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
	starts := &replay.Starts{}
	d := &worker.Deps{Fetcher: gateFetcher{}}
	starts.Wrap(d)
	var (
		appear                atomic.Bool
		localDone, handedAt   atomic.Int64
		started               time.Time
		base                  jobs.ReplayRun
		localAcked, handAcked atomic.Int64
	)
	local := func(ctx context.Context, c jetstream.Consumer) error {
		defer func() { localDone.Store(time.Now().UnixNano()) }()
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
				started = time.Now()
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
	work := replay.Alone(kv, replay.AloneOptions{
		Run: "r1", Target: "file:///new", Local: local, Starts: starts, Poll: 20 * time.Millisecond,
		Done: func() int64 { return localAcked.Load() },
		Pods: func(context.Context) (map[string][]string, error) {
			if appear.Load() {
				return map[string][]string{"pod-1": {"file:///new"}}, nil
			}
			return nil, nil
		},
		Handover: func(pods map[string][]string, b jobs.ReplayRun) (replay.Work, error) {
			handedAt.Store(time.Now().UnixNano())
			base = b
			return func(ctx context.Context, c jetstream.Consumer) error {
				for ctx.Err() == nil {
					b, err := c.Fetch(n, jetstream.FetchMaxWait(100*time.Millisecond))
					if err != nil {
						continue
					}
					for m := range b.Messages() {
						m.Ack()
						handAcked.Add(1)
					}
				}
				return nil
			}, nil
		},
	})
	go func() {
		for {
			if r, ok := readRun(t, kv, "r1"); ok && r.Alone && localAcked.Load() == 2 && !r.LastStarts["a.example:443"].IsZero() {
				appear.Store(true)
				return
			}
			time.Sleep(50 * time.Millisecond)
		}
	}()
	res, err := replay.Run(ctx, js, work, &replay.Options{Poll: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if res.Jobs != n || localAcked.Load() != 2 || handAcked.Load() != n-2 {
		t.Errorf("jobs %d: %d done alone, %d handed over; want 2 and %d", res.Jobs, localAcked.Load(), handAcked.Load(), n-2)
	}
	if handedAt.Load() == 0 || localDone.Load() == 0 || handedAt.Load() < localDone.Load() {
		t.Fatalf("the hand-over began at %d, the local work ended at %d: want it after", handedAt.Load(), localDone.Load())
	}
	if base.Alone || base.AloneUntil.UnixNano() < localDone.Load() || base.Done != 2 || base.Run != "r1" {
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
	work := replay.Alone(kv, replay.AloneOptions{Run: "r2", Target: "file:///new", Local: local, Starts: starts,
		Pods: func(context.Context) (map[string][]string, error) { return nil, nil },
		Handover: func(map[string][]string, jobs.ReplayRun) (replay.Work, error) {
			t.Error("handed over without pods")
			return nil, fmt.Errorf("no")
		},
	})
	if _, err := replay.Run(ctx, js, work, &replay.Options{Poll: 20 * time.Millisecond}); err != nil {
		t.Fatal(err)
	}
	r, ok := readRun(t, kv, "r2")
	if !ok || r.Alone || r.Ended.IsZero() || r.LastStarts["a.example:443"].IsZero() {
		t.Errorf("entry after the end: %+v (found %v); want Ended, not Alone, with the last start of a.example:443", r, ok)
	}
}
