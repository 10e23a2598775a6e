package worker

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/mirrorworker/mirrorworker/broker"
	"github.com/mirrorworker/mirrorworker/broker/brokertest"
	"github.com/mirrorworker/mirrorworker/clock"
	"github.com/mirrorworker/mirrorworker/jobs"
)

// TestPlainAcksLostWithTheConnectionAreSentAgain: on a stream of one
// replica the acks of done jobs are plain. Ten are applied; ten more are
// swallowed by a link that goes dark and then drops, as a dead socket
// swallows what was written to it. Once nats.go is reconnected, acks sends
// the last ackResendWindow's acks again and the consumer has nothing
// pending: without the resend the ten would wait for AckWait (a minute
// here) and be fetched again.
func TestPlainAcksLostWithTheConnectionAreSentAgain(t *testing.T) {
	srv := brokertest.Start(t, broker.EmbeddedOptions{Listen: "127.0.0.1:0"})
	direct, _ := brokertest.JetStream(t, srv) // in-process: sees the server's state
	px, js, _ := brokertest.ThroughProxy(t, srv, 20*time.Millisecond)
	const n = 20
	q := newAckQueue(t, direct, js, n)
	a := newAcks(js, clock.Real{}, zerolog.Nop(), 0)
	a.confirm.Store(false) // one replica (refresh reads it from the jobs stream)
	waitPending := func(want int) {
		t.Helper()
		q.waitPending(want, func() string { return fmt.Sprintf("%d sent again", a.resent.Load()) })
	}

	for _, m := range q.msgs[:n/2] {
		if err := a.plain(m); err != nil {
			t.Fatal(err)
		}
	}
	waitPending(n / 2)

	px.BlackHole()
	var bytes int64
	for _, m := range q.msgs[n/2:] {
		if err := a.plain(m); err != nil {
			t.Fatal(err)
		}
		bytes += int64(len(fmt.Sprintf("PUB %s 4\r\n+ACK\r\n", m.Reply())))
	}
	deadline := time.Now().Add(30 * time.Second)
	for px.Held() < bytes { // every ack is written, into the dark link
		if time.Now().After(deadline) {
			t.Fatalf("the proxy holds %d bytes, want the acks' %d", px.Held(), bytes)
		}
		time.Sleep(5 * time.Millisecond)
	}
	px.Cut() // what it held is gone with the connection
	if got := q.pending(); got != n/2 {
		t.Fatalf("%d acks pending with the link cut, want %d: the test's acks were not swallowed", got, n/2)
	}
	px.Restore()
	waitPending(0)
	if got := a.resent.Load(); got != n {
		t.Errorf("%d acks sent again, want the last window's %d", got, n)
	}
}

// TestAcksFollowTheJobsStreamsReplicas: refresh reads MIRROR_JOBS; one
// replica on the server the worker is connected to means plain acks, and
// acks starts out confirming until it knows.
func TestAcksFollowTheJobsStreamsReplicas(t *testing.T) {
	js, _ := brokertest.Streams(t)
	a := newAcks(js, clock.Real{}, zerolog.Nop(), 0)
	if !a.confirmed() {
		t.Fatal("acks plain before the stream was read")
	}
	a.refresh(context.Background())
	if a.confirmed() {
		t.Fatal("acks confirmed on a jobs stream of one replica")
	}
	s, err := js.Stream(brokertest.Context(t), jobs.JobsStream)
	if err != nil {
		t.Fatal(err)
	}
	if r := s.CachedInfo().Config.Replicas; r != 1 {
		t.Fatalf("jobs stream has %d replicas, want 1", r)
	}
}

// TestPlainAcksOnlyWhereNoAckCanBeDroppedSilently: plain acks need one
// replica on the very server of the worker's connection.
func TestPlainAcksOnlyWhereNoAckCanBeDroppedSilently(t *testing.T) {
	for _, c := range []struct {
		replicas          int
		leader, connected string
		plain             bool
	}{
		{1, "n1", "n1", true},
		{0, "n1", "n1", true}, // 0: the server's default, one
		{3, "n1", "n1", false},
		{1, "n2", "n1", false}, // acks routed to another server
		{1, "", "n1", false},   // no leader now
	} {
		if got := plainAcks(c.replicas, c.leader, c.connected); got != c.plain {
			t.Errorf("plainAcks(%d, %q, %q) = %v, want %v", c.replicas, c.leader, c.connected, got, c.plain)
		}
	}
}

// TestPlainAcksGoOutInBatches: with a batch, plain acks wait for the
// upkeep's next flush, every batch, and the upkeep's end sends what is
// left: a stop loses none.
func TestPlainAcksGoOutInBatches(t *testing.T) {
	srv := brokertest.Start(t, broker.EmbeddedOptions{})
	js, _ := brokertest.JetStream(t, srv)
	ctx := brokertest.Context(t)
	const n = 15
	q := newAckQueue(t, js, js, n)
	pending := func() int {
		t.Helper()
		if err := js.Conn().Flush(); err != nil { // the server has read what was sent
			t.Fatal(err)
		}
		return q.pending()
	}
	waitPending := func(want int) { t.Helper(); q.waitPending(want, nil) }

	const batch = 500 * time.Millisecond
	clk := clock.NewFake(time.Now())
	a := newAcks(js, clk, zerolog.Nop(), batch)
	a.confirm.Store(false)
	uctx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { a.upkeep(uctx); close(done) }()
	for deadline := time.Now().Add(10 * time.Second); clk.Timers() < 2; { // the mode's and the batch's
		if time.Now().After(deadline) {
			t.Fatalf("the upkeep set %d timers, want the mode's and the batch's", clk.Timers())
		}
		time.Sleep(time.Millisecond)
	}

	for _, m := range q.msgs[:10] {
		if err := a.plain(m); err != nil {
			t.Fatal(err)
		}
	}
	if got := pending(); got != n {
		t.Fatalf("%d acks pending before the batch's time, want all %d", got, n)
	}
	clk.Advance(batch - time.Millisecond)
	if got := pending(); got != n {
		t.Fatalf("%d acks pending a millisecond before the batch's time, want all %d", got, n)
	}
	clk.Advance(time.Millisecond)
	waitPending(n - 10)

	for _, m := range q.msgs[10:] {
		if err := a.plain(m); err != nil {
			t.Fatal(err)
		}
	}
	stop() // a stop sends what is batched
	<-done
	waitPending(0)
}

// ackQueue is a stream ACKS with n jobs and a consumer c that delivered
// them all (msgs), for tests of how their acks reach the server.
type ackQueue struct {
	t    *testing.T
	cons jetstream.Consumer // read through admin: the server's own view
	msgs []jetstream.Msg    // delivered through via
}

// newAckQueue makes the stream and consumer through admin and fetches the
// n jobs through via (the same connection, or one behind a proxy).
func newAckQueue(t *testing.T, admin, via jetstream.JetStream, n int) *ackQueue {
	t.Helper()
	ctx := brokertest.Context(t)
	if _, err := admin.CreateStream(ctx, jetstream.StreamConfig{Name: "ACKS", Subjects: []string{"acks.>"}}); err != nil {
		t.Fatal(err)
	}
	cons, err := admin.CreateConsumer(ctx, "ACKS", jetstream.ConsumerConfig{Durable: "c", AckPolicy: jetstream.AckExplicitPolicy, AckWait: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	for i := range n {
		if _, err := admin.Publish(ctx, fmt.Sprintf("acks.%d", i), []byte("job")); err != nil {
			t.Fatal(err)
		}
	}
	remote, err := via.Consumer(ctx, "ACKS", "c")
	if err != nil {
		t.Fatal(err)
	}
	q := &ackQueue{t: t, cons: cons}
	for len(q.msgs) < n {
		b, err := remote.Fetch(n-len(q.msgs), jetstream.FetchMaxWait(5*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		for m := range b.Messages() {
			q.msgs = append(q.msgs, m)
		}
	}
	return q
}

// pending is how many of the jobs the server still waits an ack for.
func (q *ackQueue) pending() int {
	q.t.Helper()
	info, err := q.cons.Info(brokertest.Context(q.t))
	if err != nil {
		q.t.Fatal(err)
	}
	return info.NumAckPending
}

// waitPending waits up to 30 s for want acks pending; detail, if set,
// adds to the failure.
func (q *ackQueue) waitPending(want int, detail func() string) {
	q.t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for q.pending() != want {
		if time.Now().After(deadline) {
			more := ""
			if detail != nil {
				more = " (" + detail() + ")"
			}
			q.t.Fatalf("%d acks pending after 30s, want %d%s", q.pending(), want, more)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
