//go:build e2e

package worker_test

import (
	"context"
	"fmt"
	"net/http"
	"sort"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mirrorworker/mirrorworker/facts"
	"github.com/mirrorworker/mirrorworker/jobs"
	"github.com/mirrorworker/mirrorworker/pacer"
	"github.com/mirrorworker/mirrorworker/worker"
	"github.com/prometheus/client_golang/prometheus"
)

// TestIsolation is issue 4's acceptance test: an authority that throttles
// every request must not slow the others down, must see no request during
// its cooldowns, and must get every one of its jobs stored once it recovers,
// none dead-lettered for waiting.
func TestIsolation(t *testing.T) {
	if testing.Short() {
		t.Skip("isolation runs ~6,000 jobs")
	}
	const (
		healthyAuthorities = 20
		half               = 2000
		retryAfter         = 5 * time.Second
	)
	e := newEnv(t, 30*time.Second)
	var healthy []*origin
	for range healthyAuthorities {
		healthy = append(healthy, newOrigin(t))
	}
	slow := newOrigin(t)
	var throttling atomic.Bool
	throttling.Store(true)
	slow.setBehave(func(w http.ResponseWriter, _ *http.Request, _ int) bool {
		if !throttling.Load() {
			return false
		}
		w.Header().Set("Retry-After", fmt.Sprint(int(retryAfter/time.Second)))
		w.WriteHeader(http.StatusTooManyRequests)
		return true
	})

	reg := prometheus.NewRegistry()
	m, err := worker.NewMetrics(reg, 0)
	if err != nil {
		t.Fatal(err)
	}
	sink := facts.NewSink(e.js, testLogger(t), m)
	sctx, stopSink := context.WithCancel(context.Background())
	sinkDone := make(chan struct{})
	go func() { sink.Run(sctx); close(sinkDone) }()
	t.Cleanup(func() { stopSink(); <-sinkDone })

	// A 10 ms floor for the healthy authorities, 1 ms for the throttled one
	// (it has 2,000 jobs to serve alone at the end). It also gets an in-flight
	// cap of 1 so that "no request during a cooldown" is exact at the
	// origin: with two requests in flight, the second may already be on the
	// wire when the first's 429 arrives, which no client can prevent. A
	// short quiet window lets the escalated interval decay after recovery.
	p := testPacer(10*time.Millisecond, 2,
		map[string]pacer.Limits{slow.auth: {Floor: time.Millisecond, MaxInFlight: 1}},
		500*time.Millisecond, sink.Handle)
	r := e.start(p, worker.Options{
		Concurrency: 8, HoldMax: time.Second, DeferSpread: 10 * time.Second,
		Registerer: reg, Metrics: m,
	})

	healthyJob := func(round string, i int) jobs.Job {
		o := healthy[i%healthyAuthorities]
		return jobs.Job{ID: fmt.Sprintf("%s-%d", round, i), URL: o.url(fmt.Sprintf("/%s/%d", round, i)),
			Target: fmt.Sprintf("%s/h%d/%d", round, i%healthyAuthorities, i), Tenant: []string{"t1", "t2", "t3"}[i%3]}
	}

	// Warm up (streams, connections, directories), then the baseline: the
	// healthy half alone.
	var warm []jobs.Job
	for i := range half / 2 {
		warm = append(warm, healthyJob("warm", i))
	}
	e.publish(warm...)
	r.f.waitFor(t, len(warm), isRound("warm"), time.Minute)
	var alone []jobs.Job
	for i := range half {
		alone = append(alone, healthyJob("alone", i))
	}
	start := time.Now()
	e.publish(alone...)
	tAlone := r.f.waitFor(t, half, isRound("alone"), 2*time.Minute).Sub(start)

	// Mixed: the same amount of healthy work interleaved with as many jobs
	// for the throttled authority.
	var mixed []jobs.Job
	for i := range half {
		mixed = append(mixed, healthyJob("mixed", i))
		mixed = append(mixed, jobs.Job{ID: fmt.Sprintf("slow-%d", i), URL: slow.url(fmt.Sprintf("/slow/%d", i)),
			Target: fmt.Sprintf("slow/%d", i), Tenant: []string{"t1", "t2"}[i%2]})
	}
	start = time.Now()
	e.publish(mixed...)
	tMixed := r.f.waitFor(t, half, isRound("mixed"), 2*time.Minute).Sub(start)
	// Speed is the benchmarks' business; this only catches a collapse
	// (head-of-line blocking would take the cooldowns' time, minutes).
	if tMixed > 4*tAlone+10*time.Second {
		t.Errorf("healthy half took %v beside the throttled authority, %v alone", tMixed, tAlone)
	}

	// Let the throttled authority answer a few probes with 429 too, so that
	// several cooldowns (and the interval's escalation) are exercised.
	deadline := time.Now().Add(time.Minute)
	for count429(slow) < 3 {
		if time.Now().After(deadline) {
			t.Fatalf("only %d 429s in a minute", count429(slow))
		}
		time.Sleep(50 * time.Millisecond)
	}

	// The origin recovers: every throttled job must end stored.
	throttling.Store(false)
	recovered := time.Now()
	r.f.waitFor(t, half, isRound("slow"), 3*time.Minute)
	t.Logf("throttled authority's %d jobs stored %v after it recovered", half, time.Since(recovered).Round(time.Millisecond))
	e.waitDrained(30 * time.Second)

	// The baseline once more, now that the throttled authority is quiet.
	// The first baseline runs cold (it is often twice as slow), so the ratio
	// is taken against the faster of the two: the conservative reading.
	var after []jobs.Job
	for i := range half {
		after = append(after, healthyJob("after", i))
	}
	start = time.Now()
	e.publish(after...)
	tAfter := r.f.waitFor(t, half, isRound("after"), 2*time.Minute).Sub(start)
	base := min(tAlone, tAfter)
	t.Logf("healthy half: alone %v and %v, beside a throttled authority %v: drains at %.0f%% of the speed alone",
		tAlone.Round(time.Millisecond), tAfter.Round(time.Millisecond), tMixed.Round(time.Millisecond),
		100*base.Seconds()/tMixed.Seconds())

	// No request arrived inside a cooldown: after every 429 the next
	// request came Retry-After later or more. The origin stamps a request
	// on arrival, before it answers; the worker starts the cooldown when it
	// reads the answer, later still, so no slack is needed.
	log := slow.log()
	sort.Slice(log, func(i, j int) bool { return log[i].at.Before(log[j].at) })
	throttled := 0
	for i, a := range log {
		if a.status != http.StatusTooManyRequests {
			continue
		}
		throttled++
		if i+1 < len(log) {
			if gap := log[i+1].at.Sub(a.at); gap < retryAfter {
				t.Errorf("request %d arrived %v after a 429 with Retry-After %v", i+1, gap, retryAfter)
			}
		}
	}
	if throttled == 0 {
		t.Fatal("the throttled authority never answered 429")
	}
	t.Logf("throttled authority: %d requests answered 429, %d in all for %d jobs", throttled, len(log), half)

	if dl := e.deadLetters(); len(dl) != 0 {
		t.Fatalf("%d dead letters, first %+v", len(dl), dl[0])
	}
	var deliveries, n uint64
	for _, f := range r.f.snapshot() {
		if strings.HasPrefix(f.JobID, "slow-") {
			deliveries += f.Deliveries
			n++
		}
	}
	deferred := counter(t, reg, "mirrorworker_jobs_total", map[string]string{"outcome": worker.OutcomeDeferred})
	t.Logf("deferred jobs: %d stored after %.2f deliveries on average (%v deferrals in all)",
		n, float64(deliveries)/float64(n), deferred)
	if avg := float64(deliveries) / float64(n); avg > 20 {
		t.Errorf("%.1f deliveries per deferred job: deferral is close to a busy loop", avg)
	}
	if got := counter(t, reg, "mirrorworker_cooldowns_total", map[string]string{"host": "127.0.0.1"}); got < 1 {
		t.Errorf("cooldowns_total = %v", got)
	}
	stopSink()
	<-sinkDone
	s, err := e.js.Stream(context.Background(), jobs.EventsStream)
	if err != nil {
		t.Fatal(err)
	}
	info, err := s.Info(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if info.State.Msgs == 0 {
		t.Error("no pacer event on MIRROR_EVENTS")
	}
}

func count429(o *origin) int {
	n := 0
	for _, a := range o.log() {
		if a.status == http.StatusTooManyRequests {
			n++
		}
	}
	return n
}
