package replay_test

import (
	"testing"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/mirrorworker/mirrorworker/authority"
	"github.com/mirrorworker/mirrorworker/broker/brokertest"
	"github.com/mirrorworker/mirrorworker/jobs"
	"github.com/mirrorworker/mirrorworker/replay"
)

// publishJobs publishes jobs and waits for every ack.
func publishJobs(t *testing.T, js jetstream.JetStream, js_ ...jobs.Job) {
	t.Helper()
	ctx := brokertest.Context(t)
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
