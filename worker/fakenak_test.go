package worker_test

import (
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/mirrorworker/mirrorworker/clock"
)

// fakeNaks moves JetStream's NAK delays onto a fake clock. A worker on
// clock.Fake computes its deferrals and retry backoffs on that clock, but
// NakWithDelay hands them to the server, which waits them out on the wall
// clock: a test of a 3 s cooldown waited 3 s. Through fakeNaks, a message
// NAKed with delay d is NAKed without delay (redelivered at once) when the
// fake clock reaches now+d, so the job comes back at the instant the
// worker asked for, as the test advances the clock, and not before.
// Meanwhile the server counts it ack pending, as it does a NAK with delay.
//
// Only what the worker pulls with Consumer.Fetch goes through it: its
// intakes (one consumer, or the partition consumers the test adds). Lanes
// and the parking lot make their own consumers and stay on the wall clock.
type fakeNaks struct {
	clk  *clock.Fake
	stop chan struct{} // closed at the test's end: pending NAKs are dropped

	mu     sync.Mutex
	delays []time.Duration // every NakWithDelay's delay, in order
	due    []time.Time     // when each comes back, on clk
}

func newFakeNaks(e *env, clk *clock.Fake) *fakeNaks {
	n := &fakeNaks{clk: clk, stop: make(chan struct{})}
	e.t.Cleanup(func() { close(n.stop) })
	e.wrap = n.consumer
	return n
}

// asked returns how many NAKs with delay were asked for so far.
func (n *fakeNaks) asked() int {
	n.mu.Lock()
	defer n.mu.Unlock()
	return len(n.delays)
}

// delay returns the delay of the i-th NAK (from 0).
func (n *fakeNaks) delay(i int) time.Duration {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.delays[i]
}

// pending returns how many NAKed messages wait for the clock, and the
// instant the first of them comes back.
func (n *fakeNaks) pending() (int, time.Time) {
	now := n.clk.Now()
	n.mu.Lock()
	defer n.mu.Unlock()
	k, first := 0, time.Time{}
	for _, at := range n.due {
		if at.After(now) {
			k++
			if first.IsZero() || at.Before(first) {
				first = at
			}
		}
	}
	return k, first
}

// advanceWhenWaiting waits until want() messages wait for the clock (every
// job the test still expects back is NAKed with delay, none in the
// worker's hands) or done() holds, and then advances the clock to the
// first of them. It returns done().
func (n *fakeNaks) advanceWhenWaiting(t testing.TB, want func() int, done func() bool) bool {
	t.Helper()
	var first time.Time
	waitCond(t, 20*time.Second, "every job NAKed with delay", func() bool {
		if done() {
			return true
		}
		var k int
		k, first = n.pending()
		return k > 0 && k >= want()
	})
	if done() {
		return true
	}
	n.clk.Advance(first.Sub(n.clk.Now()))
	return false
}

func (n *fakeNaks) consumer(c jetstream.Consumer) jetstream.Consumer {
	return fakeNakConsumer{Consumer: c, n: n}
}

type fakeNakConsumer struct {
	jetstream.Consumer
	n *fakeNaks
}

// Fetch is the worker's only way of pulling (worker.go's intakeLoop).
func (c fakeNakConsumer) Fetch(batch int, opts ...jetstream.FetchOpt) (jetstream.MessageBatch, error) {
	b, err := c.Consumer.Fetch(batch, opts...)
	if err != nil {
		return nil, err
	}
	out := make(chan jetstream.Msg, batch)
	go func() {
		defer close(out)
		for m := range b.Messages() {
			out <- fakeNakMsg{Msg: m, n: c.n}
		}
	}()
	return fakeNakBatch{MessageBatch: b, msgs: out}, nil
}

type fakeNakBatch struct {
	jetstream.MessageBatch
	msgs chan jetstream.Msg
}

func (b fakeNakBatch) Messages() <-chan jetstream.Msg { return b.msgs }

type fakeNakMsg struct {
	jetstream.Msg
	n *fakeNaks
}

func (m fakeNakMsg) NakWithDelay(d time.Duration) error {
	m.n.mu.Lock()
	m.n.delays = append(m.n.delays, d)
	m.n.due = append(m.n.due, m.n.clk.Now().Add(d))
	m.n.mu.Unlock()
	if d <= 0 {
		return m.Msg.Nak()
	}
	t := m.n.clk.NewTimer(d)
	go func() {
		select {
		case <-t.C():
			_ = m.Msg.Nak() // the test may have ended the server meanwhile
		case <-m.n.stop:
			t.Stop()
		}
	}()
	return nil
}
