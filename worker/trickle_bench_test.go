package worker_test

import (
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/mirrorworker/mirrorworker/fetch"
	"github.com/mirrorworker/mirrorworker/jobs"
	"github.com/mirrorworker/mirrorworker/worker"
)

// BenchmarkHealthyBesideTrickles measures healthy jobs/s (b.N small jobs
// on 10 authorities, 16 fetch slots) alone, and while 8 trickling
// authorities (1 byte per 20 ms) with 2 jobs each have taken every slot
// first: issue 13's stall, scaled down. The minimum rate is 1 KiB/s over
// 1 s windows (the default window is 30 s: a shorter window frees slots
// sooner). Compare the two jobs/s side by side:
//
//	go test -run '^$' -bench HealthyBesideTrickles -benchtime 2000x ./worker/
func BenchmarkHealthyBesideTrickles(b *testing.B) {
	for _, trickling := range []int{0, 8} {
		b.Run(fmt.Sprintf("trickling=%d", trickling), func(b *testing.B) {
			e := newEnv(b, 60*time.Second)
			healthy := multiOrigin(b, 10)
			f := fetch.New(&fetch.Options{AllowPrivate: true, MinRate: 1 << 10, MinRateWindow: time.Second})
			r := e.startWith(testPacer(0, 2, nil, 0, nil), worker.Options{Concurrency: 16, FailureBudget: 1000}, f, e.target)
			var slow []jobs.Job
			for i := range trickling {
				base := trickleOrigin(b)
				for k := range 2 {
					id := fmt.Sprintf("slow-%d-%d", i, k)
					slow = append(slow, jobs.Job{ID: id, URL: base + "/" + id, Target: id})
				}
			}
			if len(slow) > 0 {
				e.publish(slow...)
				waitCond(b, time.Minute, "the trickles did not take every slot", func() bool {
					return counter(b, r.reg, "mirrorworker_held_jobs", map[string]string{"state": "fetching"}) == 16
				})
			}
			var js []jobs.Job
			for i := range b.N {
				js = append(js, jobs.Job{ID: fmt.Sprint("b", i), URL: "http://" + healthy[i%10] + "/o/" + strconv.Itoa(i),
					Target: fmt.Sprintf("a%d/%d", i%10, i)})
			}
			b.ResetTimer()
			start := time.Now()
			e.publish(js...)
			r.f.waitFor(b, b.N, func(x worker.Final) bool { return x.Outcome == worker.OutcomeStored && x.JobID[0] == 'b' }, 10*time.Minute)
			elapsed := time.Since(start)
			b.StopTimer()
			b.ReportMetric(float64(b.N)/elapsed.Seconds(), "healthy_jobs/s")
			r.stop(b)
		})
	}
}
