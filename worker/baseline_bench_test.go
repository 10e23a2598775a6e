package worker_test

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mirrorworker/mirrorworker/authority"
	"github.com/mirrorworker/mirrorworker/fetch"
	"github.com/mirrorworker/mirrorworker/jobs"
	"github.com/mirrorworker/mirrorworker/mirror"
)

// BenchmarkBaselineSequential is the side-by-side baseline for
// BenchmarkEndToEnd: the walking-skeleton shape of a worker, with the same
// JetStream, origin, fetch client and mirror target but no scheduler and no
// pacer. Eight goroutines take jobs in stream order and, for each, fetch,
// store (fsynced) and ack. It is the fastest a worker can be when politeness
// costs nothing; the ratio EndToEnd/Baseline says what scheduling and pacing
// cost on healthy origins.
//
//	go test -run '^$' -bench 'EndToEnd|Baseline' -benchtime 3000x ./worker/
func BenchmarkBaselineSequential(b *testing.B) {
	for _, n := range []int{1, 1000} {
		b.Run(fmt.Sprintf("authorities=%d", n), func(b *testing.B) {
			e := newEnv(b, 60*time.Second)
			auths := multiOrigin(b, n)
			var js []jobs.Job
			for i := range b.N {
				js = append(js, jobs.Job{ID: fmt.Sprint("b", i), URL: "http://" + auths[i%n] + "/o/" + strconv.Itoa(i),
					Target: fmt.Sprintf("a%d/%d", i%n, i)})
			}
			e.publish(js...)
			fc := fetch.New(&fetch.Options{AllowPrivate: true})
			defer fc.CloseIdleConnections()
			open := func(context.Context, int, authority.Authority) (func(fetch.Result), error) {
				return func(fetch.Result) {}, nil
			}

			b.ResetTimer()
			start := time.Now()
			it, err := e.cons.Messages()
			if err != nil {
				b.Fatal(err)
			}
			var stored, failed atomic.Int64
			var wg sync.WaitGroup
			for range 8 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for {
						m, err := it.Next()
						if err != nil {
							return // iterator stopped
						}
						j, err := jobs.Parse(m.Data())
						if err != nil {
							failed.Add(1)
							_ = m.Term()
							continue
						}
						resp, err := fc.Do(context.Background(), fetch.Request{URL: j.URL}, open)
						if err != nil || resp.Body == nil {
							failed.Add(1)
							_ = m.Nak()
							continue
						}
						_, err = e.target.Put(context.Background(), j.Target, resp.Body, mirror.Expect{}, mirror.Meta{URL: j.URL, JobID: j.ID})
						resp.Body.Close()
						if err != nil {
							failed.Add(1)
							_ = m.Nak()
							continue
						}
						if err := m.Ack(); err != nil {
							b.Error(err)
						}
						if stored.Add(1) == int64(b.N) {
							it.Stop()
						}
					}
				}()
			}
			wg.Wait()
			elapsed := time.Since(start)
			b.StopTimer()
			if stored.Load() != int64(b.N) || failed.Load() != 0 {
				b.Fatalf("stored %d of %d, %d failures", stored.Load(), b.N, failed.Load())
			}
			b.ReportMetric(float64(b.N)/elapsed.Seconds(), "jobs/s")
		})
	}
}
