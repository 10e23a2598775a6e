package worker_test

import (
	"context"
	"fmt"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/mirrorworker/mirrorworker/authority"
	"github.com/mirrorworker/mirrorworker/clock"
	"github.com/mirrorworker/mirrorworker/jobs"
	"github.com/mirrorworker/mirrorworker/pacer"
	"github.com/mirrorworker/mirrorworker/worker"
)

// TestRedirectIsHandedToTheAuthoritysPod: two pods on one stream, each
// serving its own partitions. Every job of origin a redirects to origin b,
// whose partition the other pod serves, and b has jobs of its own. The pod
// of a does not follow the redirect with its own pacer for b: it hands the
// rest of the fetch to b's pod, so every request b sees is paced by one
// pacer and b's floor holds, and every object is stored once, with b's
// bytes and a's URL in its metadata.
//
// Both pods run on one fake clock, which the test moves one spacing at a
// time, after b's latest request has arrived: b times its requests on that
// clock, so its floor is judged at the origin to the instant, with no
// slack, however loaded the machine. The jobs wait in memory (HoldMax past
// the whole run), not in NATS.
func TestRedirectIsHandedToTheAuthoritysPod(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 30*time.Second)
	fake := clock.NewFake(time.Now())
	newFakeNaks(e, fake)
	parts, err := jobs.EnsureWork(context.Background(), e.js, &jobs.WorkOptions{Consumer: &jobs.ConsumerOptions{AckWait: 30 * time.Second}})
	if err != nil {
		t.Fatal(err)
	}
	partOf := func(o *origin) int { return jobs.Partition(authority.KeyOf(o.auth), parts) }
	a := newOrigin(t)
	b := newOrigin(t)
	for partOf(b) == partOf(a) {
		b = newOrigin(t)
	}
	pb := partOf(b)
	a.setBehave(func(w http.ResponseWriter, r *http.Request, _ int) bool {
		http.Redirect(w, r, b.url(r.URL.Path), http.StatusFound)
		return true
	})
	var mu sync.Mutex
	var atB []time.Time // b's requests, on the pods' clock
	b.setBehave(func(http.ResponseWriter, *http.Request, int) bool {
		mu.Lock()
		atB = append(atB, fake.Now())
		mu.Unlock()
		return false
	})
	countB := func() int {
		mu.Lock()
		defer mu.Unlock()
		return len(atB)
	}

	const (
		floor   = 300 * time.Millisecond
		spacing = floor + pacer.MaxStartGuard
		per     = 6
	)
	o := worker.Options{Clock: fake, Concurrency: 8, HoldMax: time.Hour}
	podA := e.startServing(testPacer(floor, 2, nil, 0, nil), o, nil, func(i int) bool { return i != pb })
	podB := e.startServing(testPacer(floor, 2, nil, 0, nil), o, nil, func(i int) bool { return i == pb })
	var js []jobs.Job
	for i := range per {
		js = append(js,
			jobs.Job{ID: fmt.Sprint("r-", i), URL: a.url(fmt.Sprint("/r/", i)), Target: fmt.Sprint("r/", i)},
			jobs.Job{ID: fmt.Sprint("d-", i), URL: b.url(fmt.Sprint("/d/", i)), Target: fmt.Sprint("d/", i)})
	}
	e.publish(js...)

	// b has a job of its own at every step (its d-jobs, then a's
	// continuations, one handed over per step of a's floor): one request
	// per spacing. The first is a spacing after the pods took their
	// partitions over (AddPartition's since).
	for k := 1; k <= 2*per; k++ {
		fake.Advance(spacing)
		waitCond(t, 30*time.Second, fmt.Sprint("b's request ", k), func() bool { return countB() >= k })
	}
	podA.f.waitFor(t, per, isOutcome(worker.OutcomeHandedOff), 60*time.Second)
	podB.f.waitFor(t, 2*per, isOutcome(worker.OutcomeStored), 60*time.Second)
	if n := podA.f.count(isOutcome(worker.OutcomeStored)); n != 0 {
		t.Errorf("a's pod stored %d objects itself, want 0: it followed redirects to b", n)
	}
	for i := range per {
		e.checkStored(fmt.Sprint("r/", i), body(fmt.Sprint("/r/", i)))
		e.checkStored(fmt.Sprint("d/", i), body(fmt.Sprint("/d/", i)))
		m, err := e.target.Stat(context.Background(), fmt.Sprint("r/", i))
		if err != nil {
			t.Fatal(err)
		}
		if want := a.url(fmt.Sprint("/r/", i)); m.URL != want {
			t.Errorf("r/%d: metadata URL %q, want the job's %q", i, m.URL, want)
		}
	}
	if got := len(a.log()); got != per {
		t.Errorf("a saw %d requests, want %d (one redirect per job)", got, per)
	}
	if got := len(b.log()); got != 2*per {
		t.Fatalf("b saw %d requests, want %d", got, 2*per)
	}
	mu.Lock()
	defer mu.Unlock()
	for i := 1; i < len(atB); i++ {
		if gap := atB[i].Sub(atB[i-1]); gap < floor {
			t.Errorf("b's requests %d and %d %v apart on the pods' clock, floor %v", i-1, i, gap, floor)
		}
	}
}

// TestRedirectToACoolingAuthorityContinuesThere: with partitions, a
// redirect whose authority is cooling past HoldMax does not defer the whole job (which
// would ask the first hop again after the wait): the rest of the fetch
// waits in the cooling authority's queue, as a continuation, and is
// fetched there once the cooldown ends. The first hop is asked once.
//
// On the worker's fake clock, with the NAK delays on it too (fakeNaks):
// the test advances the clock by each delay the worker asks for, and the
// cooling authority's request is timed on that clock, to the instant.
func TestRedirectToACoolingAuthorityContinuesThere(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 30*time.Second)
	fake := clock.NewFake(time.Now())
	naks := newFakeNaks(e, fake)
	from, to := newOrigin(t), newOrigin(t)
	from.setBehave(func(w http.ResponseWriter, r *http.Request, _ int) bool {
		http.Redirect(w, r, to.url("/target"), http.StatusFound)
		return true
	})
	var mu sync.Mutex
	var asked []time.Time // the cooling authority's requests, on the fake clock
	to.setBehave(func(http.ResponseWriter, *http.Request, int) bool {
		mu.Lock()
		asked = append(asked, fake.Now())
		mu.Unlock()
		return false
	})
	p := testPacer(0, 2, nil, 0, nil)
	// The redirect's authority is cooling for 3 s, longer than HoldMax.
	cooled := fake.Now()
	pm, err := p.Acquire(cooled, to.auth, 0)
	if err != nil {
		t.Fatal(err)
	}
	p.Done(cooled, pm, pacer.Response{Status: 429, Header: http.Header{"Retry-After": {"3"}}})
	r := e.startPartitioned(p, worker.Options{Clock: fake, Concurrency: 4, HoldMax: 500 * time.Millisecond})
	e.publish(jobs.Job{ID: "redir", URL: from.url("/start"), Target: "redir"})

	r.f.waitFor(t, 1, isOutcome(worker.OutcomeHandedOff), 20*time.Second)
	// Each deferral of the continuation is one NAK with delay: advance the
	// clock by it, and the continuation comes back then.
	for k := 1; r.f.count(isOutcome(worker.OutcomeStored)) == 0; k++ {
		if k > 5 {
			t.Fatalf("the continuation was deferred %d times, and not fetched", k-1)
		}
		waitCond(t, 20*time.Second, fmt.Sprint("deferral ", k, " or the fetch"), func() bool {
			return naks.asked() >= k || r.f.count(isOutcome(worker.OutcomeStored)) > 0
		})
		if naks.asked() >= k {
			fake.Advance(naks.delay(k - 1))
		}
		waitCond(t, 20*time.Second, "the continuation back", func() bool {
			return naks.asked() > k || r.f.count(isOutcome(worker.OutcomeStored)) > 0
		})
	}
	e.checkStored("redir", body("/target"))
	if n := len(from.log()); n != 1 {
		t.Errorf("first hop requested %d times, want 1", n)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(asked) != 1 {
		t.Fatalf("cooling authority received %d requests, want 1", len(asked))
	}
	if at := asked[0].Sub(cooled); at < 3*time.Second {
		t.Errorf("the cooling authority was asked %v after its 429, Retry-After 3 s", at)
	} else {
		t.Logf("the cooling authority was asked %v after its 429 (on the worker's clock), Retry-After 3 s", at)
	}
	if dl := e.deadLetters(); len(dl) != 0 {
		t.Errorf("dead-lettered: %+v", dl)
	}
}
