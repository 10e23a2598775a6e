package worker_test

import (
	"net/http"
	"testing"
	"time"

	"github.com/mirrorworker/mirrorworker/jobs"
	"github.com/mirrorworker/mirrorworker/pacer"
	"github.com/mirrorworker/mirrorworker/worker"
)

// TestLimiter503DefersWithoutBudget: a 503 without Retry-After answered at
// once after another URL of the origin succeeded is a limiter's refusal
// (pacer.TestLimiter503): the job is deferred and asked again, spending none
// of its failure budget (1 here: one failed attempt would dead-letter it),
// while /broken, answering 500 to every request, is that URL's failure:
// dead-lettered after its own attempts, and no backoff fact for the origin.
func TestLimiter503DefersWithoutBudget(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 30*time.Second)
	o := newOrigin(t)
	o.setBehave(func(w http.ResponseWriter, r *http.Request, n int) bool {
		switch {
		case r.URL.Path == "/limited" && n == 1:
			w.WriteHeader(http.StatusServiceUnavailable)
			return true
		case r.URL.Path == "/broken":
			w.WriteHeader(http.StatusInternalServerError)
			return true
		}
		return false
	})
	var backoffs int
	evs := make(chan pacer.Event, 1024)
	// Scale 0.01: the first escalation step is 20 ms.
	p := pacer.New(&pacer.Options{Policy: &pacer.Policy{Default: pacer.Limits{Floor: 0, MaxInFlight: 1}}, Scale: 0.01,
		OnEvent: func(ev pacer.Event) { evs <- ev }})
	r := e.start(p, worker.Options{FailureBudget: 1, BackoffInitial: 20 * time.Millisecond, BackoffMax: 100 * time.Millisecond})
	e.publish(jobs.Job{ID: "ok", URL: o.url("/ok"), Target: "ok"})
	r.f.waitFor(t, 1, nil, 30*time.Second)
	e.publish(jobs.Job{ID: "limited", URL: o.url("/limited"), Target: "limited"},
		jobs.Job{ID: "broken", URL: o.url("/broken"), Target: "broken"})
	r.f.waitFor(t, 3, nil, 30*time.Second)
	e.waitDrained(10 * time.Second)
	e.checkStored("limited", body("/limited"))
	dls := e.deadLetters()
	if len(dls) != 1 || dls[0].JobID != "broken" || dls[0].LastStatus != 500 {
		t.Fatalf("dead letters %+v, want /broken's alone", dls)
	}
	var limited int
	for _, a := range o.log() {
		if a.path == "/limited" {
			limited++
		}
	}
	if limited != 2 {
		t.Errorf("/limited requested %d times, want 2 (refused, then stored)", limited)
	}
	if got := counter(t, r.reg, "mirrorworker_jobs_total", map[string]string{"outcome": "retried"}); got != 0 {
		t.Errorf("jobs_total{retried} = %v, want 0: the limiter's 503 is no failed attempt", got)
	}
	var throttles int
	for more := true; more; {
		select {
		case ev := <-evs:
			switch ev.Type {
			case pacer.EventBackoff:
				backoffs++
			case pacer.EventThrottle:
				throttles++
			}
		default:
			more = false
		}
	}
	if backoffs != 0 || throttles != 1 {
		t.Errorf("%d backoff and %d throttle facts, want 0 and 1", backoffs, throttles)
	}
}
