package main

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/mirrorworker/mirrorworker/authority"
	"github.com/mirrorworker/mirrorworker/jobs"
)

type replayResult struct {
	err            error
	stdout, stderr string
}

func runReplayCmd(t *testing.T, args ...string) replayResult {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 40*time.Second)
	defer cancel()
	var stdout, stderr bytes.Buffer
	err := run(ctx, append([]string{"replay"}, args...), func(string) string { return "" }, strings.NewReader(""), &stdout, &stderr)
	return replayResult{err, stdout.String(), stderr.String()}
}

func TestReplayUsageErrors(t *testing.T) {
	tests := []struct {
		name string
		args []string
		want string
	}{
		{"two start options", []string{"--from-seq", "5", "--since", "1h"}, "--from-seq and --since are mutually exclusive"},
		{"sequence zero", []string{"--from-seq", "0"}, `--from-seq "0" is not a stream sequence`},
		{"bad since", []string{"--since", "yesterday"}, `--since "yesterday" is not a duration (e.g. 90m, 24h, 7d)`},
		{"negative since", []string{"--since", "-2h"}, `--since "-2h" must be positive`},
		{"bad time", []string{"--from-time", "29/11/2026"}, `--from-time "29/11/2026" is not an RFC 3339 time`},
		{"future time", []string{"--from-time", "2999-01-01T00:00:00Z"}, "is in the future"},
		{"bare host", []string{"--authority", "files.example.org"}, `--authority "files.example.org": give a URL (https://host/...) or host:port`},
		{"bad tenant", []string{"--tenant", "ACME"}, `--tenant "ACME"`},
		{"bad floor", []string{"--floor", "soon"}, `--floor "soon": want a duration, like 1s`},
		{"short restore window", []string{"--restore-window", "1m"}, "--restore-window 1m0s: want at least 30m0s"},
		{"bad progress", []string{"--progress", "fancy"}, `--progress "fancy"`},
		{"stray argument", []string{"https://files.example.org/"}, "unexpected arguments"},
		{"several at once", []string{"--from-seq", "x", "--authority", "nohost", "--concurrency", "0"}, `--from-seq "x" is not a stream sequence`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := runReplayCmd(t, tt.args...)
			if exitCode(r.err) != 2 || !strings.Contains(r.err.Error()+r.stderr, tt.want) {
				t.Errorf("exit %d, error %v, stderr %q; want exit 2 mentioning %q", exitCode(r.err), r.err, r.stderr, tt.want)
			}
			if r.stdout != "" {
				t.Errorf("stdout %q", r.stdout)
			}
		})
	}
}

func TestReplayNoServer(t *testing.T) {
	r := runReplayCmd(t, "--nats-url", "nats://127.0.0.1:1", "--nats-connect-timeout", "200ms", "--dry-run")
	if exitCode(r.err) != 1 || !strings.Contains(r.err.Error(), "connect nats nats://127.0.0.1:1") {
		t.Fatalf("exit %d, error %v", exitCode(r.err), r.err)
	}
}

func TestReplayNoStreams(t *testing.T) {
	url, _ := enqueueServer(t) // a server on which no worker ever ran
	r := runReplayCmd(t, "--nats-url", url, "--dry-run")
	if exitCode(r.err) != 1 || !strings.Contains(r.err.Error(), "no stream MIRROR_JOBS") {
		t.Fatalf("exit %d, error %v", exitCode(r.err), r.err)
	}
}

// replayOrigin serves /n.bin with a body and an ETag and counts requests.
type replayOrigin struct {
	srv  *httptest.Server
	auth authority.Authority
	mu   sync.Mutex
	hits int
	cond int
	at   []time.Time // arrivals
}

func newReplayOrigin(t *testing.T) *replayOrigin {
	o := &replayOrigin{}
	o.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		o.mu.Lock()
		o.hits++
		o.at = append(o.at, time.Now())
		if r.Header.Get("If-None-Match") != "" {
			o.cond++
		}
		o.mu.Unlock()
		etag := `"` + r.URL.Path + `"`
		w.Header().Set("ETag", etag)
		if r.Header.Get("If-None-Match") == etag {
			w.WriteHeader(http.StatusNotModified)
			return
		}
		fmt.Fprintf(w, "body of %s%s", r.Host, r.URL.Path)
	}))
	t.Cleanup(o.srv.Close)
	a, err := authority.Parse(o.srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	o.auth = a
	return o
}

func (o *replayOrigin) counts() (hits, cond int) {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.hits, o.cond
}

// TestReplayCommand runs `mirrorworker replay` in-process against a NATS
// server holding jobs, as a user would after `mirrorworker run` and
// `mirrorworker enqueue`.
func TestReplayCommand(t *testing.T) {
	url, js := enqueueServer(t)
	ctx, cancel := context.WithTimeout(context.Background(), 40*time.Second)
	defer cancel()
	if err := jobs.EnsureStreams(ctx, js, nil); err != nil {
		t.Fatal(err)
	}
	a, b := newReplayOrigin(t), newReplayOrigin(t)
	for i := range 12 {
		o := a
		if i%3 == 2 {
			o = b
		}
		if _, err := jobs.Publish(ctx, js, jobs.Job{URL: fmt.Sprintf("%s/%d.bin", o.srv.URL, i)}); err != nil {
			t.Fatal(err)
		}
	}
	common := []string{"--nats-url", url, "--floor", "0", "--allow-private-networks", "--progress", "lines"}

	r := runReplayCmd(t, append(common, "--dry-run")...)
	if r.err != nil {
		t.Fatalf("dry run: %v\n%s", r.err, r.stderr)
	}
	for _, want := range []string{"dry run: 12 jobs would be replayed (from the beginning, mirror.jobs.>): 12 stream messages, sequences 1 to 12",
		a.auth.String() + " ", " 8 jobs\n", b.auth.String() + " ", " 4 jobs\n"} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("dry run output lacks %q:\n%s", want, r.stdout)
		}
	}
	if h, _ := a.counts(); h != 0 {
		t.Fatalf("the dry run fetched %d objects", h)
	}

	root := t.TempDir()
	r = runReplayCmd(t, append(common, "--target", root)...)
	if r.err != nil {
		t.Fatalf("replay: %v\n%s", r.err, r.stderr)
	}
	if !strings.Contains(r.stdout, "replayed 12 jobs") || !strings.Contains(r.stdout, "12 stored, 0 unchanged") {
		t.Errorf("replay output: %s", r.stdout)
	}
	if !strings.Contains(r.stderr, "replay: 12 jobs to handle") || !strings.Contains(r.stderr, "replay: 12/12 jobs (100%)") {
		t.Errorf("progress lines missing from stderr:\n%s", r.stderr)
	}
	for i := range 12 {
		o := a
		if i%3 == 2 {
			o = b
		}
		name := filepath.Join(root, o.auth.Host+"_"+o.auth.Port, fmt.Sprintf("%d.bin", i))
		got, err := os.ReadFile(name)
		want := fmt.Sprintf("body of %s/%d.bin", o.auth, i)
		if err != nil || string(got) != want {
			t.Errorf("%s = %q, %v; want %q", name, got, err, want)
		}
	}

	// Again over the same root, filtered to b: conditional requests to b only.
	r = runReplayCmd(t, append(common, "--target", root, "--authority", b.srv.URL+"/any/path")...)
	if r.err != nil {
		t.Fatalf("filtered replay: %v\n%s", r.err, r.stderr)
	}
	if !strings.Contains(r.stdout, "replayed 4 jobs") || !strings.Contains(r.stdout, "0 stored, 4 unchanged") {
		t.Errorf("filtered replay output: %s", r.stdout)
	}
	if h, c := a.counts(); h != 8 || c != 0 {
		t.Errorf("origin a: %d requests (%d conditional), want the first replay's 8 only", h, c)
	}
	if h, c := b.counts(); h != 8 || c != 4 {
		t.Errorf("origin b: %d requests (%d conditional), want 4 + 4 conditional", h, c)
	}
}

// TestReplayObeysAPauseGivenDuringIt: an operator's pause given while a
// replay runs reaches the replay's pacer as it reaches every pod: the
// paused authority gets no request after it, and the other goes on.
func TestReplayObeysAPauseGivenDuringIt(t *testing.T) {
	url, js := enqueueServer(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := jobs.EnsureStreams(ctx, js, nil); err != nil {
		t.Fatal(err)
	}
	a, b := newReplayOrigin(t), newReplayOrigin(t)
	const n = 10
	for i := range n {
		for _, o := range []*replayOrigin{a, b} {
			if _, err := jobs.Publish(ctx, js, jobs.Job{URL: fmt.Sprintf("%s/%d.bin", o.srv.URL, i)}); err != nil {
				t.Fatal(err)
			}
		}
	}
	rctx, stop := context.WithCancel(ctx)
	defer stop()
	done := make(chan replayResult, 1)
	go func() {
		var stdout, stderr bytes.Buffer
		err := run(rctx, []string{"replay", "--nats-url", url, "--floor", "300ms", "--allow-private-networks",
			"--progress", "lines", "--target", t.TempDir()}, func(string) string { return "" }, strings.NewReader(""), &stdout, &stderr)
		done <- replayResult{err, stdout.String(), stderr.String()}
	}()
	waitFor(t, 30*time.Second, "the replay's first requests to a", func() bool { h, _ := a.counts(); return h >= 2 })
	var out, errOut bytes.Buffer
	if err := run(ctx, []string{"pause", "--nats-url", url, "--authority", a.auth.String(), "--for", "10m", "--reason", "test"},
		func(string) string { return "" }, strings.NewReader(""), &out, &errOut); err != nil {
		t.Fatalf("pause: %v; %s", err, errOut.String())
	}
	paused := time.Now()
	// b's remaining jobs take 300 ms each after the pause: time for as many
	// of a's, had the pause not reached the replay.
	waitFor(t, 30*time.Second, "every job of b", func() bool { h, _ := b.counts(); return h >= n })
	stop()
	r := <-done
	if r.err == nil || !strings.Contains(r.err.Error(), "replay interrupted") {
		t.Errorf("replay stopped with %v, want interrupted (a's jobs wait for the pause)\n%s", r.err, r.stderr)
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	// A request whose permit was confirmed before the pause arrived may
	// still be on its way: 250 ms, less than the floor, allows for that.
	late := 0
	for _, at := range a.at {
		if at.After(paused.Add(250 * time.Millisecond)) {
			late++
		}
	}
	if late > 0 || len(a.at) >= n {
		t.Errorf("a got %d requests, %d of them after its pause; want none after it", len(a.at), late)
	}
	t.Logf("a: %d requests, %d of them after the pause; b: all %d", len(a.at), late, n)
}

// TestReplayDryRunCountsJobs: a job in the stream twice is one job (of two
// messages), a dead-lettered one says so, and authorities read as
// host:port.
func TestReplayDryRunCountsJobs(t *testing.T) {
	url, js := enqueueServer(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := jobs.EnsureStreams(ctx, js, nil); err != nil {
		t.Fatal(err)
	}
	var seqs []uint64
	for _, raw := range []string{
		`{"url":"http://127.0.0.1:18765/pub/hello.txt"}`,
		`{"url":"http://127.0.0.1:18765/pub/refused.txt"}`,
		`{"url":"http://127.0.0.1:18765/pub/hello.txt"}`, // again, after the duplicate window
	} {
		j, err := jobs.Parse([]byte(raw))
		if err != nil {
			t.Fatal(err)
		}
		ack, err := js.Publish(ctx, j.Subject(), []byte(raw)) // no message id: as after the window
		if err != nil {
			t.Fatal(err)
		}
		seqs = append(seqs, ack.Sequence)
	}
	dl := jobs.DeadLetter{Authority: "127.0.0.1:18765", StreamSeq: seqs[1], Reason: "destination_refused"}
	dl.SetJob([]byte(`{"url":"http://127.0.0.1:18765/pub/refused.txt"}`))
	if _, err := jobs.PublishDeadLetter(ctx, js, dl); err != nil {
		t.Fatal(err)
	}
	r := runReplayCmd(t, "--nats-url", url, "--dry-run")
	if r.err != nil {
		t.Fatalf("dry run: %v\n%s", r.err, r.stderr)
	}
	for _, want := range []string{
		"dry run: 2 jobs would be replayed (from the beginning, mirror.jobs.>): 3 stream messages, sequences 1 to 3\n",
		"  127.0.0.1:18765                  2 jobs (3 messages: some enqueued more than once), 1 dead-lettered (destination_refused 1); " +
			"a loopback address: a replay without --allow-private-networks refuses it (pass it if the live worker runs with it)\n",
		"Dead-lettered jobs are replayed too",
	} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("dry run output lacks %q:\n%s", want, r.stdout)
		}
	}
	if r := runReplayCmd(t, "--nats-url", url, "--dry-run", "--allow-private-networks"); r.err != nil || strings.Contains(r.stdout, "refuses it") {
		t.Errorf("dry run with --allow-private-networks: %v\n%s", r.err, r.stdout)
	}
	if strings.Contains(r.stdout, "127_0_0_1") {
		t.Errorf("an authority is shown as a subject token:\n%s", r.stdout)
	}
}

// TestProbeDefaultNATS: with nothing listening, replay fails at once and
// says to start the worker, instead of retrying for the connect timeout.
func TestProbeDefaultNATS(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	if err := probeDefaultNATS(context.Background(), "nats://"+addr); err != nil {
		t.Fatalf("with a listener: %v", err)
	}
	ln.Close()
	err = probeDefaultNATS(context.Background(), "nats://"+addr)
	if err == nil || !strings.Contains(err.Error(), "no NATS server at "+addr) || !strings.Contains(err.Error(), "start 'mirrorworker run' first") {
		t.Fatalf("without a listener: %v", err)
	}
}
