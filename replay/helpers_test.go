package replay_test

import (
	"context"
	"testing"
	"time"

	"github.com/mirrorworker/mirrorworker/authority"
	"github.com/mirrorworker/mirrorworker/broker"
	"github.com/mirrorworker/mirrorworker/broker/brokertest"
	"github.com/mirrorworker/mirrorworker/jobs"
	"github.com/mirrorworker/mirrorworker/replay"
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

// publishJobs publishes jobs and waits for every ack.
func publishJobs(t *testing.T, js jetstream.JetStream, js_ ...jobs.Job) {
	t.Helper()
	ctx := testContext(t)
	for _, j := range js_ {
		if _, err := jobs.Publish(ctx, js, j); err != nil {
			t.Fatal(err)
		}
	}
}

func auths(t *testing.T, specs ...string) []authority.Authority {
	t.Helper()
	var out []authority.Authority
	for _, s := range specs {
		a, err := replay.ParseAuthority(s)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, a)
	}
	return out
}
