package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
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
	departlog "github.com/mirrorworker/mirrorworker/internal/departures"
	"github.com/mirrorworker/mirrorworker/internal/rxstamp"
	"github.com/mirrorworker/mirrorworker/jobs"
)

// clusterOrigin is one origin with several authorities (loopback ports),
// each with its own throttling behaviour. It times every request as the
// origin sees it: gaps between arrivals, requests that arrive while the
// origin has said wait, and requests that arrive while a cooldown's probe
// is still running.
type clusterOrigin struct {
	mu    sync.Mutex
	auths map[string]*originAuth // by "127.0.0.1:port"
	start time.Time
}

type originAuth struct {
	name     string
	behave   string // plain, 429, 503date, ratelimit; cdn (plain), redirect<n> (a 302 to the cdn)
	every    int    // the n-th requests (n % every == every-1) are throttled
	wait     time.Duration
	n        int
	arrivals []time.Time
	paths    []string  // each arrival's path, same index
	until    time.Time // told to wait until
	probing  bool      // the first request after until is running
	cooled   bool      // a cooldown was told and its probe has not come yet
	early    []string  // requests that arrived while told to wait
	overlap  []string  // requests that arrived while the probe ran
	probes   int
	inflight int
	maxIn    int
	// hold, if set, keeps every request unanswered until it is closed (or
	// the client goes).
	hold <-chan struct{}
	srv  *httptest.Server
}

func clusterBody(path string) []byte {
	return []byte("object " + path + "\n" + strings.Repeat(path, 1+len(path)%7))
}

func newClusterOrigin(t *testing.T, partitions int, behaves ...string) *clusterOrigin {
	o := &clusterOrigin{auths: map[string]*originAuth{}, start: time.Now()}
	used := map[int]bool{}
	for _, b := range behaves {
		// Put each authority in a partition of its own, so that the pods
		// really share the work and a kill moves some of it.
		_, p := o.add(t, b, partitions, 200, func(p int) bool { return !used[p] })
		used[p] = true
	}
	return o
}

// add starts an authority of behaviour b on a loopback port whose partition
// (of partitions) fit accepts, or on any port after tries that it did not,
// and returns it and its partition.
func (o *clusterOrigin) add(t *testing.T, b string, partitions, tries int, fit func(p int) bool) (*originAuth, int) {
	t.Helper()
	a := &originAuth{behave: b, every: 6, wait: 2 * time.Second}
	for try := 0; ; try++ {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		p := jobs.Partition(authority.KeyOf(ln.Addr().String()), partitions)
		if !fit(p) && try < tries {
			ln.Close()
			continue
		}
		a.srv = httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { o.serve(a, w, r) }))
		a.srv.Listener.Close()
		a.srv.Listener = rxstamp.Serve(a.srv.Config, ln)
		a.srv.Start()
		a.name = ln.Addr().String()
		o.mu.Lock()
		o.auths[a.name] = a
		o.mu.Unlock()
		t.Cleanup(a.srv.Close)
		return a, p
	}
}

func (o *clusterOrigin) serve(a *originAuth, w http.ResponseWriter, r *http.Request) {
	o.mu.Lock()
	hold := a.hold
	o.mu.Unlock()
	if hold != nil {
		select {
		case <-hold:
		case <-r.Context().Done():
			return
		}
	}
	// A request arrived when this host received it (rxstamp), however
	// late the test process got to run this handler; what the origin
	// answers and tells it is timed from now.
	now, arrived := time.Now(), rxstamp.Arrival(r)
	o.mu.Lock()
	a.arrivals = append(a.arrivals, arrived)
	a.paths = append(a.paths, r.URL.Path)
	a.inflight++
	a.maxIn = max(a.maxIn, a.inflight)
	at := fmt.Sprintf("%s %s at %.3fs", a.name, r.URL.Path, arrived.Sub(o.start).Seconds())
	probe := false
	switch {
	case arrived.Before(a.until):
		a.early = append(a.early, at+fmt.Sprintf(" (told to wait until %.3fs)", a.until.Sub(o.start).Seconds()))
	case a.probing:
		a.overlap = append(a.overlap, at)
	case a.cooled:
		a.cooled, a.probing, probe = false, true, true
		a.probes++
	}
	throttle := throttles(a.behave) && a.n%a.every == a.every-1 && !probe
	a.n++
	cdn := ""
	if strings.HasPrefix(a.behave, "redirect") {
		for n, b := range o.auths {
			if b.behave == "cdn" {
				cdn = n
			}
		}
	}
	if throttle {
		a.until = now.Add(a.wait)
		a.cooled = true
	}
	until := a.until
	o.mu.Unlock()
	defer func() {
		o.mu.Lock()
		a.inflight--
		if probe {
			a.probing = false
		}
		o.mu.Unlock()
	}()
	// A little service time, so requests overlap as they would for real.
	time.Sleep(20 * time.Millisecond)
	if cdn != "" {
		// The same path on the cdn, which serves the same bytes.
		http.Redirect(w, r, "http://"+cdn+r.URL.Path, http.StatusFound)
		return
	}
	if throttle {
		switch a.behave {
		case "429":
			w.Header().Set("Retry-After", strconv.Itoa(int(a.wait/time.Second)))
			w.WriteHeader(http.StatusTooManyRequests)
			return
		case "503date":
			// An HTTP-date has whole seconds: the origin holds the worker to
			// the date it sent, measured against the Date it sent.
			date := now.UTC().Truncate(time.Second)
			w.Header().Set("Date", date.Format(http.TimeFormat))
			w.Header().Set("Retry-After", date.Add(a.wait).Format(http.TimeFormat))
			o.mu.Lock()
			a.until = date.Add(a.wait)
			o.mu.Unlock()
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		case "ratelimit":
			w.Header().Set("RateLimit-Policy", `"default";q=100;w=60`)
			w.Header().Set("RateLimit", fmt.Sprintf(`"default";r=0;t=%d`, int(until.Sub(now).Round(time.Second)/time.Second)))
		}
	}
	w.Header().Set("Content-Type", "application/octet-stream")
	w.Write(clusterBody(r.URL.Path))
}

// throttles reports whether an authority of this behaviour throttles.
func throttles(behave string) bool {
	return behave != "plain" && behave != "cdn" && !strings.HasPrefix(behave, "redirect")
}

// check reports every breach of the politeness contract the origin saw,
// and any two requests to one authority whose starts the pods' pacers
// confirmed closer than the floor (deps, from the pods' departure logs; nil
// for none). The departures tell an origin-timed short gap whose requests
// were spaced as they should be (a handler, or a request on its way, run
// late on a busy machine) from one they were not.
func (o *clusterOrigin) check(t *testing.T, floor time.Duration, maxInFlight int, deps map[string][]departure) {
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
		arr := append([]time.Time(nil), a.arrivals...)
		sort.Slice(arr, func(i, j int) bool { return arr[i].Before(arr[j]) })
		// Arrivals are timed as this host received them (rxstamp), not by
		// the handlers, which a loaded machine can run late. A request can
		// still be late on its way from a busy pod's pacer to the socket,
		// so a correctly spaced gap can look short by some ms when the
		// earlier request was the later to leave. The slack (a tenth of
		// the floor) excuses only that; pods without one owner per
		// authority show gaps of 0.1 to 60 ms here.
		slack := floor / 10
		minGap, below := time.Duration(1<<62), 0
		for i := 1; i < len(arr); i++ {
			g := arr[i].Sub(arr[i-1])
			minGap = min(minGap, g)
			if g < floor-slack {
				below++
			}
		}
		sent := "not logged"
		if deps != nil {
			d := deps[n]
			minDep := time.Duration(1 << 62)
			for i := 1; i < len(d); i++ {
				g := d[i].at.Sub(d[i-1].at)
				minDep = min(minDep, g)
				if g < floor {
					t.Errorf("%s: pod %d's pacer started a request at %.3fs, %s after pod %d's (floor %s)", n, d[i].pod, d[i].at.Sub(o.start).Seconds(), g, d[i-1].pod, floor)
				}
			}
			sent = fmt.Sprintf("%s (%d requests)", minDep.Round(100*time.Microsecond), len(d))
		}
		t.Logf("%s (%s): %d requests, closest gap %s as arrived, %s as the pods' pacers started them; %d cooldowns probed, max in flight %d",
			n, a.behave, len(arr), minGap.Round(100*time.Microsecond), sent, a.probes, a.maxIn)
		if below > 0 {
			t.Errorf("%s: %d gaps below the floor %s as arrived (closest %s; as started %s)", n, below, floor, minGap, sent)
		}
		if len(a.early) > 0 {
			t.Errorf("%s: %d requests while told to wait: %v", n, len(a.early), a.early)
		}
		if len(a.overlap) > 0 {
			t.Errorf("%s: %d requests while a probe ran: %v", n, len(a.overlap), a.overlap)
		}
		if a.maxIn > maxInFlight {
			t.Errorf("%s: %d requests in flight at once, cap %d", n, a.maxIn, maxInFlight)
		}
		if throttles(a.behave) && a.probes == 0 {
			t.Errorf("%s: no cooldown was ever probed; the test proves nothing", n)
		}
	}
}

func (o *clusterOrigin) urls(perAuth int) (map[string]string, []string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	targets := map[string]string{}
	var urls []string
	for _, a := range o.auths {
		urls = append(urls, a.urls(perAuth, targets)...)
	}
	sort.Strings(urls)
	return targets, urls
}

// urls returns n URLs of a, each with its target key in targets.
func (a *originAuth) urls(n int, targets map[string]string) []string {
	var urls []string
	for i := range n {
		path := fmt.Sprintf("/%s/%d", a.behave, i)
		u := "http://" + a.name + path
		targets[u] = a.behave + "/" + strconv.Itoa(i)
		urls = append(urls, u)
	}
	return urls
}

func publishURLs(t *testing.T, natsURL string, targets map[string]string, urls []string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	js, closeConn := connectJS(t, natsURL)
	defer closeConn()
	if err := jobs.EnsureStreams(ctx, js, &jobs.StreamOptions{KeepExisting: true}); err != nil {
		t.Fatal(err)
	}
	for _, u := range urls {
		if _, err := jobs.Publish(ctx, js, jobs.Job{URL: u, Target: targets[u]}); err != nil {
			t.Fatal(err)
		}
	}
}

func checkClusterMirror(t *testing.T, root string, targets map[string]string) {
	t.Helper()
	files := mirrorFiles(t, root)
	for u, key := range targets {
		path := u[strings.Index(u[len("http://"):], "/")+len("http://"):]
		got, ok := files[key]
		if !ok {
			t.Errorf("%s not stored at %s", u, key)
			continue
		}
		if want := clusterBody(path); string(got) != string(want) {
			t.Errorf("%s: stored %d bytes, want %d", key, len(got), len(want))
		}
	}
	if len(files) != len(targets) {
		t.Errorf("mirror has %d files, want %d", len(files), len(targets))
	}
}

// TestProcessClusterKeepsOnePace is issue 10's test: three `mirrorworker
// run` processes on one NATS, one origin with four authorities (plain, 429 +
// Retry-After, 503 + HTTP-date Retry-After, 200 with an exhausted RateLimit),
// floor 300 ms. As the origin times them: no gap below the floor, no request
// while told to wait, one probe per expired cooldown, at most the in-flight
// cap at once, every job stored byte-exact. The second run SIGKILLs one
// process mid-run and starts another.
func TestProcessClusterKeepsOnePace(t *testing.T) {
	if testing.Short() {
		t.Skip("starts worker processes")
	}
	for _, kill := range []bool{false, true} {
		t.Run(map[bool]string{false: "three pods", true: "kill one, start one"}[kill], func(t *testing.T) {
			// 8 jobs an authority: the throttling ones tell the 6th
			// request to wait (every 6th), so each has one cooldown, its
			// probe and two requests after it at the pace the wait left.
			// 12 gave the 429 and 503 authorities a second cooldown, which
			// checks nothing the first does not, and more jobs at the
			// slower pace a wait leaves behind: 7 s of each run's drain.
			const (
				partitions = jobs.DefaultPartitions
				perAuth    = 8
				floor      = 300 * time.Millisecond
			)
			natsURL := externalNATS(t)
			origin := newClusterOrigin(t, partitions, "plain", "429", "503date", "ratelimit")
			targets, urls := origin.urls(perAuth)
			publishURLs(t, natsURL, targets, urls)
			root := t.TempDir()
			args := func() []string {
				return workerArgs(natsURL, t.TempDir(), "--target", root, "--floor", floor.String(),
					"--max-in-flight", "2", "--lease-ttl", "2s",
					"--ack-wait", "3s", "--log-level", "info")
			}
			deps := &departureLogs{dir: t.TempDir()}
			pods := []*workerProcess{deps.start(t, args()...), deps.start(t, args()...), deps.start(t, args()...)}
			if kill {
				waitFor(t, 60*time.Second, "a third of the jobs stored", func() bool {
					return len(mirrorFiles(t, root)) >= len(urls)/3
				})
				// Kill the pod that serves the 429 authority, so that its
				// partition, cooldown and interval must move.
				victim := podServing(t, natsURL, origin.named("429"), partitions, pods)
				killed := time.Now()
				if _, err := pods[victim].signalAndWait(t, syscall.SIGKILL, 10*time.Second); err == nil {
					t.Fatal("killed worker reported success")
				}
				if n := len(mirrorFiles(t, root)); n >= len(urls) {
					t.Fatalf("all %d jobs stored before the kill; the test proves nothing", n)
				}
				pods = append(append(pods[:victim:victim], pods[victim+1:]...), deps.start(t, args()...))
				waitFor(t, 60*time.Second, "a request to the killed pod's authority", func() bool {
					return origin.lastArrival(origin.named("429")).After(killed)
				})
				t.Logf("failover: first request to the killed pod's authority %s after the SIGKILL",
					origin.firstArrivalAfter(origin.named("429"), killed).Sub(killed).Round(time.Millisecond))
			}
			waitQueueEmpty(t, natsURL, root, len(urls), 120*time.Second, multiLog(pods))
			for _, p := range pods {
				if _, err := p.signalAndWait(t, syscall.SIGTERM, 30*time.Second); err != nil {
					t.Errorf("pod exit after SIGTERM: %v", err)
				}
			}
			checkClusterMirror(t, root, targets)
			origin.check(t, floor, 2, readDepartures(t, deps.files))
			served := 0
			for _, p := range pods {
				if strings.Contains(p.log.String(), `"partitions taken"`) {
					served++
				}
			}
			if served < 2 {
				t.Errorf("only %d pods took partitions; the work was not shared", served)
			}
		})
	}
}

// TestProcessClusterHandsRedirectsToTheCDNsPod: three `mirrorworker run`
// processes, eight authorities whose every answer is a redirect to one cdn
// authority, which has jobs of its own; every authority in a partition of
// its own, floor 300 ms. A pod that follows a redirect to the cdn while
// another pod serves the cdn's partition would put two pods' requests on
// it; instead the redirect is handed to the cdn's pod (worker/handoff.go).
// As the origin times them: no gap below the floor at the cdn either, each
// job fetched once from its authority and once from the cdn, every job
// stored byte-exact.
func TestProcessClusterHandsRedirectsToTheCDNsPod(t *testing.T) {
	if testing.Short() {
		t.Skip("starts worker processes")
	}
	// 3 jobs an authority: the cdn takes all 27 requests (its 3 and the
	// 24 redirects) at its floor, 8.1 s; 5 made them 45, 13.5 s, handed
	// over the same way.
	const (
		partitions = jobs.DefaultPartitions
		perAuth    = 3
		floor      = 300 * time.Millisecond
	)
	natsURL := externalNATS(t)
	behaves := []string{"cdn"}
	for i := range 8 {
		behaves = append(behaves, fmt.Sprint("redirect", i))
	}
	origin := newClusterOrigin(t, partitions, behaves...)
	targets, urls := origin.urls(perAuth)
	publishURLs(t, natsURL, targets, urls)
	root := t.TempDir()
	args := func() []string {
		return workerArgs(natsURL, t.TempDir(), "--target", root, "--floor", floor.String(),
			"--max-in-flight", "2", "--lease-ttl", "2s", "--ack-wait", "5s", "--log-level", "info")
	}
	deps := &departureLogs{dir: t.TempDir(), env: podsShareMirror}
	pods := []*workerProcess{deps.start(t, args()...), deps.start(t, args()...), deps.start(t, args()...)}
	waitQueueEmpty(t, natsURL, root, len(urls), 120*time.Second, multiLog(pods))
	// Which redirects crossed pods, by the leases at the end (they can
	// move while the pods start; a redirect whose authority shares the
	// cdn's pod is followed there, with the cdn's own pacer).
	cdnPod, crossed := podServing(t, natsURL, origin.named("cdn"), partitions, pods), 0
	for _, b := range behaves[1:] {
		if podServing(t, natsURL, origin.named(b), partitions, pods) != cdnPod {
			crossed++
		}
	}
	for _, p := range pods {
		if _, err := p.signalAndWait(t, syscall.SIGTERM, 30*time.Second); err != nil {
			t.Errorf("pod exit after SIGTERM: %v", err)
		}
	}
	checkClusterMirror(t, root, targets)
	origin.check(t, floor, 2, readDepartures(t, deps.files))
	t.Logf("%d of %d redirecting authorities served by another pod than the cdn's", crossed, len(behaves)-1)
	if crossed == 0 {
		t.Error("every redirecting authority shares the cdn's pod; the test proves nothing")
	}
	origin.mu.Lock()
	defer origin.mu.Unlock()
	for n, a := range origin.auths {
		want := perAuth
		if a.behave == "cdn" {
			want = perAuth * len(behaves) // its own jobs and every redirect
		}
		if len(a.arrivals) != want {
			t.Errorf("%s (%s): %d requests, want %d", n, a.behave, len(a.arrivals), want)
		}
	}
}

// departureLogs starts worker processes that each log the instant their
// pacer confirmed every request's start (departlog.Log), for
// readDepartures; the order of files is the order of the pods started.
// env is more of the pods' environment (podsShareMirror).
type departureLogs struct {
	dir   string
	files []string
	env   []string
}

// podsShareMirror is the environment of pods that share one mirror, for a
// test in which their start is no part of what it checks: each pod after
// the first gives up the target's sha256 index another pod holds at once
// instead of after sumindex.DefaultLockWait (2 s), and runs without it, as
// it would after the wait.
var podsShareMirror = []string{indexLockWaitEnv + "=50ms"}

func (d *departureLogs) start(t *testing.T, args ...string) *workerProcess {
	t.Helper()
	f := filepath.Join(d.dir, fmt.Sprintf("departures-%d", len(d.files)))
	d.files = append(d.files, f)
	return startWorkerProcessEnv(t, append([]string{departlog.Env + "=" + f}, d.env...), args...)
}

// waitQueueEmpty waits until n files are in the mirror and nothing is left
// in the queue (pending, unacked or parked), with no dead letter.
func waitQueueEmpty(t *testing.T, natsURL, root string, n int, deadline time.Duration, logs fmt.Stringer) {
	t.Helper()
	js, closeConn := connectJS(t, natsURL)
	defer closeConn()
	ctx, cancel := context.WithTimeout(context.Background(), deadline)
	defer cancel()
	for {
		stored := len(mirrorFiles(t, root))
		q, qerr := readQueue(ctx, js)
		if qerr == nil && stored == n && q.pending == 0 && q.ackPending == 0 {
			if q.dlq != 0 {
				t.Errorf("%d jobs dead-lettered, want 0", q.dlq)
			}
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("not drained after %s: %d/%d stored, queue %+v (err %v); logs:\n%s", deadline, stored, n, q, qerr, logs)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// named returns the authority with behaviour b.
func (o *clusterOrigin) named(b string) string {
	o.mu.Lock()
	defer o.mu.Unlock()
	for n, a := range o.auths {
		if a.behave == b {
			return n
		}
	}
	return ""
}

func (o *clusterOrigin) lastArrival(auth string) time.Time {
	o.mu.Lock()
	defer o.mu.Unlock()
	var last time.Time
	for _, t := range o.auths[auth].arrivals {
		if t.After(last) {
			last = t
		}
	}
	return last
}

func (o *clusterOrigin) firstArrivalAfter(auth string, after time.Time) time.Time {
	o.mu.Lock()
	defer o.mu.Unlock()
	var first time.Time
	for _, t := range o.auths[auth].arrivals {
		if t.After(after) && (first.IsZero() || t.Before(first)) {
			first = t
		}
	}
	return first
}

// podServing returns the index of the pod holding the lease of auth's
// partition.
func podServing(t *testing.T, natsURL, auth string, partitions int, pods []*workerProcess) int {
	t.Helper()
	js, closeConn := connectJS(t, natsURL)
	defer closeConn()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	leases, _, err := readLeases(ctx, js)
	if err != nil {
		t.Fatal(err)
	}
	owner := leases[jobs.Partition(authority.KeyOf(auth), partitions)]
	for i, p := range pods {
		if owner == fmt.Sprintf("vm-%d", p.cmd.Process.Pid) || strings.HasSuffix(owner, fmt.Sprintf("-%d", p.cmd.Process.Pid)) {
			return i
		}
	}
	t.Fatalf("no pod holds the lease of %s (owner %q)", auth, owner)
	return -1
}

type logsOf []*workerProcess

func multiLog(ps []*workerProcess) fmt.Stringer { return logsOf(ps) }

func (l logsOf) String() string {
	var b strings.Builder
	for _, p := range l {
		fmt.Fprintf(&b, "--- pod pid %d\n%s\n", p.cmd.Process.Pid, p.log)
	}
	return b.String()
}

// TestProcessCrashWhileParking kills a worker (SIGKILL, from inside, at the
// exact step) between parking a job and acking its delivery, and between
// bringing a parked job back and deleting its parked copy. A second worker
// then stores every job, byte-exact: none is lost at either step, and the
// parking lot ends empty.
func TestProcessCrashWhileParking(t *testing.T) {
	if testing.Short() {
		t.Skip("starts worker processes")
	}
	t.Parallel()
	for _, point := range []string{"parked-before-ack", "unparked-before-delete"} {
		t.Run(point, func(t *testing.T) {
			t.Parallel()
			const n = 5 // the 429 escalates the interval to 2 s
			natsURL := externalNATS(t)
			origin := newClusterOrigin(t, jobs.DefaultPartitions, "429")
			a := origin.auths[origin.named("429")]
			a.every, a.wait = 1000, 3*time.Second // only the first answer is a 429
			origin.mu.Lock()
			a.n = a.every - 1
			origin.mu.Unlock()
			targets, urls := origin.urls(n)
			publishURLs(t, natsURL, targets, urls)
			root := t.TempDir()
			args := workerArgs(natsURL, t.TempDir(), "--target", root,
				"--park-after", "1s", "--ack-wait", "2s", "--lease-ttl", "2s")
			first := startKilledAt(t, point, args...)
			second := startWorkerProcess(t, args...)
			waitQueueEmpty(t, natsURL, root, len(urls), 90*time.Second, multiLog([]*workerProcess{first, second}))
			if _, err := second.signalAndWait(t, syscall.SIGTERM, 30*time.Second); err != nil {
				t.Errorf("second worker exit: %v", err)
			}
			checkClusterMirror(t, root, targets)
		})
	}
}

// startKilledAt starts a worker process that kills itself with SIGKILL at
// the named fault point (MW_FAULT_POINT) and waits until it has.
func startKilledAt(t *testing.T, point string, args ...string) *workerProcess {
	t.Helper()
	p := startWorkerProcessEnv(t, []string{faultEnv + "=" + point}, args...)
	select {
	case <-p.exited:
	case <-time.After(60 * time.Second):
		t.Fatalf("the worker never reached %s; log:\n%s", point, p.log)
	}
	if p.err == nil || !strings.Contains(p.err.Error(), "killed") {
		t.Fatalf("the worker exited with %v, want killed at %s", p.err, point)
	}
	return p
}

// TestProcessCrashBeforeLaneSkip: a process killed (SIGKILL) after it moved
// a cooling authority's backlog to a lane and the other jobs of its
// partition to a catch-up consumer, and before it reset the partition
// consumer past that backlog, loses nothing: the next process finds the
// lane and the catch-up consumer, serves the lane when the cooldown is
// over, acks the backlog the partition consumer still delivers unread, and
// deletes both once they are done.
func TestProcessCrashBeforeLaneSkip(t *testing.T) {
	if testing.Short() {
		t.Skip("starts worker processes")
	}
	t.Parallel()
	const (
		n = 400 // the cooling authority's backlog
		// held: jobs of an authority in the cooling one's partition whose
		// requests the origin holds until the first worker is dead. That
		// worker can neither store nor park them (fewer than the queue
		// bound, a quarter of --max-held's 1000: none overflows), so they
		// stay ahead of the partition consumer however fast its intake
		// parks the cooling backlog, and there are --lane-backlog of them:
		// the lane opens and the skip goes on to the fault point in every
		// interleaving. Without them the intake could park all n before
		// the skip looked, which then had nothing to skip (stop 51's
		// failure, "never reached lane-before-reset").
		held = 60
	)
	natsURL := externalNATS(t)
	origin := newClusterOrigin(t, jobs.DefaultPartitions, "429", "plain")
	a := origin.auths[origin.named("429")]
	a.every, a.wait = 1<<30, 3*time.Second // only the first answer is a 429
	origin.mu.Lock()
	a.n = a.every - 1
	origin.mu.Unlock()
	origin.auths[origin.named("plain")].every = 1 << 30
	targets, urls := origin.urls(n)
	coolPart := jobs.Partition(authority.KeyOf(a.name), jobs.DefaultPartitions)
	mate, p := origin.add(t, "held", jobs.DefaultPartitions, 2000, func(p int) bool { return p == coolPart })
	if p != coolPart {
		t.Fatalf("no loopback port found in partition %d", coolPart)
	}
	hold := make(chan struct{})
	release := sync.OnceFunc(func() { close(hold) })
	t.Cleanup(release)
	origin.mu.Lock()
	mate.every, mate.hold = 1<<30, hold
	origin.mu.Unlock()
	urls = append(urls, mate.urls(held, targets)...)
	// The partitioned layout before the jobs, so that they are queued in
	// their partitions, the cooling backlog ahead of the worker's first pull.
	js, closeConn := connectJS(t, natsURL)
	if err := jobs.EnsureStreams(context.Background(), js, &jobs.StreamOptions{KeepExisting: true}); err != nil {
		t.Fatal(err)
	}
	if _, err := jobs.EnsureWork(context.Background(), js, &jobs.WorkOptions{LeaseTTL: 2 * time.Second}); err != nil {
		t.Fatal(err)
	}
	closeConn()
	publishURLs(t, natsURL, targets, urls)
	root := t.TempDir()
	// --time-scale: the 429's 2 s step is 20 ms, so the backlog drains in
	// seconds once the 3 s Retry-After is over.
	args := workerArgs(natsURL, t.TempDir(), "--target", root, "--park-after", "1s", "--ack-wait", "2s",
		"--lease-ttl", "2s", "--lane-backlog", strconv.Itoa(held), "--time-scale", "0.01")
	first := startKilledAt(t, "lane-before-reset", args...)
	js, closeConn = connectJS(t, natsURL)
	defer closeConn()
	// laneConsumers counts the lane and catch-up consumers on MIRROR_JOBS.
	laneConsumers := func() (lanes, catchups int, err error) {
		s, err := js.Stream(context.Background(), jobs.JobsStream)
		if err != nil {
			return 0, 0, err
		}
		names := s.ConsumerNames(context.Background())
		for name := range names.Name() {
			switch {
			case strings.HasPrefix(name, jobs.LaneConsumerPrefix):
				lanes++
			case strings.HasPrefix(name, jobs.CatchupConsumerPrefix):
				catchups++
			}
		}
		return lanes, catchups, names.Err()
	}
	// What the crash left is what this test is about: both consumers made
	// (steps 1 and 2), the partition consumer not reset (step 3).
	if l, c, err := laneConsumers(); err != nil || l != 1 || c != 1 {
		t.Fatalf("after the kill: %d lanes and %d catch-up consumers (err %v), want 1 and 1", l, c, err)
	}
	release()
	second := startWorkerProcess(t, args...)
	logs := multiLog([]*workerProcess{first, second})
	waitQueueEmpty(t, natsURL, root, len(urls), 120*time.Second, logs)
	checkClusterMirror(t, root, targets)
	waitFor(t, 30*time.Second, "the lane and the catch-up consumer deleted once done", func() bool {
		l, c, err := laneConsumers()
		return err == nil && l == 0 && c == 0
	})
	// The line follows the lane's deletion.
	waitFor(t, 10*time.Second, "the second worker's log of the lane it drained", func() bool {
		return second.log.logLine("lane drained; the partition consumer serves the authority again", nil) != nil
	})
	if _, err := second.signalAndWait(t, syscall.SIGTERM, 30*time.Second); err != nil {
		t.Errorf("second worker exit: %v", err)
	}
}

// TestProcessPauseResumeStatus: an operator's pause reaches every pod within
// a second and holds the authority's jobs (parked, no request) while the
// other authorities flow; status shows it paused, with its parked jobs and
// the pod serving it; resume lets them through.
func TestProcessPauseResumeStatus(t *testing.T) {
	if testing.Short() {
		t.Skip("starts worker processes")
	}
	natsURL := externalNATS(t)
	origin := newClusterOrigin(t, jobs.DefaultPartitions, "paused", "plain")
	origin.auths[origin.named("paused")].every = 1 << 30 // never throttles by itself
	targets, urls := origin.urls(6)
	root := t.TempDir()
	args := func() []string {
		return workerArgs(natsURL, t.TempDir(), "--target", root, "--lease-ttl", "2s", "--park-after", "2s")
	}
	pods := []*workerProcess{startWorkerProcess(t, args()...), startWorkerProcess(t, args()...)}
	paused := origin.named("paused")

	var out, errOut strings.Builder
	pausedAt := time.Now()
	if err := run(context.Background(), []string{"pause", "--nats-url", natsURL, "--authority", paused, "--for", "10m", "--reason", "test"},
		noEnv, strings.NewReader(""), &out, &errOut); err != nil {
		t.Fatalf("pause: %v; %s", err, errOut.String())
	}
	if !strings.Contains(out.String(), "paused "+paused+" until") {
		t.Errorf("pause printed %q", out.String())
	}
	for _, p := range pods {
		waitFor(t, 10*time.Second, "the pause applied by every pod", func() bool {
			return p.log.logLine("operator paused authority", map[string]string{"authority": paused}) != nil
		})
		line := p.log.logLine("operator paused authority", map[string]string{"authority": paused})
		at, err := time.Parse(time.RFC3339Nano, line["time"].(string))
		if err != nil {
			t.Fatal(err)
		}
		if d := at.Sub(pausedAt); d > time.Second {
			t.Errorf("a pod applied the pause %v after it was given, want within 1s", d)
		}
	}
	publishURLs(t, natsURL, targets, urls)
	waitFor(t, 60*time.Second, "the other authority's jobs stored", func() bool {
		n := 0
		for u, key := range targets {
			if strings.Contains(u, origin.named("plain")) {
				if _, err := os.Stat(root + "/" + key); err == nil {
					n++
				}
			}
		}
		return n == 6
	})
	// status: the paused authority, its jobs waiting, the pod serving it.
	var st struct {
		Authorities []statusRow `json:"authorities"`
	}
	waitFor(t, 30*time.Second, "status showing the paused authority with its jobs waiting", func() bool {
		out.Reset()
		if err := run(context.Background(), []string{"status", "--nats-url", natsURL, "--authority", paused, "--json"},
			noEnv, strings.NewReader(""), &out, &errOut); err != nil {
			t.Fatalf("status: %v; %s", err, errOut.String())
		}
		if err := json.Unmarshal([]byte(out.String()), &st); err != nil {
			t.Fatalf("status --json: %v: %s", err, out.String())
		}
		return len(st.Authorities) == 1 && st.Authorities[0].State.State == "paused" &&
			int64(st.Authorities[0].Queued)+st.Authorities[0].Parked == 6 && st.Authorities[0].Pod != ""
	})
	if n := len(origin.auths[paused].arrivals); n != 0 {
		t.Errorf("the paused authority got %d requests", n)
	}
	out.Reset()
	if err := run(context.Background(), []string{"status", "--nats-url", natsURL}, noEnv, strings.NewReader(""), &out, &errOut); err != nil {
		t.Fatalf("status: %v", err)
	}
	t.Logf("status while paused:\n%s", out.String())
	if !strings.Contains(out.String(), paused) || !strings.Contains(out.String(), "(paused: test)") {
		t.Errorf("status table lacks the paused authority:\n%s", out.String())
	}

	if err := run(context.Background(), []string{"resume", "--nats-url", natsURL, "--authority", paused}, noEnv,
		strings.NewReader(""), &out, &errOut); err != nil {
		t.Fatalf("resume: %v", err)
	}
	waitQueueEmpty(t, natsURL, root, len(urls), 60*time.Second, multiLog(pods))
	checkClusterMirror(t, root, targets)
	for _, p := range pods {
		if _, err := p.signalAndWait(t, syscall.SIGTERM, 30*time.Second); err != nil {
			t.Errorf("pod exit: %v", err)
		}
	}
}

// TestOperatorCommandsCheckTheAuthority: pause, resume and status read
// --authority like replay and dlq do, and say what is wrong before they
// reach for NATS.
func TestOperatorCommandsCheckTheAuthority(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"pause", "--for", "1m"}, "pause: --authority is required"},
		{[]string{"pause", "--authority", "files.example.org", "--for", "1m"}, `pause: --authority "files.example.org": give a URL`},
		{[]string{"pause", "--authority", "files.example.org:443"}, "pause: --for is required"},
		{[]string{"resume"}, "resume: --authority is required"},
		{[]string{"status", "--authority", "nohost"}, `status: --authority "nohost": give a URL`},
	} {
		var out, errOut strings.Builder
		err := run(context.Background(), c.args, noEnv, strings.NewReader(""), &out, &errOut)
		var ue usageError
		if !errors.As(err, &ue) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v: error %v, want a usage error containing %q", c.args, err, c.want)
		}
	}
}
