package pipeline_test

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/mirrorworker/mirrorworker/clock"
	"github.com/mirrorworker/mirrorworker/jobs"
	"github.com/mirrorworker/mirrorworker/pacer"
	"github.com/mirrorworker/mirrorworker/pipeline"
)

// TestSharedPodWaitsForALoneReplay: a pod of the shared consumer
// (--partitions 0) announces itself in MIRROR_PODS, takes no work while a
// replay's entry says it paces alone, keeping its entry younger than the
// bucket's TTL all the while, then starts with its first request to the
// replay's last authority spaced from the replay's last start; and
// withdraws its entry when it stops. The pod runs on clock.Fake: the test
// moves its wait on, poll by poll, past the TTL.
func TestSharedPodWaitsForALoneReplay(t *testing.T) {
	t.Parallel()
	js := startJetStream(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	clk := clock.NewFake(time.Now())
	replays, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: jobs.ReplaysBucket, History: 1, TTL: jobs.ReplaysTTL})
	if err != nil {
		t.Fatal(err)
	}
	put := func(r jobs.ReplayRun) {
		r.Run, r.Target, r.Updated = "r1", "file:///new", clk.Now().UTC()
		if _, err := replays.Put(ctx, r.Run, r.Encode()); err != nil {
			t.Fatal(err)
		}
	}
	put(jobs.ReplayRun{Alone: true})
	const floor = 10 * time.Second
	parts, err := pipeline.New(js, pipeline.Config{
		Policy: &pacer.Policy{Default: pacer.Limits{Floor: floor, MaxInFlight: 1}},
		Clock:  clk,
		Logger: zerolog.New(zerolog.NewTestWriter(t)).Level(zerolog.InfoLevel),
	})
	if err != nil {
		t.Fatal(err)
	}
	defer parts.Close()
	target, err := pipeline.OpenTarget(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	const ttl = 2 * time.Second // the pods bucket's
	pod, err := parts.StartPod(ctx, &pipeline.PodOptions{PodID: "pod-1", Target: target, LeaseTTL: ttl,
		Logger: zerolog.New(zerolog.NewTestWriter(t)).Level(zerolog.InfoLevel)})
	if err != nil {
		t.Fatal(err)
	}
	rctx, stop := context.WithCancel(ctx)
	ran := make(chan error, 1)
	go func() { ran <- pod.Run(rctx) }()

	// revision is the pod's entry's revision in MIRROR_PODS, 0 if none.
	revision := func() uint64 {
		kv, err := js.KeyValue(ctx, jobs.PodsBucket)
		if err != nil {
			return 0
		}
		e, err := kv.Get(ctx, "pod-1")
		if err != nil {
			return 0
		}
		return e.Revision()
	}
	// waiting waits until the pod waits for its next read of the replays
	// (a timer armed a poll from now on its clock); polling then moves it
	// there.
	const poll = 200 * time.Millisecond
	waiting := func() {
		t.Helper()
		at := clk.Now().Add(poll)
		for !slices.ContainsFunc(clk.Deadlines(), at.Equal) {
			select {
			case <-pod.Worker.Pulling():
				t.Fatal("the pod took work while a replay paced alone")
			case <-ctx.Done():
				t.Fatalf("the pod is not waiting for the replay (clock's deadlines %v, want %v among them)", clk.Deadlines(), at)
			case <-time.After(5 * time.Millisecond):
			}
		}
	}
	polling := func() {
		t.Helper()
		waiting()
		clk.Advance(poll)
	}
	// Past the bucket's TTL on the pod's clock, poll by poll: the pod
	// takes no work, and its entry, rewritten while it waits, is never
	// older than the TTL.
	waiting()
	began := clk.Now()
	rev, written := revision(), began
	if rev == 0 {
		t.Fatal("the pod did not announce itself in " + jobs.PodsBucket)
	}
	for clk.Now().Sub(began) < 2*ttl {
		polling()
		if r := revision(); r != rev {
			rev, written = r, clk.Now()
		}
		if age := clk.Now().Sub(written); age >= ttl {
			t.Fatalf("%s into the wait, the pod's entry was last written %s ago (the bucket's TTL is %s)", clk.Now().Sub(began), age, ttl)
		}
	}
	waiting() // its last read of the replays done: it still waits
	select {
	case <-pod.Worker.Pulling():
		t.Fatal("the pod took work while a replay paced alone")
	default:
	}
	last := clk.Now().Add(-time.Second)
	put(jobs.ReplayRun{AloneUntil: clk.Now().UTC(), LastStarts: map[string]time.Time{"a.example:443": last}})
	polling()
	select {
	case <-pod.Worker.Pulling():
	case <-ctx.Done():
		t.Fatal("the pod did not start once the replay stopped pacing alone")
	}
	// The floor and its start guard, from the replay's last start.
	want := floor + pacer.StartGuardFor(floor) - clk.Now().Sub(last)
	if wait, _, _ := parts.Pacer.ReadyIn(clk.Now(), "a.example:443"); wait != want {
		t.Errorf("first request to a.example:443 in %s; want %s: the floor %s from the replay's last start, %s ago", wait, want, floor, clk.Now().Sub(last))
	}
	stop()
	if err := <-ran; err != nil && !errors.Is(err, context.Canceled) {
		t.Fatalf("pod: %v", err)
	}
	if revision() != 0 {
		t.Error("the pod's entry is left after it stopped")
	}
}
