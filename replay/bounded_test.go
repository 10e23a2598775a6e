package replay_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/mirrorworker/mirrorworker/broker/brokertest"
	"github.com/mirrorworker/mirrorworker/jobs"
	"github.com/mirrorworker/mirrorworker/replay"
)

// TestRunWorksOnTheStreamAsItWas: the worker (a stand-in that pulls with
// Fetch, as the real one does, and holds any job it cannot do now) is never
// handed a job stored after the replay began, and the replay ends although
// the last message at the start is not one it selected and newer selected
// jobs keep arriving: the case that made a replay's progress go backwards
// and never finish.
func TestRunWorksOnTheStreamAsItWas(t *testing.T) {
	js, _ := brokertest.Streams(t)
	ctx := brokertest.Context(t)
	publishJobs(t, js, jobsFor(3, 0)...)                                // a.example: 1..3
	publishJobs(t, js, jobs.Job{URL: "https://b.example/not-selected"}) // 4
	filter := replay.Filter{Authorities: auths(t, "a.example:443")}
	subjects, err := filter.Subjects()
	if err != nil {
		t.Fatal(err)
	}
	var (
		mu        sync.Mutex
		seen      []uint64
		published bool
	)
	work := func(ctx context.Context, c jetstream.Consumer) error {
		for ctx.Err() == nil {
			batch, err := c.Fetch(10, jetstream.FetchMaxWait(100*time.Millisecond))
			if err != nil {
				return err
			}
			for m := range batch.Messages() {
				md, _ := m.Metadata()
				mu.Lock()
				seen = append(seen, md.Sequence.Stream)
				mu.Unlock()
				if md.Sequence.Stream > 4 {
					continue // held, as a paced worker holds a job
				}
				if !published {
					published = true
					publishJobs(t, js, jobsFor(3, 100)...) // 5..7, after the start
				}
				if err := m.DoubleAck(ctx); err != nil && ctx.Err() == nil {
					return err
				}
			}
		}
		return nil
	}
	res, err := replay.Run(ctx, js, work, &replay.Options{Subjects: subjects, Poll: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if res.LastSeq != 4 || res.Jobs != 3 {
		t.Errorf("Run = %+v, want 3 jobs up to sequence 4", res)
	}
	for _, s := range seen {
		if s > res.LastSeq {
			t.Errorf("the worker was handed sequence %d, stored after the start (%d)", s, res.LastSeq)
		}
	}
	if len(seen) < 3 {
		t.Errorf("the worker saw %v, want sequences 1 to 3", seen)
	}
	if res.Later < 0 || res.Later > 3 {
		t.Errorf("Later = %d, want 0 to 3", res.Later)
	}
}
