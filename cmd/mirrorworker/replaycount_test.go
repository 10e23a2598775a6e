package main

import (
	"bytes"
	"context"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/mirrorworker/mirrorworker/replay"
)

// TestProcessReplayCountsJobsAfterAPodIsKilled is issue 37's one count: 30
// jobs stored by a first pod, then a replay of them into a new directory
// beside a pod at a 100 ms floor that is SIGKILLed mid-way (its replay
// jobs stay in the stream as copies) and replaced by a second pod, which
// finishes them. The dry run, the progress, `status` and the summary all
// say 30 jobs, for that replay and for one run after it over a stream
// that now holds the hand-over's copies too (which once made a stream of
// 60 jobs "167 jobs to handle").
func TestProcessReplayCountsJobsAfterAPodIsKilled(t *testing.T) {
	if testing.Short() {
		t.Skip("starts worker processes")
	}
	t.Parallel()
	const (
		n     = 30
		floor = 100 * time.Millisecond
	)
	natsURL, origin, root, newRoot := externalNATS(t), newClassOrigin(t), t.TempDir(), t.TempDir()
	js, closeConn := connectJS(t, natsURL)
	defer closeConn()
	for i := range n {
		u := fmt.Sprintf("%s/old/%d", origin.srv.URL, i)
		if i == 0 {
			publishURLs(t, natsURL, map[string]string{u: fmt.Sprintf("old/%d", i)}, []string{u}) // creates the streams
			continue
		}
		publishJob(t, js, u, fmt.Sprintf("old/%d", i))
	}
	first := startWorkerProcess(t, workerArgs(natsURL, t.TempDir(), "--target", root, "--max-in-flight", "8")...)
	waitQueueEmpty(t, natsURL, root, n, 3*time.Minute, first.log)
	if _, err := first.signalAndWait(t, syscall.SIGTERM, 30*time.Second); err != nil {
		t.Fatalf("first pod: %v", err)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmd := func(args ...string) string {
		t.Helper()
		var out, errOut bytes.Buffer
		if err := run(ctx, args, func(string) string { return "" }, strings.NewReader(""), &out, &errOut); err != nil {
			t.Fatalf("%s: %v\n%s", args[0], err, errOut.String())
		}
		return out.String()
	}
	wantDry := fmt.Sprintf("dry run: %d jobs would be replayed", n)
	if out := cmd("replay", "--nats-url", natsURL, "--dry-run"); !strings.Contains(out, wantDry) {
		t.Errorf("dry run before the replay:\n%s", out)
	}

	podArgs := func() []string {
		return workerArgs(natsURL, t.TempDir(), "--target", root,
			"--floor", floor.String(), "--max-in-flight", "1", "--lease-ttl", "2s", "--ack-wait", "3s")
	}
	pod := startWorkerProcess(t, podArgs()...)
	waitFor(t, 30*time.Second, "the pod announced", func() bool {
		pods, err := replay.LivePods(ctx, js)
		return err == nil && len(pods) == 1
	})
	done := runReplayIn(ctx, "--nats-url", natsURL, "--target", newRoot, "--progress", "lines", "--allow-private-networks")
	waitFor(t, 60*time.Second, "objects stored by the replay", func() bool { return len(mirrorFiles(t, newRoot)) >= 8 })
	if _, err := pod.signalAndWait(t, syscall.SIGKILL, 10*time.Second); err == nil {
		t.Log("the pod exited 0 after SIGKILL")
	}
	if got := len(mirrorFiles(t, newRoot)); got >= n {
		t.Fatalf("all %d stored before the kill; the test proves nothing", got)
	}
	// status, while the replay waits for a pod: done/jobs with jobs = n.
	doneCol := regexp.MustCompile(`(?m)^\S+\s+file://\S+\s+(\d+)/(\d+)\s`)
	status := cmd("status", "--nats-url", natsURL)
	if m := doneCol.FindStringSubmatch(status); m == nil || m[2] != strconv.Itoa(n) {
		t.Errorf("status during the replay, want DONE x/%d:\n%s", n, status)
	}
	second := startWorkerProcess(t, podArgs()...)
	var r replayResult
	select {
	case r = <-done:
	case <-ctx.Done():
		t.Fatalf("the replay did not end; pod log:\n%s", second.log)
	}
	if r.err != nil {
		t.Fatalf("replay: %v\n%s\n%s", r.err, r.stdout, r.stderr)
	}
	checkCounts(t, "the replay across the kill", r, n)

	// Run again: the stream now holds the hand-over's copies too.
	if out := cmd("replay", "--nats-url", natsURL, "--dry-run"); !strings.Contains(out, wantDry) {
		t.Errorf("dry run after the replay:\n%s", out)
	}
	r = <-runReplayIn(ctx, "--nats-url", natsURL, "--target", newRoot, "--progress", "lines", "--allow-private-networks")
	if r.err != nil {
		t.Fatalf("replay run again: %v\n%s\n%s", r.err, r.stdout, r.stderr)
	}
	checkCounts(t, "the replay run again", r, n)
	if _, err := second.signalAndWait(t, syscall.SIGTERM, 30*time.Second); err != nil {
		t.Errorf("second pod exit: %v", err)
	}
}

// checkCounts checks that a replay's progress and summary say n jobs: the
// progress's first line and last count, the summary's jobs and the sum of
// its final outcomes.
func checkCounts(t *testing.T, what string, r replayResult, n int) {
	t.Helper()
	t.Logf("%s: %s", what, strings.TrimSpace(r.stdout))
	if !strings.Contains(r.stderr, fmt.Sprintf("replay: %d jobs to handle", n)) {
		t.Errorf("%s: progress does not begin with %d jobs:\n%s", what, n, r.stderr)
	}
	lines := regexp.MustCompile(`replay: (\d+)/(\d+) jobs`).FindAllStringSubmatch(r.stderr, -1)
	if len(lines) == 0 || lines[len(lines)-1][1] != strconv.Itoa(n) || lines[len(lines)-1][2] != strconv.Itoa(n) {
		t.Errorf("%s: progress does not end at %d/%d:\n%s", what, n, n, r.stderr)
	}
	m := regexp.MustCompile(`replayed (\d+) jobs .*: (\d+) stored, (\d+) unchanged, \d+ deferred, \d+ retried, (\d+) dead-lettered`).FindStringSubmatch(r.stdout)
	if m == nil {
		t.Fatalf("%s: no summary:\n%s", what, r.stdout)
	}
	var sum int
	for _, s := range m[2:] {
		k, _ := strconv.Atoi(s)
		sum += k
	}
	if m[1] != strconv.Itoa(n) || sum != n {
		t.Errorf("%s: summary says %s jobs, %d of them done; want %d", what, m[1], sum, n)
	}
}
