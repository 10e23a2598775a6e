package replay_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/mirrorworker/mirrorworker/broker/brokertest"
	"github.com/mirrorworker/mirrorworker/jobs"
	"github.com/mirrorworker/mirrorworker/replay"
	"github.com/nats-io/nats.go/jetstream"
)

func jobsFor(n, from int) []jobs.Job {
	var out []jobs.Job
	for i := range n {
		out = append(out, jobs.Job{URL: fmt.Sprintf("https://a.example/%d", from+i)})
	}
	return out
}

func consumerGone(t *testing.T, js jetstream.JetStream, name string) {
	t.Helper()
	if _, err := js.Consumer(brokertest.Context(t), jobs.JobsStream, name); !errors.Is(err, jetstream.ErrConsumerNotFound) {
		t.Errorf("replay consumer %s still there after Run (%v)", name, err)
	}
}

// A worker stand-in that acks what it gets: Run ends once the jobs stored
// before it began are acked, even while newer jobs are held unacked.
func TestRunDoesNotWaitForNewerJobs(t *testing.T) {
	js, _ := brokertest.Streams(t)
	ctx := brokertest.Context(t)
	publishJobs(t, js, jobsFor(5, 0)...)
	work := func(ctx context.Context, c jetstream.Consumer) error {
		it, err := c.Messages()
		if err != nil {
			return err
		}
		defer it.Stop()
		acked := 0
		for {
			m, err := it.Next(jetstream.NextContext(ctx))
			if err != nil {
				return ctx.Err()
			}
			md, _ := m.Metadata()
			if md.Sequence.Stream > 5 {
				continue // held, never acked
			}
			if err := m.DoubleAck(ctx); err != nil {
				return err
			}
			if acked++; acked == 5 {
				publishJobs(t, js, jobsFor(3, 100)...) // sequences 6..8, after the start
			}
		}
	}
	res, err := replay.Run(ctx, js, work, &replay.Options{Poll: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if res.Jobs != 5 || res.LastSeq != 5 {
		t.Errorf("Run = %+v, want 5 jobs up to sequence 5", res)
	}
	consumerGone(t, js, res.Consumer)
}

func TestRunReportsAWorkerThatFails(t *testing.T) {
	js, _ := brokertest.Streams(t)
	publishJobs(t, js, jobsFor(2, 0)...)
	res, err := replay.Run(brokertest.Context(t), js, func(context.Context, jetstream.Consumer) error {
		return errors.New("no bucket")
	}, nil)
	if err == nil || !strings.Contains(err.Error(), "no bucket") {
		t.Fatalf("Run = %v, want the worker's error", err)
	}
	consumerGone(t, js, res.Consumer)

	res, err = replay.Run(brokertest.Context(t), js, func(context.Context, jetstream.Consumer) error { return nil }, nil)
	if err == nil || !strings.Contains(err.Error(), "stopped before the replay was complete") {
		t.Fatalf("Run = %v, want an early stop reported", err)
	}
	consumerGone(t, js, res.Consumer)
}

func TestRunInterrupted(t *testing.T) {
	js, _ := brokertest.Streams(t)
	publishJobs(t, js, jobsFor(2, 0)...)
	ctx, cancel := context.WithCancel(brokertest.Context(t))
	stopped := make(chan struct{})
	res, err := replay.Run(ctx, js, func(wctx context.Context, _ jetstream.Consumer) error {
		cancel() // the user presses Ctrl-C
		<-wctx.Done()
		close(stopped)
		return nil
	}, nil)
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("Run = %v, want context.Canceled", err)
	}
	select {
	case <-stopped:
	default:
		t.Error("Run returned before the worker stopped")
	}
	consumerGone(t, js, res.Consumer)
}

func TestRunNothingToReplay(t *testing.T) {
	js, _ := brokertest.Streams(t)
	res, err := replay.Run(brokertest.Context(t), js, func(ctx context.Context, _ jetstream.Consumer) error {
		<-ctx.Done()
		return nil
	}, &replay.Options{Start: replay.Start{Seq: 10}})
	if err != nil || res.Jobs != 0 {
		t.Fatalf("Run = %+v, %v; want nothing to do", res, err)
	}
	consumerGone(t, js, res.Consumer)
}
