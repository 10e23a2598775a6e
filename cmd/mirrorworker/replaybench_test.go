package main

import (
	"context"
	"fmt"
	"os"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/mirrorworker/mirrorworker/replay"
)

// replayBenchEnv runs TestReplayThroughputBesideIdlePods when set (to the
// jobs per authority; "1" is 1,000): it measures, it asserts no speed, and
// it takes minutes on a shared machine.
const replayBenchEnv = "MW_BENCH_REPLAY"

// TestReplayThroughputBesideIdlePods is issue 37's benchmark: 10 origins of
// 1,000 stored jobs each, stored into the live mirror by two pods (floor 0,
// in-flight cap 8) that then stay idle; a replay of all of them into the
// live mirror (every request conditional, every answer 304) beside those
// pods. It logs the replay's jobs per second, whatever the design: the
// same file runs on a commit of the hand-over design (docs/adr/0025) and
// on the grants' (docs/adr/0031), which is how ADR 0031's numbers were
// taken.
//
//	MW_BENCH_REPLAY=1 testslot go test ./cmd/mirrorworker -run TestReplayThroughputBesideIdlePods -count 1 -v -timeout 20m
func TestReplayThroughputBesideIdlePods(t *testing.T) {
	per := os.Getenv(replayBenchEnv)
	if per == "" {
		t.Skip("a benchmark: set " + replayBenchEnv + "=1 to run it")
	}
	perAuth := 1000
	if per != "1" {
		fmt.Sscan(per, &perAuth)
	}
	const auths = 10
	natsURL := externalNATS(t)
	js, closeConn := connectJS(t, natsURL)
	defer closeConn()
	origins := make([]*classOrigin, auths)
	first := true
	for a := range origins {
		origins[a] = newClassOrigin(t)
		for i := range perAuth {
			u := fmt.Sprintf("%s/old/%d", origins[a].srv.URL, i)
			key := fmt.Sprintf("a%d/old/%d", a, i)
			if first {
				publishURLs(t, natsURL, map[string]string{u: key}, []string{u}) // creates the streams
				first = false
				continue
			}
			publishJob(t, js, u, key)
		}
	}
	n := auths * perAuth
	root := t.TempDir()
	args := func() []string {
		return workerArgs(natsURL, t.TempDir(), "--target", root, "--floor", "0", "--max-in-flight", "8", "--log-level", "info")
	}
	pods := []*workerProcess{startWorkerProcess(t, args()...), startWorkerProcess(t, args()...)}
	began := time.Now()
	waitQueueEmpty(t, natsURL, root, n, 15*time.Minute, multiLog(pods))
	t.Logf("pods stored %d jobs in %s", n, time.Since(began).Round(time.Millisecond))
	waitFor(t, 30*time.Second, "both pods announced", func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		ps, err := replay.LivePods(ctx, js)
		return err == nil && len(ps) == 2
	})
	served := 0
	for _, o := range origins {
		served += o.count()
	}

	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	began = time.Now()
	r := <-runReplayIn(ctx, "--nats-url", natsURL, "--target", root, "--progress", "none", "--allow-private-networks")
	took := time.Since(began)
	if r.err != nil {
		t.Fatalf("replay: %v\n%s\n%s", r.err, r.stdout, r.stderr)
	}
	conds := 0
	for _, o := range origins {
		for _, q := range o.since(0) {
			if q.cond {
				conds++
			}
		}
	}
	m := regexp.MustCompile(`(\d+) unchanged`).FindStringSubmatch(r.stdout)
	t.Logf("replay of %d jobs beside 2 idle pods: %s, %.0f jobs/s; %d requests (%d conditional) at the origins, %d during the replay; %s",
		n, took.Round(time.Millisecond), float64(n)/took.Seconds(), func() int {
			k := 0
			for _, o := range origins {
				k += o.count()
			}
			return k
		}(), conds, func() int {
			k := 0
			for _, o := range origins {
				k += o.count()
			}
			return k - served
		}(), strings.TrimSpace(r.stdout))
	if m == nil || m[1] != fmt.Sprint(n) {
		t.Errorf("want %d unchanged: %s", n, r.stdout)
	}
	for _, p := range pods {
		if _, err := p.signalAndWait(t, syscall.SIGTERM, 30*time.Second); err != nil {
			t.Errorf("pod exit: %v", err)
		}
	}
}
