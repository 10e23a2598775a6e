package worker_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/mirrorworker/mirrorworker/authority"
	"github.com/mirrorworker/mirrorworker/clock"
	"github.com/mirrorworker/mirrorworker/jobs"
	"github.com/mirrorworker/mirrorworker/pacer"
	"github.com/mirrorworker/mirrorworker/worker"
	"github.com/nats-io/nats.go/jetstream"
)

func TestStoresEveryJobThenRevalidates(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 30*time.Second)
	var origins []*origin
	for range 10 {
		origins = append(origins, newOrigin(t))
	}
	const n = 500
	mk := func(round string) []jobs.Job {
		var js []jobs.Job
		for i := range n {
			o := origins[i%len(origins)]
			js = append(js, jobs.Job{
				ID:     fmt.Sprintf("%s-%d", round, i),
				URL:    o.url(fmt.Sprintf("/obj/%d", i)),
				Target: fmt.Sprintf("o%d/obj%d", i%len(origins), i),
				Tenant: []string{"alpha", "beta"}[i%2],
			})
		}
		return js
	}
	r := e.start(testPacer(0, 2, nil, 0, nil), worker.Options{Concurrency: 8})
	e.publish(mk("first")...)
	r.f.waitFor(t, n, nil, 60*time.Second)
	if got := r.f.count(isOutcome(worker.OutcomeStored)); got != n {
		t.Fatalf("stored %d of %d: %+v", got, n, r.f.snapshot()[:5])
	}
	e.waitDrained(10 * time.Second)
	mtimes := map[string]time.Time{}
	for i := range n {
		key := fmt.Sprintf("o%d/obj%d", i%len(origins), i)
		e.checkStored(key, body(fmt.Sprintf("/obj/%d", i)))
		fi, err := os.Stat(filepath.Join(e.root, key))
		if err != nil {
			t.Fatal(err)
		}
		mtimes[key] = fi.ModTime()
	}

	// Again, under new ids (the stream would drop the same ids as
	// duplicates): every request is conditional and nothing is rewritten.
	served := 0
	for _, o := range origins {
		served += len(o.log())
	}
	e.publish(mk("second")...)
	r.f.waitFor(t, 2*n, nil, 60*time.Second)
	if got := r.f.count(isOutcome(worker.OutcomeUnchanged)); got != n {
		t.Fatalf("unchanged %d of %d", got, n)
	}
	e.waitDrained(10 * time.Second)
	second := 0
	for _, o := range origins {
		for _, a := range o.log()[len(o.log())-50:] {
			if !a.cond || a.status != http.StatusNotModified {
				t.Fatalf("second round request %+v is not a conditional request answered 304", a)
			}
		}
		second += len(o.log())
	}
	if second-served != n {
		t.Fatalf("second round made %d requests, want %d", second-served, n)
	}
	for key, mt := range mtimes {
		fi, err := os.Stat(filepath.Join(e.root, key))
		if err != nil {
			t.Fatal(err)
		}
		if !fi.ModTime().Equal(mt) {
			t.Fatalf("%s rewritten in the second round", key)
		}
	}
	if dl := e.deadLetters(); len(dl) != 0 {
		t.Fatalf("dead letters: %+v", dl)
	}
	if got := counter(t, r.reg, "mirrorworker_upstream_requests_total", map[string]string{"outcome": "not_modified"}); got != n {
		t.Errorf("upstream_requests_total{outcome=not_modified} = %v, want %d", got, n)
	}
}

func TestTransientFailuresUseTheBudget(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 30*time.Second)
	o := newOrigin(t)
	o.setBehave(func(w http.ResponseWriter, r *http.Request, n int) bool {
		switch {
		case r.URL.Path == "/bad":
			// 500, not 503: a 503 answered at once after /flaky's success
			// would be read as a limiter's refusal (pacer.TestLimiter503).
			w.WriteHeader(http.StatusInternalServerError)
			return true
		case r.URL.Path == "/flaky" && n <= 2:
			w.WriteHeader(http.StatusBadGateway)
			return true
		}
		return false
	})
	// The job's budget is the point here: the authority's failure backoff
	// (pacer/backoff.go, its own tests) would space these attempts by
	// seconds, so it is left to the floor, 0.
	p := pacer.New(&pacer.Options{Policy: &pacer.Policy{Default: pacer.Limits{Floor: 0, MaxInFlight: 2}}, FailureBackoffMin: -1})
	r := e.start(p, worker.Options{
		FailureBudget: 3, BackoffInitial: 20 * time.Millisecond, BackoffMax: 100 * time.Millisecond,
	})
	e.publish(
		jobs.Job{ID: "bad", URL: o.url("/bad"), Target: "bad"},
		jobs.Job{ID: "flaky", URL: o.url("/flaky"), Target: "flaky"},
	)
	r.f.waitFor(t, 2, nil, 30*time.Second)
	e.waitDrained(10 * time.Second)
	e.checkStored("flaky", body("/flaky"))

	dls := e.deadLetters()
	if len(dls) != 1 {
		t.Fatalf("%d dead letters, want 1: %+v", len(dls), dls)
	}
	d := dls[0]
	if d.JobID != "bad" || d.Reason != jobs.ReasonBudgetExhausted || d.LastStatus != 500 || len(d.Attempts) != 3 {
		t.Fatalf("dead letter %+v, want bad/budget_exhausted/500 with 3 attempts", d)
	}
	for _, a := range d.Attempts {
		if a.Reason != "http_500" || a.Status != 500 || a.Time.IsZero() {
			t.Errorf("attempt %+v", a)
		}
	}
	if len(d.Job) == 0 || d.Subject == "" || d.StreamSeq == 0 {
		t.Errorf("dead letter lacks the original job: %+v", d)
	}
	var bad int
	for _, a := range o.log() {
		if a.path == "/bad" {
			bad++
		}
	}
	if bad != 3 {
		t.Errorf("/bad requested %d times, want the budget, 3", bad)
	}
	kv, err := e.js.KeyValue(context.Background(), jobs.AttemptsBucket)
	if err != nil {
		t.Fatal(err)
	}
	keys, err := kv.Keys(context.Background())
	if err != nil && !errors.Is(err, jetstream.ErrNoKeysFound) {
		t.Fatal(err)
	}
	if len(keys) != 0 {
		t.Errorf("attempt counters left behind: %v", keys)
	}
	if got := counter(t, r.reg, "mirrorworker_jobs_total", map[string]string{"outcome": "retried"}); got != 4 {
		t.Errorf("jobs_total{retried} = %v, want 4 (2 for bad, 2 for flaky)", got)
	}
}

func TestPermanentAndInvalidJobsAreDeadLettered(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 30*time.Second)
	o := newOrigin(t)
	o.setBehave(func(w http.ResponseWriter, r *http.Request, _ int) bool {
		if r.URL.Path == "/missing" {
			http.NotFound(w, r)
			return true
		}
		return false
	})
	r := e.start(testPacer(0, 2, nil, 0, nil), worker.Options{})
	a, err := authority.Parse(o.url("/"))
	if err != nil {
		t.Fatal(err)
	}
	subj := "mirror.jobs.default." + a.Key()
	invalid := []struct {
		subject string
		data    string
		reason  string
	}{
		{subj, "\xff\x00{garbage", jobs.ReasonInvalidJob},
		{subj, "", jobs.ReasonInvalidJob},
		{subj, `{"url":"ftp://example.org/x"}`, jobs.ReasonInvalidJob},
		{subj, `{"v":3,"url":"` + o.url("/v2") + `"}`, jobs.ReasonUnsupportedVersion},
		{"mirror.jobs.other." + a.Key(), `{"url":"` + o.url("/tenant") + `"}`, jobs.ReasonInvalidJob},
		{"mirror.jobs.default.elsewhere_80", `{"url":"` + o.url("/akey") + `"}`, jobs.ReasonInvalidJob},
		{"mirror.jobs.x", `{"url":"` + o.url("/short-subject") + `"}`, jobs.ReasonInvalidJob},
		{subj, `{"url":"` + o.url("/h") + `","headers":{"Authorization":"x"}}`, jobs.ReasonInvalidJob},
	}
	for _, in := range invalid {
		e.publishRaw(in.subject, []byte(in.data))
	}
	e.publish(jobs.Job{ID: "missing", URL: o.url("/missing"), Target: "missing"},
		jobs.Job{ID: "fine", URL: o.url("/fine"), Target: "fine"})
	r.f.waitFor(t, len(invalid)+2, nil, 30*time.Second)
	e.waitDrained(10 * time.Second)
	e.checkStored("fine", body("/fine"))

	dls := e.deadLetters()
	if len(dls) != len(invalid)+1 {
		t.Fatalf("%d dead letters, want %d", len(dls), len(invalid)+1)
	}
	byReason := map[string]int{}
	for _, d := range dls {
		byReason[d.Reason]++
		if d.JobID == "missing" && (d.Reason != "http_404" || d.LastStatus != 404) {
			t.Errorf("missing: %+v", d)
		}
		if len(d.Job) == 0 && len(d.JobBytes) == 0 && d.JobLen != 0 {
			t.Errorf("dead letter without the original: %+v", d)
		}
	}
	if byReason["http_404"] != 1 || byReason[jobs.ReasonUnsupportedVersion] != 1 || byReason[jobs.ReasonInvalidJob] != len(invalid)-1 {
		t.Errorf("reasons %v", byReason)
	}
	missing := 0
	for _, a := range o.log() {
		if a.path == "/missing" {
			missing++
		}
		if strings.HasPrefix(a.path, "/v2") || a.path == "/tenant" || a.path == "/akey" || a.path == "/h" {
			t.Errorf("invalid job fetched: %s", a.path)
		}
	}
	if missing != 1 {
		t.Errorf("/missing requested %d times, want 1", missing)
	}
}

func TestTargetConflictIsDeadLetteredAtOnce(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 30*time.Second)
	o := newOrigin(t)
	r := e.start(testPacer(0, 2, nil, 0, nil), worker.Options{})
	e.publish(jobs.Job{ID: "base", URL: o.url("/base"), Target: "base"})
	r.f.waitFor(t, 1, nil, 30*time.Second)
	// "base" is now a file, so "base/sub" can never be stored.
	e.publish(jobs.Job{ID: "conflict", URL: o.url("/conflict"), Target: "base/sub"})
	r.f.waitFor(t, 2, nil, 30*time.Second)
	e.waitDrained(10 * time.Second)
	e.checkStored("base", body("/base"))
	dls := e.deadLetters()
	if len(dls) != 1 || dls[0].JobID != "conflict" || dls[0].Reason != "target_conflict" {
		t.Fatalf("dead letters %+v, want one target_conflict for the conflicting job", dls)
	}
	n := 0
	for _, a := range o.log() {
		if a.path == "/conflict" {
			n++
		}
	}
	if n != 1 {
		t.Fatalf("/conflict requested %d times, want 1 (no retries for a conflict)", n)
	}
}

func TestShutdownHandsHeldJobsBack(t *testing.T) {
	t.Parallel()
	const ackWait = 30 * time.Second
	e := newEnv(t, ackWait)
	o := newOrigin(t)
	// An hour between requests and an even longer HoldMax: every job but
	// the first is held in memory, waiting for its slot.
	r1 := e.start(testPacer(time.Hour, 2, nil, 0, nil), worker.Options{HoldMax: 2 * time.Hour, AckWait: ackWait})
	const n = 20
	var js []jobs.Job
	for i := range n {
		js = append(js, jobs.Job{ID: fmt.Sprint("s", i), URL: o.url(fmt.Sprint("/s/", i)), Target: fmt.Sprint("s/", i)})
	}
	e.publish(js...)
	r1.f.waitFor(t, 1, nil, 10*time.Second)
	waitCond(t, 10*time.Second, fmt.Sprint("every job but the first ack pending (", n-1, ")"), func() bool {
		info, err := e.cons.Info(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		return info.NumPending == 0 && info.NumAckPending == n-1
	})
	// The consumer counts a job ack-pending as soon as it is delivered; the
	// worker counts it held once the intake has queued it, a moment later.
	// Wait for what the test means: every job but the first queued here.
	waitCond(t, 10*time.Second, fmt.Sprint("held_jobs{queued} = ", n-1), func() bool {
		return counter(t, r1.reg, "mirrorworker_held_jobs", map[string]string{"state": "queued"}) == n-1
	})
	stopped := time.Now()
	r1.stop(t)
	if d := time.Since(stopped); d > 5*time.Second {
		t.Errorf("shutdown took %v", d)
	}

	// A second worker gets every held job at once, not after the ack wait.
	r2 := e.start(testPacer(0, 2, nil, 0, nil), worker.Options{AckWait: ackWait})
	r2.f.waitFor(t, n-1, nil, ackWait/3)
	e.waitDrained(10 * time.Second)
	for _, f := range r2.f.snapshot() {
		if f.Outcome != worker.OutcomeStored || f.Deliveries != 2 {
			t.Errorf("second worker: %+v, want stored at the second delivery", f)
		}
	}
	for i := range n {
		e.checkStored(fmt.Sprint("s/", i), body(fmt.Sprint("/s/", i)))
	}
}

func TestRedirectToACoolingAuthorityDefers(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 30*time.Second)
	from, to := newOrigin(t), newOrigin(t)
	from.setBehave(func(w http.ResponseWriter, r *http.Request, _ int) bool {
		http.Redirect(w, r, to.url("/target"), http.StatusFound)
		return true
	})
	p := testPacer(0, 2, nil, 0, nil)
	// The redirect's authority is cooling for a minute.
	pm, err := p.Acquire(time.Now(), to.auth, 0)
	if err != nil {
		t.Fatal(err)
	}
	p.Done(time.Now(), pm, pacer.Response{Status: 429, Header: http.Header{"Retry-After": {"60"}}})
	r := e.start(p, worker.Options{})
	e.publish(jobs.Job{ID: "redir", URL: from.url("/start"), Target: "redir"})

	waitCond(t, 10*time.Second, "the job deferred", func() bool {
		return counter(t, r.reg, "mirrorworker_jobs_total", map[string]string{"outcome": worker.OutcomeDeferred}) >= 1
	})
	if n := len(to.log()); n != 0 {
		t.Errorf("cooling authority received %d requests", n)
	}
	if n := len(from.log()); n != 1 {
		t.Errorf("first hop requested %d times, want 1", n)
	}
	if dl := e.deadLetters(); len(dl) != 0 {
		t.Errorf("dead-lettered: %+v", dl)
	}
	if got := counter(t, r.reg, "mirrorworker_jobs_total", map[string]string{"outcome": worker.OutcomeRetried}); got != 0 {
		t.Errorf("a deferral used the failure budget (retried = %v)", got)
	}
	info, err := e.cons.Info(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if info.NumAckPending != 1 {
		t.Errorf("ack pending %d, want the deferred job", info.NumAckPending)
	}
}

// phasedPacer refuses every request with a short spacing wait until hold,
// then with a cooldown until open, then grants (no floor, no cap).
type phasedPacer struct{ hold, open time.Time }

func (p *phasedPacer) Acquire(now time.Time, auth string, _ time.Duration) (pacer.Permit, error) {
	switch {
	case now.Before(p.hold):
		return pacer.Permit{}, &pacer.RefusedError{Authority: auth, Reason: pacer.ReasonSpacing, Wait: p.hold.Sub(now), Interval: 10 * time.Millisecond}
	case now.Before(p.open):
		return pacer.Permit{}, &pacer.RefusedError{Authority: auth, Reason: pacer.ReasonCooling, Wait: p.open.Sub(now), Interval: 10 * time.Millisecond, Until: p.open}
	}
	return pacer.Permit{Authority: auth, Start: now}, nil
}

// Confirm lets every granted permit go as granted.
func (p *phasedPacer) Confirm(_ time.Time, pm pacer.Permit) (pacer.Permit, error) { return pm, nil }

// PaceKey knows no groups.
func (p *phasedPacer) PaceKey(auth string) string { return auth }

// Sent has no spacing to keep.
func (p *phasedPacer) Sent(time.Time, pacer.Permit) {}

// Heard has no hold to end.
func (p *phasedPacer) Heard(time.Time, pacer.Permit, int) bool { return false }

// ReadyIn says what Acquire would: the wait until hold, then until open.
func (p *phasedPacer) ReadyIn(now time.Time, _ string) (time.Duration, time.Duration, pacer.Reason) {
	switch {
	case now.Before(p.hold):
		return p.hold.Sub(now), 10 * time.Millisecond, pacer.ReasonSpacing
	case now.Before(p.open):
		return p.open.Sub(now), 10 * time.Millisecond, pacer.ReasonCooling
	}
	return 0, 0, ""
}

// Changed is never closed: the phases are the pacer's whole rule.
func (p *phasedPacer) Changed() <-chan struct{} { return nil }

// Fence changes nothing: the phases are the pacer's whole rule.
func (p *phasedPacer) Fence(time.Time, string, time.Time) {}

func (p *phasedPacer) Apply(time.Time, pacer.Event) {}

func (p *phasedPacer) Done(time.Time, pacer.Permit, pacer.Response) pacer.Verdict {
	return pacer.Verdict{}
}

func TestDeferringAFullMemoryResumesPulling(t *testing.T) {
	t.Parallel()
	// MaxHeld jobs wait in memory (a short spacing wait) while more are
	// pending, so the intake waits for space. Then a cooldown longer than
	// HoldMax defers every one of them, with no fetch in flight: the
	// deferral itself must wake the intake, or the deferred jobs (and those
	// never pulled) are never delivered again.
	//
	// On the worker's fake clock, with the NAK delays on it too
	// (fakeNaks): the intake's safety-net timer does not fire unless the
	// test advances the clock, so only the deferral's wake-up can resume
	// pulling.
	const maxHeld = 16
	e := newEnv(t, 30*time.Second)
	o := newOrigin(t)
	fake := clock.NewFake(time.Now())
	newFakeNaks(e, fake)
	now := fake.Now()
	p := &phasedPacer{hold: now.Add(time.Second), open: now.Add(3500 * time.Millisecond)}
	var js []jobs.Job
	for i := range 3 * maxHeld {
		js = append(js, jobs.Job{ID: fmt.Sprint("full", i), URL: o.url(fmt.Sprint("/full/", i)), Target: fmt.Sprint("full/", i)})
	}
	e.publish(js...)
	r := e.start(p, worker.Options{Clock: fake, MaxHeld: maxHeld, MaxHeldPerAuthority: maxHeld, HoldMax: 1500 * time.Millisecond, PullWait: 100 * time.Millisecond})
	held := func() float64 { return counter(t, r.reg, "mirrorworker_held_jobs", nil) }
	deferred := func() float64 {
		return counter(t, r.reg, "mirrorworker_jobs_total", map[string]string{"outcome": worker.OutcomeDeferred})
	}
	waitCond(t, 15*time.Second, "memory full of jobs waiting for their spacing", func() bool { return held() == maxHeld })
	fake.Advance(time.Second) // the spacing ends; the cooldown (2.5 s, past HoldMax) begins
	waitCond(t, 15*time.Second, "every job deferred", func() bool { return deferred() == float64(len(js)) })
	if got := r.f.count(nil); got != 0 {
		t.Fatalf("%d jobs ended during the cooldown", got)
	}
	// Past the cooldown and the deferral calendar's whole horizon: every
	// deferred job is due.
	fake.Advance(2500*time.Millisecond + worker.DefaultDeferSpread)
	r.f.waitFor(t, len(js), isOutcome(worker.OutcomeStored), 15*time.Second)
	if got := deferred(); got < maxHeld {
		t.Errorf("%v jobs deferred, want at least the %d held at the cooldown", got, maxHeld)
	}
	e.waitDrained(10 * time.Second)
}
