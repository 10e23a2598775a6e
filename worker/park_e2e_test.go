//go:build e2e

package worker_test

import (
	"context"
	"fmt"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mirrorworker/mirrorworker/authority"
	"github.com/mirrorworker/mirrorworker/jobs"
	"github.com/mirrorworker/mirrorworker/worker"
)

// TestParkingIsolationAtScale is issue 17's test: with default settings
// (floor 0), a large backlog of an origin that answers every request 429
// with Retry-After 120 sits ahead of healthy jobs of other origins, one of
// which shares its partition. The cooling backlog is moved out of the
// consumers (a lane, or parked), and the healthy jobs drain about as fast as
// alone (the ratio is reported; only a collapse fails the test, since speed
// is the benchmarks' business).
func TestParkingIsolationAtScale(t *testing.T) {
	if testing.Short() {
		t.Skip("publishes 100,000 jobs")
	}
	throttled := 100_000
	if raceEnabled {
		throttled = 10_000
	}
	const healthyN, healthyAuths = 1000, 10
	e := newEnv(t, 30*time.Second)
	slow := newOrigin(t)
	slow.setBehave(func(w http.ResponseWriter, _ *http.Request, _ int) bool {
		w.Header().Set("Retry-After", "120")
		w.WriteHeader(http.StatusTooManyRequests)
		return true
	})
	// One healthy authority shares the cooling one's partition (the case
	// lanes are for); the others most likely do not.
	healthy := []*origin{originInPartition(t, jobs.Partition(authority.KeyOf(slow.auth), jobs.DefaultPartitions))}
	for range healthyAuths - 1 {
		healthy = append(healthy, newOrigin(t))
	}
	round := func(name string) []jobs.Job {
		var js []jobs.Job
		for i := range healthyN {
			o := healthy[i%healthyAuths]
			js = append(js, jobs.Job{ID: fmt.Sprint(name, "-", i), URL: o.url(fmt.Sprint("/", name, "/", i)), Target: fmt.Sprint(name, "/", i)})
		}
		return js
	}
	r := e.startPartitioned(testPacer(0, 2, nil, 0, nil), worker.Options{})

	start := time.Now()
	e.publish(round("alone")...)
	tAlone := r.f.waitFor(t, healthyN, isRound("alone"), 2*time.Minute).Sub(start)

	var backlog []jobs.Job
	for i := range throttled {
		backlog = append(backlog, jobs.Job{ID: fmt.Sprint("slow-", i), URL: slow.url(fmt.Sprint("/slow/", i)), Target: fmt.Sprint("slow/", i)})
	}
	pubStart := time.Now()
	e.publish(backlog...)
	tPub := time.Since(pubStart)
	start = time.Now()
	e.publish(round("mixed")...)
	tMixed := r.f.waitFor(t, healthyN, isRound("mixed"), 3*time.Minute).Sub(start)
	if tMixed > 4*tAlone+20*time.Second {
		t.Errorf("healthy jobs took %v behind %d cooling jobs, %v alone", tMixed, throttled, tAlone)
	}
	waitCond(t, 3*time.Minute, "the cooling backlog parked", func() bool {
		return parkedTotal(t, e) >= uint64(throttled)
	})
	tParked := time.Since(pubStart)

	// Nothing of the backlog holds the consumers or memory.
	ackPending := 0
	for p := range jobs.DefaultPartitions {
		c, err := e.js.Consumer(context.Background(), jobs.JobsStream, jobs.PartitionConsumer(p))
		if err != nil {
			t.Fatal(err)
		}
		info, err := c.Info(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		ackPending += info.NumAckPending
	}
	if ackPending > 10 {
		t.Errorf("%d jobs ack-pending with the backlog parked", ackPending)
	}
	if held := counter(t, r.reg, "mirrorworker_held_jobs", nil); held > 10 {
		t.Errorf("%v jobs held in memory with the backlog parked", held)
	}
	if n := len(slow.log()); n > 3 {
		t.Errorf("the cooling origin got %d requests, want the one that earned the cooldown (and at most the cap's worth in flight then)", n)
	}
	t.Logf("%d cooling jobs published in %v and parked %v after the first; healthy %d jobs: alone %v, behind the backlog %v (%.0f%% of the speed alone); %d ack pending after",
		throttled, tPub.Round(time.Millisecond), tParked.Round(time.Millisecond), healthyN, tAlone.Round(time.Millisecond),
		tMixed.Round(time.Millisecond), 100*tAlone.Seconds()/tMixed.Seconds(), ackPending)
}

// TestParkedJobsComeBackProbeFirstThenFloor: jobs of an authority that
// asks for a long wait are parked (no consumer slot, no memory), and when
// the wait is over they come back at the origin's pace: the probe alone
// first, then one request per floor, never a burst; each job is delivered
// at most twice.
func TestParkedJobsComeBackProbeFirstThenFloor(t *testing.T) {
	const (
		floor      = 200 * time.Millisecond
		retryAfter = 4 * time.Second
		n          = 8 // the 429 escalates the interval to 2 s: n jobs take 2n s
	)
	e := newEnv(t, 30*time.Second)
	o := newOrigin(t)
	var inflight, maxAfter atomic.Int32
	var cooledAt atomic.Int64
	o.setBehave(func(w http.ResponseWriter, r *http.Request, _ int) bool {
		c := inflight.Add(1)
		defer inflight.Add(-1)
		if cooledAt.CompareAndSwap(0, time.Now().UnixNano()) {
			w.Header().Set("Retry-After", fmt.Sprint(int(retryAfter/time.Second)))
			w.WriteHeader(http.StatusTooManyRequests)
			return true
		}
		if c > maxAfter.Load() {
			maxAfter.Store(c)
		}
		time.Sleep(20 * time.Millisecond) // the probe takes a moment: nothing may overtake it
		return false
	})
	var js []jobs.Job
	for i := range n {
		js = append(js, jobs.Job{ID: fmt.Sprint("park-", i), URL: o.url(fmt.Sprint("/park/", i)), Target: fmt.Sprint("park/", i)})
	}
	r := e.startPartitioned(testPacer(floor, 2, nil, 0, nil), worker.Options{ParkAfter: time.Second})
	e.publish(js...)
	waitCond(t, 20*time.Second, "jobs parked", func() bool { return streamMsgs(t, e, jobs.ParkStream) >= n-2 })
	if held := counter(t, r.reg, "mirrorworker_held_jobs", nil); held > 2 {
		t.Errorf("%v jobs held in memory while their authority cools, want them parked", held)
	}
	r.f.waitFor(t, n, nil, 60*time.Second)
	for i := range n {
		e.checkStored(fmt.Sprint("park/", i), body(fmt.Sprint("/park/", i)))
	}
	log := o.log()
	cooled := time.Unix(0, cooledAt.Load())
	for i, a := range log[1:] {
		if a.at.Before(cooled.Add(retryAfter)) {
			t.Errorf("request %d at %v, inside the %v cooldown", i+2, a.at.Sub(cooled), retryAfter)
		}
		if i > 0 {
			if gap := a.at.Sub(log[i].at); gap < floor {
				t.Errorf("requests %d and %d only %v apart, floor %v", i+1, i+2, gap, floor)
			}
		}
	}
	if m := maxAfter.Load(); m > 1 {
		t.Errorf("%d requests in flight at once after the cooldown: the parked jobs came back as a burst", m)
	}
	for _, f := range r.f.snapshot() {
		if f.Deliveries > 2 {
			t.Errorf("job %s: %d deliveries, want at most 2", f.JobID, f.Deliveries)
		}
	}
	if got := counter(t, r.reg, "mirrorworker_parks_total", map[string]string{"op": "parked"}); got < n-2 {
		t.Errorf("parks_total{parked} = %v, want about %d", got, n)
	}
	waitCond(t, 10*time.Second, "parking lot empty", func() bool { return streamMsgs(t, e, jobs.ParkStream) == 0 })
	t.Logf("first request after the cooldown %v after the 429; %d requests for %d jobs",
		log[1].at.Sub(cooled).Round(time.Millisecond), len(log), n)
}
