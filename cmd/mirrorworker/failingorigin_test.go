package main

import (
	"fmt"
	"net"
	"net/http"
	"sort"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/mirrorworker/mirrorworker/internal/rxstamp"
)

// failingOrigin is one authority on loopback that resets every connection
// (phase refuse), then answers 500 (phase fail), then serves (phase ok),
// timing every arrival with the phase it met. The origin moves from phase
// to phase at arrivals (phaseOf), not at instants the test picks: however
// late a loaded machine runs the pod, its requests meet the same outage.
type failingOrigin struct {
	refuse, failing time.Duration // see refusing and answer
	mu              sync.Mutex
	t0              time.Time // the first arrival
	over            bool      // the outage has ended
	arr             []arrival
	addr            string
}

const (
	phaseRefuse = iota
	phaseFail
	phaseOK
)

type arrival struct {
	at    time.Time
	phase int32
}

// refusing reports whether a connection accepted at is reset: within
// refuse of the first arrival. It records the arrival when it is.
func (o *failingOrigin) refusing(at time.Time) bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.t0.IsZero() {
		o.t0 = at
	}
	if o.over || !at.Before(o.t0.Add(o.refuse)) {
		return false
	}
	o.arr = append(o.arr, arrival{at, phaseRefuse})
	return true
}

// answer is the phase of a request that got past the listener, recorded:
// 500 up to and including the first request at least failing after the
// first arrival, then served. Ending the outage on a failed request, not
// at an instant, keeps the number of backoff steps in it the same on a
// loaded machine (a late step still fails), and the wait for the recovery
// one step after it.
func (o *failingOrigin) answer(at time.Time) int32 {
	o.mu.Lock()
	defer o.mu.Unlock()
	p := int32(phaseFail)
	switch {
	case o.over:
		p = phaseOK
	case !at.Before(o.t0.Add(o.failing)):
		o.over = true
	}
	o.arr = append(o.arr, arrival{at, p})
	return p
}

func (o *failingOrigin) arrivals() []arrival {
	o.mu.Lock()
	defer o.mu.Unlock()
	a := append([]arrival(nil), o.arr...)
	sort.Slice(a, func(i, j int) bool { return a[i].at.Before(a[j].at) })
	return a
}

// resetListener resets (RST) every connection while the origin refuses.
type resetListener struct {
	net.Listener
	o *failingOrigin
}

func (l resetListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil || !l.o.refusing(time.Now()) {
			return c, err
		}
		if tc, ok := c.(*net.TCPConn); ok {
			tc.SetLinger(0)
		}
		c.Close()
	}
}

// SyscallConn lets rxstamp set its option on the listening socket.
func (l resetListener) SyscallConn() (syscall.RawConn, error) {
	return l.Listener.(syscall.Conn).SyscallConn()
}

func newFailingOrigin(t *testing.T, refuse, failing time.Duration) *failingOrigin {
	o := &failingOrigin{refuse: refuse, failing: failing}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	o.addr = ln.Addr().String()
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if o.answer(rxstamp.Arrival(r)) == phaseFail { // as this host received it
			http.Error(w, "down for maintenance", http.StatusInternalServerError)
			return
		}
		w.Write(clusterBody(r.URL.Path))
	})}
	go srv.Serve(rxstamp.Serve(srv, resetListener{ln, o}))
	t.Cleanup(func() { srv.Close() })
	return o
}

// TestProcessFailingOriginIsBackedOff is issue 28's failing-origin test: a
// `mirrorworker run` pod with 12 jobs for one origin at floor 200 ms; the
// origin resets every connection for 1 s, answers 500 up to the first
// request 4 s or more after the first, then serves. As the origin times
// them: during the outage the requests are spaced by the backoff (x2 from
// 1 s, jittered by at most a fifth), not by the number of jobs; once it
// answers, the backoff is over and the jobs go at the floor; every job is
// stored, none dead-lettered.
func TestProcessFailingOriginIsBackedOff(t *testing.T) {
	if testing.Short() {
		t.Skip("starts worker processes")
	}
	const (
		jobsN   = 12
		floor   = 200 * time.Millisecond
		refuse  = time.Second     // connections reset
		failing = 4 * time.Second // then 500s, up to the first request this long after the first
	)
	natsURL := externalNATS(t)
	origin := newFailingOrigin(t, refuse, failing)
	targets := map[string]string{}
	var urls []string
	for i := range jobsN {
		u := fmt.Sprintf("http://%s/obj/%03d", origin.addr, i)
		targets[u] = fmt.Sprintf("obj/%03d", i)
		urls = append(urls, u)
	}
	publishURLs(t, natsURL, targets, urls)
	root := t.TempDir()
	pod := startWorkerProcess(t, workerArgs(natsURL, t.TempDir(), "--target", root, "--floor", floor.String(),
		"--max-in-flight", "2", "--ack-wait", "5s", "--log-level", "info")...)
	waitQueueEmpty(t, natsURL, root, jobsN, 120*time.Second, pod.log)
	if _, err := pod.signalAndWait(t, syscall.SIGTERM, 30*time.Second); err != nil {
		t.Errorf("pod exit after SIGTERM: %v", err)
	}
	checkClusterMirror(t, root, targets)

	arr := origin.arrivals()
	var failed, served []time.Time
	perPhase := map[int32]int{}
	for _, a := range arr {
		perPhase[a.phase]++
		if a.phase == phaseOK {
			served = append(served, a.at)
		} else {
			failed = append(failed, a.at)
		}
	}
	var gaps []string
	for i := 1; i < len(failed); i++ {
		gaps = append(gaps, failed[i].Sub(failed[i-1]).Round(10*time.Millisecond).String())
	}
	var okGaps []time.Duration
	for i := 1; i < len(served); i++ {
		okGaps = append(okGaps, served[i].Sub(served[i-1]))
	}
	sort.Slice(okGaps, func(i, j int) bool { return okGaps[i] < okGaps[j] })
	var median time.Duration
	if len(okGaps) > 0 {
		median = okGaps[len(okGaps)/2]
	}
	t.Logf("%d jobs; %d requests during the outage (%d reset, %d answered 500), gaps %v; %d requests after it, median gap %s",
		jobsN, len(failed), perPhase[phaseRefuse], perPhase[phaseFail], gaps, len(served), median.Round(time.Millisecond))
	if len(served) > 0 && len(failed) > 0 {
		// The recovery is seen at the first request after the backoff in
		// force when the origin came back: one step after the last failure.
		last := failed[len(failed)-1]
		t.Logf("outage %s; first request after it %s after its last failure; all %d served within %s of that",
			last.Sub(failed[0]).Round(time.Millisecond), served[0].Sub(last).Round(time.Millisecond), len(served), served[len(served)-1].Sub(last).Round(time.Millisecond))
	}
	// The backoff after k failures is 2^k s times [0.8, 1]: 1.6 s at least.
	// The outage ends at the first request 4 s or more after the first, and
	// the backoffs put the second request at 1.6 to 2 s and the third at 4.8
	// to 6 s: 3 requests; 2 more for requests already in flight (the cap)
	// when a failure came back. The jobs' own pace, at the floor, would put
	// 20 in those 4 s.
	if len(failed) > 5 {
		t.Errorf("%d requests during the outage, want at most 5 (the backoff's, not the %d jobs')", len(failed), jobsN)
	}
	if perPhase[phaseRefuse] == 0 || perPhase[phaseFail] == 0 {
		t.Errorf("requests per phase %v: the test wants both reset connections and 500s", perPhase)
	}
	// Two requests in flight at once may fail together (the cap is 2), so
	// one short gap is excused; every other is a backoff step.
	short := 0
	for i := 1; i < len(failed); i++ {
		if failed[i].Sub(failed[i-1]) < 1500*time.Millisecond {
			short++
		}
	}
	if short > 1 {
		t.Errorf("%d gaps under 1.5 s during the outage (%v), want at most 1", short, gaps)
	}
	// Recovered: the jobs go at the floor, not at a backoff step.
	if len(served) < jobsN || median > time.Second {
		t.Errorf("after recovery: %d requests, median gap %s; want %d at about the floor %s", len(served), median, jobsN, floor)
	}
	// Every gap after recovery respects the floor (okGaps is sorted).
	if len(okGaps) > 0 && okGaps[0] < floor-floor/10 {
		t.Errorf("after recovery: a gap of %s below the floor %s", okGaps[0], floor)
	}
}
