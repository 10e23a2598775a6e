package broker_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/mirrorworker/mirrorworker/broker"
	"github.com/mirrorworker/mirrorworker/clock"
)

func TestConnCollector(t *testing.T) {
	e, err := broker.StartEmbedded(broker.EmbeddedOptions{StoreDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Shutdown()
	c := broker.NewConnCollector()
	want := func(v string) {
		t.Helper()
		exp := "# HELP mirrorworker_nats_connected 1 while the worker's NATS connection is connected, 0 while connecting, reconnecting or closed.\n" +
			"# TYPE mirrorworker_nats_connected gauge\nmirrorworker_nats_connected " + v + "\n"
		if err := testutil.CollectAndCompare(c, strings.NewReader(exp), "mirrorworker_nats_connected"); err != nil {
			t.Error(err)
		}
	}
	want("0") // before the connection exists
	nc, err := e.Connect("test")
	if err != nil {
		t.Fatal(err)
	}
	c.SetConn(nc)
	want("1")
	nc.Close()
	want("0")
}

// TestConsumerLagCollector: pending and ack-pending come from consumer info
// of every listed consumer, read at most once per interval however often
// Prometheus scrapes; a consumer dropped from the list disappears, a
// missing one counts an error.
func TestConsumerLagCollector(t *testing.T) {
	e, err := broker.StartEmbedded(broker.EmbeddedOptions{StoreDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Shutdown()
	nc, err := e.Connect("test")
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "S", Subjects: []string{"s.>"}}); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"a", "b"} {
		if _, err := js.CreateOrUpdateConsumer(ctx, "S", jetstream.ConsumerConfig{Durable: name, FilterSubject: "s." + name, AckPolicy: jetstream.AckExplicitPolicy}); err != nil {
			t.Fatal(err)
		}
	}
	publish := func(subj string, n int) {
		for range n {
			if _, err := js.Publish(ctx, subj, []byte("x")); err != nil {
				t.Fatal(err)
			}
		}
	}
	publish("s.a", 5)
	publish("s.b", 2)
	// Deliver one of b's without acking: ack pending 1.
	cb, _ := js.Consumer(ctx, "S", "b")
	if _, err := cb.Next(jetstream.FetchMaxWait(5 * time.Second)); err != nil {
		t.Fatal(err)
	}

	// The server counts pending asynchronously: wait until it agrees, so
	// that what the collector reports is its own doing.
	serverSays := func(name string, pending uint64, ackPending int) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for {
			c, err := js.Consumer(ctx, "S", name)
			if err == nil && c.CachedInfo().NumPending == pending && c.CachedInfo().NumAckPending == ackPending {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("the server never counted %d pending, %d ack pending on %s", pending, ackPending, name)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	serverSays("a", 5, 0)
	serverSays("b", 1, 1)

	clk := clock.NewFake(time.Unix(1e9, 0))
	refs := []broker.ConsumerRef{{Stream: "S", Consumer: "a"}, {Stream: "S", Consumer: "b"}}
	c := broker.NewConsumerLagCollector(js, broker.ConsumerLagOptions{
		Consumers: func() []broker.ConsumerRef { return refs },
		Interval:  5 * time.Second,
		Clock:     clk,
	})
	reg := prometheus.NewRegistry()
	reg.MustRegister(c)
	value := func(name, consumer string) float64 {
		t.Helper()
		mfs, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, mf := range mfs {
			if mf.GetName() != name {
				continue
			}
			for _, m := range mf.GetMetric() {
				for _, l := range m.GetLabel() {
					if l.GetName() == "consumer" && l.GetValue() == consumer {
						return m.GetGauge().GetValue()
					}
				}
				if consumer == "" {
					return m.GetCounter().GetValue()
				}
			}
		}
		return -1
	}
	if got := value("mirrorworker_consumer_pending", "a"); got != 5 {
		t.Errorf("pending a = %v, want 5", got)
	}
	if p, ap := value("mirrorworker_consumer_pending", "b"), value("mirrorworker_consumer_ack_pending", "b"); p != 1 || ap != 1 {
		t.Errorf("b: pending %v ack pending %v, want 1 and 1", p, ap)
	}
	publish("s.a", 3)
	serverSays("a", 8, 0)
	clk.Advance(4 * time.Second)
	if got := value("mirrorworker_consumer_pending", "a"); got != 5 {
		t.Errorf("pending a = %v within the interval, want the cached 5", got)
	}
	clk.Advance(time.Second)
	if got := value("mirrorworker_consumer_pending", "a"); got != 8 {
		t.Errorf("pending a = %v after the interval, want 8", got)
	}

	refs = []broker.ConsumerRef{{Stream: "S", Consumer: "a"}, {Stream: "S", Consumer: "gone"}}
	clk.Advance(5 * time.Second)
	if got := value("mirrorworker_consumer_pending", "b"); got != -1 {
		t.Errorf("consumer b no longer listed but still reported (%v)", got)
	}
	if got := value("mirrorworker_consumer_info_errors_total", ""); got != 1 {
		t.Errorf("errors = %v, want 1 (consumer gone)", got)
	}
}
