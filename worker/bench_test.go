package worker_test

import (
	"fmt"
	"net"
	"net/http"
	"strconv"
	"testing"
	"time"

	"github.com/mirrorworker/mirrorworker/jobs"
	"github.com/mirrorworker/mirrorworker/worker"
)

// multiOrigin serves small objects on n loopback listeners (n authorities)
// with one http.Server.
func multiOrigin(b *testing.B, n int) []string {
	b.Helper()
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body := []byte("small object " + r.URL.Path + "\n")
		w.Header().Set("Content-Length", strconv.Itoa(len(body)))
		w.Write(body)
	})}
	var auths []string
	for range n {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			b.Fatal(err)
		}
		auths = append(auths, ln.Addr().String())
		go srv.Serve(ln)
	}
	b.Cleanup(func() { srv.Close() })
	return auths
}

// BenchmarkEndToEnd measures jobs/s from a backlog of b.N small-object
// jobs on the embedded JetStream to every job stored (fsynced) and acked,
// floor 0, default in-flight cap 2 per authority, 8 fetch slots.
//
//	go test -run '^$' -bench EndToEnd -benchtime 3000x ./worker/
func BenchmarkEndToEnd(b *testing.B) {
	for _, n := range []int{1, 1000} {
		b.Run(fmt.Sprintf("authorities=%d", n), func(b *testing.B) {
			e := newEnv(b, 60*time.Second)
			auths := multiOrigin(b, n)
			var js []jobs.Job
			for i := range b.N {
				a := auths[i%n]
				js = append(js, jobs.Job{ID: fmt.Sprint("b", i), URL: "http://" + a + "/o/" + strconv.Itoa(i),
					Target: fmt.Sprintf("a%d/%d", i%n, i)})
			}
			e.publish(js...)
			b.ResetTimer()
			start := time.Now()
			r := e.start(testPacer(0, 2, nil, 0, nil), worker.Options{Concurrency: 8})
			r.f.waitFor(b, b.N, isOutcome(worker.OutcomeStored), 10*time.Minute)
			elapsed := time.Since(start)
			b.StopTimer()
			b.ReportMetric(float64(b.N)/elapsed.Seconds(), "jobs/s")
			var deliveries uint64
			for _, f := range r.f.snapshot() {
				deliveries += f.Deliveries
			}
			b.ReportMetric(float64(deliveries)/float64(b.N), "deliveries/job")
			r.stop(b)
		})
	}
}
