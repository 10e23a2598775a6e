package main

// Network faults between a pod and NATS (issue 25): three `mirrorworker run`
// processes, each reaching NATS through a fault-injecting TCP proxy of its
// own (faultproxy), one origin with five authorities timed as the origin
// sees them. The faults hit the link of the pod that serves the
// RateLimit authority, right after that authority has told the pod to wait.

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/mirrorworker/mirrorworker/authority"
	"github.com/mirrorworker/mirrorworker/cluster"
	"github.com/mirrorworker/mirrorworker/faultproxy"
	departlog "github.com/mirrorworker/mirrorworker/internal/departures"
	"github.com/mirrorworker/mirrorworker/jobs"
)

// netFaultCase is one run: a fault struck on one pod's link, and when it
// is lifted (0: never, the fault lasts to the end of the run).
type netFaultCase struct {
	name   string
	strike func(*faultproxy.Proxy)
	lasts  time.Duration
	// afterWait: strike the link of the RateLimit authority's pod right
	// after that authority said wait (else the link of the pod serving
	// the 429 authority, the slowest to drain, once a fifth of the jobs
	// are stored).
	afterWait bool
	// keeps: the struck pod keeps its share of the partitions through the
	// fault (its renewals survive it).
	keeps bool
}

// TestProcessClusterNetworkFaults: as the origin times them, every job is
// stored byte-exact and no two requests to an authority come closer than
// the floor, through 200 ms and 2 s of latency on one pod's link (for the
// rest of the run), a cut and a black hole of it (for 2.5 TTLs). Each run
// reports its drain time against the run with no fault. The cut and the
// black hole strike right after the RateLimit authority told its pod to
// wait, and no request may arrive while the origin had said wait: the
// pod's fact is stored once its link returns, within the hold of the pod
// that took the expired lease over (docs/adr/0007, bound 5).
func TestProcessClusterNetworkFaults(t *testing.T) {
	if testing.Short() {
		t.Skip("starts worker processes")
	}
	const ttl = 2 * time.Second
	cases := []netFaultCase{
		{name: "no fault"},
		{name: "latency 200ms", strike: func(p *faultproxy.Proxy) { p.Latency(200*time.Millisecond, 200*time.Millisecond) }, keeps: true},
		{name: "latency 2s", strike: func(p *faultproxy.Proxy) { p.Latency(2*time.Second, 2*time.Second) }},
		{name: "cut", strike: (*faultproxy.Proxy).Cut, lasts: 5 * time.Second, afterWait: true},
		{name: "black hole", strike: (*faultproxy.Proxy).BlackHole, lasts: 5 * time.Second, afterWait: true},
	}
	t.Parallel()
	// The runs are independent (a NATS server, an origin, pods and links
	// of their own) and mostly wait on floors, TTLs and faults: they run at
	// once, and the drain times are compared once all have ended.
	var (
		mu     sync.Mutex
		drains = map[string]time.Duration{}
	)
	t.Run("runs", func(t *testing.T) {
		for _, tc := range cases {
			t.Run(tc.name, func(t *testing.T) {
				t.Parallel()
				d := runNetFault(t, tc, ttl)
				mu.Lock()
				drains[tc.name] = d
				mu.Unlock()
			})
		}
	})
	base, ok := drains["no fault"]
	for _, tc := range cases[1:] {
		if d, done := drains[tc.name]; done && ok {
			t.Logf("%s: drained in %s, %.2f of the no-fault drain (%s) of the same, concurrent, runs", tc.name, d.Round(10*time.Millisecond), d.Seconds()/base.Seconds(), base.Round(10*time.Millisecond))
		}
	}
}

// runNetFault runs one case and returns its drain time (0 if it failed
// before the drain).
func runNetFault(t *testing.T, tc netFaultCase, ttl time.Duration) time.Duration {
	const (
		partitions = jobs.DefaultPartitions
		perAuth    = 12
		floor      = 300 * time.Millisecond
	)
	natsURL := externalNATS(t)
	u, err := url.Parse(natsURL)
	if err != nil {
		t.Fatal(err)
	}
	origin := newClusterOrigin(t, partitions, "plain", "cdn", "429", "503date", "ratelimit")
	rl := origin.named("ratelimit")
	origin.mu.Lock()
	// Every fifth answer an exhausted RateLimit with an 8 s reset: a wait
	// that outlasts a take-over (about a TTL), as in the runs.
	origin.auths[rl].every, origin.auths[rl].wait = 5, 8*time.Second
	origin.mu.Unlock()
	targets, urls := origin.urls(perAuth)
	if !tc.keeps {
		publishURLs(t, natsURL, targets, urls)
	}
	root := t.TempDir()
	var (
		proxies    []*faultproxy.Proxy
		pods       []*workerProcess
		departures []string // each pod records when each of its requests leaves
	)
	t0 := time.Now()
	for i := range 3 {
		px, err := faultproxy.New(u.Host)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { px.Close() })
		proxies = append(proxies, px)
		departures = append(departures, filepath.Join(t.TempDir(), fmt.Sprintf("departures-%d", i)))
		pods = append(pods, startWorkerProcessEnv(t, []string{departlog.Env + "=" + departures[i]}, workerArgs("nats://"+px.Addr(), t.TempDir(),
			"--target", root, "--floor", floor.String(), "--concurrency", "8", "--max-in-flight", "2",
			"--lease-ttl", ttl.String(), "--ack-wait", "10s", "--log-level", "info")...))
	}
	if tc.strike != nil {
		if tc.keeps {
			// What the struck pod keeps is judged against its share: it
			// must hold it before the fault (the pods balance the
			// partitions in their first lease rounds). The jobs come
			// once it does: on a loaded machine the pods start seconds
			// apart, and the first alone once stored every job before
			// the others had their shares.
			share := cluster.Share(partitions, len(pods))
			waitFor(t, 60*time.Second, "every pod holding its share of the partitions", func() bool {
				for _, p := range pods {
					if netFaultHeld(t, natsURL, p) < share {
						return false
					}
				}
				return true
			})
			t0 = time.Now()
			publishURLs(t, natsURL, targets, urls)
		}
		if tc.afterWait {
			// Right after a wait-answer: the pod has just learned the wait,
			// and its fact is on its way to NATS through the faulty link.
			waitFor(t, 60*time.Second, "a wait-answer of the RateLimit authority", func() bool {
				origin.mu.Lock()
				defer origin.mu.Unlock()
				return time.Now().Before(origin.auths[rl].until)
			})
		} else {
			waitFor(t, 60*time.Second, "a fifth of the jobs stored", func() bool {
				return len(mirrorFiles(t, root)) >= len(urls)/5
			})
		}
		auth := origin.named("429")
		if tc.afterWait {
			auth = rl
		}
		// The lease may be between two pods for a moment (given back, not
		// yet taken): strike the one that holds it next.
		owner := netFaultOwner(t, natsURL, auth, partitions, pods)
		victim := -1
		waitFor(t, 30*time.Second, "a pod holding the lease of "+auth, func() bool { victim = owner(); return victim >= 0 })
		struck := time.Now()
		tc.strike(proxies[victim])
		t.Logf("%s on pod %d's link at %.3fs (%.3fs on the origin's clock), %d/%d stored", tc.name, victim, struck.Sub(t0).Seconds(), struck.Sub(origin.start).Seconds(), len(mirrorFiles(t, root)), len(urls))
		if n := len(mirrorFiles(t, root)); n >= len(urls) {
			t.Fatalf("all %d jobs stored before the fault; the test proves nothing", n)
		}
		if tc.lasts > 0 {
			time.AfterFunc(tc.lasts, proxies[victim].Restore)
		}
		if tc.keeps {
			// Three TTLs into the fault the pod still serves its share.
			for time.Since(struck) < 3*ttl {
				time.Sleep(50 * time.Millisecond)
			}
			held := netFaultHeld(t, natsURL, pods[victim])
			t.Logf("pod %d holds %d partitions %s into the fault", victim, held, time.Since(struck).Round(time.Millisecond))
			if share := cluster.Share(partitions, len(pods)); held < share {
				t.Errorf("pod %d holds %d partitions through %s, its share is %d: its renewals did not survive", victim, held, tc.name, share)
			}
		} else {
			// Who serves the struck authority, and since when.
			deadline := time.Now().Add(30 * time.Second)
			o := owner()
			for (o == victim || o < 0) && time.Now().Before(deadline) {
				time.Sleep(20 * time.Millisecond)
				o = owner()
			}
			if o == victim || o < 0 {
				t.Errorf("%s's partition not served by another pod 30 s into the fault (owner %d)", origin.auths[auth].behave, o)
			} else {
				t.Logf("%s's partition served by pod %d %s after the fault struck (lease TTL %s)", origin.auths[auth].behave, o, time.Since(struck).Round(10*time.Millisecond), ttl)
			}
		}
	}
	waitQueueEmpty(t, natsURL, root, len(urls), 120*time.Second, multiLog(pods))
	drain := time.Since(t0)
	for _, px := range proxies {
		px.Restore() // the pods give their leases up through a working link
	}
	for i, p := range pods {
		if _, err := p.signalAndWait(t, syscall.SIGTERM, 30*time.Second); err != nil {
			t.Errorf("pod %d exit after SIGTERM: %v", i, err)
		}
	}
	checkClusterMirror(t, root, targets)
	early := netFaultCheck(t, origin, floor, readDepartures(t, departures))
	if tc.afterWait && early > 0 {
		t.Errorf("%s: %d requests while the origin had said wait", tc.name, early)
	}
	failed := 0
	for _, p := range pods {
		failed += strings.Count(p.log.String(), "lease round failed")
	}
	t.Logf("%s: drained %d jobs in %s; %d requests while told to wait; %d failed lease rounds logged", tc.name, len(urls), drain.Round(10*time.Millisecond), early, failed)
	return drain
}

// netFaultOwner returns a func that reports which pod holds the lease of
// auth's partition now (-1: none).
func netFaultOwner(t *testing.T, natsURL, auth string, partitions int, pods []*workerProcess) func() int {
	js, closeConn := connectJS(t, natsURL)
	t.Cleanup(closeConn)
	p := jobs.Partition(authority.KeyOf(auth), partitions)
	return func() int {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		leases, _, err := readLeases(ctx, js)
		if err != nil {
			return -1
		}
		for i, w := range pods {
			if strings.HasSuffix(leases[p], fmt.Sprintf("-%d", w.cmd.Process.Pid)) {
				return i
			}
		}
		return -1
	}
}

// netFaultHeld is how many partition leases pod p holds now.
func netFaultHeld(t *testing.T, natsURL string, p *workerProcess) int {
	t.Helper()
	js, closeConn := connectJS(t, natsURL)
	defer closeConn()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	leases, _, err := readLeases(ctx, js)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, owner := range leases {
		if strings.HasSuffix(owner, fmt.Sprintf("-%d", p.cmd.Process.Pid)) {
			n++
		}
	}
	return n
}

// departure is one request as the pod that sent it recorded it.
type departure struct {
	at  time.Time
	pod int
}

// readDepartures reads each pod's departure log (departlog.Log:
// "<unix ns> <authority>" per request), by authority, sorted.
func readDepartures(t *testing.T, files []string) map[string][]departure {
	t.Helper()
	out := map[string][]departure{}
	for pod, f := range files {
		b, err := os.ReadFile(f)
		if err != nil && !os.IsNotExist(err) {
			t.Fatal(err)
		}
		for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
			// "<unix ns> <authority>", and the instant the pod's Confirm
			// returned after it where logged (departlog.Log.RecordStart).
			f := strings.Fields(line)
			if len(f) < 2 {
				continue
			}
			auth := f[1]
			n, err := strconv.ParseInt(f[0], 10, 64)
			if err != nil {
				t.Fatalf("departure log %s: %q", f, line)
			}
			out[auth] = append(out[auth], departure{at: time.Unix(0, n), pod: pod})
		}
	}
	for _, d := range out {
		sort.Slice(d, func(i, j int) bool { return d[i].at.Before(d[j].at) })
	}
	return out
}

// netFaultCheck asserts the floor at every authority, on the instants the
// pods sent their requests (exact, from the pods' departure logs, all on
// this machine's clock) and on those the origin timed, with the slack check
// explains: a gap short at the origin whose requests left the pods at
// least the floor apart is the origin's handler running late on a loaded
// machine, and is logged, not failed. It returns the number of requests
// that arrived while the origin had said wait, logging them, the requests
// that overlapped a probe and the peak in flight.
func netFaultCheck(t *testing.T, o *clusterOrigin, floor time.Duration, deps map[string][]departure) (early int) {
	t.Helper()
	o.mu.Lock()
	defer o.mu.Unlock()
	names := make([]string, 0, len(o.auths))
	for n := range o.auths {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		a := o.auths[n]
		d := deps[n]
		minDep, crossPods := time.Duration(1<<62), 0
		for i := 1; i < len(d); i++ {
			g := d[i].at.Sub(d[i-1].at)
			minDep = min(minDep, g)
			if d[i].pod != d[i-1].pod {
				crossPods++
			}
			if g < floor {
				t.Errorf("%s: pod %d sent a request at %.3fs, %s after pod %d's (floor %s)", n, d[i].pod, d[i].at.Sub(o.start).Seconds(), g, d[i-1].pod, floor)
			}
		}
		if minDep < floor {
			var b strings.Builder
			for _, x := range d {
				fmt.Fprintf(&b, " %.3fs/pod%d", x.at.Sub(o.start).Seconds(), x.pod)
			}
			t.Logf("%s: every request as sent:%s", n, b.String())
		}
		if len(d) != len(a.arrivals) {
			t.Logf("%s: the pods recorded %d requests, the origin %d", n, len(d), len(a.arrivals))
		}
		arr := append([]time.Time(nil), a.arrivals...)
		sort.Slice(arr, func(i, j int) bool { return arr[i].Before(arr[j]) })
		minGap, below := time.Duration(1<<62), 0
		for i := 1; i < len(arr); i++ {
			g := arr[i].Sub(arr[i-1])
			minGap = min(minGap, g)
			if g < floor-floor/10 {
				below++
			}
		}
		t.Logf("%s (%s): %d requests (%d hand-overs between pods), closest gap %s as sent, %s as arrived; %d cooldowns probed, %d while told to wait %v, %d during a probe, max in flight %d",
			n, a.behave, len(arr), crossPods, minDep.Round(100*time.Microsecond), minGap.Round(100*time.Microsecond), a.probes, len(a.early), a.early, len(a.overlap), a.maxIn)
		if below > 0 && minDep >= floor {
			t.Logf("%s: %d gaps below the floor as the origin timed them (closest %s), none as the pods sent them: the origin's handler ran late", n, below, minGap)
		}
		if throttles(a.behave) && a.probes == 0 {
			t.Errorf("%s: no cooldown was ever probed; the test proves nothing", n)
		}
		early += len(a.early)
	}
	return early
}

// TestProcessReadinessMeansServing: /readyz of a pod that joins a running
// pod answers 200 only once it holds its share of the partitions, so a
// rolling restart that waits for readiness hands the partitions over one
// pod at a time; while it is not ready it says why.
func TestProcessReadinessMeansServing(t *testing.T) {
	if testing.Short() {
		t.Skip("starts worker processes")
	}
	t.Parallel()
	const partitions = jobs.DefaultPartitions
	natsURL := externalNATS(t)
	args := func() []string {
		return workerArgs(natsURL, t.TempDir(), "--lease-ttl", "2s", "--log-level", "info")
	}
	readyz := func(p *workerProcess) (int, string) {
		resp, err := (&http.Client{Timeout: 5 * time.Second}).Get(p.start.AdminURL + "/readyz")
		if err != nil {
			return 0, err.Error()
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, strings.TrimSpace(string(b))
	}
	held := func(p *workerProcess) int { return netFaultHeld(t, natsURL, p) }
	a := startWorkerProcess(t, args()...)
	waitFor(t, 30*time.Second, "the first pod ready", func() bool { code, _ := readyz(a); return code == 200 })
	if n := held(a); n != partitions {
		t.Errorf("the only pod is ready holding %d of %d partitions", n, partitions)
	}
	b := startWorkerProcess(t, args()...)
	var notReady []string
	waitFor(t, 30*time.Second, "the second pod ready", func() bool {
		code, body := readyz(b)
		if code != 200 {
			if len(notReady) == 0 || notReady[len(notReady)-1] != body {
				notReady = append(notReady, body)
			}
			return false
		}
		return true
	})
	share := cluster.Share(partitions, 2)
	if n := held(b); n < share {
		t.Errorf("the joining pod answered 200 holding %d partitions, its share is %d", n, share)
	}
	t.Logf("the joining pod said, until it was ready: %q", notReady)
	waitFor(t, 30*time.Second, "the first pod ready again with its share", func() bool { code, _ := readyz(a); return code == 200 })
	if n := held(a); n < share {
		t.Errorf("the first pod answers 200 holding %d partitions, its share is %d", n, share)
	}
	for _, p := range []*workerProcess{a, b} {
		if _, err := p.signalAndWait(t, syscall.SIGTERM, 30*time.Second); err != nil {
			t.Errorf("exit after SIGTERM: %v", err)
		}
	}
}
