package jobs_test

import (
	"testing"
	"time"

	"github.com/mirrorworker/mirrorworker/jobs"
	"github.com/nats-io/nats.go/jetstream"
)

// TestDrained: a consumer is drained when every message its filter selects
// is delivered and acked, as the stream's store says. A consumer info read
// before a publish was counted (the server signals new messages to its
// consumers after the publish's ack) is the case the counters miss: its
// NumPending and NumAckPending are 0 while a job is stored for it.
func TestDrained(t *testing.T) {
	js := startJetStream(t)
	ctx := testContext(t)
	st, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "T", Subjects: []string{"t.>"}})
	if err != nil {
		t.Fatal(err)
	}
	c, err := st.CreateConsumer(ctx, jetstream.ConsumerConfig{Durable: "a", FilterSubjects: []string{"t.a.*"}, AckPolicy: jetstream.AckExplicitPolicy})
	if err != nil {
		t.Fatal(err)
	}
	drained := func(ci *jetstream.ConsumerInfo) bool {
		t.Helper()
		d, err := jobs.Drained(ctx, st, ci)
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	info := func() *jetstream.ConsumerInfo {
		t.Helper()
		ci, err := c.Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return ci
	}
	if !drained(info()) {
		t.Error("a consumer of an empty stream is not drained")
	}
	for _, s := range []string{"t.a.1", "t.b.1", "t.a.2"} {
		if _, err := js.Publish(ctx, s, nil); err != nil {
			t.Fatal(err)
		}
	}
	// Wait for the server to count both (the very lag this guards against).
	for ci := info(); ci.NumPending < 2; ci = info() {
		time.Sleep(5 * time.Millisecond)
	}
	if drained(info()) {
		t.Error("drained with two jobs pending")
	}
	b, err := c.Fetch(1, jetstream.FetchMaxWait(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	for m := range b.Messages() {
		if drained(info()) {
			t.Error("drained with one job pending and one unacked")
		}
		if err := m.DoubleAck(ctx); err != nil {
			t.Fatal(err)
		}
	}
	b, err = c.Fetch(1, jetstream.FetchMaxWait(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	for m := range b.Messages() {
		if err := m.DoubleAck(ctx); err != nil {
			t.Fatal(err)
		}
	}
	before := info()
	if !drained(before) {
		t.Fatalf("not drained with every job acked: %+v", before)
	}
	// A message its filter does not select keeps it drained; a job for
	// it stored after the info was read does not.
	if _, err := js.Publish(ctx, "t.b.2", nil); err != nil {
		t.Fatal(err)
	}
	if !drained(before) {
		t.Error("a message the filter does not select made the consumer undrained")
	}
	if _, err := js.Publish(ctx, "t.a.3", nil); err != nil {
		t.Fatal(err)
	}
	if before.NumPending != 0 || before.NumAckPending != 0 {
		t.Fatalf("the info read before the publish counts %d pending, %d unacked", before.NumPending, before.NumAckPending)
	}
	if drained(before) {
		t.Error("drained by its counters while a job is stored for it")
	}
	now := info()
	for ; now.NumPending == 0; now = info() {
		time.Sleep(5 * time.Millisecond) // the server counts it
	}
	if n, err := jobs.Unsignalled(ctx, st, []*jetstream.ConsumerInfo{before, now}); err != nil || n != 1 {
		t.Errorf("Unsignalled of the stale info and a current one: %d, %v; want 1 (the stale one; the current one counts its job)", n, err)
	}
	// A catch-up consumer is not looked up (its counts are exact for the
	// jobs it holds).
	catchup := *before
	catchup.Name = jobs.CatchupPrefix(0) + "1"
	if n, err := jobs.Unsignalled(ctx, st, []*jetstream.ConsumerInfo{&catchup}); err != nil || n != 0 {
		t.Errorf("Unsignalled of a catch-up consumer: %d, %v; want 0", n, err)
	}
}
