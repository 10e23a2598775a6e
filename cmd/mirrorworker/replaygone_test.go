package main

import (
	"bytes"
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/mirrorworker/mirrorworker/internal/departures"
	"github.com/mirrorworker/mirrorworker/replay"
)

// TestProcessReplayCarriesOnWhenThePodsGo is issue 37's "a replay beside
// pods that all go away carries on alone": a replay beside one pod at a
// 300 ms floor (each start granted by the pod, docs/adr/0031); the pod is
// SIGKILLed mid-run. Once no pod runs and none answers its asks, the
// replay paces alone with the cluster's last facts, its first requests
// spaced from the pod's last grants, says so on stderr and in status, and
// finishes: as the pod's and the replay's pacers started their requests
// (departure logs) and as the origin timed them, no gap below the floor,
// across the switch too; every job requested once
// after the replay began and stored byte-exact. Before the switch existed
// the replay asked the dead pod once a second until killed: the test timed
// out waiting for it.
func TestProcessReplayCarriesOnWhenThePodsGo(t *testing.T) {
	if testing.Short() {
		t.Skip("starts worker processes")
	}
	t.Parallel()
	const (
		perAuth = 12
		floor   = 300 * time.Millisecond
	)
	natsURL, origin, targets, urls, root := storedJobs(t, perAuth)
	base := map[string]int{} // each authority's requests before the replay (the first pod's)
	origin.mu.Lock()
	for n, a := range origin.auths {
		base[n] = len(a.paths)
	}
	origin.mu.Unlock()
	newRoot := t.TempDir()
	js, closeConn := connectJS(t, natsURL)
	defer closeConn()
	deps := &departureLogs{dir: t.TempDir()}
	pod := deps.start(t, workerArgs(natsURL, t.TempDir(), "--target", root,
		"--floor", floor.String(), "--max-in-flight", "2", "--log-level", "info")...)
	waitFor(t, 30*time.Second, "the pod announced", func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		pods, err := replay.LivePods(ctx, js)
		return err == nil && len(pods) == 1
	})
	// The replay's own pace, once alone, is its flags' (and the live
	// policy's), as for a replay that started alone.
	replayDeps := filepath.Join(deps.dir, "departures-replay")
	rp, rout := startReplayProcessEnv(t, []string{departures.Env + "=" + replayDeps}, "--nats-url", natsURL, "--target", newRoot, "--floor", floor.String(), "--max-in-flight", "2",
		"--allow-private-networks", "--progress", "lines", "--log-level", "info")
	waitFor(t, 30*time.Second, "the replay's granted requests", func() bool {
		return strings.Contains(rout.String(), "beside 1 live pod") && origin.arrivalsSoFar() >= 4
	})
	if _, err := pod.signalAndWait(t, syscall.SIGKILL, 10*time.Second); err == nil {
		t.Fatal("the pod exited 0 after SIGKILL")
	}
	killedAt, killedAfter := time.Now(), origin.arrivalsSoFar()
	if killedAfter >= len(urls) {
		t.Fatalf("the replay made all %d requests before the kill; the test proves nothing", killedAfter)
	}
	waitFor(t, 30*time.Second, "the replay pacing alone", func() bool { return strings.Contains(rout.String(), "no pod answers grants") })
	for _, l := range strings.Split(rout.String(), "\n") {
		if strings.Contains(l, "no pod answers grants") {
			t.Logf("%.1fs after the kill: %s", time.Since(killedAt).Seconds(), l)
		}
	}
	// status says why it paces alone while it does.
	var out, errOut bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := run(ctx, []string{"status", "--nats-url", natsURL}, func(string) string { return "" }, strings.NewReader(""), &out, &errOut); err != nil {
		t.Fatalf("status: %v\n%s", err, errOut.String())
	}
	if runs := replayRuns(t, js); len(runs) == 1 && runs[0].Ended.IsZero() {
		if !runs[0].Alone || runs[0].PodsGone.IsZero() || !strings.Contains(out.String(), "no pod answers grants") {
			t.Errorf("the replay's entry %+v and status while it paces alone:\n%s", runs[0], out.String())
		}
	}
	done := make(chan error, 1)
	go func() { done <- rp.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("replay: %v\n%s", err, rout)
		}
	case <-time.After(30 * time.Second):
		t.Fatalf("the replay did not finish within 30 s of the switch:\n%s", rout)
	}
	s := rout.String()
	t.Logf("the pod was killed after %d of the replay's %d requests", killedAfter, len(urls))
	if !strings.Contains(s, fmt.Sprintf("replayed %d jobs", len(urls))) || !strings.Contains(s, fmt.Sprintf("%d stored", len(urls))) {
		t.Errorf("replay output:\n%s", s)
	}
	checkClusterMirror(t, newRoot, targets)
	for n := range origin.auths {
		before := time.Time{}
		for _, at := range origin.auths[n].arrivals {
			if at.Before(killedAt) && at.After(before) {
				before = at
			}
		}
		if after := origin.firstArrivalAfter(n, killedAt); !before.IsZero() && !after.IsZero() {
			t.Logf("%s: the last request the pod granted and the first the replay paced alone %s apart", n, after.Sub(before).Round(time.Millisecond))
		}
	}
	origin.mu.Lock()
	for n, a := range origin.auths {
		seen := map[string]int{}
		for _, p := range a.paths[base[n]:] {
			seen[p]++
		}
		for p, k := range seen {
			if k != 1 {
				t.Errorf("%s%s requested %d times after the replay began, want once", n, p, k)
			}
		}
		if len(seen) != perAuth {
			t.Errorf("%s: %d of its %d jobs requested after the replay began", n, len(seen), perAuth)
		}
	}
	origin.mu.Unlock()
	// As the pod's and the replay's pacers started them (granted, then
	// alone) and as the origin timed them.
	origin.check(t, floor, 2, readDepartures(t, append(append([]string(nil), deps.files...), replayDeps)))
}
