package worker_test

import (
	"bytes"
	"context"
	"net/http"
	"path/filepath"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/mirrorworker/mirrorworker/clock"
	"github.com/mirrorworker/mirrorworker/deadletter"
	"github.com/mirrorworker/mirrorworker/fetch"
	"github.com/mirrorworker/mirrorworker/jobs"
	"github.com/mirrorworker/mirrorworker/mirror"
	"github.com/mirrorworker/mirrorworker/pacer"
	"github.com/mirrorworker/mirrorworker/replay"
	"github.com/mirrorworker/mirrorworker/worker"
)

// TestAReplaysFailuresAreItsOwn (issue 37): a live job failing while its
// replay copy runs on the same pod keeps its own attempts, and the copy its
// own, both ways. The live job had used two of its three attempts when the
// copy arrived; before attempts were keyed by run, the copy's first failure
// was the shared count's third: the copy was dead-lettered into the
// replays' stream with the live job's attempts, and the live job began
// again at attempt 1 (five live requests). Now each is dead-lettered after
// three requests of its own: the live job into MIRROR_DLQ (`dlq list`),
// the copy into the replays' stream (`dlq list --replays`).
//
// The origin tells the two apart by the conditional request: the object is
// in the pod's target, so the live job asks with If-None-Match, and the
// replay's target is empty, so the copy asks without.
//
// On the worker's fake clock, with the NAK delays of the retries on it too
// (fakeNaks): the test advances the clock to the next retry whenever both
// jobs wait for theirs.
func TestAReplaysFailuresAreItsOwn(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 30*time.Second)
	fake := clock.NewFake(time.Now())
	naks := newFakeNaks(e, fake)
	ctx := context.Background()
	if err := replay.EnsureDeadLetterStream(ctx, e.js, 0); err != nil {
		t.Fatal(err)
	}
	o := newOrigin(t)
	o.setBehave(func(w http.ResponseWriter, r *http.Request, n int) bool {
		w.WriteHeader(http.StatusServiceUnavailable)
		return true
	})
	const key = "obj"
	b := body("/obj")
	if _, err := e.target.Put(ctx, key, bytes.NewReader(b), mirror.Expect{}, mirror.Meta{URL: o.url("/obj"), ETag: etag(b), JobID: "j1"}); err != nil {
		t.Fatal(err)
	}
	replayTarget, err := mirror.Open(filepath.Join(t.TempDir(), "replay"))
	if err != nil {
		t.Fatal(err)
	}

	const budget = 3
	// The job's budget is the point: the authority's failure backoff is
	// off, and the live job's third try waits its backoff (1 to 3 s) while
	// the copy, published then, starts at once.
	p := pacer.New(&pacer.Options{Policy: &pacer.Policy{Default: pacer.Limits{Floor: 0, MaxInFlight: 2}}, FailureBackoffMin: -1})
	f := fetch.New(&fetch.Options{AllowPrivate: true})
	reg := prometheus.NewRegistry()
	w, err := worker.New(worker.Deps{JS: e.js, Consumer: e.consumer(e.cons), Fetcher: f, Target: e.target, Pacer: p,
		ReplayTarget: func(context.Context, string, string) (worker.Target, error) { return replayTarget, nil },
	}, &worker.Options{FailureBudget: budget, BackoffInitial: time.Second, BackoffMax: 3 * time.Second,
		Registerer: reg, Logger: testLogger(t), PullWait: testPullWait(0), Clock: fake})
	if err != nil {
		t.Fatal(err)
	}
	r := e.launch(w, reg, f)
	e.waitReady(w)

	job := jobs.Job{ID: "j1", URL: o.url("/obj"), Target: key}
	e.publish(job)
	retried := func() bool {
		return counter(t, reg, "mirrorworker_jobs_total", map[string]string{"outcome": "retried"}) >= 2
	}
	for !naks.advanceWhenWaiting(t, func() int { return 1 }, retried) {
	}
	copyAt := fake.Now()
	m, _, err := jobs.NewMsg(job)
	if err != nil {
		t.Fatal(err)
	}
	m.Header.Set(jetstream.MsgIDHeader, "replay:r1:1:1") // as replay.Handover's copies
	m.Header.Set(jobs.HeaderReplay, "r1")
	m.Header.Set(jobs.HeaderReplayTarget, "file://"+replayTarget.Root())
	m.Header.Set(jobs.HeaderReplayOf, "1")
	if _, err := e.js.PublishMsg(ctx, m); err != nil {
		t.Fatal(err)
	}
	// Each job comes back when the clock reaches its retry: advance it
	// whenever neither is in the worker's hands.
	dead := func() int { return r.f.count(isOutcome(worker.OutcomeDeadLettered)) }
	for !naks.advanceWhenWaiting(t, func() int { return 2 - dead() }, func() bool { return dead() == 2 }) {
	}
	e.waitDrained(10 * time.Second)

	var live, replayed int
	for _, a := range o.log() {
		if a.cond {
			live++
		} else {
			replayed++
		}
	}
	if live != budget || replayed != budget {
		t.Errorf("the origin saw %d requests of the live job and %d of its replay copy, want %d each", live, replayed, budget)
	}
	dls := e.deadLetters()
	if len(dls) != 1 || dls[0].Replay != "" || len(dls[0].Attempts) != budget || dls[0].Reason != jobs.ReasonBudgetExhausted {
		t.Fatalf("MIRROR_DLQ holds %+v, want the live job's one dead letter with its %d attempts", dls, budget)
	}
	recs, err := deadletter.List(context.Background(), e.js, deadletter.Query{Replays: true})
	if err != nil {
		t.Fatal(err)
	}
	var rdls []jobs.DeadLetter
	for _, r := range recs {
		rdls = append(rdls, r.Record)
	}
	if len(rdls) != 1 || rdls[0].Replay != "r1" || len(rdls[0].Attempts) != budget {
		t.Fatalf("the replays' stream holds %+v, want the copy's one dead letter with its %d attempts", rdls, budget)
	}
	for _, a := range rdls[0].Attempts {
		if a.Time.Before(copyAt) {
			t.Errorf("the copy's dead letter holds an attempt of %s, before the copy was published (%s): the live job's", a.Time, copyAt)
		}
	}
}
