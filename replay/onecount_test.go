package replay_test

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/mirrorworker/mirrorworker/broker/brokertest"
	"github.com/mirrorworker/mirrorworker/jobs"
	"github.com/mirrorworker/mirrorworker/replay"
)

// recordedProgress records what Run tells a Progress.
type recordedProgress struct {
	mu          sync.Mutex
	total, last int64
	sets        []int64
}

func (p *recordedProgress) Begin(total int64) { p.mu.Lock(); p.total = total; p.mu.Unlock() }
func (p *recordedProgress) Set(done int64) {
	p.mu.Lock()
	p.last = done
	p.sets = append(p.sets, done)
	p.mu.Unlock()
}
func (p *recordedProgress) Waiting(string) {}
func (p *recordedProgress) End()           {}

// TestOneCountOfJobs (issue 37): a stream of 12 submitted jobs, one of them
// enqueued again, beside the copies that parking, a move and an earlier
// replay's hand-over left in it, is 12 jobs to the dry run, to the
// progress and to the summary; each job is done once, and the progress
// never counts past the jobs done.
func TestOneCountOfJobs(t *testing.T) {
	js, _ := brokertest.Streams(t)
	ctx := brokertest.Context(t)
	const n = 12
	var subj []string
	for i := range n {
		j := jobs.Job{ID: fmt.Sprintf("job-%d", i), URL: fmt.Sprintf("https://a.example/%d", i)}
		m, _, err := jobs.NewMsg(j)
		if err != nil {
			t.Fatal(err)
		}
		ack, err := js.PublishMsg(ctx, m)
		if err != nil {
			t.Fatal(err)
		}
		st, err := js.Stream(ctx, jobs.JobsStream)
		if err != nil {
			t.Fatal(err)
		}
		sm, err := st.GetMsg(ctx, ack.Sequence)
		if err != nil {
			t.Fatal(err)
		}
		subj = append(subj, sm.Subject)
	}
	// job-0 enqueued again after the duplicate window (another message id).
	again, _, _ := jobs.NewMsg(jobs.Job{ID: "job-0", URL: "https://a.example/0"})
	again.Header.Set(jetstream.MsgIDHeader, "job-0-again")
	if _, err := js.PublishMsg(ctx, again); err != nil {
		t.Fatal(err)
	}
	// The workers' copies: brought back from parking, a redirect's
	// continuation, an earlier replay's copy, on the jobs' own subjects.
	for i, h := range []string{jobs.HeaderUnparked, jobs.HeaderContinues, jobs.HeaderReplay} {
		cp := nats.NewMsg(subj[i])
		cp.Data = []byte(fmt.Sprintf(`{"id":"job-%d","url":"https://a.example/%d"}`, i, i))
		cp.Header.Set(h, "1")
		cp.Header.Set(jetstream.MsgIDHeader, "copy-"+strconv.Itoa(i))
		if _, err := js.PublishMsg(ctx, cp); err != nil {
			t.Fatal(err)
		}
	}
	counts, err := replay.Count(ctx, js, replay.Start{}, nil, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	if counts.Total != n {
		t.Fatalf("dry run: %d jobs, want %d", counts.Total, n)
	}

	var mu sync.Mutex
	handed := map[string]int{}
	var tally replay.Tally
	prog := &recordedProgress{}
	// The work does each job it is given, as the replay's worker does
	// (worker.Options.SkipCopies: copies are acked, not done).
	work := func(ctx context.Context, c jetstream.Consumer) error {
		for ctx.Err() == nil {
			b, err := c.Fetch(8, jetstream.FetchMaxWait(100*time.Millisecond))
			if err != nil {
				continue
			}
			for m := range b.Messages() {
				if !jobs.IsCopy(m.Headers()) {
					j, err := jobs.Parse(m.Data())
					if err != nil {
						t.Errorf("job: %v", err)
					}
					mu.Lock()
					handed[j.ID]++
					mu.Unlock()
					tally.Add("stored")
				}
				m.Ack()
			}
		}
		return nil
	}
	res, err := replay.Run(ctx, js, work, &replay.Options{Poll: 20 * time.Millisecond, Progress: prog})
	if err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	prog.mu.Lock()
	defer prog.mu.Unlock()
	if res.Jobs != n || prog.total != n || prog.last != n || tally.Summary().Stored != n {
		t.Errorf("jobs: run %d, progress %d (done %d at the end), summary %d stored; want %d each",
			res.Jobs, prog.total, prog.last, tally.Summary().Stored, n)
	}
	for _, d := range prog.sets {
		if d > n {
			t.Errorf("progress set to %d of %d", d, n)
		}
	}
	if len(handed) != n {
		t.Errorf("%d jobs done, want %d", len(handed), n)
	}
	for id, k := range handed {
		if k != 1 {
			t.Errorf("%s done %d times", id, k)
		}
	}
	if res.Copies != 4 {
		t.Errorf("Copies %d, want 4 (three copies and job-0's first message)", res.Copies)
	}
}
