package worker_test

import (
	"context"
	"fmt"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/mirrorworker/mirrorworker/clock"
	"github.com/mirrorworker/mirrorworker/fetch"
	"github.com/mirrorworker/mirrorworker/jobs"
	"github.com/mirrorworker/mirrorworker/worker"
)

// partitioned is a worker in partitioned mode on e, serving every partition
// while owned reports true for it.
type partitioned struct {
	*running
	owned []atomic.Bool
}

func (e *env) startPartitioned(p worker.Pacer, o worker.Options) *partitioned {
	return e.startPartitionedWith(p, o, nil)
}

// startPartitionedWith is startPartitioned with the single consumer of an
// earlier version to move unpartitioned jobs from (nil: none).
func (e *env) startPartitionedWith(p worker.Pacer, o worker.Options, legacy jetstream.Consumer) *partitioned {
	e.t.Helper()
	return e.startServing(p, o, legacy, func(int) bool { return true })
}

// startServing is a partitioned worker, one pod of several on e, that
// owns and serves the partitions serve selects.
func (e *env) startServing(p worker.Pacer, o worker.Options, legacy jetstream.Consumer, serve func(int) bool) *partitioned {
	e.t.Helper()
	ctx := context.Background()
	parts, err := jobs.EnsureWork(ctx, e.js, &jobs.WorkOptions{Consumer: &jobs.ConsumerOptions{AckWait: 30 * time.Second}})
	if err != nil {
		e.t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	o.Registerer = reg
	o.Logger = testLogger(e.t)
	o.Partitions = parts
	o.PullWait = testPullWait(o.PullWait)
	pw := &partitioned{owned: make([]atomic.Bool, parts)}
	f := fetch.New(&fetch.Options{AllowPrivate: true})
	w, err := worker.New(worker.Deps{JS: e.js, Fetcher: f, Target: e.target, Pacer: p,
		Owns: func(i int) bool { return pw.owned[i].Load() }, Legacy: legacy}, &o)
	if err != nil {
		e.t.Fatal(err)
	}
	pw.running = e.launch(w, reg, f)
	e.waitReady(w)
	var clk clock.Clock = clock.Real{}
	if o.Clock != nil {
		clk = o.Clock
	}
	for i := range parts {
		if !serve(i) {
			continue
		}
		c, err := jobs.EnsurePartitionConsumer(ctx, e.js, i, &jobs.ConsumerOptions{AckWait: 30 * time.Second}, 0)
		if err != nil {
			e.t.Fatal(err)
		}
		pw.owned[i].Store(true)
		if err := w.AddPartition(i, e.consumer(c), clk.Now()); err != nil {
			e.t.Fatal(err)
		}
	}
	return pw
}

// TestPartitionedDrains: in partitioned mode every job of every authority
// is stored once, from the partition consumers.
func TestPartitionedDrains(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 30*time.Second)
	origins := []*origin{newOrigin(t), newOrigin(t), newOrigin(t)}
	const per = 20
	var js []jobs.Job
	for k, o := range origins {
		for i := range per {
			js = append(js, jobs.Job{ID: fmt.Sprint("p", k, "-", i), URL: o.url(fmt.Sprint("/p/", i)), Target: fmt.Sprint("o", k, "/p/", i)})
		}
	}
	// Published before any partition consumer exists.
	e.publish(js...)
	r := e.startPartitioned(testPacer(0, 2, nil, 0, nil), worker.Options{Concurrency: 8})
	r.f.waitFor(t, len(js), nil, 30*time.Second)
	for k := range origins {
		for i := range per {
			e.checkStored(fmt.Sprint("o", k, "/p/", i), body(fmt.Sprint("/p/", i)))
		}
	}
	_ = http.StatusOK
}

// TestPartitionedMovesJobsOfAnEarlierVersion: jobs an earlier version stored
// without a partition token, and that its single consumer had not acked,
// are moved into their partitions and stored after an upgrade; the ones it
// had acked are not done again.
func TestPartitionedMovesJobsOfAnEarlierVersion(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 30*time.Second)
	o := newOrigin(t)
	ctx := context.Background()
	s, err := e.js.Stream(ctx, jobs.JobsStream)
	if err != nil {
		t.Fatal(err)
	}
	cfg := s.CachedInfo().Config
	cfg.SubjectTransform = nil // as an earlier version created it
	if _, err := e.js.UpdateStream(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	var js []jobs.Job
	for i := range 6 {
		js = append(js, jobs.Job{ID: fmt.Sprint("old-", i), URL: o.url(fmt.Sprint("/old/", i)), Target: fmt.Sprint("old/", i)})
	}
	e.publish(js...)
	b, err := e.cons.Fetch(2)
	if err != nil {
		t.Fatal(err)
	}
	for m := range b.Messages() { // an earlier worker did these two
		if err := m.DoubleAck(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if err := jobs.EnsureStreams(ctx, e.js, nil); err != nil { // the upgrade
		t.Fatal(err)
	}
	r := e.startPartitionedWith(testPacer(0, 2, nil, 0, nil), worker.Options{}, e.cons)
	r.f.waitFor(t, 4, nil, 30*time.Second)
	for i := 2; i < 6; i++ {
		e.checkStored(fmt.Sprint("old/", i), body(fmt.Sprint("/old/", i)))
	}
	if n := len(o.log()); n != 4 {
		t.Errorf("origin got %d requests, want the 4 jobs not done before", n)
	}
}

// TestEveryPartitionPullsOnceAdded: once a pod has added its partitions,
// every one of them has a pull waiting on the server. The pulls of the
// first partitions added were sized for the few served then (256, 250,
// 166, ... of MaxHeld 1000) and held that room until they expired: the
// partitions added after them waited a whole PullWait for room, and a job
// published into one sat in the stream that long (0.93 s after each pod's
// start in the politeness benchmark, ADR 0029's eighth look). PullWait is
// long here so that no expiry hides the wait; nothing is published.
func TestEveryPartitionPullsOnceAdded(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 30*time.Second)
	const pullWait = 4 * time.Second
	r := e.startPartitioned(testPacer(0, 2, nil, 0, nil), worker.Options{PullWait: pullWait})
	defer r.stop(t)
	ctx := context.Background()
	waiting := func() []int {
		var none []int
		for i := range r.owned {
			c, err := e.js.Consumer(ctx, jobs.JobsStream, jobs.PartitionConsumer(i))
			if err != nil {
				t.Fatal(err)
			}
			info, err := c.Info(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if info.NumWaiting == 0 {
				none = append(none, i)
			}
		}
		return none
	}
	// Half the expiry: a partition without a pull by then waits for room
	// that only an expiry frees.
	deadline := time.Now().Add(pullWait / 2)
	for {
		none := waiting()
		if len(none) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d partitions have no pull waiting %s after they were added: %v", len(none), len(r.owned), pullWait/2, none)
		}
		time.Sleep(20 * time.Millisecond) // polls the server's state; no time is meant to pass
	}
}
