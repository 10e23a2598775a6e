package replay

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/mirrorworker/mirrorworker/clock"
	"github.com/mirrorworker/mirrorworker/jobs"
)

// A replay beside live pods fetches and stores its jobs itself, each
// request's start granted by the pod that owns its authority (package
// grant, docs/adr/0031); a replay that finds none paces alone until one
// starts (Alone). These are what it reads of the pods, and the bucket of
// the runs.

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
	pods, err := jobs.Entries[podStatus](ctx, js, kv)
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

// EnsureReplaysBucket creates jobs.ReplaysBucket when it is missing.
func EnsureReplaysBucket(ctx context.Context, js jetstream.JetStream, replicas int) (jetstream.KeyValue, error) {
	kv, err := js.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: jobs.ReplaysBucket,
		Description: "mirrorworker replays: their counts, and whether they pace alone", History: 1, TTL: jobs.ReplaysTTL,
		Storage: jetstream.FileStorage, Replicas: max(replicas, 1)})
	if err != nil {
		return nil, fmt.Errorf("create or update bucket %s: %w", jobs.ReplaysBucket, err)
	}
	return kv, nil
}

// podsRetry is how often WaitForPods asks again: a pod announces itself
// within a lease round of a failed one, so a quarter second sees it soon
// after, and a replay's start is no hot path.
const podsRetry = 250 * time.Millisecond

// WaitForPods is LivePods, except that while partitions of MIRROR_JOBS are
// leased (jobs.LeasesBucket) but no pod is announced (a pod whose lease
// round failed withdraws its announcement until one succeeds) it asks again
// for up to patience, on clk (nil: the wall clock): a replay must not take
// itself for alone beside a pod.
func WaitForPods(ctx context.Context, js jetstream.JetStream, clk clock.Clock, patience time.Duration) (map[string][]string, error) {
	if clk == nil {
		clk = clock.Real{}
	}
	deadline := clk.Now().Add(patience)
	for {
		pods, err := LivePods(ctx, js)
		if err != nil || len(pods) > 0 || !leased(ctx, js) {
			return pods, err
		}
		if clk.Now().After(deadline) {
			return nil, fmt.Errorf("partitions of %s are leased but no pod is announced in %s: a pod is running and cannot reach NATS; try again", jobs.JobsStream, jobs.PodsBucket)
		}
		if !clock.Sleep(clk, podsRetry, ctx.Done()) {
			return nil, ctx.Err()
		}
	}
}

// PodsRunning reports whether a pod runs: one is announced in
// jobs.PodsBucket, or a partition is leased (a pod between lease rounds,
// as WaitForPods reads it). A killed pod stops running when its entry and
// its leases expire (their TTL, jobs.DefaultLeaseTTL by default).
func PodsRunning(ctx context.Context, js jetstream.JetStream) (bool, error) {
	pods, err := LivePods(ctx, js)
	if err != nil {
		return false, err
	}
	return len(pods) > 0 || leased(ctx, js), nil
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
