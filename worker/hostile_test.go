package worker_test

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mirrorworker/mirrorworker/fetch"
	"github.com/mirrorworker/mirrorworker/fetch/fetchtest"
	"github.com/mirrorworker/mirrorworker/jobs"
	"github.com/mirrorworker/mirrorworker/mirror"
	"github.com/mirrorworker/mirrorworker/worker"
	"github.com/prometheus/client_golang/prometheus"
)

// startWith runs a worker on e with the given fetch client and target
// (start is startWith with the default client and e's target, waiting
// until the worker is ready).
func (e *env) startWith(p worker.Pacer, o worker.Options, f *fetch.Client, target worker.Target) *running {
	e.t.Helper()
	reg, _ := o.Registerer.(*prometheus.Registry)
	if reg == nil {
		reg = prometheus.NewRegistry()
		o.Registerer = reg
	}
	o.Logger = testLogger(e.t)
	o.PullWait = testPullWait(o.PullWait)
	w, err := worker.New(worker.Deps{JS: e.js, Consumer: e.consumer(e.cons), Fetcher: f, Target: target, Pacer: p}, &o)
	if err != nil {
		e.t.Fatal(err)
	}
	return e.launch(w, reg, f)
}

// launch runs w until the test ends (stopped and waited for at cleanup,
// then f's idle connections closed), recording its finals.
func (e *env) launch(w *worker.Worker, reg *prometheus.Registry, f *fetch.Client) *running {
	r := &running{w: w, f: &finals{}, reg: reg, done: make(chan struct{})}
	worker.SetFinalHook(w, r.f.add)
	ctx, cancel := context.WithCancel(context.Background())
	r.cancel = cancel
	go func() { r.err = w.Run(ctx); close(r.done) }()
	e.t.Cleanup(func() {
		cancel()
		select {
		case <-r.done:
		case <-time.After(30 * time.Second):
		}
		f.CloseIdleConnections()
	})
	return r
}

// trickleOrigin announces a large body and sends one byte every 20 ms.
func trickleOrigin(t testing.TB) string {
	stop := make(chan struct{})
	srv := httptest.NewUnstartedServer(fetchtest.Trickle(20*time.Millisecond, stop))
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv.Listener = ln
	srv.Start()
	t.Cleanup(srv.Close)
	t.Cleanup(func() { close(stop) }) // runs before srv.Close
	return "http://" + ln.Addr().String()
}

// Issue 13, case 1: trickling origins that could hold every fetch slot
// for good (each read makes progress, so no idle timeout fires) are cut
// at the minimum rate, so healthy jobs keep flowing; the trickling jobs
// end as retries and then dead letters whose attempts say too_slow.
func TestTrickleDoesNotStallHealthyOrigins(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 30*time.Second)
	healthy := newOrigin(t)
	slow := []string{trickleOrigin(t), trickleOrigin(t)}
	f := fetch.New(&fetch.Options{AllowPrivate: true, IdleTimeout: time.Minute,
		MinRate: 1 << 10, MinRateWindow: 300 * time.Millisecond})
	// Four slots, two per trickling authority: without a minimum rate the
	// four trickling jobs would hold all of them.
	r := e.startWith(testPacer(0, 2, nil, 0, nil), worker.Options{
		Concurrency: 4, FailureBudget: 2, BackoffInitial: 20 * time.Millisecond, BackoffMax: 50 * time.Millisecond,
	}, f, e.target)
	var js []jobs.Job
	for i, base := range slow {
		for k := range 2 {
			id := fmt.Sprintf("slow-%d-%d", i, k)
			js = append(js, jobs.Job{ID: id, URL: base + "/" + id, Target: id})
		}
	}
	e.publish(js...)
	// Healthy jobs arrive once the trickles hold every slot.
	waitCond(t, 30*time.Second, "the trickling jobs did not all start", func() bool {
		return counter(t, r.reg, "mirrorworker_held_jobs", map[string]string{"state": "fetching"}) == 4
	})
	js = nil
	for i := range 10 {
		js = append(js, jobs.Job{ID: fmt.Sprintf("ok-%d", i), URL: healthy.url(fmt.Sprintf("/ok/%d", i)), Target: fmt.Sprintf("ok/%d", i)})
	}
	e.publish(js...)
	r.f.waitFor(t, 10, func(x worker.Final) bool {
		return strings.HasPrefix(x.JobID, "ok-") && x.Outcome == worker.OutcomeStored
	}, 60*time.Second)
	for i := range 10 {
		e.checkStored(fmt.Sprintf("ok/%d", i), body(fmt.Sprintf("/ok/%d", i)))
	}

	r.f.waitFor(t, 4, func(x worker.Final) bool { return strings.HasPrefix(x.JobID, "slow-") }, 60*time.Second)
	for _, d := range e.deadLetters() {
		if d.Reason != jobs.ReasonBudgetExhausted || len(d.Attempts) != 2 {
			t.Errorf("dead letter %s: %s with %d attempts, want budget_exhausted after 2", d.JobID, d.Reason, len(d.Attempts))
		}
		for _, a := range d.Attempts {
			if a.Reason != "too_slow" || !strings.Contains(a.Detail, "minimum") {
				t.Errorf("dead letter %s: attempt %+v, want too_slow naming the minimum rate", d.JobID, a)
			}
		}
	}
}

// faultTarget is the real file target with injected failures of the disk
// under it: while putErr is set, every Put reads a little of the body and
// fails with it (as a write into a full disk does); while probeErr is set,
// every Probe fails with it.
type faultTarget struct {
	*mirror.FileTarget
	putErr   atomic.Pointer[error]
	probeErr atomic.Pointer[error]
	probes   atomic.Int64

	mu       sync.Mutex
	putFails map[string]int // by key
}

var _ worker.Target = (*faultTarget)(nil)

func (f *faultTarget) Put(ctx context.Context, key string, body io.Reader, want mirror.Expect, m mirror.Meta) (mirror.Meta, error) {
	if e := f.putErr.Load(); e != nil {
		io.Copy(io.Discard, io.LimitReader(body, 16))
		f.mu.Lock()
		f.putFails[key]++
		f.mu.Unlock()
		tmp := filepath.Join(f.Root(), mirror.ReservedDir, "tmp", "obj-123")
		return mirror.Meta{}, fmt.Errorf("put %q: write: %w", key, &os.PathError{Op: "write", Path: tmp, Err: *e})
	}
	return f.FileTarget.Put(ctx, key, body, want, m)
}

func (f *faultTarget) Probe(ctx context.Context) error {
	f.probes.Add(1)
	if e := f.probeErr.Load(); e != nil {
		return fmt.Errorf("probe: %w", &os.PathError{Op: "write", Path: "probe", Err: *e})
	}
	return f.FileTarget.Probe(ctx)
}

func (f *faultTarget) minPutFails(keys []string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	least := -1
	for _, k := range keys {
		if n := f.putFails[k]; least < 0 || n < least {
			least = n
		}
	}
	return least
}

// Issue 13, case 3: a body larger than the job's size is never read in
// full: a Content-Length that differs fails before the body, a body
// without one is cut at size+1 bytes; after two such answers the job is
// dead-lettered content_mismatch.
func TestOversizedBodyIsCutAndDeadLettered(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 30*time.Second)
	o := newOrigin(t)
	const big = 50 << 20
	o.setBehave(func(w http.ResponseWriter, r *http.Request, _ int) bool {
		if !strings.HasPrefix(r.URL.Path, "/big") {
			return false
		}
		if r.URL.Path == "/big-length" {
			w.Header().Set("Content-Length", strconv.Itoa(big))
		}
		chunk := []byte(strings.Repeat("b", 32<<10))
		for n := big; n > 0; n -= len(chunk) {
			if _, err := w.Write(chunk); err != nil {
				return true // the worker stopped reading
			}
		}
		return true
	})
	r := e.start(testPacer(0, 2, nil, 0, nil), worker.Options{
		FailureBudget: 10, BackoffInitial: 20 * time.Millisecond, BackoffMax: 50 * time.Millisecond,
	})
	size := int64(10)
	e.publish(
		jobs.Job{ID: "big-length", URL: o.url("/big-length"), Target: "big-length", Size: &size},
		jobs.Job{ID: "big-chunked", URL: o.url("/big-chunked"), Target: "big-chunked", Size: &size},
	)
	r.f.waitFor(t, 2, nil, 60*time.Second)
	e.waitDrained(10 * time.Second)
	dls := e.deadLetters()
	if len(dls) != 2 {
		t.Fatalf("%d dead letters, want 2", len(dls))
	}
	for _, d := range dls {
		if d.Reason != jobs.ReasonContentMismatch || len(d.Attempts) != worker.MaxContentMismatches {
			t.Errorf("%s: %s after %d attempts, want content_mismatch after %d", d.JobID, d.Reason, len(d.Attempts), worker.MaxContentMismatches)
		}
	}
	// The origin logs a request when its handler returns, and a handler
	// still writing the chunked body notices the cut connection a moment
	// after the worker has moved on: wait for both logs (a third request
	// still fails below).
	n := map[string]int{}
	waitCond(t, 10*time.Second, "the origin's handlers to return", func() bool {
		n = map[string]int{}
		for _, a := range o.log() {
			n[a.path]++
		}
		return n["/big-length"] >= 2 && n["/big-chunked"] >= 2
	})
	if n["/big-length"] != 2 || n["/big-chunked"] != 2 {
		t.Errorf("requests %v, want 2 each", n)
	}
	// Bytes read: none for the announced length, at most size+1 per
	// attempt for the other; the bound is size + 64 KiB.
	sum := histogramSum(t, r.reg, "mirrorworker_body_read_bytes")
	if sum > 2*float64(size+64<<10) {
		t.Errorf("body_read_bytes sum %v over 2 attempts, want at most %d", sum, 2*(size+64<<10))
	}
	if got := counter(t, r.reg, "mirrorworker_body_read_bytes", map[string]string{"result": "discarded"}); got != 2 {
		t.Errorf("body_read_bytes{discarded} has %v observations, want 2 (the chunked answers)", got)
	}
}

func histogramSum(t testing.TB, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var sum float64
	for _, mf := range mfs {
		if mf.GetName() == name {
			for _, m := range mf.GetMetric() {
				sum += m.GetHistogram().GetSampleSum()
			}
		}
	}
	return sum
}

// Issue 13, case 4: the label cap counts (host, port) pairs, so neither
// many hosts nor one host with many ports grows the series past the cap.
func TestLabelCapCountsAuthorities(t *testing.T) {
	reg := prometheus.NewRegistry()
	const limit = 500
	m, err := worker.NewMetrics(reg, limit)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 10000 {
		host := "h" + strconv.Itoa(i%50) + ".example.org" // 50 hosts, 200 ports each
		port := strconv.Itoa(1024 + i)
		m.CountUpstreamRequest(host, port, "artifact", "ok")
		m.CountCooldown(host, port, "429")
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	// Pairs, not series: the other pair's series of every outcome and
	// reason exist at 0 from the start.
	pairs := map[string]map[[2]string]bool{}
	other := map[string]float64{}
	for _, mf := range mfs {
		for _, s := range mf.GetMetric() {
			var pair [2]string
			for _, l := range s.GetLabel() {
				switch l.GetName() {
				case "host":
					pair[0] = l.GetValue()
				case "port":
					pair[1] = l.GetValue()
				}
				if l.GetName() == "host" && l.GetValue() == worker.OtherHost {
					other[mf.GetName()] += s.GetCounter().GetValue()
				}
			}
			if pairs[mf.GetName()] == nil {
				pairs[mf.GetName()] = map[[2]string]bool{}
			}
			pairs[mf.GetName()][pair] = true
		}
	}
	for _, name := range []string{"mirrorworker_upstream_requests_total", "mirrorworker_cooldowns_total"} {
		if n := len(pairs[name]); n > limit+1 {
			t.Errorf("%s: %d host and port pairs from 10,000 authorities, want at most %d (the cap and other)", name, n, limit+1)
		}
		if other[name] != 10000-limit {
			t.Errorf("%s{host=other} = %v, want %d", name, other[name], 10000-limit)
		}
	}
}

// Issue 13, case 6: the dead letter of an invalid job names the job's id
// when it carries a valid one.
func TestInvalidJobDeadLetterNamesItsID(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 30*time.Second)
	o := newOrigin(t)
	r := e.start(testPacer(0, 2, nil, 0, nil), worker.Options{})
	a := strings.NewReplacer(".", "_", ":", "_").Replace(o.auth)
	e.publishRaw("mirror.jobs.default."+a, []byte(`{"id":"bad-header-7","url":"`+o.url("/x")+`","headers":{"Cookie":"c"}}`))
	e.publishRaw("mirror.jobs.default."+a, []byte(`{"id":"not valid!","url":"ftp://x"}`))
	r.f.waitFor(t, 2, nil, 30*time.Second)
	ids := map[string]string{}
	for _, d := range e.deadLetters() {
		ids[d.JobID] = d.Reason
	}
	if ids["bad-header-7"] != jobs.ReasonInvalidJob || ids[""] != jobs.ReasonInvalidJob || len(ids) != 2 {
		t.Errorf("dead letters by job id %v, want bad-header-7 and one without an id, both invalid_job", ids)
	}
}

// A job cut as too slow waits at least SlowRetryFactor times as long as it
// held its slot before its next attempt, so that trickles leave most of the
// slot time to healthy origins.
func TestSlowTransferRetryWaitsInProportion(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 30*time.Second)
	const window = 200 * time.Millisecond
	f := fetch.New(&fetch.Options{AllowPrivate: true, MinRate: 1 << 10, MinRateWindow: window})
	r := e.startWith(testPacer(0, 2, nil, 0, nil), worker.Options{
		FailureBudget: 2, BackoffInitial: 10 * time.Millisecond, BackoffMax: time.Minute,
	}, f, e.target)
	base := trickleOrigin(t)
	e.publish(jobs.Job{ID: "slow", URL: base + "/slow", Target: "slow"})
	r.f.waitFor(t, 1, nil, 60*time.Second)
	dls := e.deadLetters()
	if len(dls) != 1 || len(dls[0].Attempts) != 2 {
		t.Fatalf("dead letters %+v, want one with 2 attempts", dls)
	}
	a := dls[0].Attempts
	// Each attempt held its slot for at least one window of reads; the
	// second failed no sooner than the retry delay plus its own window.
	if gap, least := a[1].Time.Sub(a[0].Time), (worker.SlowRetryFactor+1)*window; gap < least {
		t.Errorf("attempts %v apart, want at least %v (retry after %d x the time the first held its slot)", gap, least, worker.SlowRetryFactor)
	}
}
