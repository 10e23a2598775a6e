package pipeline_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/mirrorworker/mirrorworker/jobs"
	"github.com/mirrorworker/mirrorworker/pacer"
	"github.com/mirrorworker/mirrorworker/pipeline"
)

// TestSharedPodWaitsForALoneReplay: a pod of the shared consumer
// (--partitions 0) announces itself in MIRROR_PODS, takes no work while a
// replay's entry says it paces alone, then starts with its first request
// to the replay's last authority spaced from the replay's last start; and
// withdraws its entry when it stops.
func TestSharedPodWaitsForALoneReplay(t *testing.T) {
	t.Parallel()
	js := startJetStream(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	replays, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: jobs.ReplaysBucket, History: 1, TTL: jobs.ReplaysTTL})
	if err != nil {
		t.Fatal(err)
	}
	put := func(r jobs.ReplayRun) {
		r.Run, r.Target, r.Updated = "r1", "file:///new", time.Now().UTC()
		if _, err := replays.Put(ctx, r.Run, r.Encode()); err != nil {
			t.Fatal(err)
		}
	}
	put(jobs.ReplayRun{Alone: true})
	const floor = 10 * time.Second
	parts, err := pipeline.New(js, pipeline.Config{
		Policy: &pacer.Policy{Default: pacer.Limits{Floor: floor, MaxInFlight: 1}},
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
	pod, err := parts.StartPod(ctx, &pipeline.PodOptions{PodID: "pod-1", Target: target, LeaseTTL: 2 * time.Second,
		Logger: zerolog.New(zerolog.NewTestWriter(t)).Level(zerolog.InfoLevel)})
	if err != nil {
		t.Fatal(err)
	}
	rctx, stop := context.WithCancel(ctx)
	ran := make(chan error, 1)
	go func() { ran <- pod.Run(rctx) }()

	announced := func() bool {
		kv, err := js.KeyValue(ctx, jobs.PodsBucket)
		if err != nil {
			return false
		}
		_, err = kv.Get(ctx, "pod-1")
		return err == nil
	}
	deadline := time.Now().Add(10 * time.Second)
	for !announced() {
		if time.Now().After(deadline) {
			t.Fatal("the pod did not announce itself in " + jobs.PodsBucket)
		}
		time.Sleep(20 * time.Millisecond)
	}
	// Longer than the bucket's TTL: the entry is kept while the pod waits.
	select {
	case <-pod.Worker.Pulling():
		t.Fatal("the pod took work while a replay paced alone")
	case <-time.After(3 * time.Second):
	}
	if !announced() {
		t.Error("the pod's entry lapsed while it waited")
	}
	last := time.Now().Add(-time.Second)
	put(jobs.ReplayRun{AloneUntil: time.Now().UTC(), LastStarts: map[string]time.Time{"a.example:443": last}})
	select {
	case <-pod.Worker.Pulling():
	case <-time.After(10 * time.Second):
		t.Fatal("the pod did not start once the replay stopped pacing alone")
	}
	if wait, _, _ := parts.Pacer.ReadyIn(time.Now(), "a.example:443"); wait < floor-3*time.Second || wait > floor {
		t.Errorf("first request to a.example:443 in %s; want the floor %s from the replay's last start, 1 s ago", wait, floor)
	}
	stop()
	if err := <-ran; err != nil && !errors.Is(err, context.Canceled) {
		t.Fatalf("pod: %v", err)
	}
	if announced() {
		t.Error("the pod's entry is left after it stopped")
	}
}
