package jobs_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/mirrorworker/mirrorworker/jobs"
)

// TestWorkStreamPartitionsLikeTheServer: every job published to MIRROR_JOBS
// reaches MIRROR_WORK in the partition jobs.Partition computes, so the
// worker, the parking lot and `status` agree with the server's mapping.
func TestWorkStreamPartitionsLikeTheServer(t *testing.T) {
	js := startJetStream(t)
	ctx := testContext(t)
	if err := jobs.EnsureStreams(ctx, js, nil); err != nil {
		t.Fatal(err)
	}
	const parts = 7
	n, err := jobs.EnsureWork(ctx, js, &jobs.WorkOptions{Partitions: parts})
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
	ws, err := js.Stream(ctx, jobs.WorkStream)
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(20 * time.Second)
	for {
		info, err := ws.Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if info.State.Msgs == jobsN {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("MIRROR_WORK has %d messages, want %d (sources %+v)", info.State.Msgs, jobsN, info.Sources)
		}
		time.Sleep(20 * time.Millisecond)
	}
	seen := 0
	for seq := uint64(1); seen < jobsN; seq++ {
		m, err := ws.GetMsg(ctx, seq)
		if err != nil {
			t.Fatalf("seq %d: %v", seq, err)
		}
		seen++
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
	}
	// A second EnsureWork keeps the partition count; asking for another fails.
	if n, err := jobs.EnsureWork(ctx, js, nil); err != nil || n != parts {
		t.Errorf("EnsureWork again = %d, %v; want %d", n, err, parts)
	}
	if _, err := jobs.EnsureWork(ctx, js, &jobs.WorkOptions{Partitions: parts + 1}); err == nil {
		t.Error("EnsureWork with another partition count succeeded")
	}
	_ = jetstream.WorkQueuePolicy
}
