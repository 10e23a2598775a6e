package worker_test

import (
	"fmt"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/mirrorworker/mirrorworker/jobs"
	"github.com/mirrorworker/mirrorworker/pacer"
	"github.com/mirrorworker/mirrorworker/worker"
)

// TestTheColdHoldEndsAtTheHeaders: a cold authority's second request waits
// for the answer to the first (pacer.Options.ColdHold, ADR 0029, the
// fifteenth look), and a 2xx's answer is its headers, not its body: the
// worker tells the pacer (Heard) and wakes the authority's queue. The
// origin holds the first file's body until a second request arrives, and
// the cold hold is an hour: the second must start while the first body is
// still held, after the first's headers were written.
func TestTheColdHoldEndsAtTheHeaders(t *testing.T) {
	const giveUp = 20 * time.Second // only a failure waits this long
	e := newEnv(t, 30*time.Second)
	o := newOrigin(t)
	var (
		mu        sync.Mutex
		seen      int
		headersAt time.Time
		second    = make(chan time.Time, 1)
		timedOut  bool
	)
	o.setBehave(func(w http.ResponseWriter, r *http.Request, _ int) bool {
		mu.Lock()
		seen++
		first := seen == 1
		mu.Unlock()
		if !first {
			second <- time.Now()
			return false
		}
		b := body(r.URL.Path)
		w.Header().Set("ETag", etag(b))
		w.Header().Set("Content-Length", fmt.Sprint(len(b)))
		w.WriteHeader(http.StatusOK)
		mu.Lock()
		headersAt = time.Now()
		mu.Unlock()
		w.Write(b[:1])
		w.(*statusRecorder).ResponseWriter.(http.Flusher).Flush()
		select {
		case at := <-second:
			second <- at
		case <-time.After(giveUp):
			mu.Lock()
			timedOut = true
			mu.Unlock()
		}
		w.Write(b[1:])
		return true
	})
	var js []jobs.Job
	for i := range 2 {
		js = append(js, jobs.Job{ID: fmt.Sprint("c-", i), URL: o.url(fmt.Sprint("/o/", i)), Target: fmt.Sprint("c/", i)})
	}
	e.publish(js...)
	p := pacer.New(&pacer.Options{
		Policy:     &pacer.Policy{Default: pacer.Limits{Floor: 0, MaxInFlight: 2}},
		AwaitSends: true,
		ColdHold:   time.Hour,
	})
	r := e.start(p, worker.Options{Concurrency: 8})
	r.f.waitFor(t, 2, isOutcome(worker.OutcomeStored), 60*time.Second)

	mu.Lock()
	defer mu.Unlock()
	if timedOut {
		t.Fatalf("the second request waited %v for the first's body: the cold hold ended at the body, not the headers", giveUp)
	}
	if at := <-second; at.Before(headersAt) {
		t.Errorf("the second request arrived %v before the first's headers were written: the cold hold did not hold it", headersAt.Sub(at))
	}
	for i := range 2 {
		e.checkStored(fmt.Sprint("c/", i), body(fmt.Sprint("/o/", i)))
	}
}
