package main

// Process tests of issue 36's lifecycle defects: two workers on one data
// directory, and Ctrl-C during a long download.

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/mirrorworker/mirrorworker/broker"
)

// TestProcessSecondWorkerOnOneDataDir: a second `run` on a data directory
// whose worker runs its embedded server there, with its own admin and NATS
// addresses (what the port-clash error suggests), exits 1 at once, naming
// the first's pid and how to join it; the first keeps working (a job
// enqueued afterwards is stored) and keeps its nats-client.url.
func TestProcessSecondWorkerOnOneDataDir(t *testing.T) {
	if testing.Short() {
		t.Skip("starts worker processes")
	}
	t.Parallel()
	origin := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Write([]byte("after the second\n"))
	}))
	defer origin.Close()
	dataDir := t.TempDir()
	common := []string{"--data-dir", dataDir, "--embedded-listen", "127.0.0.1:0", "--admin-addr", "127.0.0.1:0", "--floor", "0"}
	first := startWorkerProcess(t, append(common, "--allow-private-networks")...)

	t0 := time.Now()
	_, stderr, exit := runProcess(t, append([]string{"run"}, common...)...)
	took := time.Since(t0)
	if exit != 1 {
		t.Fatalf("second worker: exit %d, want 1; stderr:\n%s", exit, stderr)
	}
	last := lastLine(stderr)
	for _, want := range []string{
		"data dir " + dataDir + " is in use",
		fmt.Sprintf("pid %d", first.cmd.Process.Pid),
		"--nats-url " + first.start.NATSURL,
	} {
		if !strings.Contains(last, want) {
			t.Errorf("the second worker's error %q does not say %q", last, want)
		}
	}
	t.Logf("second worker exited after %s: %s", took.Round(time.Millisecond), last)
	if u, err := broker.ReadClientURL(dataDir); err != nil || u != first.start.NATSURL {
		t.Fatalf("%s after the second worker: %q, %v; want the first's %q", broker.ClientURLFile, u, err, first.start.NATSURL)
	}

	fileURL := origin.URL + "/pub/after.txt"
	if stdout, stderr, exit := runProcess(t, "enqueue", "--data-dir", dataDir, fileURL); exit != 0 {
		t.Fatalf("enqueue: exit %d, stdout %q, stderr %q", exit, stdout, stderr)
	}
	u, _ := url.Parse(origin.URL)
	stored := filepath.Join(dataDir, "mirror", u.Hostname()+"_"+u.Port(), "pub", "after.txt")
	waitFor(t, 30*time.Second, stored, func() bool {
		b, err := os.ReadFile(stored)
		return err == nil && string(b) == "after the second\n"
	})
	if _, err := first.signalAndWait(t, syscall.SIGTERM, 30*time.Second); err != nil {
		t.Fatalf("first worker exit: %v", err)
	}
	if strings.Contains(first.log.String(), "corrupt") {
		t.Errorf("the first worker's log speaks of corruption:\n%s", first.log)
	}
}
