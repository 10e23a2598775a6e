package replay_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/mirrorworker/mirrorworker/broker/brokertest"
	"github.com/mirrorworker/mirrorworker/jobs"
	"github.com/mirrorworker/mirrorworker/replay"
)

// BenchmarkCount10000 is the scan a replay makes before it starts (the one
// count of jobs, issue 37), as a dry run makes it: 10,000 stored jobs over
// 10 authorities.
func BenchmarkCount10000(b *testing.B) {
	js, _ := brokertest.Streams(b)
	ctx := context.Background()
	const n = 10000
	for i := range n {
		m, _, err := jobs.NewMsg(jobs.Job{URL: fmt.Sprintf("https://h%d.example/%d", i%10, i)})
		if err != nil {
			b.Fatal(err)
		}
		if _, err := js.PublishMsgAsync(m, jetstream.WithStallWait(30*time.Second)); err != nil {
			b.Fatal(err)
		}
	}
	<-js.PublishAsyncComplete()
	b.ResetTimer()
	for range b.N {
		c, err := replay.Count(ctx, js, replay.Start{}, nil, time.Now())
		if err != nil || c.Total != n {
			b.Fatalf("%+v, %v", c.Total, err)
		}
	}
}
