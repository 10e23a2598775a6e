package pipeline

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/mirrorworker/mirrorworker/clock"
	"github.com/mirrorworker/mirrorworker/facts"
	"github.com/mirrorworker/mirrorworker/jobs"
)

// A pod keeps one pace with a replay that paces its own requests because
// it found no pod (docs/adr/0025): the pod announces itself in
// jobs.PodsBucket, then, before it takes any work, waits until no entry of
// jobs.ReplaysBucket says a replay paces alone (the replay sees the pod,
// stops starting requests, lets those in flight end and goes
// on in the pods' pace), at most LoneReplayPatience; then it spaces its first request to
// each authority such a replay started recently from that start
// (pacer.Fence). A pod of the shared consumer (no partitions, no lease
// manager to announce it) announces itself here for as long as it runs, so
// that a replay beside it asks it for its starts too (docs/adr/0031).

// LoneReplayPatience bounds how long a starting pod waits for replays that
// pace alone to stop: longer than a replay takes to notice the pod (half a
// second), end its requests in flight (its worker's 10 s grace) and
// publish its facts (5 s at most).
const LoneReplayPatience = 30 * time.Second

// loneReplayPoll is how often a waiting pod reads the replays' entries.
const loneReplayPoll = 200 * time.Millisecond

// podsBucket opens jobs.PodsBucket, creating it for a pod of the shared
// consumer (EnsureWork creates it in the partitioned layout).
func (pod *Pod) podsBucket(ctx context.Context) (jetstream.KeyValue, error) {
	js := pod.parts.js
	kv, err := js.KeyValue(ctx, jobs.PodsBucket)
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		kv, err = js.CreateKeyValue(ctx, jobs.PodsBucketConfig(pod.leaseTTL, max(pod.replicas, 1)))
		if errors.Is(err, jetstream.ErrBucketExists) {
			kv, err = js.KeyValue(ctx, jobs.PodsBucket)
		}
	}
	if err != nil {
		return nil, fmt.Errorf("bucket %s: %w", jobs.PodsBucket, err)
	}
	return kv, nil
}

// status is the pod's entry in jobs.PodsBucket: written by the lease
// manager (podHooks.Status), or by announce with the shared consumer.
func (pod *Pod) status() []byte {
	st := pod.Worker.Status(pod.id, pod.version, pod.Owned(), pod.parts.Pacer.Snapshot(pod.parts.Clock.Now()))
	st.AllowPrivateNetworks = pod.parts.cfg.Fetch != nil && pod.parts.cfg.Fetch.AllowPrivate
	b, _ := json.Marshal(st)
	return withReplayTargets(b, pod.replay)
}

// putStatus writes the pod's entry (none without the bucket).
func (pod *Pod) putStatus(ctx context.Context, kv jetstream.KeyValue) error {
	if kv == nil {
		return nil
	}
	pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	_, err := kv.Put(pctx, pod.id, pod.status())
	return err
}

// refreshEvery is how often a pod's entry is written: a third of the
// bucket's TTL.
func refreshEvery(ctx context.Context, kv jetstream.KeyValue) time.Duration {
	ttl := jobs.DefaultLeaseTTL
	if st, err := kv.Status(ctx); err == nil && st.TTL() > 0 {
		ttl = st.TTL()
	}
	return max(ttl/3, 100*time.Millisecond)
}

// announce keeps the entry of a pod of the shared consumer in kv until
// ctx ends, then deletes it.
func (pod *Pod) announce(ctx context.Context, kv jetstream.KeyValue) {
	every := refreshEvery(ctx, kv)
	t := pod.parts.Clock.NewTimer(every)
	defer t.Stop()
	failing := false
	for {
		err := pod.putStatus(ctx, kv)
		switch {
		case err != nil && !failing && ctx.Err() == nil:
			pod.log.Warn().Err(err).Msg("announce the pod in " + jobs.PodsBucket + " (a replay beside it may not see it)")
		case err == nil && failing:
			pod.log.Info().Msg("the pod is announced in " + jobs.PodsBucket + " again")
		}
		failing = err != nil
		select {
		case <-ctx.Done():
			dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
			defer cancel()
			if err := kv.Delete(dctx, pod.id); err != nil {
				pod.log.Warn().Err(err).Msg("withdraw the pod from " + jobs.PodsBucket + " (it expires by itself)")
			}
			return
		case <-t.C():
			t.Reset(every)
		}
	}
}

// awaitLoneReplays announces the pod, waits until no replay paces alone
// (at most LoneReplayPatience), and fences the authorities that replays
// started requests to recently. It returns early only when ctx ends.
func (pod *Pod) awaitLoneReplays(ctx context.Context, pods jetstream.KeyValue) {
	// Announced first, then the replays read: a replay writes its entry
	// first, then reads the pods, so that one of the two sees the other.
	if err := pod.putStatus(ctx, pods); err != nil && ctx.Err() == nil {
		pod.log.Warn().Err(err).Msg("announce the pod in " + jobs.PodsBucket)
	}
	kv, err := pod.parts.js.KeyValue(ctx, jobs.ReplaysBucket)
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		return
	} else if err != nil {
		pod.log.Warn().Err(err).Msg("read the replays (" + jobs.ReplaysBucket + "): a replay pacing alone, if any, is not waited for")
		return
	}
	every := time.Second
	if pods != nil {
		every = refreshEvery(ctx, pods)
	}
	clk := pod.parts.Clock
	began := clk.Now()
	lastPut := began
	waited := false
	for {
		runs, err := jobs.Entries[jobs.ReplayRun](ctx, pod.parts.js, kv)
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			pod.log.Warn().Err(err).Msg("read the replays (" + jobs.ReplaysBucket + "): a replay pacing alone, if any, is not waited for")
			return
		}
		var alone []string
		for _, r := range runs {
			if r.Alone {
				alone = append(alone, r.Run+" (into "+r.Target+")")
			}
		}
		sort.Strings(alone)
		if len(alone) == 0 {
			pod.fenceFrom(ctx, runs, waited)
			return
		}
		if !waited {
			pod.log.Info().Strs("replays", alone).Str("at_most", LoneReplayPatience.String()).
				Msg("waiting for replays that pace their own requests to stop and hand their jobs to the pods, before taking work")
			waited = true
		}
		if clk.Now().Sub(began) > LoneReplayPatience {
			pod.log.Warn().Strs("replays", alone).Str("waited", LoneReplayPatience.String()).
				Msg("replays still pace their own requests: taking work anyway (their requests and this pod's may come closer than the floor; stop them or check that they reach NATS)")
			pod.fenceFrom(ctx, runs, waited)
			return
		}
		if !clock.Sleep(clk, loneReplayPoll, ctx.Done()) {
			return
		}
		if now := clk.Now(); now.Sub(lastPut) >= every {
			lastPut = now
			if err := pod.putStatus(ctx, pods); err != nil && ctx.Err() == nil {
				pod.log.Warn().Err(err).Msg("announce the pod in " + jobs.PodsBucket)
			}
		}
	}
}

// fenceFrom spaces the pod's first request to each authority the replays
// of runs started recently from that start. After a wait, a pod of the
// shared consumer (which follows no pacer facts) restores them again, for
// what the replay learned while it ran; a partitioned pod syncs them when
// it takes each partition.
func (pod *Pod) fenceFrom(ctx context.Context, runs []jobs.ReplayRun, waited bool) {
	if waited && pod.follow == nil {
		if _, err := facts.Restore(ctx, pod.parts.js, pod.parts.Pacer, facts.RestoreOptions{Logger: pod.log}); err != nil && ctx.Err() == nil {
			pod.log.Warn().Err(err).Msg("restore the pacer facts a replay published")
		}
	}
	n := pod.parts.Pacer.FenceAll(pod.parts.Clock.Now(), jobs.LastStartsOf(runs)...)
	if waited || n > 0 {
		pod.log.Info().Int("authorities", n).Msg("replays pacing alone have stopped: this pod's first requests are spaced from their last starts")
	}
}
