package main

import (
	"context"
	"encoding/json"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/mirrorworker/mirrorworker/jobs"
)

// TestProcessPauseSurvivesRestart (issue 26): an operator's pause is a
// promise to an origin's operator, so it survives a worker's restart as a
// cooldown does. The pause is given while one worker runs; a second
// worker, started after the first stopped, restores it from MIRROR_EVENTS
// (no "unknown fact type" skip) and sends the paused authority nothing
// while the other authority's jobs are stored and status shows the paused
// one's jobs waiting. A resume given while no worker runs is restored too:
// a third worker stores the paused authority's jobs.
func TestProcessPauseSurvivesRestart(t *testing.T) {
	if testing.Short() {
		t.Skip("starts worker processes")
	}
	t.Parallel()
	natsURL := externalNATS(t)
	origin := newClusterOrigin(t, jobs.DefaultPartitions, "paused", "plain")
	paused, plain := origin.named("paused"), origin.named("plain")
	origin.auths[paused].every = 1 << 30 // never throttles by itself
	targets, urls := origin.urls(4)
	root := t.TempDir()
	dataDir := t.TempDir() // one pod restarted: the same data dir
	args := func() []string {
		return workerArgs(natsURL, dataDir, "--target", root, "--lease-ttl", "2s", "--park-after", "2s")
	}
	cli := func(args ...string) string {
		t.Helper()
		var out, errOut strings.Builder
		if err := run(context.Background(), append(args, "--nats-url", natsURL), noEnv, strings.NewReader(""), &out, &errOut); err != nil {
			t.Fatalf("%s: %v; %s", args[0], err, errOut.String())
		}
		return out.String()
	}
	stop := func(p *workerProcess) {
		t.Helper()
		if _, err := p.signalAndWait(t, syscall.SIGTERM, 30*time.Second); err != nil {
			t.Fatalf("worker exit: %v", err)
		}
	}

	first := startWorkerProcess(t, args()...)
	cli("pause", "--authority", paused, "--for", "10m", "--reason", "restart test")
	waitFor(t, 10*time.Second, "the pause applied by the first worker", func() bool {
		return first.log.logLine("operator paused authority", map[string]string{"authority": paused}) != nil
	})
	stop(first)

	second := startWorkerProcess(t, args()...)
	restored := func(p *workerProcess) map[string]any {
		var line map[string]any
		waitFor(t, 30*time.Second, "the restore's summary line", func() bool {
			line = p.log.logLine("restore pacer: replayed pacer facts from "+jobs.EventsStream, nil)
			return line != nil
		})
		return line
	}
	if line := restored(second); line["skipped"] != float64(0) || line["facts"] == float64(0) {
		t.Errorf("restore after the pause: %v; want the pause applied and nothing skipped", line)
	}
	if line := second.log.logLine("restore pacer: skipping a message that is not a pacer fact", nil); line != nil {
		t.Errorf("the restore skipped a fact: %v", line)
	}
	publishURLs(t, natsURL, targets, urls)
	stored := func(auth string) int {
		n := 0
		for u, key := range targets {
			if strings.Contains(u, auth) {
				if _, err := os.Stat(root + "/" + key); err == nil {
					n++
				}
			}
		}
		return n
	}
	waitFor(t, 60*time.Second, "the other authority's jobs stored", func() bool { return stored(plain) == 4 })
	var st struct {
		Authorities []statusRow `json:"authorities"`
	}
	waitFor(t, 30*time.Second, "status showing the paused authority with its jobs waiting", func() bool {
		out := cli("status", "--authority", paused, "--json")
		if err := json.Unmarshal([]byte(out), &st); err != nil {
			t.Fatalf("status --json: %v: %s", err, out)
		}
		return len(st.Authorities) == 1 && st.Authorities[0].State.State == "paused" &&
			int64(st.Authorities[0].Queued)+st.Authorities[0].Parked == 4
	})
	origin.mu.Lock()
	n := len(origin.auths[paused].arrivals)
	origin.mu.Unlock()
	if n != 0 {
		t.Errorf("the paused authority got %d requests after the restart, inside its pause", n)
	}
	if got := stored(paused); got != 0 {
		t.Errorf("%d of the paused authority's jobs stored inside the pause", got)
	}
	stop(second)

	cli("resume", "--authority", paused)
	third := startWorkerProcess(t, args()...)
	restored(third)
	waitQueueEmpty(t, natsURL, root, len(urls), 60*time.Second, multiLog([]*workerProcess{third}))
	checkClusterMirror(t, root, targets)
	stop(third)
}
