package main

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/mirrorworker/mirrorworker/internal/departures"
	"github.com/mirrorworker/mirrorworker/jobs"
	"github.com/mirrorworker/mirrorworker/replay"
)

// runReplayIn runs `mirrorworker replay` in this process until it returns
// or ctx is cancelled; the result arrives on the channel.
func runReplayIn(ctx context.Context, args ...string) <-chan replayResult {
	done := make(chan replayResult, 1)
	go func() {
		var stdout, stderr bytes.Buffer
		err := run(ctx, append([]string{"replay"}, args...), func(string) string { return "" }, strings.NewReader(""), &stdout, &stderr)
		done <- replayResult{err, stdout.String(), stderr.String()}
	}()
	return done
}

// replayRuns returns the replay runs with an entry in MIRROR_REPLAYS.
func replayRuns(t *testing.T, js jetstream.JetStream) []jobs.ReplayRun {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	kv, err := js.KeyValue(ctx, jobs.ReplaysBucket)
	if err != nil {
		return nil
	}
	runs, err := readReplayRuns(ctx, js, kv)
	if err != nil {
		t.Fatal(err)
	}
	return runs
}

func publishJob(t *testing.T, js jetstream.JetStream, url, target string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := jobs.Publish(ctx, js, jobs.Job{URL: url, Target: target}); err != nil {
		t.Fatal(err)
	}
}

// TestProcessReplayBesideLivePods is issue 37's scenario: two `mirrorworker
// run` pods at a 300 ms floor, two authorities (one answering 429 with
// Retry-After now and then), jobs stored; then a replay into a directory
// only it writes (the pods have no --replay-target) and 60 new live jobs at
// the same moment. The replay fetches and stores its jobs itself, each
// start granted by the owner pod (docs/adr/0031), so that, judged on the
// pods' and the replay's requests together: no gap below the floor as the
// pods' and the replay's pacers started them (departure logs) nor as the
// origin timed them (with the usual slack), no request while told to
// wait, no request beside a probe, at most 2 in flight; live jobs first
// (while live jobs wait, at most one replay request in four, with slack
// for a cooldown's edges); every live job in the live mirror and every
// replayed one in the new one, byte-exact.
func TestProcessReplayBesideLivePods(t *testing.T) {
	if testing.Short() {
		t.Skip("starts worker processes")
	}
	t.Parallel()
	const (
		partitions = jobs.DefaultPartitions
		perAuth    = 20 // more than a quarter of the live window, so that live first is what keeps the replay out of it
		live       = 60
		floor      = 300 * time.Millisecond
	)
	natsURL := externalNATS(t)
	origin := newClusterOrigin(t, partitions, "plain", "429")
	origin.mu.Lock()
	for _, a := range origin.auths {
		// One 429 (2 s), late in the replay: its cooldown, its probe and
		// the 2 s interval that follows it hold for the replay's requests
		// too. More would only make the test slower.
		a.every = perAuth + live/2 + perAuth/2 + 1
	}
	origin.mu.Unlock()
	targets, urls := origin.urls(perAuth)
	publishURLs(t, natsURL, targets, urls)
	root, newRoot := t.TempDir(), t.TempDir()
	deps := &departureLogs{dir: t.TempDir()}
	args := func() []string {
		return workerArgs(natsURL, t.TempDir(), "--target", root, "--floor", floor.String(),
			"--max-in-flight", "2", "--lease-ttl", "2s", "--ack-wait", "3s", "--log-level", "info")
	}
	pods := []*workerProcess{deps.start(t, args()...), deps.start(t, args()...)}
	waitQueueEmpty(t, natsURL, root, len(urls), 90*time.Second, multiLog(pods))
	first := map[string]int{} // each authority's requests before the replay
	origin.mu.Lock()
	for n, a := range origin.auths {
		first[n] = len(a.arrivals)
	}
	origin.mu.Unlock()

	js, closeConn := connectJS(t, natsURL)
	defer closeConn()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	// A process of its own, so that this one (the origin's clock) stays
	// light; it logs its departures as the pods do.
	replayDeps := filepath.Join(deps.dir, "departures-replay")
	rp, rout := startReplayProcessEnv(t, []string{departures.Env + "=" + replayDeps},
		"--nats-url", natsURL, "--target", newRoot, "--progress", "lines", "--allow-private-networks")
	// Its entry is written before it has chosen its jobs (it waits for
	// earlier lone replays first); once the entry counts them, the choice
	// is made, and the live jobs below are after it.
	waitFor(t, 30*time.Second, "the replay's entry with its jobs counted", func() bool {
		runs := replayRuns(t, js)
		return len(runs) == 1 && runs[0].Jobs > 0
	})
	liveTargets := map[string]string{}
	names := []string{origin.named("plain"), origin.named("429")}
	liveAt := time.Now() // every live job waits from here
	for i := range live {
		n := names[i%2]
		b := origin.auths[n].behave
		u := fmt.Sprintf("http://%s/%s/live-%d", n, b, i)
		liveTargets[u] = fmt.Sprintf("%s/live-%d", b, i)
		publishJob(t, js, u, liveTargets[u])
	}
	// status shows the replay while it runs.
	var out, errOut bytes.Buffer
	if err := run(ctx, []string{"status", "--nats-url", natsURL}, func(string) string { return "" }, strings.NewReader(""), &out, &errOut); err != nil {
		t.Fatalf("status: %v\n%s", err, errOut.String())
	}
	run0 := replayRuns(t, js)
	if len(run0) != 1 || !strings.Contains(out.String(), "REPLAY") || !strings.Contains(out.String(), run0[0].Run) {
		t.Errorf("status during the replay:\n%s", out.String())
	}
	if err := rp.Wait(); err != nil {
		t.Fatalf("replay: %v\n%s", err, rout)
	}
	if s := rout.String(); !strings.Contains(s, fmt.Sprintf("replayed %d jobs", len(urls))) || !strings.Contains(s, fmt.Sprintf("%d stored", len(urls))) ||
		!strings.Contains(s, "beside 2 live pods: the replay fetches and stores its jobs itself") {
		t.Errorf("replay output:\n%s", s)
	}
	all := map[string]string{}
	for u, k := range targets {
		all[u] = k
	}
	for u, k := range liveTargets {
		all[u] = k
	}
	waitQueueEmpty(t, natsURL, root, len(all), 90*time.Second, multiLog(pods))
	for _, p := range pods {
		if _, err := p.signalAndWait(t, syscall.SIGTERM, 30*time.Second); err != nil {
			t.Errorf("pod exit after SIGTERM: %v", err)
		}
	}
	checkClusterMirror(t, root, all)
	// Only the replay wrote the new directory: it holds the replayed jobs
	// and nothing else.
	checkClusterMirror(t, newRoot, targets)
	if n, want := len(mirrorFiles(t, newRoot)), len(targets); n != want {
		t.Errorf("%d files in the replay's directory, want %d", n, want)
	}
	d := readDepartures(t, append(append([]string(nil), deps.files...), replayDeps))
	replayed := 0
	for _, ds := range d {
		for _, x := range ds {
			if x.pod == len(deps.files) {
				replayed++
			}
		}
	}
	if replayed < len(urls) {
		t.Errorf("the replay logged %d departures, want at least %d (its own requests)", replayed, len(urls))
	}
	origin.check(t, floor, 2, d)
	checkLiveFirst(t, origin, first, liveAt)
	if runs := replayRuns(t, js); len(runs) != 0 {
		t.Errorf("the replay left its entry behind: %+v", runs)
	}
}

// checkLiveFirst judges, at each authority, the requests after the first
// ones (before the replay): from the moment the live jobs were enqueued
// (liveAt) to the last live request, the replay's requests (paths without
// "live-") are at most one in four, as the owners grant them
// (docs/contract.md, "Grants"), with two more for the asks already held
// for a slot then and a cooldown's edges. Measured: 9 of 20 replay
// requests in that window at each authority, against 30 live ones; with
// the owners' live first switched off (grant.Options.Defer returning 0),
// all 20 were, and the check fails.
func checkLiveFirst(t *testing.T, o *clusterOrigin, first map[string]int, liveAt time.Time) {
	t.Helper()
	o.mu.Lock()
	defer o.mu.Unlock()
	for n, a := range o.auths {
		idx := make([]int, 0, len(a.arrivals))
		for i := first[n]; i < len(a.arrivals); i++ {
			idx = append(idx, i)
		}
		sort.Slice(idx, func(i, j int) bool { return a.arrivals[idx[i]].Before(a.arrivals[idx[j]]) })
		lo, hi := -1, -1
		for k, i := range idx {
			if lo < 0 && !a.arrivals[i].Before(liveAt) {
				lo = k
			}
			if strings.Contains(a.paths[i], "live-") {
				hi = k
			}
		}
		if lo < 0 || hi < lo {
			t.Errorf("%s: no live request", n)
			continue
		}
		lives, replays := 0, 0
		for _, i := range idx[lo : hi+1] {
			if strings.Contains(a.paths[i], "live-") {
				lives++
			} else {
				replays++
			}
		}
		t.Logf("%s: %d live requests, %d replay requests among them (%d replay requests in all)", n, lives, replays, len(idx)-lives)
		if replays > lives/3+2 {
			t.Errorf("%s: %d replay requests among %d live ones: want at most one in four", n, replays, lives)
		}
	}
}

// classOrigin is one authority that answers a conditional request for what
// it served with 304, and records every request in order.
type classOrigin struct {
	mu   sync.Mutex
	srv  *httptest.Server
	reqs []classReq
}

type classReq struct {
	at   time.Time
	path string
	cond bool // a conditional request (If-None-Match)
}

func newClassOrigin(t *testing.T) *classOrigin {
	o := &classOrigin{}
	o.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		etag := `"` + r.URL.Path + `"`
		cond := r.Header.Get("If-None-Match") != ""
		o.mu.Lock()
		o.reqs = append(o.reqs, classReq{at: time.Now(), path: r.URL.Path, cond: cond})
		o.mu.Unlock()
		if r.Header.Get("If-None-Match") == etag {
			w.WriteHeader(http.StatusNotModified)
			return
		}
		w.Header().Set("ETag", etag)
		w.Write(clusterBody(r.URL.Path))
	}))
	t.Cleanup(o.srv.Close)
	return o
}

// since returns the requests from the i-th on.
func (o *classOrigin) since(i int) []classReq {
	o.mu.Lock()
	defer o.mu.Unlock()
	return append([]classReq(nil), o.reqs[min(i, len(o.reqs)):]...)
}

func (o *classOrigin) count() int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return len(o.reqs)
}

func countPrefix(reqs []classReq, prefix string) int {
	n := 0
	for _, r := range reqs {
		if strings.HasPrefix(r.path, prefix) {
			n++
		}
	}
	return n
}

// TestProcessReplayYieldsToLiveJobs: one authority at a 100 ms floor with
// one request in flight, its 60 jobs stored, served by one pod; a replay of
// them into a new directory runs through the pod.
//
//   - Live first: 10 live jobs enqueued one at a time during the replay
//     (issue 27 asks for 20 among 2,000; the replay keeps only
//     replay.DefaultWindow jobs per authority in the pod's queue, so the
//     backlog's size does not change what a live job waits behind). Each
//     is requested with at most 2 replay requests between its enqueue and
//     its own: the one granted when it came, and the share. Behind the
//     replay's window in arrival order it would be 4 or 5.
//   - Ctrl-C: the replay's entry goes, and the pod drops its remaining
//     copies: its consumers are left with nothing, after at most the
//     window's worth of replay requests.
//   - SIGKILL mid-way and run again: every object stored in the new
//     directory byte-exact, and none fetched unconditionally twice by the
//     replays (what the killed run stored is asked for with If-None-Match).
func TestProcessReplayYieldsToLiveJobs(t *testing.T) {
	if testing.Short() {
		t.Skip("starts worker processes")
	}
	// It judges the order of requests, not their gaps, and owns its NATS,
	// origin and processes, as TestProcessReplayOf2000JobsYieldsToLiveJobs.
	t.Parallel()
	const (
		n     = 60
		live  = 10
		floor = liveFloor
	)
	rs := startReplayBesideAPod(t, n, floor)
	natsURL, js, origin, root, newRoot, pod, began, done, stop, want := rs.natsURL, rs.js, rs.origin, rs.root, rs.newRoot, rs.pod, rs.began, rs.done, rs.stop, rs.want
	worst, _ := liveJobsFirst(t, js, origin, "live", live)
	if worst > 2 {
		t.Errorf("a live job waited behind %d replay requests; want at most 2 (live first)", worst)
	}
	if countPrefix(origin.since(began), "/old/") >= n {
		t.Fatalf("the replay finished before the live jobs did; the test proves nothing")
	}

	// Ctrl-C: nothing of the replay stays queued.
	stop()
	r := <-done
	stopped := origin.count()
	if r.err == nil || !strings.Contains(r.err.Error(), "replay interrupted") {
		t.Fatalf("replay after Ctrl-C: %v\n%s", r.err, r.stdout)
	}
	waitFor(t, 30*time.Second, "the replay's entry gone", func() bool { return len(replayRuns(t, js)) == 0 })
	waitQueueEmpty(t, natsURL, root, n+live, 30*time.Second, pod.log)
	if after := countPrefix(origin.since(stopped), "/old/"); after > 1 {
		t.Errorf("%d replay requests after the replay returned from Ctrl-C; want at most the one the pod's cap let be in flight", after)
	}

	// SIGKILL mid-way, then run again to the end.
	killAt := len(mirrorFiles(t, newRoot)) + 8
	rp, _ := startReplayProcess(t, "--nats-url", natsURL, "--target", newRoot, "--progress", "none", "--allow-private-networks")
	waitFor(t, 30*time.Second, "objects stored by the second replay", func() bool { return len(mirrorFiles(t, newRoot)) >= killAt })
	if err := rp.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = rp.Wait()
	if got := len(mirrorFiles(t, newRoot)); got >= n {
		t.Fatalf("all %d stored before the kill; the test proves nothing", got)
	}
	// The pod finishes what the killed replay had handed it.
	waitQueueEmpty(t, natsURL, root, n+live, 30*time.Second, pod.log)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	r = <-runReplayIn(ctx, "--nats-url", natsURL, "--target", newRoot, "--progress", "none", "--from-seq", "1", "--allow-private-networks")
	if r.err != nil {
		t.Fatalf("replay run again: %v\n%s\n%s", r.err, r.stdout, r.stderr)
	}
	t.Logf("run again: %s", strings.TrimSpace(r.stdout))
	if !strings.Contains(r.stdout, " unchanged") || strings.Contains(r.stdout, " 0 unchanged") {
		t.Errorf("the run after the kill found nothing unchanged: %s", r.stdout)
	}
	if _, err := pod.signalAndWait(t, syscall.SIGTERM, 30*time.Second); err != nil {
		t.Errorf("pod exit: %v", err)
	}
	files := mirrorFiles(t, newRoot)
	for u, key := range want {
		path := u[len(origin.srv.URL):]
		if got := files[key]; string(got) != string(clusterBody(path)) {
			t.Errorf("%s: stored %q in the new directory", key, got)
		}
	}
	fetched := map[string]int{}
	for _, q := range origin.since(began) {
		if strings.HasPrefix(q.path, "/old/") && !q.cond {
			fetched[q.path]++
		}
	}
	for p, k := range fetched {
		if k > 1 {
			t.Errorf("%s fetched %d times without a condition by the replays", p, k)
		}
	}
}

// replayBesideAPod is a replay (in-process, into newRoot) running beside
// one pod at floor with an in-flight cap of 1, over n jobs /old/0 to
// /old/<n-1> of origin that a first pod stored into root at floor 0 and
// has stopped since; it is returned once the origin saw 6 of the replay's
// requests. began is the origin's request count when the pod started.
type replayBesideAPod struct {
	natsURL       string
	js            jetstream.JetStream
	origin        *classOrigin
	root, newRoot string
	want          map[string]string // the jobs' URLs and keys
	pod           *workerProcess
	began         int
	done          <-chan replayResult
	stop          context.CancelFunc // Ctrl-C for the replay
}

func startReplayBesideAPod(t *testing.T, n int, floor time.Duration) *replayBesideAPod {
	t.Helper()
	rs := &replayBesideAPod{natsURL: externalNATS(t), origin: newClassOrigin(t), root: t.TempDir(), newRoot: t.TempDir(), want: map[string]string{}}
	js, closeConn := connectJS(t, rs.natsURL)
	t.Cleanup(closeConn)
	rs.js = js
	for i := range n {
		u := fmt.Sprintf("%s/old/%d", rs.origin.srv.URL, i)
		rs.want[u] = fmt.Sprintf("old/%d", i)
		if i == 0 {
			publishURLs(t, rs.natsURL, map[string]string{u: rs.want[u]}, []string{u}) // creates the streams
			continue
		}
		publishJob(t, js, u, rs.want[u])
	}
	// Stored at floor 0 by a first pod, quickly.
	first := startWorkerProcess(t, workerArgs(rs.natsURL, t.TempDir(), "--target", rs.root, "--max-in-flight", "8")...)
	waitQueueEmpty(t, rs.natsURL, rs.root, n, 3*time.Minute, first.log)
	if _, err := first.signalAndWait(t, syscall.SIGTERM, 30*time.Second); err != nil {
		t.Fatalf("first pod: %v", err)
	}
	rs.pod = startWorkerProcess(t, workerArgs(rs.natsURL, t.TempDir(), "--target", rs.root,
		"--floor", floor.String(), "--max-in-flight", "1", "--log-level", "info")...)
	rs.began = rs.origin.count()
	waitFor(t, 30*time.Second, "the pod announced", func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		pods, err := replay.LivePods(ctx, js)
		return err == nil && len(pods) == 1
	})
	rctx, stop := context.WithCancel(context.Background())
	t.Cleanup(stop)
	rs.stop = stop
	rs.done = runReplayIn(rctx, "--nats-url", rs.natsURL, "--target", rs.newRoot, "--progress", "none", "--allow-private-networks")
	waitFor(t, 60*time.Second, "the replay's first requests", func() bool {
		select {
		case r := <-rs.done:
			t.Fatalf("the replay ended before its first requests: %v\n%s\n%s", r.err, r.stdout, r.stderr)
		default:
		}
		return countPrefix(rs.origin.since(rs.began), "/old/") >= 6
	})
	return rs
}

// liveJobsFirst enqueues live jobs /<name>/0 to /<name>/<live-1> on origin
// one after the other while a replay of /old/ jobs runs, each once the one
// before was requested; it returns the most replay requests the origin saw
// between a live job's enqueue and its request, and the longest time from
// an enqueue to its request.
func liveJobsFirst(t *testing.T, js jetstream.JetStream, origin *classOrigin, name string, live int) (worst int, longest time.Duration) {
	t.Helper()
	for i := range live {
		at, t0 := origin.count(), time.Now()
		publishJob(t, js, fmt.Sprintf("%s/%s/%d", origin.srv.URL, name, i), fmt.Sprintf("%s/%d", name, i))
		path := fmt.Sprintf("/%s/%d", name, i)
		var reqs []classReq
		waitFor(t, 30*time.Second, "live job "+path, func() bool {
			reqs = origin.since(at)
			return countPrefix(reqs, path) > 0
		})
		before := 0
		for _, r := range reqs {
			if r.path == path {
				t.Logf("%s requested %s after its enqueue, %d replay requests before it", path, r.at.Sub(t0).Round(time.Millisecond), before)
				longest = max(longest, r.at.Sub(t0))
				break
			}
			if strings.HasPrefix(r.path, "/old/") {
				before++
			}
		}
		if i == 0 {
			// The owner puts live jobs first once they are in its memory: the
			// first one after the pod idled comes in with its intake's next
			// pull (worker.Options.PullWait, 1 s), and the grants the owner
			// made meanwhile went before it (ADR 0031, consequences).
			before = max(0, before-int(time.Second/liveFloor))
		}
		worst = max(worst, before)
	}
	return worst, longest
}

// liveFloor is the floor of the pod in the tests of liveJobsFirst.
const liveFloor = 100 * time.Millisecond

// TestProcessReplayOf2000JobsYieldsToLiveJobs is issue 27's priority test
// at its size: a replay of 2,000 jobs for one authority at floor 100 ms
// (in-flight cap 1), and 20 live jobs enqueued one after the other while
// it runs. Each live job is requested after at most two replay requests
// (live first: the replay's backlog in the stream is not ahead of it),
// while nearly all of the replay is still to do; Ctrl-C then ends the
// replay with nothing of it left queued, and every live job stored.
func TestProcessReplayOf2000JobsYieldsToLiveJobs(t *testing.T) {
	if testing.Short() {
		t.Skip("starts worker processes")
	}
	t.Parallel()
	const (
		n     = 2000
		live  = 20
		floor = liveFloor
	)
	rs := startReplayBesideAPod(t, n, floor)
	natsURL, js, origin, root, pod, began, done, stop := rs.natsURL, rs.js, rs.origin, rs.root, rs.pod, rs.began, rs.done, rs.stop
	worst, longest := liveJobsFirst(t, js, origin, "live", live)
	replayed := countPrefix(origin.since(began), "/old/")
	t.Logf("%d live jobs: at most %d replay requests before one, at most %s from an enqueue to its request; the replay had done %d of %d",
		live, worst, longest.Round(time.Millisecond), replayed, n)
	if worst > 2 {
		t.Errorf("a live job waited behind %d replay requests; want at most 2 (live first)", worst)
	}
	if replayed > n/10 {
		t.Fatalf("the replay had done %d of %d jobs by the last live one; the test is meant to hold most of them back", replayed, n)
	}
	stop()
	if r := <-done; r.err == nil || !strings.Contains(r.err.Error(), "replay interrupted") {
		t.Fatalf("replay after Ctrl-C: %v\n%s", r.err, r.stdout)
	}
	stopped := origin.count()
	waitFor(t, 30*time.Second, "the replay's entry gone", func() bool { return len(replayRuns(t, js)) == 0 })
	waitQueueEmpty(t, natsURL, root, n+live, 60*time.Second, pod.log)
	if after := countPrefix(origin.since(stopped), "/old/"); after > 1 {
		t.Errorf("%d replay requests after the replay returned from Ctrl-C; want at most the one the pod's cap let be in flight", after)
	}
	if _, err := pod.signalAndWait(t, syscall.SIGTERM, 30*time.Second); err != nil {
		t.Errorf("pod exit: %v", err)
	}
}

// startReplayProcess starts `mirrorworker replay` as a child process; its
// stdout and stderr go to the writer returned.
func startReplayProcess(t *testing.T, args ...string) (*exec.Cmd, *syncBuffer) {
	t.Helper()
	return startReplayProcessEnv(t, nil, args...)
}

// startReplayProcessEnv is startReplayProcess with extra environment
// variables ("NAME=value").
func startReplayProcessEnv(t *testing.T, extra []string, args ...string) (*exec.Cmd, *syncBuffer) {
	t.Helper()
	cmd := exec.Command(os.Args[0], append([]string{"replay"}, args...)...)
	env := append([]string{asMainEnv + "=1"}, extra...)
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "MIRRORWORKER_") {
			env = append(env, kv)
		}
	}
	cmd.Env = env
	out := &syncBuffer{}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			cmd.Process.Kill()
			cmd.Wait()
		}
		if t.Failed() {
			t.Logf("replay process output:\n%s", out.String())
		}
	})
	return cmd, out
}
