package main

// Process tests of issue 26's first-week defects: a bad NATS credentials
// file, commands that must find their own worker, and a replay that must
// leave the live dead-letter queue alone and end.

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/mirrorworker/mirrorworker/broker"
	"github.com/mirrorworker/mirrorworker/broker/brokertest"
	"github.com/mirrorworker/mirrorworker/jobs"
	"github.com/mirrorworker/mirrorworker/replay"
)

// TestProcessBadNATSCredentials: a worker given a credentials file that is
// missing, unreadable (a directory here: the test may run as root, who
// reads any file) or a placeholder, or credentials the server refuses,
// exits with an error that names the file or the user and the server's
// words; it does not hang at "connecting to NATS".
func TestProcessBadNATSCredentials(t *testing.T) {
	if testing.Short() {
		t.Skip("starts worker processes")
	}
	t.Parallel()
	natsURL := externalNATS(t)
	authURL := brokertest.StartWithPassword(t, "mirror", "s3cret")
	dir := t.TempDir()
	placeholder := filepath.Join(dir, "placeholder.creds")
	if err := os.WriteFile(placeholder, []byte("# replace with the .creds file of your NATS account\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	missing := filepath.Join(dir, "mirrorworker.creds")
	tests := []struct {
		name string
		url  string
		args []string
		want []string
	}{
		{"missing file", natsURL, []string{"--nats-creds", missing}, []string{"credentials file", missing, "no such file"}},
		{"unreadable file", natsURL, []string{"--nats-creds", dir}, []string{"credentials file", dir, "is a directory"}},
		{"placeholder", natsURL, []string{"--nats-creds", placeholder}, []string{placeholder, "no NATS user JWT"}},
		{"refused authorization", authURL, []string{"--nats-user", "mirror", "--nats-password", "wrong"}, []string{"Authorization Violation", `user "mirror"`}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t0 := time.Now()
			_, stderr, exit := runProcess(t, append([]string{"run"}, workerArgs(tt.url, t.TempDir(), tt.args...)...)...)
			took := time.Since(t0)
			if exit != 1 {
				t.Fatalf("exit %d, want 1; stderr:\n%s", exit, stderr)
			}
			last := lastLine(stderr)
			for _, w := range tt.want {
				if !strings.Contains(last, w) {
					t.Errorf("last line %q does not say %q", last, w)
				}
			}
			t.Logf("exited after %s: %s", took.Round(time.Millisecond), last)
		})
	}
}

func lastLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return lines[len(lines)-1]
}

// TestProcessCommandsFindWorkerByDataDir: with --data-dir and no
// --nats-url, enqueue, status and dlq reach the embedded server of the
// worker running on that directory (on a random port, not 4222), and say
// which server and stream they used; once the worker is gone, they say no
// worker runs there instead of reaching some other server.
func TestProcessCommandsFindWorkerByDataDir(t *testing.T) {
	if testing.Short() {
		t.Skip("starts worker processes")
	}
	t.Parallel()
	dataDir := t.TempDir()
	w := startWorkerProcess(t, "--data-dir", dataDir, "--embedded-listen", "127.0.0.1:0", "--admin-addr", "127.0.0.1:0", "--log-level", "debug")
	if !strings.HasPrefix(w.start.NATSURL, "nats://127.0.0.1:") || strings.HasSuffix(w.start.NATSURL, ":4222") {
		t.Fatalf("the worker's NATS URL %q", w.start.NATSURL)
	}
	if u, err := broker.ReadClientURL(dataDir); err != nil || u != w.start.NATSURL {
		t.Fatalf("%s holds %q (%v), want %q", broker.ClientURLFile, u, err, w.start.NATSURL)
	}
	using := "using NATS " + w.start.NATSURL + " (the worker of --data-dir " + dataDir + ")"

	// A job that the worker dead-letters at once (a loopback URL, without
	// --allow-private-networks): it shows that the job reached this worker.
	stdout, stderr, exit := runProcess(t, "enqueue", "--data-dir", dataDir, "http://127.0.0.1:9/found-by-data-dir")
	if exit != 0 || stdout != "accepted 1\n" || !strings.HasPrefix(stderr, using+", stream "+jobs.JobsStream+"\n") {
		t.Fatalf("enqueue: exit %d, stdout %q, stderr %q", exit, stdout, stderr)
	}
	waitFor(t, 30*time.Second, "the dead letter of the enqueued job", func() bool {
		return w.log.logLine("job dead-lettered", map[string]string{"reason": "destination_refused"}) != nil
	})
	stdout, stderr, exit = runProcess(t, "dlq", "list", "--data-dir", dataDir)
	if exit != 0 || !strings.Contains(stdout, "/found-by-data-dir") || !strings.HasPrefix(stderr, using+", stream "+jobs.DLQStream+"\n") {
		t.Fatalf("dlq list: exit %d, stdout %q, stderr %q", exit, stdout, stderr)
	}
	stdout, stderr, exit = runProcess(t, "status", "--data-dir", dataDir)
	if exit != 0 || !strings.Contains(stdout, "POD") || !strings.HasPrefix(stderr, using) {
		t.Fatalf("status: exit %d, stdout %q, stderr %q", exit, stdout, stderr)
	}
	// -v says it also when --nats-url names the server.
	_, stderr, exit = runProcess(t, "status", "-v", "--nats-url", w.start.NATSURL)
	if exit != 0 || !strings.HasPrefix(stderr, "using NATS "+w.start.NATSURL+" (--nats-url)") {
		t.Fatalf("status -v: exit %d, stderr %q", exit, stderr)
	}

	if _, err := w.signalAndWait(t, syscall.SIGTERM, 30*time.Second); err != nil {
		t.Fatalf("worker exit: %v", err)
	}
	if _, err := broker.ReadClientURL(dataDir); err == nil {
		t.Fatalf("%s left behind by a stopped worker", broker.ClientURLFile)
	}
	_, stderr, exit = runProcess(t, "status", "--data-dir", dataDir)
	if exit != 1 || !strings.Contains(stderr, "no running worker with an embedded NATS server in "+dataDir) ||
		!strings.Contains(stderr, "is not running, and its embedded NATS server, which holds the queue") ||
		!strings.Contains(stderr, "start it again with 'mirrorworker run --data-dir "+dataDir+"'") {
		t.Fatalf("status of a stopped worker's data dir: exit %d, stderr %q", exit, stderr)
	}
}

// TestProcessReplayKeepsTheLiveDLQ: the README's replay into a new target,
// run without --allow-private-networks while the live worker stored the
// jobs with it: every job fails in the replay, but its dead letters go to
// the replay's own stream, the live MIRROR_DLQ stays empty, the replay
// ends, and a dry run afterwards reports no job dead-lettered. The live
// worker is stopped first: beside a live pod the pod would do the work
// (docs/adr/0025, TestProcessReplayBesideLivePods).
func TestProcessReplayKeepsTheLiveDLQ(t *testing.T) {
	if testing.Short() {
		t.Skip("starts worker processes")
	}
	t.Parallel()
	const n = 5
	natsURL := externalNATS(t)
	origin := newObjectOrigin(t)
	publishObjects(t, natsURL, origin, n)
	live := t.TempDir()
	w := startWorkerProcess(t, workerArgs(natsURL, live)...)
	waitDrained(t, natsURL, filepath.Join(live, "mirror"), n, 60*time.Second, w.log)
	if _, err := w.signalAndWait(t, syscall.SIGTERM, 30*time.Second); err != nil {
		t.Fatalf("worker exit: %v", err)
	}

	// The dry run says which authorities such a replay refuses.
	stdout, stderr, exit := runProcess(t, "replay", "--nats-url", natsURL, "--dry-run")
	if exit != 0 || !strings.Contains(stdout, "a loopback address: a replay without --allow-private-networks refuses it") {
		t.Errorf("dry run before the replay: exit %d, stdout %q, stderr %q", exit, stdout, stderr)
	}
	stdout, stderr, exit = runProcess(t, "replay", "--nats-url", natsURL, "--data-dir", live,
		"--target", t.TempDir(), "--floor", "0", "--progress", "none")
	if exit != 0 {
		t.Fatalf("replay: exit %d, stdout %q, stderr %q", exit, stdout, stderr)
	}
	if !strings.Contains(stdout, "dlq list --replays") || !strings.Contains(stdout, "the live "+jobs.DLQStream+" is untouched") {
		t.Errorf("the replay's summary does not say where its dead letters are: %q", stdout)
	}
	if !strings.Contains(stdout, "by reason: destination_refused 5") || !strings.Contains(stdout, "pass it to the replay too") {
		t.Errorf("the replay's summary does not say why its jobs failed and what to pass: %q", stdout)
	}
	js, closeConn := connectJS(t, natsURL)
	defer closeConn()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	dlq, err := js.Stream(ctx, jobs.DLQStream)
	if err != nil {
		t.Fatal(err)
	}
	if got := dlq.CachedInfo().State.Msgs; got != 0 {
		t.Errorf("the live %s holds %d records after the replay, want 0", jobs.DLQStream, got)
	}
	rdlq, err := js.Stream(ctx, replay.DeadLetterStream)
	if err != nil {
		t.Fatal(err)
	}
	if got := rdlq.CachedInfo().State.Msgs; got != n {
		t.Errorf("%s holds %d records, want %d", replay.DeadLetterStream, got, n)
	}
	stdout, _, exit = runProcess(t, "dlq", "list", "--replays", "--nats-url", natsURL)
	if exit != 0 || !strings.Contains(stdout, "destination_refused") || !strings.Contains(stdout, "5 dead letters") {
		t.Errorf("dlq list --replays: exit %d, stdout %q", exit, stdout)
	}
	stdout, _, exit = runProcess(t, "replay", "--nats-url", natsURL, "--dry-run")
	if exit != 0 || strings.Contains(stdout, "dead-lettered") {
		t.Errorf("dry run after the replay: exit %d, stdout %q", exit, stdout)
	}
}
