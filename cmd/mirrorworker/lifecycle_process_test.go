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
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/mirrorworker/mirrorworker/broker"
	"github.com/mirrorworker/mirrorworker/mirror"
	"github.com/mirrorworker/mirrorworker/worker"
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

// slowOrigin streams a body it says is slowBodySize bytes long, a little
// at a time, until its client goes away: a download that outlives any
// grace. It counts the requests it gets.
type slowOrigin struct {
	*httptest.Server
	requests atomic.Int64
	sent     atomic.Int64 // body bytes written, over every request
}

const slowBodySize = 500_000_000

func newSlowOrigin(t *testing.T) *slowOrigin {
	o := &slowOrigin{}
	o.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		o.requests.Add(1)
		w.Header().Set("Content-Length", strconv.Itoa(slowBodySize))
		w.WriteHeader(http.StatusOK)
		chunk := make([]byte, 64<<10)
		tick := time.NewTicker(20 * time.Millisecond) // about 3 MB/s: a pace, not a wait for time to pass
		defer tick.Stop()
		for {
			select {
			case <-r.Context().Done():
				return
			case <-tick.C:
			}
			if _, err := w.Write(chunk); err != nil {
				return
			}
			w.(http.Flusher).Flush()
			o.sent.Add(int64(len(chunk)))
		}
	}))
	t.Cleanup(o.Close)
	return o
}

// TestProcessCtrlCDuringALongDownload: SIGINT during a download that
// outlives the grace says at once what the stop waits for (the URL, the
// bytes so far of the size, the grace left), and says it again while it
// waits; a second SIGINT ends the process at once with a non-zero exit,
// the job handed back (handed_back=1) and no temporary file left; a
// worker started right after fetches the job at once, not after the ack
// wait (the NAK reached the server before the connection closed). The
// admin endpoint serves /metrics throughout the grace: it stops last.
func TestProcessCtrlCDuringALongDownload(t *testing.T) {
	if testing.Short() {
		t.Skip("starts worker processes")
	}
	t.Parallel()
	natsURL := externalNATS(t)
	origin := newSlowOrigin(t)
	root := t.TempDir()
	const ackWait = 60 * time.Second
	args := func() []string {
		return workerArgs(natsURL, t.TempDir(), "--target", root, "--shutdown-grace", "2m", "--ack-wait", ackWait.String())
	}
	first := startWorkerProcess(t, args()...)
	fileURL := origin.URL + "/big.iso"
	if stdout, stderr, exit := runProcess(t, "enqueue", "--nats-url", natsURL, fileURL); exit != 0 {
		t.Fatalf("enqueue: exit %d, stdout %q, stderr %q", exit, stdout, stderr)
	}
	waitFor(t, 30*time.Second, "a megabyte of the body sent", func() bool { return origin.sent.Load() >= 1<<20 })

	if err := first.cmd.Process.Signal(syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	waiting := func() []string {
		var out []string
		for _, line := range strings.Split(first.log.String(), "\n") {
			if strings.Contains(line, `"message":"waiting up to `) {
				out = append(out, line)
			}
		}
		return out
	}
	waitFor(t, 10*time.Second, "the stop's report of the fetch in flight", func() bool { return len(waiting()) >= 1 })
	report := waiting()[0]
	for _, want := range []string{"for 1 fetch in flight: " + fileURL + " (", "of 476.8 MiB)", "waiting up to 2m0s", "a second Ctrl-C"} {
		if !strings.Contains(report, want) {
			t.Errorf("the stop's report %s does not say %q", report, want)
		}
	}
	// The admin endpoint stops last (pipeline.StageAdmin): while the
	// worker waits for its fetch, /metrics still answers.
	if res, err := http.Get(first.start.AdminURL + "/metrics"); err != nil {
		t.Errorf("/metrics during the stop's grace: %v, want it served until the worker is done", err)
	} else {
		res.Body.Close()
		if res.StatusCode != http.StatusOK {
			t.Errorf("/metrics during the stop's grace: %s", res.Status)
		}
	}
	if !strings.Contains(first.log.String(), "stopping: the worker first") {
		t.Errorf("no line says what the stop does")
	}
	waitFor(t, 3*worker.ShutdownReportEvery, "the report said again", func() bool { return len(waiting()) >= 2 })
	t.Logf("reports: %s", strings.Join(waiting(), "\n"))

	took, err := first.signalAndWait(t, syscall.SIGINT, 15*time.Second)
	if err == nil {
		t.Errorf("a stop ended by a second SIGINT exited 0")
	}
	t.Logf("exited %s after the second SIGINT: %v", took.Round(time.Millisecond), err)
	if l := first.log.logLine("worker stopped", nil); l == nil || l["handed_back"] != float64(1) {
		t.Errorf("the worker's stop line %v, want handed_back 1", l)
	}
	if !strings.Contains(first.log.String(), "stopped at once by a second signal") {
		t.Errorf("the last line does not say the stop was cut short")
	}
	if left, err := os.ReadDir(filepath.Join(root, mirror.ReservedDir, "tmp")); err != nil || len(left) != 0 {
		t.Errorf("temporary files after the stop: %v, %v", left, err)
	}

	t0 := time.Now()
	startWorkerProcess(t, args()...)
	waitFor(t, ackWait/2, "the second worker's request for the handed-back job", func() bool { return origin.requests.Load() >= 2 })
	t.Logf("the second worker asked for the job %s after it started (ack wait %s)", time.Since(t0).Round(time.Millisecond), ackWait)
}
