package main

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"
)

// runProcess runs the command as its own OS process (this test binary as
// main) and returns its output and exit status.
func runProcess(t *testing.T, args ...string) (stdout, stderr string, exit int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, os.Args[0], args...)
	env := []string{asMainEnv + "=1"}
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "MIRRORWORKER_") {
			env = append(env, kv)
		}
	}
	cmd.Env = env
	var o, e bytes.Buffer
	cmd.Stdout, cmd.Stderr = &o, &e
	err := cmd.Run()
	if ctx.Err() != nil {
		t.Fatalf("%q did not finish within 60 s; stderr:\n%s", args, e.String())
	}
	if cmd.ProcessState == nil {
		t.Fatalf("%q: %v", args, err)
	}
	return o.String(), e.String(), cmd.ProcessState.ExitCode()
}

// logLine returns the first JSON log line with message msg whose fields
// include want (string values), or nil.
func (l *logWatch) logLine(msg string, want map[string]string) map[string]any {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, line := range l.lines {
		var m map[string]any
		if json.Unmarshal([]byte(line), &m) != nil || m["message"] != msg {
			continue
		}
		ok := true
		for k, v := range want {
			if s, _ := m[k].(string); !strings.Contains(s, v) {
				ok = false
			}
		}
		if ok {
			return m
		}
	}
	return nil
}

// TestProcessNewcomerQuickStart follows the README's quick start with real
// processes: a worker on its embedded NATS, a local origin, `enqueue` with
// flags after the URL. Without --allow-private-networks, enqueue warns and
// the worker's dead-letter line names the flag; restarted with the flag
// (make run RUN_ARGS=...), the same URL is a duplicate, said so with what
// to do; a new --id stores the file at <host>_<port>/<path>. The logs have
// millisecond timestamps and durations with units.
func TestProcessNewcomerQuickStart(t *testing.T) {
	if testing.Short() {
		t.Skip("starts worker processes")
	}
	t.Parallel()
	origin := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/pub/hello.txt" {
			http.NotFound(w, r)
			return
		}
		w.Write([]byte("hello\n"))
	}))
	defer origin.Close()
	u, err := url.Parse(origin.URL)
	if err != nil {
		t.Fatal(err)
	}
	fileURL := origin.URL + "/pub/hello.txt"
	dataDir := t.TempDir()
	common := []string{"--data-dir", dataDir, "--embedded-listen", "127.0.0.1:0", "--admin-addr", "127.0.0.1:0", "--floor", "0"}

	// 1. The worker as `make run` starts it, without the flag.
	w1 := startWorkerProcess(t, common...)
	stdout, stderr, exit := runProcess(t, "enqueue", fileURL, "--nats-url", w1.start.NATSURL)
	if exit != 0 || stdout != "accepted 1\n" {
		t.Fatalf("enqueue: exit %d, stdout %q, stderr %q", exit, stdout, stderr)
	}
	if !strings.Contains(stderr, "warning: argument 1: 127.0.0.1 is a loopback address: a worker refuses it (dead letter destination_refused) unless it runs with --allow-private-networks (make run RUN_ARGS=--allow-private-networks)") {
		t.Errorf("enqueue did not warn about the loopback URL: %q", stderr)
	}
	var dead map[string]any
	waitFor(t, 30*time.Second, "the dead-letter log line", func() bool {
		dead = w1.log.logLine("job dead-lettered", map[string]string{"reason": "destination_refused"})
		return dead != nil
	})
	if d, _ := dead["error"].(string); !strings.Contains(d, "run the worker with --allow-private-networks") {
		t.Errorf("the dead-letter line does not say how to allow it: %v", dead)
	}
	if _, err := w1.signalAndWait(t, syscall.SIGTERM, 30*time.Second); err != nil {
		t.Fatalf("worker 1 exit: %v", err)
	}

	// 2. `make run RUN_ARGS=--allow-private-networks`, on the same data.
	w2 := startWorkerProcess(t, append(common, "--allow-private-networks")...)
	// The worker announces the flag in MIRROR_PODS once it holds its
	// partitions; enqueue believes it and does not warn (issue 36 item 6).
	waitFor(t, 30*time.Second, "worker 2's partitions", func() bool { return w2.log.logLine("partitions taken", nil) != nil })
	stdout, stderr, exit = runProcess(t, "enqueue", fileURL, "--nats-url", w2.start.NATSURL)
	if exit != 0 || stdout != "accepted 1 (1 duplicate)\n" {
		t.Fatalf("enqueue again: exit %d, stdout %q, stderr %q", exit, stdout, stderr)
	}
	if strings.Contains(stderr, "warning") {
		t.Errorf("enqueue warned although the worker runs with --allow-private-networks: %q", stderr)
	}
	if !strings.Contains(stderr, "To fetch it again now, pass a new --id; or wait 2m0s") {
		t.Errorf("the duplicate is not explained: %q", stderr)
	}
	stdout, stderr, exit = runProcess(t, "enqueue", fileURL, "--id", "hello-2", "--nats-url", w2.start.NATSURL)
	if exit != 0 || stdout != "accepted 1\n" {
		t.Fatalf("enqueue --id: exit %d, stdout %q, stderr %q", exit, stdout, stderr)
	}
	stored := filepath.Join(dataDir, "mirror", u.Hostname()+"_"+u.Port(), "pub", "hello.txt")
	waitFor(t, 30*time.Second, stored, func() bool {
		b, err := os.ReadFile(stored)
		return err == nil && string(b) == "hello\n"
	})
	if _, err := w2.signalAndWait(t, syscall.SIGTERM, 30*time.Second); err != nil {
		t.Fatalf("worker 2 exit: %v", err)
	}

	// The logs a stranger reads: milliseconds, and units on durations.
	restore := w2.log.logLine("restore pacer: replayed pacer facts from MIRROR_EVENTS", nil)
	if restore == nil {
		t.Fatalf("no restore line in the log:\n%s", w2.log)
	}
	if ts, _ := restore["time"].(string); !regexp.MustCompile(`^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}`).MatchString(ts) {
		t.Errorf("timestamp %q has no milliseconds", ts)
	}
	if w, _ := restore["window"].(string); w != "30m0s" {
		t.Errorf("window = %v, want the duration string \"30m0s\"", restore["window"])
	}
}
