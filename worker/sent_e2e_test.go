//go:build e2e

package worker_test

import (
	"crypto/tls"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mirrorworker/mirrorworker/fetch"
	"github.com/mirrorworker/mirrorworker/fetch/fetchtest"
	"github.com/mirrorworker/mirrorworker/internal/rxstamp"
	"github.com/mirrorworker/mirrorworker/jobs"
	"github.com/mirrorworker/mirrorworker/pacer"
	"github.com/mirrorworker/mirrorworker/worker"
)

// TestFloorHoldsAtTheOriginBehindASlowConnect: an HTTPS origin behind an
// egress proxy whose first CONNECT takes 300 ms (a loaded proxy, a slow
// TLS path); floor 150 ms, in-flight cap 2. The first request starts,
// then waits on its tunnel; spaced from that start alone, the second
// would leave one spacing later on a tunnel of its own, reach the origin
// first, and the third, on the second's pooled connection, would follow
// the first within tens of milliseconds. Spaced from each request's write
// (pacer.Options.AwaitSends, the worker's Sent from the fetch's trace), no
// two requests reach the origin closer than the floor, as its kernel
// timed their arrival (rxstamp), short of it by at most the proxy's own
// relay jitter (relaySlack).
//
// It asserts gaps as the origin timed them, so it stays serial (ADR 0024).
func TestFloorHoldsAtTheOriginBehindASlowConnect(t *testing.T) {
	const (
		floor = 150 * time.Millisecond
		hold  = 300 * time.Millisecond
		n     = 8
		// relaySlack is the proxy's hop, which no client controls: the
		// worker spaces its writes into the tunnel, and the proxy's copy
		// loop (a goroutine of this test process) forwards each after a
		// delay of its own. Under the race detector that delay varied by
		// up to 0.06 ms between two requests (149.94 ms at the origin, 3
		// runs in 24); the bug this test is for costs tens of milliseconds.
		relaySlack = time.Millisecond
	)
	e := newEnv(t, 30*time.Second)
	ca, err := fetchtest.NewCA()
	if err != nil {
		t.Fatal(err)
	}
	stc, err := ca.ServerTLS(false, "slow.test")
	if err != nil {
		t.Fatal(err)
	}
	o := &origin{perPath: map[string]int{}}
	o.srv = httptest.NewUnstartedServer(http.HandlerFunc(o.serve))
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	o.srv.Listener = rxstamp.Serve(o.srv.Config, ln)
	o.srv.TLS = stc
	o.srv.StartTLS()
	t.Cleanup(o.srv.Close)
	o.auth = ln.Addr().String()

	px := fetchtest.NewProxy(map[string]string{"slow.test:443": o.auth}, "")
	t.Cleanup(px.Close)
	var connects atomic.Int32
	px.SetHold(func(q fetchtest.ProxyRequest) time.Duration {
		if q.Method == http.MethodConnect && connects.Add(1) == 1 {
			return hold
		}
		return 0
	})
	fc := fetch.New(&fetch.Options{
		Proxy:     fetch.Proxy{HTTPSProxy: px.URL},
		Resolver:  nameResolver{},
		TLSConfig: &tls.Config{RootCAs: ca.Pool},
	})
	t.Cleanup(fc.CloseIdleConnections)

	var js []jobs.Job
	for i := range n {
		js = append(js, jobs.Job{ID: fmt.Sprint("s-", i), URL: fmt.Sprintf("https://slow.test/o/%d", i), Target: fmt.Sprint("s/", i)})
	}
	e.publish(js...)
	r := e.startWith(testPacer(floor, 2, nil, 0, nil), worker.Options{Concurrency: 8}, fc, e.target)
	e.waitReady(r.w)
	r.f.waitFor(t, n, isOutcome(worker.OutcomeStored), 60*time.Second)

	log := o.log()
	if len(log) != n {
		t.Fatalf("the origin saw %d requests, want %d", len(log), n)
	}
	minGap := checkGaps(t, "arrivals", log, floor, relaySlack)
	t.Logf("%d CONNECTs (the first held %v); smallest gap between arrivals %v, floor %v", connects.Load(), hold, minGap, floor)
	if connects.Load() < 1 {
		t.Error("no CONNECT: the requests did not go through the proxy")
	}
	for i := range n {
		e.checkStored(fmt.Sprint("s/", i), body(fmt.Sprint("/o/", i)))
	}
}

// lateFlushPacer reports the first write to its pacer and then returns
// late, as a writing goroutine descheduled on a loaded machine does:
// net/http calls the trace's WroteRequest (and so Pacer.Sent) before it
// flushes a GET to the socket, so the flush waits for Sent to return. Only
// the first: a delay on every write would delay every arrival alike.
type lateFlushPacer struct {
	*pacer.Pacer
	late  time.Duration
	calls *atomic.Int32
}

func (p lateFlushPacer) Sent(now time.Time, pm pacer.Permit) {
	p.Pacer.Sent(now, pm)
	if p.calls.Add(1) == 1 {
		time.Sleep(p.late) // the fault itself, not a wait for something to happen
	}
}

// TestFloorHoldsWhenTheFlushIsLate: the write the worker reports when
// net/http says a request is written precedes the flush that sends it; the
// first request's flush 40 ms late (the writing goroutine descheduled) at a
// 100 ms floor and an in-flight cap of 2 let the origin's kernel receive
// the second about 62 ms after it, the pacer having spaced the next start
// from the report. Reported again once the flush has returned
// (fetch.AfterNextWrite), the write is spaced from when the bytes left:
// no two arrivals closer than the floor.
//
// It asserts gaps as the origin timed them, so it stays serial (ADR 0024).
func TestFloorHoldsWhenTheFlushIsLate(t *testing.T) {
	const (
		floor = 100 * time.Millisecond
		late  = 40 * time.Millisecond
		n     = 6
	)
	e := newEnv(t, 30*time.Second)
	o := newOrigin(t)
	var js []jobs.Job
	for i := range n {
		js = append(js, jobs.Job{ID: fmt.Sprint("l-", i), URL: fmt.Sprintf("http://%s/o/%d", o.auth, i), Target: fmt.Sprint("l/", i)})
	}
	e.publish(js...)
	r := e.start(lateFlushPacer{Pacer: testPacer(floor, 2, nil, 0, nil), late: late, calls: new(atomic.Int32)}, worker.Options{Concurrency: 8})
	r.f.waitFor(t, n, isOutcome(worker.OutcomeStored), 60*time.Second)

	log := o.log()
	if len(log) != n {
		t.Fatalf("the origin saw %d requests, want %d", len(log), n)
	}
	minGap := checkGaps(t, "arrivals", log, floor, 0)
	t.Logf("the first flush %v late; smallest gap between arrivals %v, floor %v", late, minGap, floor)
}
