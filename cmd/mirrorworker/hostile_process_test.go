package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/mirrorworker/mirrorworker/fetch/fetchtest"
	"github.com/mirrorworker/mirrorworker/jobs"
)

// publishRawJobs publishes job messages, each to the subject its parsed
// job names, creating the streams first as enqueue does.
func publishRawJobs(t *testing.T, natsURL string, raws []string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	js, closeConn := connectJS(t, natsURL)
	defer closeConn()
	if err := jobs.EnsureStreams(ctx, js, &jobs.StreamOptions{KeepExisting: true}); err != nil {
		t.Fatal(err)
	}
	for _, raw := range raws {
		j, err := jobs.Parse([]byte(raw))
		if err != nil {
			t.Fatalf("job %s: %v", raw, err)
		}
		if _, err := js.PublishAsync(j.Subject(), []byte(raw), jetstream.WithMsgID(j.ID)); err != nil {
			t.Fatalf("publish %s: %v", raw, err)
		}
	}
	select {
	case <-js.PublishAsyncComplete():
	case <-ctx.Done():
		t.Fatal("publish acks did not arrive")
	}
}

// deadLetters reads every record on MIRROR_DLQ.
func deadLetters(t *testing.T, natsURL string) []jobs.DeadLetter {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	js, closeConn := connectJS(t, natsURL)
	defer closeConn()
	s, err := js.Stream(ctx, jobs.DLQStream)
	if err != nil {
		t.Fatal(err)
	}
	info, err := s.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var out []jobs.DeadLetter
	for seq := info.State.FirstSeq; info.State.Msgs > 0 && seq <= info.State.LastSeq; seq++ {
		m, err := s.GetMsg(ctx, seq)
		if err != nil {
			t.Fatal(err)
		}
		var d jobs.DeadLetter
		if err := json.Unmarshal(m.Data, &d); err != nil {
			t.Fatal(err)
		}
		out = append(out, d)
	}
	return out
}

// trickler announces a large body and sends a byte every 20 ms until its
// client goes away; inflight counts the requests it holds.
type trickler struct {
	*httptest.Server
	inflight chan struct{} // one token per request in progress
	started  atomic.Int64  // requests begun
}

func newTrickler(t *testing.T) *trickler {
	tr := &trickler{inflight: make(chan struct{}, 64)}
	stop := make(chan struct{})
	trickle := fetchtest.Trickle(20*time.Millisecond, stop)
	tr.Server = httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		tr.started.Add(1)
		tr.inflight <- struct{}{}
		defer func() { <-tr.inflight }()
		trickle(w, r)
	}))
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	tr.Listener = ln
	tr.Start()
	t.Cleanup(func() {
		close(stop)
		tr.CloseClientConnections()
		tr.Close()
	})
	return tr
}

// TestProcessTrickleDoesNotStallHealthyJobs is issue 13's case 1 at the
// process level: trickling origins take every fetch slot of a real
// `mirrorworker run`; with a minimum transfer rate the healthy origin's
// jobs are all stored anyway, and the trickling jobs end as dead letters
// whose attempts say too_slow. Every line the process writes is JSON.
func TestProcessTrickleDoesNotStallHealthyJobs(t *testing.T) {
	if testing.Short() {
		t.Skip("starts worker processes")
	}
	t.Parallel()
	const n = 20
	natsURL := externalNATS(t)
	healthy := newObjectOrigin(t)
	slow := []*trickler{newTrickler(t), newTrickler(t)}
	var raws []string
	for i, tr := range slow {
		for k := range 2 {
			raws = append(raws, fmt.Sprintf(`{"id":"slow-%d-%d","url":"%s/slow/%d","target":"slow/%d-%d"}`, i, k, tr.URL, k, i, k))
		}
	}
	publishRawJobs(t, natsURL, raws)

	dataDir := t.TempDir()
	p := startWorkerProcess(t, workerArgs(natsURL, dataDir,
		"--concurrency", "4", "--max-in-flight", "2", "--failure-budget", "2",
		"--min-transfer-rate", "1KiB", "--min-transfer-window", "2s", "--log-level", "info")...)
	// Every slot taken by a trickle (on a loaded machine the four may not
	// overlap exactly: count the requests started, not the ones in flight).
	waitFor(t, 30*time.Second, "the trickling origins to take all four fetch slots", func() bool {
		return slow[0].started.Load()+slow[1].started.Load() >= 4
	})
	publishObjects(t, natsURL, healthy, n)

	root := p.start.Mirror
	waitFor(t, 60*time.Second, "every healthy job stored", func() bool {
		c := 0
		for k := range mirrorFiles(t, root) {
			if strings.HasPrefix(k, "objects/") {
				c++
			}
		}
		return c == n
	})
	waitFor(t, 60*time.Second, "the trickling jobs dead-lettered", func() bool { return len(deadLetters(t, natsURL)) == 4 })
	for _, d := range deadLetters(t, natsURL) {
		if d.Reason != jobs.ReasonBudgetExhausted || len(d.Attempts) != 2 || d.Attempts[1].Reason != "too_slow" {
			t.Errorf("dead letter %s: %s, attempts %+v; want budget_exhausted after 2 too_slow attempts", d.JobID, d.Reason, d.Attempts)
		}
	}
	if _, err := p.signalAndWait(t, syscall.SIGTERM, 30*time.Second); err != nil {
		t.Fatalf("exit after SIGTERM: %v", err)
	}
	checkMirrorObjects(t, root, n)
	for _, line := range strings.Split(strings.TrimSpace(p.log.String()), "\n") {
		var m map[string]any
		if json.Unmarshal([]byte(line), &m) != nil {
			t.Errorf("a line on stderr is not JSON: %q", line)
		}
	}
	if !strings.Contains(p.log.String(), `"reason":"too_slow"`) || !strings.Contains(p.log.String(), `"retry_in":"`) {
		t.Errorf("no retry line with reason too_slow and a duration string in the log")
	}
}

// checkMirrorObjects checks the healthy objects 0..n-1 byte for byte.
func checkMirrorObjects(t *testing.T, root string, n int) {
	t.Helper()
	files := mirrorFiles(t, root)
	for i := range n {
		if got, want := files[objectKey(i)], objectBody(i); string(got) != string(want) {
			t.Errorf("%s: %d bytes, want %d exactly as served", objectKey(i), len(got), len(want))
		}
	}
}

// TestProcessFullDiskCostsNoBudget is issue 13's case 2 at the process
// level, with a real full file system: the mirror target is a 2 MiB tmpfs
// that ten 512 KiB objects cannot fit. The worker dead-letters nothing
// (with a failure budget of 3), /readyz answers 503 naming "no space left
// on device", the log and the metrics name ENOSPC; once the tmpfs is grown
// the worker resumes by itself and stores everything. Mounting needs root,
// so elsewhere the test is skipped; worker.TestFullTargetCostsNoBudget
// covers the same behaviour with a fault-injecting target everywhere.
func TestProcessFullDiskCostsNoBudget(t *testing.T) {
	if testing.Short() {
		t.Skip("starts worker processes")
	}
	t.Parallel()
	mnt := t.TempDir()
	if err := syscall.Mount("tmpfs", mnt, "tmpfs", 0, "size=2m"); err != nil {
		t.Skipf("cannot mount a tmpfs (needs root): %v", err)
	}
	t.Cleanup(func() {
		if err := syscall.Unmount(mnt, syscall.MNT_DETACH); err != nil {
			t.Errorf("unmount %s: %v", mnt, err)
		}
	})
	const n, size = 10, 512 << 10
	bodyOf := func(i int) []byte { return []byte(strings.Repeat(string(rune('a'+i)), size)) }
	origin := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var i int
		if _, err := fmt.Sscanf(r.URL.Path, "/big/%d", &i); err != nil || i < 0 || i >= n {
			http.NotFound(w, r)
			return
		}
		w.Header().Set("Content-Length", fmt.Sprint(size))
		w.Write(bodyOf(i))
	}))
	t.Cleanup(origin.Close)
	natsURL := externalNATS(t)
	var raws []string
	for i := range n {
		raws = append(raws, fmt.Sprintf(`{"id":"big-%d","url":"%s/big/%d","target":"big/%d.bin"}`, i, origin.URL, i, i))
	}
	publishRawJobs(t, natsURL, raws)

	p := startWorkerProcess(t, workerArgs(natsURL, t.TempDir(), "--target", "file://"+mnt,
		"--failure-budget", "3", "--log-level", "info")...)
	get := func(path string) (int, string) {
		resp, err := http.Get(p.start.AdminURL + path)
		if err != nil {
			return 0, err.Error()
		}
		defer resp.Body.Close()
		var b strings.Builder
		_, _ = io.Copy(&b, resp.Body)
		return resp.StatusCode, b.String()
	}
	waitFor(t, 60*time.Second, "/readyz to answer 503 naming the full disk", func() bool {
		code, body := get("/readyz")
		return code == http.StatusServiceUnavailable && strings.Contains(body, "no space left on device")
	})
	if _, m := get("/metrics"); !strings.Contains(m, `mirrorworker_target_failures_total{error="ENOSPC"}`) || !strings.Contains(m, "mirrorworker_target_up 0") {
		t.Errorf("metrics do not show the full disk")
	}
	if !strings.Contains(p.log.String(), `"error_code":"ENOSPC"`) || !strings.Contains(p.log.String(), "no space left on device") {
		t.Errorf("the log does not name the error")
	}
	if dls := deadLetters(t, natsURL); len(dls) != 0 {
		t.Fatalf("%d dead letters while the disk was full, first %+v", len(dls), dls[0])
	}

	// Free space: grow the tmpfs. The worker finds out by probing.
	if err := syscall.Mount("tmpfs", mnt, "tmpfs", syscall.MS_REMOUNT, "size=64m"); err != nil {
		t.Fatalf("grow the tmpfs: %v", err)
	}
	waitFor(t, 120*time.Second, "every object stored after space was freed", func() bool {
		return len(mirrorFiles(t, mnt)) == n
	})
	for i := range n {
		if got := mirrorFiles(t, mnt)[fmt.Sprintf("big/%d.bin", i)]; string(got) != string(bodyOf(i)) {
			t.Errorf("big/%d.bin: %d bytes, want %d exactly as served", i, len(got), size)
		}
	}
	waitFor(t, 30*time.Second, "/readyz to answer 200 again", func() bool {
		code, _ := get("/readyz")
		return code == http.StatusOK
	})
	if dls := deadLetters(t, natsURL); len(dls) != 0 {
		t.Fatalf("%d dead letters, first %+v", len(dls), dls[0])
	}
	if _, err := p.signalAndWait(t, syscall.SIGTERM, 30*time.Second); err != nil {
		t.Fatalf("exit after SIGTERM: %v", err)
	}
}
