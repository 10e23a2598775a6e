package facts_test

import (
	"context"
	"testing"
	"time"

	"github.com/mirrorworker/mirrorworker/broker"
	"github.com/mirrorworker/mirrorworker/broker/brokertest"
	"github.com/mirrorworker/mirrorworker/jobs"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// startJetStream starts an in-process JetStream server with mirrorworker's
// streams and returns a client on it; everything stops with the test.
func startJetStream(t *testing.T) (jetstream.JetStream, *nats.Conn) {
	t.Helper()
	js, nc := brokertest.JetStream(t, brokertest.Start(t, broker.EmbeddedOptions{}))
	if err := jobs.EnsureStreams(testContext(t), js, nil); err != nil {
		t.Fatal(err)
	}
	return js, nc
}

func testContext(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Second)
	t.Cleanup(cancel)
	return ctx
}
