//go:build e2e

package worker_test

import (
	"encoding/json"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/mirrorworker/mirrorworker/jobs"
	"github.com/mirrorworker/mirrorworker/worker"
)

// TestPartitionsPullOnlyFullBatches: with memory full, a partition's
// intake waits until a whole pull's room is free and asks for all of it,
// so that its consumer's state changes as seldom as the jobs allow
// (nats-server rewrites each consumer's state file after each change, up
// to 10 times a second; ADR 0036, fourteenth pass). Seen from the server:
// every pull request the worker sends asks for the partition's batch,
// MaxHeld / (2 x partitions), none for the few places a job or two freed.
func TestPartitionsPullOnlyFullBatches(t *testing.T) {
	const (
		n       = 1200
		maxHeld = 320 // 5 a pull with 32 partitions: held fills, then frees a job at a time
	)
	e := newEnv(t, 30*time.Second)
	var origins []*origin // authorities enough that memory, not one's share, fills
	for range 40 {
		origins = append(origins, newOrigin(t))
	}
	nc := e.js.Conn()
	var (
		mu      sync.Mutex
		batches = map[int]int{} // asked for -> pulls
	)
	sub, err := nc.Subscribe("$JS.API.CONSUMER.MSG.NEXT."+jobs.JobsStream+".>", func(m *nats.Msg) {
		req := struct {
			Batch int `json:"batch"`
		}{Batch: -1} // a request that does not say is counted as -1, and fails below
		_ = json.Unmarshal(m.Data, &req)
		mu.Lock()
		batches[req.Batch]++
		mu.Unlock()
	})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	var js []jobs.Job
	for i := range n {
		o := origins[i%len(origins)]
		js = append(js, jobs.Job{ID: fmt.Sprint("j-", i), URL: o.url(fmt.Sprint("/p/", i)), Target: fmt.Sprint("p/", i)})
	}
	e.publish(js...)
	r := e.startPartitioned(testPacer(0, 2, nil, time.Second, nil), worker.Options{MaxHeld: maxHeld})
	r.f.waitFor(t, n, isOutcome(worker.OutcomeStored), 2*time.Minute)
	for _, i := range []int{0, n / 2, n - 1} {
		e.checkStored(fmt.Sprint("p/", i), body(fmt.Sprint("/p/", i)))
	}
	mu.Lock()
	defer mu.Unlock()
	want := maxHeld / (2 * jobs.DefaultPartitions)
	pulls := 0
	for b, k := range batches {
		pulls += k
		if b != want {
			t.Errorf("%d pulls asked for %d jobs, want every pull to ask for a partition's batch of %d (all asked: %v)", k, b, want, batches)
		}
	}
	if pulls < n/want {
		t.Errorf("%d pull requests seen for %d jobs in batches of at most %d: the watch missed some", pulls, n, want)
	}
	t.Logf("%d pull requests: %v", pulls, batches)
}
