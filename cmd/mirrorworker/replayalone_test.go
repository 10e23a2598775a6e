package main

import (
	"bytes"
	"context"
	"fmt"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/mirrorworker/mirrorworker/jobs"
	"github.com/mirrorworker/mirrorworker/replay"
)

// forget drops what the origin saw so far: what a test measures starts
// now.
func (o *clusterOrigin) forget() {
	o.mu.Lock()
	defer o.mu.Unlock()
	for _, a := range o.auths {
		a.arrivals, a.maxIn = nil, 0
	}
}

func (o *clusterOrigin) arrivalsSoFar() int {
	o.mu.Lock()
	defer o.mu.Unlock()
	n := 0
	for _, a := range o.auths {
		n += len(a.arrivals)
	}
	return n
}

// TestProcessReplayHandsOverToAPodStartedMidway is issue 27's "a pod
// started mid-replay takes its place in the one pace": a replay started
// with no pod running paces its own requests (floor 300 ms, 40 jobs on two
// authorities); a `mirrorworker run` pod at the same floor starts mid-way,
// with live jobs for the same authorities waiting. The pod waits for the
// replay to stop its requests, the replay hands the rest over, and, as the
// origin times the arrivals: no gap below the floor, at most the in-flight
// cap at once; the replay's target and the live mirror complete and
// byte-exact.
func TestProcessReplayHandsOverToAPodStartedMidway(t *testing.T) {
	if testing.Short() {
		t.Skip("starts worker processes")
	}
	t.Parallel()
	const (
		perAuth = 20
		live    = 10 // per authority
		floor   = 300 * time.Millisecond
	)
	natsURL, origin, targets, urls, root := storedJobs(t, perAuth)
	newRoot := t.TempDir()
	js, closeConn := connectJS(t, natsURL)
	defer closeConn()
	rp, rout := startLoneReplay(t, js, natsURL, origin, newRoot, floor)
	liveTargets := map[string]string{}
	for _, n := range []string{origin.named("plain"), origin.named("cdn")} {
		b := origin.auths[n].behave
		for i := range live {
			u := fmt.Sprintf("http://%s/%s/live-%d", n, b, i)
			liveTargets[u] = fmt.Sprintf("%s/live-%d", b, i)
			publishJob(t, js, u, liveTargets[u])
		}
	}
	ownBefore := len(mirrorFiles(t, newRoot))
	// The pod cannot write the replay's directory (no --replay-target):
	// the replay goes on writing it, in the pod's pace.
	pod := startWorkerProcess(t, workerArgs(natsURL, t.TempDir(), "--target", root,
		"--floor", floor.String(), "--max-in-flight", "2", "--log-level", "info")...)
	if err := rp.Wait(); err != nil {
		t.Fatalf("replay: %v\n%s", err, rout)
	}
	out := rout.String()
	m := regexp.MustCompile(`1 pod started after (\d+) jobs: the replay goes on in their pace`).FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("the replay did not go on in the pod's pace:\n%s", out)
	}
	own, _ := strconv.Atoi(m[1])
	t.Logf("the replay did %d jobs in its own pace (%d stored when the pod started), %d granted by the pod", own, ownBefore, len(urls)-own)
	if own < ownBefore || own >= len(urls) {
		t.Errorf("the replay did %d of %d jobs in its own pace, %d of them before the pod started: want some granted by the pod", own, len(urls), ownBefore)
	}
	if !strings.Contains(out, fmt.Sprintf("replayed %d jobs", len(urls))) || !strings.Contains(out, fmt.Sprintf("%d stored", len(urls))) {
		t.Errorf("replay output:\n%s", out)
	}
	waitedFrom, _ := time.Parse(time.RFC3339Nano, pod.log.field("waiting for replays that pace their own requests to stop and hand their jobs to the pods, before taking work", "time"))
	waitedTo, _ := time.Parse(time.RFC3339Nano, pod.log.field("replays pacing alone have stopped: this pod's first requests are spaced from their last starts", "time"))
	if waitedFrom.IsZero() || waitedTo.IsZero() {
		t.Errorf("the pod did not wait for the replay:\n%s", pod.log)
	} else {
		t.Logf("the pod waited %s for the replay to stop its own requests", waitedTo.Sub(waitedFrom))
	}
	if !strings.Contains(out, "replay: --floor, --max-in-flight do not apply beside the pods: they grant each request's start, in their policy") {
		t.Errorf("the replay did not say that its --floor and --max-in-flight do not apply beside the pod:\n%s", out)
	}
	all := map[string]string{}
	for u, k := range targets {
		all[u] = k
	}
	for u, k := range liveTargets {
		all[u] = k
	}
	waitQueueEmpty(t, natsURL, root, len(all), 90*time.Second, pod.log)
	if _, err := pod.signalAndWait(t, syscall.SIGTERM, 30*time.Second); err != nil {
		t.Errorf("pod exit after SIGTERM: %v", err)
	}
	checkClusterMirror(t, root, all)
	checkClusterMirror(t, newRoot, targets)
	origin.check(t, floor, 2, nil)
}

// storedJobs is an origin of two authorities (plain, cdn) with perAuth jobs
// each, stored into root by a first pod that has stopped since (and is no
// longer announced); what the origin saw of it is forgotten.
func storedJobs(t *testing.T, perAuth int) (natsURL string, origin *clusterOrigin, targets map[string]string, urls []string, root string) {
	t.Helper()
	natsURL = externalNATS(t)
	origin = newClusterOrigin(t, jobs.DefaultPartitions, "plain", "cdn")
	targets, urls = origin.urls(perAuth)
	publishURLs(t, natsURL, targets, urls)
	root = t.TempDir()
	first := startWorkerProcess(t, workerArgs(natsURL, t.TempDir(), "--target", root)...)
	waitQueueEmpty(t, natsURL, root, len(urls), 60*time.Second, first.log)
	if _, err := first.signalAndWait(t, syscall.SIGTERM, 30*time.Second); err != nil {
		t.Fatalf("first pod: %v", err)
	}
	js, closeConn := connectJS(t, natsURL)
	defer closeConn()
	waitFor(t, 30*time.Second, "the first pod withdrawn", func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		pods, err := replay.LivePods(ctx, js)
		return err == nil && len(pods) == 0
	})
	origin.forget()
	return natsURL, origin, targets, urls, root
}

// startLoneReplay starts a replay process into newRoot with no pod running
// and returns once it paces alone and the origin has seen 8 requests.
func startLoneReplay(t *testing.T, js jetstream.JetStream, natsURL string, origin *clusterOrigin, newRoot string, floor time.Duration) (*exec.Cmd, *syncBuffer) {
	t.Helper()
	rp, rout := startReplayProcess(t, "--nats-url", natsURL, "--target", newRoot, "--floor", floor.String(), "--max-in-flight", "2",
		"--allow-private-networks", "--progress", "lines", "--log-level", "info")
	waitFor(t, 30*time.Second, "the replay pacing alone", func() bool {
		runs := replayRuns(t, js)
		return len(runs) == 1 && runs[0].Alone && origin.arrivalsSoFar() >= 8
	})
	return rp, rout
}

// TestProcessReplayBesideASharedConsumerPod: a pod on `--partitions 0`
// (the single shared consumer, no leases) announces itself in MIRROR_PODS
// and serves grants, so a replay beside it (into a directory the pod does
// not write) starts its requests in the pod's pace rather than its own;
// the replay's own --floor does not apply and it says so. The pod withdraws its entry when it stops.
func TestProcessReplayBesideASharedConsumerPod(t *testing.T) {
	if testing.Short() {
		t.Skip("starts worker processes")
	}
	t.Parallel()
	const (
		n     = 12
		floor = 100 * time.Millisecond
	)
	natsURL := externalNATS(t)
	origin := newClusterOrigin(t, jobs.DefaultPartitions, "plain")
	targets, urls := origin.urls(n)
	publishURLs(t, natsURL, targets, urls)
	root, newRoot := t.TempDir(), t.TempDir()
	pod := startWorkerProcess(t, workerArgs(natsURL, t.TempDir(), "--partitions", "0", "--target", root,
		"--floor", floor.String(), "--max-in-flight", "1", "--log-level", "info")...)
	waitQueueEmpty(t, natsURL, root, n, 60*time.Second, pod.log)
	js, closeConn := connectJS(t, natsURL)
	defer closeConn()
	livePods := func() map[string][]string {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		pods, err := replay.LivePods(ctx, js)
		if err != nil {
			t.Fatal(err)
		}
		return pods
	}
	pods := livePods()
	if len(pods) != 1 {
		t.Fatalf("pods announced: %v; want the shared consumer's pod", pods)
	}

	var id string
	for p := range pods {
		id = p
	}
	var st, stErr bytes.Buffer
	if err := run(context.Background(), []string{"status", "--nats-url", natsURL}, func(string) string { return "" }, strings.NewReader(""), &st, &stErr); err != nil {
		t.Fatalf("status: %v\n%s", err, stErr.String())
	}
	if !strings.Contains(st.String(), id+" ") || strings.Contains(st.String(), "(unowned)") {
		t.Errorf("status beside a pod of the shared consumer:\n%s", st.String())
	}

	// The replay's own floor (1 s) would take 12 s; the pod's is 100 ms.
	began := time.Now()
	r := <-runReplayIn(context.Background(), "--nats-url", natsURL, "--target", newRoot, "--floor", "1s", "--progress", "none", "--allow-private-networks")
	took := time.Since(began)
	if r.err != nil {
		t.Fatalf("replay: %v\n%s\n%s", r.err, r.stdout, r.stderr)
	}
	if !strings.Contains(r.stderr, "beside 1 live pod: the replay fetches and stores its jobs itself, each request's start granted by the pod") {
		t.Errorf("the replay did not go in the pod's pace:\n%s", r.stderr)
	}
	if !strings.Contains(r.stderr, "replay: --floor does not apply beside the pods: they grant each request's start, in their policy") {
		t.Errorf("the replay did not say that its --floor does not apply:\n%s", r.stderr)
	}
	if !strings.Contains(r.stdout, fmt.Sprintf("replayed %d jobs", n)) || !strings.Contains(r.stdout, fmt.Sprintf("%d stored", n)) {
		t.Errorf("replay output: %s", r.stdout)
	}
	t.Logf("replay of %d jobs granted by the pod: %s", n, took.Round(time.Millisecond))
	if took >= time.Duration(n-1)*time.Second {
		t.Errorf("the replay took %s: its own floor of 1 s applied, not the pod's %s", took, floor)
	}
	checkClusterMirror(t, newRoot, targets)
	checkClusterMirror(t, root, targets)
	origin.check(t, floor, 1, nil)
	if _, err := pod.signalAndWait(t, syscall.SIGTERM, 30*time.Second); err != nil {
		t.Errorf("pod exit after SIGTERM: %v", err)
	}
	if pods := livePods(); len(pods) != 0 {
		t.Errorf("pods announced after the pod stopped: %v", pods)
	}
}

// TestProcessLoneReplaysRunOneAtATime is issue 27's "one or more
// replays": two replays started with no pod running, into two new
// directories, over the same origin. The second waits (it says so, and
// `status` shows whom it waits for) until the first has ended, then paces
// from the first one's last starts: as the origin times the arrivals, no
// gap below the floor and at most the in-flight cap at once; both mirrors
// complete and byte-exact.
func TestProcessLoneReplaysRunOneAtATime(t *testing.T) {
	if testing.Short() {
		t.Skip("starts worker processes")
	}
	t.Parallel()
	const (
		perAuth = 10
		floor   = 300 * time.Millisecond
	)
	natsURL, origin, targets, urls, _ := storedJobs(t, perAuth)
	first, second := t.TempDir(), t.TempDir()
	js, closeConn := connectJS(t, natsURL)
	defer closeConn()
	rp1, rout1 := startLoneReplay(t, js, natsURL, origin, first, floor)
	rp2, rout2 := startReplayProcess(t, "--nats-url", natsURL, "--target", second, "--floor", floor.String(), "--max-in-flight", "2",
		"--allow-private-networks", "--progress", "lines")
	waitFor(t, 30*time.Second, "the second replay waiting for the first", func() bool {
		return strings.Contains(rout2.String(), "to end: it paces its own requests, and with no pod running replays run one at a time")
	})
	var st bytes.Buffer
	if err := run(context.Background(), []string{"status", "--nats-url", natsURL}, noEnv, strings.NewReader(""), &st, &st); err != nil {
		t.Fatalf("status: %v\n%s", err, st.String())
	}
	if !regexp.MustCompile(`no pod: it waits for replay [a-z0-9]+, which paces alone; replays with no pod run one at a time`).MatchString(st.String()) {
		t.Errorf("status does not show the second replay waiting:\n%s", st.String())
	}
	if err := rp1.Wait(); err != nil {
		t.Fatalf("first replay: %v\n%s", err, rout1)
	}
	if err := rp2.Wait(); err != nil {
		t.Fatalf("second replay: %v\n%s", err, rout2)
	}
	for i, out := range []string{rout1.String(), rout2.String()} {
		if !strings.Contains(out, fmt.Sprintf("replayed %d jobs", len(urls))) || !strings.Contains(out, fmt.Sprintf("%d stored", len(urls))) {
			t.Errorf("replay %d output:\n%s", i+1, out)
		}
	}
	checkClusterMirror(t, first, targets)
	checkClusterMirror(t, second, targets)
	origin.check(t, floor, 2, nil)
	if got := origin.arrivalsSoFar(); got != 2*len(urls) {
		t.Errorf("the origin saw %d requests, want %d (each replay's jobs once)", got, 2*len(urls))
	}
}

// TestReplayAloneFollowsTheLivePolicy: a replay with no pod paces by the
// live policy as a pod would (MIRROR_POLICY over its own flags, docs/adr/
// 0023): a key set for the authority beats its --floor from the first
// request, and a change made while it runs applies within a second. As the
// origin times the arrivals, no gap below the floor in force.
func TestReplayAloneFollowsTheLivePolicy(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a replay against NATS")
	}
	t.Parallel()
	const (
		n       = 8
		set     = 600 * time.Millisecond
		raised  = 1200 * time.Millisecond
		ownFlag = 50 * time.Millisecond
		reach   = time.Second
	)
	natsURL := externalNATS(t)
	origin := newArrivalOrigin(t)
	auth := origin.auth()
	targets := map[string]string{}
	var urls []string
	for i := range n {
		u := fmt.Sprintf("%s/obj/%d", origin.srv.URL, i)
		targets[u], urls = fmt.Sprintf("obj/%d", i), append(urls, u)
	}
	publishURLs(t, natsURL, targets, urls)
	if out, err := runPolicy(t, natsURL, "set", "--authority", auth, "--floor", set.String(), "--reason", "test"); err != nil {
		t.Fatalf("policy set: %v\n%s", err, out)
	}
	dir := t.TempDir()
	done := runReplayIn(context.Background(), "--nats-url", natsURL, "--target", dir, "--floor", ownFlag.String(),
		"--allow-private-networks", "--progress", "none")
	waitFor(t, 30*time.Second, "3 requests of the replay", func() bool { return len(origin.sorted()) >= 3 })
	t1 := time.Now()
	if out, err := runPolicy(t, natsURL, "set", "--authority", auth, "--floor", raised.String(), "--reason", "test: raise"); err != nil {
		t.Fatalf("policy set: %v\n%s", err, out)
	}
	r := <-done
	if r.err != nil {
		t.Fatalf("replay: %v\n%s\n%s", r.err, r.stdout, r.stderr)
	}
	if !strings.Contains(r.stdout, fmt.Sprintf("replayed %d jobs", n)) {
		t.Errorf("replay output:\n%s", r.stdout)
	}
	arr := origin.sorted()
	if len(arr) != n {
		t.Fatalf("the origin saw %d requests, want %d", len(arr), n)
	}
	slack := set / 10
	for i := 1; i < len(arr); i++ {
		g, floor := arr[i].Sub(arr[i-1]), set
		if arr[i-1].After(t1.Add(reach)) {
			floor = raised
		}
		t.Logf("gap %d: %s (floor in force %s)", i, g.Round(time.Millisecond), floor)
		if g < floor-slack {
			t.Errorf("gap %d of %s below the floor in force, %s (the replay's own --floor is %s)", i, g.Round(time.Millisecond), floor, ownFlag)
		}
	}
	if arr[len(arr)-1].Before(t1.Add(reach)) {
		t.Fatalf("every request came within %s of the raise; the test proves nothing of it", reach)
	}
}
