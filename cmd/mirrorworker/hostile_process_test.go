package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/mirrorworker/mirrorworker/jobs"
)

// publishRawJobs publishes job messages, each to the subject its parsed
// job names, creating the streams first as enqueue does.
func publishRawJobs(t *testing.T, natsURL string, raws []string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	nc, err := nats.Connect(natsURL)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
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
	nc, err := nats.Connect(natsURL)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
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
}

func newTrickler(t *testing.T) *trickler {
	tr := &trickler{inflight: make(chan struct{}, 64)}
	stop := make(chan struct{})
	tr.Server = httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		tr.inflight <- struct{}{}
		defer func() { <-tr.inflight }()
		w.Header().Set("Content-Length", "1000000")
		w.WriteHeader(http.StatusOK)
		tk := time.NewTicker(20 * time.Millisecond)
		defer tk.Stop()
		for range 1000000 {
			if _, err := w.Write([]byte("x")); err != nil {
				return
			}
			w.(http.Flusher).Flush()
			select {
			case <-r.Context().Done():
				return
			case <-stop:
				return
			case <-tk.C:
			}
		}
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
		"--min-transfer-rate", "1KiB", "--min-transfer-window", "500ms", "--log-level", "info")...)
	waitFor(t, 30*time.Second, "the trickling origins to hold all four fetch slots", func() bool {
		return len(slow[0].inflight)+len(slow[1].inflight) == 4
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
