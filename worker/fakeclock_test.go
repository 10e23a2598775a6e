package worker_test

import (
	"fmt"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/mirrorworker/mirrorworker/clock"
	"github.com/mirrorworker/mirrorworker/jobs"
	"github.com/mirrorworker/mirrorworker/pacer"
	"github.com/mirrorworker/mirrorworker/worker"
)

// TestFloorOnTheFakeClock checks the worker's spacing on its clock seam: the
// worker, its scheduler and its pacer run on a fake clock that moves only
// when the test advances it, so the instant of every request is exact and
// the test holds however loaded the machine is. With a 1-minute floor (and
// the pacer's start guard, 2 ms, on top), the k-th request to an authority
// is sent at exactly (k-1) spacings, never earlier, and the jobs wait in
// memory meanwhile. (TestFloorHoldsAtTheOrigin
// checks the same on the wall clock, at the origin.)
func TestFloorOnTheFakeClock(t *testing.T) {
	t.Parallel()
	const (
		floor   = time.Minute
		spacing = floor + pacer.MaxStartGuard // the guard is min(floor/50, 2 ms)
		n       = 4
	)
	fake := clock.NewFake(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC))
	start := fake.Now()
	e := newEnv(t, 30*time.Second)
	o := newOrigin(t)
	var mu sync.Mutex
	var sent []time.Duration // fake instants of the requests, from start
	o.setBehave(func(http.ResponseWriter, *http.Request, int) bool {
		mu.Lock()
		sent = append(sent, fake.Now().Sub(start))
		mu.Unlock()
		return false
	})
	count := func() int {
		mu.Lock()
		defer mu.Unlock()
		return len(sent)
	}
	var js []jobs.Job
	for i := range n {
		js = append(js, jobs.Job{ID: fmt.Sprint("f", i), URL: o.url(fmt.Sprint("/f/", i)), Target: fmt.Sprint("f/", i)})
	}
	// HoldMax above the floor: the jobs wait in memory, not in NATS, whose
	// redelivery delays run on the wall clock.
	r := e.start(testPacer(floor, 1, nil, 0, nil), worker.Options{Clock: fake, HoldMax: 10 * time.Minute})
	e.publish(js...)
	waitCond(t, 30*time.Second, "the first request", func() bool { return count() == 1 })
	waitCond(t, 30*time.Second, "the other jobs queued", func() bool {
		return counter(t, r.reg, "mirrorworker_held_jobs", map[string]string{"state": "queued"}) == n-1
	})
	for k := 2; k <= n; k++ {
		slot := start.Add(time.Duration(k-1) * spacing)
		armed := len(fake.Deadlines())
		fake.Advance(spacing - time.Millisecond)
		// Nothing may be sent at this instant, a millisecond before the
		// slot. Advance disarms every timer it fires before it returns, so
		// waiting until at least as many timers are armed as before, the
		// first at exactly the slot, waits until every goroutine the
		// advance woke has handled its wake and waits again: the scheduler
		// for the slot, or (when something woke it within the pacer's
		// reservation, 5 ms) the granted job's fetch slot for its reserved
		// start, the slot itself. A worker that sends early has nothing
		// armed at the slot (its next wake is a spacing later), so the wait
		// ends only by its request reaching the origin, recorded at this
		// instant.
		waitCond(t, 30*time.Second, fmt.Sprint("the wake armed for slot ", k), func() bool {
			if count() != k-1 {
				return true // early: reported below
			}
			ds := fake.Deadlines()
			return len(ds) >= armed && ds[0].Equal(slot)
		})
		if got := count(); got != k-1 {
			t.Fatalf("%d requests by %v, want %d (spacing %v)", got, fake.Now().Sub(start), k-1, spacing)
		}
		fake.Advance(time.Millisecond)
		waitCond(t, 30*time.Second, fmt.Sprint("request ", k), func() bool { return count() == k })
	}
	r.f.waitFor(t, n, isOutcome(worker.OutcomeStored), 30*time.Second)
	mu.Lock()
	defer mu.Unlock()
	for k, at := range sent {
		if want := time.Duration(k) * spacing; at != want {
			t.Errorf("request %d sent at %v on the worker's clock, want %v", k+1, at, want)
		}
	}
}
