package replay_test

import (
	"context"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/mirrorworker/mirrorworker/broker/brokertest"
	"github.com/mirrorworker/mirrorworker/clock"
	"github.com/mirrorworker/mirrorworker/pacer"
	"github.com/mirrorworker/mirrorworker/replay"
)

// waitsProgress records the last Waiting a Progress was told.
type waitsProgress struct {
	mu       sync.Mutex
	done     int64
	waiting  string
	progress []string
}

func (p *waitsProgress) Begin(int64)    {}
func (p *waitsProgress) End()           {}
func (p *waitsProgress) Set(done int64) { p.mu.Lock(); p.done = done; p.mu.Unlock() }
func (p *waitsProgress) Waiting(w string) {
	p.mu.Lock()
	p.waiting = w
	p.progress = append(p.progress, w)
	p.mu.Unlock()
}

func (p *waitsProgress) last() (int64, string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.done, p.waiting
}

// TestRunSaysWhatTheLastJobWaitsFor (issue 37): of three jobs two are done
// at once and the third is held; once none was done for replay.MinStall
// (on the replay's clock), the progress says what it waits for, from the
// owner's pacer state (Options.Waits): "1 job waits: a.example:443 in
// backoff until 14:59:02".
func TestRunSaysWhatTheLastJobWaitsFor(t *testing.T) {
	js, _ := brokertest.Streams(t)
	ctx, cancel := context.WithCancel(brokertest.Context(t))
	defer cancel()
	publishJobs(t, js, jobsFor(3, 0)...)
	t0 := time.Date(2026, 12, 3, 14, 50, 0, 0, time.UTC)
	clk := clock.NewFake(t0)
	until := t0.Add(9*time.Minute + 2*time.Second)
	var acked atomic.Int64
	work := func(ctx context.Context, c jetstream.Consumer) error {
		for ctx.Err() == nil {
			batch, err := c.Fetch(10, jetstream.FetchMaxWait(100*time.Millisecond))
			if err != nil {
				continue
			}
			for m := range batch.Messages() {
				if strings.Contains(string(m.Data()), `"url":"https://a.example/2"`) {
					_ = m.InProgress() // held: the one that waits
					continue
				}
				if err := m.Ack(); err == nil {
					acked.Add(1)
				}
			}
		}
		return ctx.Err()
	}
	var asked atomic.Value
	p := &waitsProgress{}
	done := make(chan error, 1)
	go func() {
		_, err := replay.Run(ctx, js, work, &replay.Options{Clock: clk, Poll: time.Second, Progress: p, Location: time.UTC,
			Waits: func(_ context.Context, auths []string) (map[string]pacer.State, error) {
				asked.Store(strings.Join(auths, ","))
				return map[string]pacer.State{"a.example:443": {Authority: "a.example:443", State: pacer.StateBackoff, BackoffUntil: until}}, nil
			}})
		done <- err
	}()
	waitUntil(t, "two jobs acked", func() bool { return acked.Load() == 2 })
	want := "1 job waits: a.example:443 in backoff until 14:59:02"
	deadline := time.Now().Add(30 * time.Second)
	for {
		d, w := p.last()
		if w != "" {
			if d != 2 || w != want {
				t.Errorf("progress at %d jobs, waiting %q; want 2, %q", d, w, want)
			}
			break
		}
		if clk.Now().Sub(t0) > 3*replay.MinStall {
			t.Fatalf("no Waiting after %s on the replay's clock; progress at %d", clk.Now().Sub(t0), d)
		}
		if time.Now().After(deadline) {
			t.Fatalf("no Waiting; progress at %d", d)
		}
		if clk.Timers() > 0 {
			clk.Advance(time.Second)
		}
		time.Sleep(2 * time.Millisecond) // lets Run's loop take the tick
	}
	if got := asked.Load(); got != "a.example:443" {
		t.Errorf("Waits asked about %v, want the authority of the job left", got)
	}
	cancel()
	<-done
}
