package jobs_test

import (
	"fmt"
	"testing"

	"github.com/mirrorworker/mirrorworker/jobs"
)

// TestJobsStreamPartitionsLikeTheServer: every job published to
// mirror.jobs.<tenant>.<akey> is stored with the partition jobs.Partition
// computes as its fifth token, so the worker, the parking lot and `status`
// agree with the server's mapping; EnsureWork creates a consumer per
// partition, and the partition count cannot change.
func TestJobsStreamPartitionsLikeTheServer(t *testing.T) {
	js := startJetStream(t)
	ctx := testContext(t)
	const parts = 7
	if err := jobs.EnsureStreams(ctx, js, &jobs.StreamOptions{Partitions: parts}); err != nil {
		t.Fatal(err)
	}
	n, err := jobs.EnsureWork(ctx, js, nil)
	if err != nil || n != parts {
		t.Fatalf("EnsureWork = %d, %v", n, err)
	}
	const jobsN = 200
	for i := range jobsN {
		u := fmt.Sprintf("https://host%d.example:%d/f", i, 8000+i%3)
		if _, err := jobs.Publish(ctx, js, jobs.Job{URL: u}); err != nil {
			t.Fatal(err)
		}
	}
	s, err := js.Stream(ctx, jobs.JobsStream)
	if err != nil {
		t.Fatal(err)
	}
	perPart := map[int]int{}
	for seq := uint64(1); seq <= jobsN; seq++ {
		m, err := s.GetMsg(ctx, seq)
		if err != nil {
			t.Fatalf("seq %d: %v", seq, err)
		}
		p, tenant, akey, err := jobs.ParsePartitionSubject(m.Subject)
		if err != nil {
			t.Fatal(err)
		}
		j, err := jobs.Parse(m.Data)
		if err != nil {
			t.Fatal(err)
		}
		if err := jobs.CheckSubject(j, m.Subject); err != nil {
			t.Errorf("%s: %v", m.Subject, err)
		}
		if tenant != j.Tenant || akey != j.Authority.Key() {
			t.Errorf("%s: tenant/akey %s/%s, job %s/%s", m.Subject, tenant, akey, j.Tenant, j.Authority.Key())
		}
		if want := jobs.Partition(akey, parts); p != want {
			t.Errorf("%s: server put it in partition %d, jobs.Partition says %d", m.Subject, p, want)
		}
		perPart[p]++
	}
	total := 0
	for p := range parts {
		c, err := js.Consumer(ctx, jobs.JobsStream, jobs.PartitionConsumer(p))
		if err != nil {
			t.Fatalf("partition %d: %v", p, err)
		}
		info, err := c.Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if int(info.NumPending) != perPart[p] {
			t.Errorf("partition %d consumer has %d pending, %d stored", p, info.NumPending, perPart[p])
		}
		total += int(info.NumPending)
	}
	if total != jobsN {
		t.Errorf("partition consumers see %d jobs, want %d", total, jobsN)
	}
	// The count stays; asking for another fails, and says so.
	if err := jobs.EnsureStreams(ctx, js, nil); err != nil {
		t.Fatal(err)
	}
	if n, err := jobs.EnsureWork(ctx, js, nil); err != nil || n != parts {
		t.Errorf("EnsureWork again = %d, %v; want %d", n, err, parts)
	}
	if err := jobs.EnsureStreams(ctx, js, &jobs.StreamOptions{Partitions: parts + 1}); err == nil {
		t.Error("EnsureStreams with another partition count succeeded")
	}
}

// TestUpgradeAddsThePartitionTransform: a MIRROR_JOBS created by an earlier
// version (no transform), with a single consumer that acked part of it,
// gets the transform; the partition consumers start after what that
// consumer acked, and the single consumer is narrowed to the unpartitioned
// jobs (which the worker moves).
func TestUpgradeAddsThePartitionTransform(t *testing.T) {
	js := startJetStream(t)
	ctx := testContext(t)
	cfgs, err := jobs.StreamConfigs(nil)
	if err != nil {
		t.Fatal(err)
	}
	old := cfgs[0]
	old.SubjectTransform = nil
	if _, err := js.CreateStream(ctx, old); err != nil {
		t.Fatal(err)
	}
	if err := jobs.EnsureStreams(ctx, js, nil); err != nil { // the other streams, and the transform
		t.Fatal(err)
	}
	// Undo the transform to publish as an earlier version did.
	if _, err := js.UpdateStream(ctx, old); err != nil {
		t.Fatal(err)
	}
	legacy, err := jobs.EnsureConsumer(ctx, js, nil)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 4 {
		if _, err := jobs.Publish(ctx, js, jobs.Job{URL: fmt.Sprintf("https://old.example/%d", i)}); err != nil {
			t.Fatal(err)
		}
	}
	b, err := legacy.Fetch(2)
	if err != nil {
		t.Fatal(err)
	}
	for m := range b.Messages() {
		if err := m.DoubleAck(ctx); err != nil {
			t.Fatal(err)
		}
	}
	// The upgrade: run's EnsureStreams, then EnsureWork.
	if err := jobs.EnsureStreams(ctx, js, nil); err != nil {
		t.Fatalf("add the transform to an existing stream: %v", err)
	}
	if _, err := jobs.EnsureWork(ctx, js, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := jobs.Publish(ctx, js, jobs.Job{URL: "https://new.example/x"}); err != nil {
		t.Fatal(err)
	}
	info, err := legacy.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.Config.FilterSubject != jobs.LegacyFilter || info.NumPending+uint64(info.NumAckPending) != 2 {
		t.Errorf("single consumer after the upgrade: filter %q, %d pending, %d unacked; want %q and the 2 old jobs it had not acked",
			info.Config.FilterSubject, info.NumPending, info.NumAckPending, jobs.LegacyFilter)
	}
	total := 0
	for p := range jobs.DefaultPartitions {
		c, err := js.Consumer(ctx, jobs.JobsStream, jobs.PartitionConsumer(p))
		if err != nil {
			t.Fatal(err)
		}
		ci, err := c.Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		total += int(ci.NumPending)
	}
	if total != 1 {
		t.Errorf("partition consumers see %d jobs, want only the one published after the upgrade", total)
	}
}

func TestHoldsJobs(t *testing.T) {
	for name, want := range map[string]bool{
		jobs.PartitionConsumer(7):              true,
		jobs.LaneConsumer(7, "h_example_443"):  true,
		jobs.CatchupConsumer(7, 1234):          true,
		jobs.ConsumerName:                      false, // the single consumer of earlier versions
		"mirrorworker_replay_3kK9uA8bXn2PqZt4": false, // replay's ephemeral consumers
		"someone-else":                         false,
	} {
		if got := jobs.HoldsJobs(name); got != want {
			t.Errorf("HoldsJobs(%q) = %v, want %v", name, got, want)
		}
	}
}
