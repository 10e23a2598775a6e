package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/mirrorworker/mirrorworker/internal/rxstamp"
	"github.com/mirrorworker/mirrorworker/jobs"
	"github.com/mirrorworker/mirrorworker/stuborigin/limitreq"
)

// judgedOrigin is one authority on loopback whose answer to each request
// the test decides (answer), timing every arrival as this host received it.
type judgedOrigin struct {
	addr   string
	answer func(path string, at time.Time) int // the status; 200 serves body(path)
	body   func(path string) []byte

	mu  sync.Mutex
	arr []judgedArrival
}

type judgedArrival struct {
	at     time.Time
	path   string
	status int
}

func newJudgedOrigin(t *testing.T, answer func(string, time.Time) int, body func(string) []byte) *judgedOrigin {
	o := &judgedOrigin{answer: answer, body: body}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	o.addr = ln.Addr().String()
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		at := rxstamp.Arrival(r)
		o.mu.Lock()
		st := o.answer(r.URL.Path, at)
		o.arr = append(o.arr, judgedArrival{at, r.URL.Path, st})
		o.mu.Unlock()
		if st != http.StatusOK {
			http.Error(w, http.StatusText(st), st)
			return
		}
		w.Write(o.body(r.URL.Path))
	})}
	go srv.Serve(rxstamp.Serve(srv, ln))
	t.Cleanup(func() { srv.Close() })
	return o
}

func (o *judgedOrigin) arrivals() []judgedArrival {
	o.mu.Lock()
	defer o.mu.Unlock()
	a := append([]judgedArrival(nil), o.arr...)
	sort.Slice(a, func(i, j int) bool { return a[i].at.Before(a[j].at) })
	return a
}

// watchBackoff polls the pod's /debug/pacer until ctx ends and reports
// whether it ever showed an authority in backoff.
func watchBackoff(ctx context.Context, adminURL string) func() []string {
	var mu sync.Mutex
	var seen []string
	done := make(chan struct{})
	go func() {
		defer close(done)
		c := &http.Client{Timeout: 2 * time.Second}
		for ctx.Err() == nil {
			if resp, err := c.Get(adminURL + "/debug/pacer"); err == nil {
				var states []struct {
					Authority    string `json:"authority"`
					State        string `json:"state"`
					BackoffUntil string `json:"backoff_until"`
				}
				if json.NewDecoder(resp.Body).Decode(&states) == nil {
					for _, s := range states {
						if s.State == "backoff" || s.BackoffUntil != "" {
							mu.Lock()
							seen = append(seen, fmt.Sprintf("%s %s until %s", s.Authority, s.State, s.BackoffUntil))
							mu.Unlock()
						}
					}
				}
				resp.Body.Close()
			}
			select {
			case <-ctx.Done():
			case <-time.After(50 * time.Millisecond):
			}
		}
	}()
	return func() []string {
		<-done
		mu.Lock()
		defer mu.Unlock()
		return seen
	}
}

// backoffFacts are the backoff facts on MIRROR_EVENTS.
func backoffFacts(t *testing.T, natsURL string) []string {
	js, closeConn := connectJS(t, natsURL)
	defer closeConn()
	var out []string
	for _, l := range strings.Split(streamBytes(t, js, jobs.EventsStream), "\n") {
		if strings.Contains(l, `"type":"backoff"`) {
			out = append(out, l)
		}
	}
	return out
}

// waitStoredAndDead waits until n files are in the mirror, dead jobs are
// dead-lettered and nothing is left in the queue.
func waitStoredAndDead(t *testing.T, natsURL, root string, n, dead int, deadline time.Duration, logs fmt.Stringer) {
	t.Helper()
	js, closeConn := connectJS(t, natsURL)
	defer closeConn()
	ctx, cancel := context.WithTimeout(context.Background(), deadline)
	defer cancel()
	for {
		stored := len(mirrorFiles(t, root))
		rctx, rcancel := context.WithTimeout(ctx, 5*time.Second)
		q, qerr := readQueue(rctx, js)
		rcancel()
		if qerr == nil && stored == n && q.pending == 0 && q.ackPending == 0 && q.dlq == uint64(dead) {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("not drained after %s: %d/%d stored, queue %+v (err %v); logs:\n%s", deadline, stored, n, q, qerr, logs)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// TestProcessOneBrokenURLDoesNotBackOffItsOrigin is issue 36 item 2's
// test: one origin where /broken answers 500 to every request while 10
// small files and an 8 MiB one are fine, floor 200 ms, failure budget 4.
// The healthy jobs are stored at the origin's pace, each asked once; the
// broken job is dead-lettered budget_exhausted after its own 4 attempts,
// retried with its own backoff; and the origin is never backed off (no
// backoff fact on MIRROR_EVENTS, never "backoff" in /debug/pacer).
func TestProcessOneBrokenURLDoesNotBackOffItsOrigin(t *testing.T) {
	if testing.Short() {
		t.Skip("starts worker processes")
	}
	t.Parallel()
	const (
		small  = 10
		floor  = 200 * time.Millisecond
		budget = 4
	)
	large := bytes.Repeat([]byte("0123456789abcdef"), 512<<10) // 8 MiB
	origin := newJudgedOrigin(t, func(path string, _ time.Time) int {
		if path == "/broken" {
			return http.StatusInternalServerError
		}
		return http.StatusOK
	}, func(path string) []byte {
		if path == "/large" {
			return large
		}
		return clusterBody(path)
	})
	natsURL := externalNATS(t)
	base := "http://" + origin.addr
	// The broken job first, so that it meets the origin before the others.
	urls := []string{base + "/broken", base + "/large"}
	targets := map[string]string{base + "/broken": "broken", base + "/large": "large"}
	for i := range small {
		u := fmt.Sprintf("%s/obj/%03d", base, i)
		urls = append(urls, u)
		targets[u] = fmt.Sprintf("obj/%03d", i)
	}
	publishURLs(t, natsURL, targets, urls)
	root := t.TempDir()
	pod := startWorkerProcess(t, workerArgs(natsURL, t.TempDir(), "--target", root, "--floor", floor.String(),
		"--max-in-flight", "2", "--failure-budget", fmt.Sprint(budget), "--log-level", "info")...)
	ctx, stop := context.WithCancel(context.Background())
	backoffSeen := watchBackoff(ctx, pod.start.AdminURL)
	waitStoredAndDead(t, natsURL, root, small+1, 1, 90*time.Second, pod.log)
	stop()
	seen := backoffSeen()
	if _, err := pod.signalAndWait(t, syscall.SIGTERM, 30*time.Second); err != nil {
		t.Errorf("pod exit after SIGTERM: %v", err)
	}

	files := mirrorFiles(t, root)
	if !bytes.Equal(files["large"], large) {
		t.Errorf("large: stored %d bytes, want %d", len(files["large"]), len(large))
	}
	for i := range small {
		if k := fmt.Sprintf("obj/%03d", i); !bytes.Equal(files[k], clusterBody("/"+k)) {
			t.Errorf("%s: stored %q", k, files[k])
		}
	}
	dls := deadLetters(t, natsURL)
	if len(dls) != 1 || dls[0].Reason != jobs.ReasonBudgetExhausted || dls[0].LastStatus != 500 || len(dls[0].Attempts) != budget {
		t.Errorf("dead letters %+v, want the broken job's alone, budget_exhausted after %d attempts at 500", dls, budget)
	}
	arr := origin.arrivals()
	var broken, healthy []time.Time
	for _, a := range arr {
		if a.path == "/broken" {
			broken = append(broken, a.at)
		} else {
			healthy = append(healthy, a.at)
		}
	}
	var brokenGaps, healthyGaps []string
	for i := 1; i < len(broken); i++ {
		brokenGaps = append(brokenGaps, broken[i].Sub(broken[i-1]).Round(10*time.Millisecond).String())
	}
	for i := 1; i < len(healthy); i++ {
		healthyGaps = append(healthyGaps, healthy[i].Sub(healthy[i-1]).Round(10*time.Millisecond).String())
	}
	t.Logf("broken: %d requests, gaps %v; healthy: %d requests in %s, gaps %v",
		len(broken), brokenGaps, len(healthy), healthy[len(healthy)-1].Sub(healthy[0]).Round(time.Millisecond), healthyGaps)
	if len(broken) != budget {
		t.Errorf("the broken URL was asked %d times, want its %d attempts", len(broken), budget)
	}
	if len(healthy) != small+1 {
		t.Errorf("%d requests for the %d healthy files, want one each", len(healthy), small+1)
	}
	if facts := backoffFacts(t, natsURL); len(facts) > 0 || len(seen) > 0 {
		t.Errorf("the origin was backed off for one broken URL: facts %v, /debug/pacer %v", facts, seen)
	}
	// At the origin's pace: every healthy request at least a floor after
	// the one before (no job of the broken URL's keeps them waiting: that
	// is what the backoff facts above say).
	for i := 1; i < len(healthy); i++ {
		if d := healthy[i].Sub(healthy[i-1]); d < floor-floor/10 {
			t.Errorf("healthy requests %d and %d %s apart, below the floor %s", i-1, i, d, floor)
		}
	}
}

// nginxLimiter is nginx's limit_req with nodelay (limitreq's model, the
// stub's): a refused request is answered at once with 503 and no
// Retry-After (limit_req_status's default), and changes nothing. The judged
// origin calls admit one request at a time.
type nginxLimiter struct {
	lim limitreq.Limiter
	nos atomic.Int32
}

func (l *nginxLimiter) admit(at time.Time) bool {
	if !l.lim.Admit(at) {
		l.nos.Add(1)
		return false
	}
	return true
}

// TestProcessLimiter503IsThrottling is issue 35's "a limiter's 503": 40
// jobs at floor 0 against an origin behind nginx's default limit_req
// answer (10 r/s, burst 5, nodelay, 503 without Retry-After). The 503s come
// back at once while other requests succeed: they are read as throttling
// (the interval escalates, no cooldown), so no job spends its failure
// budget (of 1: one failed attempt would dead-letter it) and every one is
// stored, and the origin is never backed off. --time-scale
// 0.1 makes the first escalation step 200 ms, above the limiter's 100 ms,
// as the real 2 s step is above any limiter that admits more than 0.5 r/s.
func TestProcessLimiter503IsThrottling(t *testing.T) {
	if testing.Short() {
		t.Skip("starts worker processes")
	}
	t.Parallel()
	const n = 40
	lim := &nginxLimiter{lim: limitreq.Limiter{Limit: limitreq.Limit{Rate: 10, Burst: 5}}}
	origin := newJudgedOrigin(t, func(_ string, at time.Time) int {
		if !lim.admit(at) {
			return http.StatusServiceUnavailable
		}
		return http.StatusOK
	}, clusterBody)
	natsURL := externalNATS(t)
	targets := map[string]string{}
	var urls []string
	for i := range n {
		u := fmt.Sprintf("http://%s/obj/%03d", origin.addr, i)
		urls = append(urls, u)
		targets[u] = fmt.Sprintf("obj/%03d", i)
	}
	publishURLs(t, natsURL, targets, urls)
	root := t.TempDir()
	pod := startWorkerProcess(t, workerArgs(natsURL, t.TempDir(), "--target", root, "--floor", "0",
		"--max-in-flight", "2", "--failure-budget", "1", "--time-scale", "0.1", "--log-level", "info")...)
	ctx, stop := context.WithCancel(context.Background())
	backoffSeen := watchBackoff(ctx, pod.start.AdminURL)
	waitQueueEmpty(t, natsURL, root, n, 90*time.Second, pod.log)
	stop()
	seen := backoffSeen()
	if _, err := pod.signalAndWait(t, syscall.SIGTERM, 30*time.Second); err != nil {
		t.Errorf("pod exit after SIGTERM: %v", err)
	}
	checkClusterMirror(t, root, targets)

	arr := origin.arrivals()
	var throttleFacts int
	js, closeConn := connectJS(t, natsURL)
	for _, l := range strings.Split(streamBytes(t, js, jobs.EventsStream), "\n") {
		if strings.Contains(l, `"type":"throttle"`) && strings.Contains(l, `"status":503`) {
			throttleFacts++
		}
	}
	closeConn()
	t.Logf("%d requests for %d jobs in %s, %d refused 503 by the limiter, %d throttle facts",
		len(arr), n, arr[len(arr)-1].at.Sub(arr[0].at).Round(time.Millisecond), lim.nos.Load(), throttleFacts)
	if lim.nos.Load() == 0 {
		t.Fatalf("the limiter refused nothing: the test did not meet it")
	}
	if throttleFacts == 0 {
		t.Errorf("no throttle fact for the limiter's 503s")
	}
	if facts := backoffFacts(t, natsURL); len(facts) > 0 || len(seen) > 0 {
		t.Errorf("the origin was backed off for its limiter's 503s: facts %v, /debug/pacer %v", facts, seen)
	}
	if dls := deadLetters(t, natsURL); len(dls) != 0 {
		t.Errorf("%d dead letters, want 0: %+v", len(dls), dls)
	}
}
