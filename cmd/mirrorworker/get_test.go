package main

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/mirrorworker/mirrorworker/internal/rxstamp"
)

// coolingOrigin answers its first request 429 with Retry-After, then 200,
// timing each arrival as the kernel received it.
type coolingOrigin struct {
	addr       string
	retryAfter int
	mu         sync.Mutex
	arr        []pathArrival
}

type pathArrival struct {
	at   time.Time
	path string
}

func newCoolingOrigin(t *testing.T, retryAfter int) *coolingOrigin {
	t.Helper()
	o := &coolingOrigin{retryAfter: retryAfter}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	o.addr = ln.Addr().String()
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		o.mu.Lock()
		o.arr = append(o.arr, pathArrival{rxstamp.Arrival(r), r.URL.Path})
		first := len(o.arr) == 1
		o.mu.Unlock()
		if first {
			w.Header().Set("Retry-After", fmt.Sprint(o.retryAfter))
			http.Error(w, "slow down", http.StatusTooManyRequests)
			return
		}
		fmt.Fprintf(w, "body of %s\n", r.URL.Path)
	})}
	go srv.Serve(rxstamp.Serve(srv, ln))
	t.Cleanup(func() { srv.Close() })
	return o
}

func (o *coolingOrigin) arrivals() []pathArrival {
	o.mu.Lock()
	defer o.mu.Unlock()
	return append([]pathArrival(nil), o.arr...)
}

// TestProcessGetWaitsOutTheCooldown is issue 37's get check: a pod (an OS
// process) whose job is answered 429 with Retry-After: 3, then `mirrorworker
// get` of another URL of the same origin during the cooldown. The origin
// sees no request while the cooldown lasts; get says it waits, waits it
// out, and writes the body.
func TestProcessGetWaitsOutTheCooldown(t *testing.T) {
	if testing.Short() {
		t.Skip("starts worker processes")
	}
	t.Parallel()
	const retryAfter = 3
	natsURL := externalNATS(t)
	origin := newCoolingOrigin(t, retryAfter)
	jobURL := "http://" + origin.addr + "/job"
	publishURLs(t, natsURL, map[string]string{jobURL: "job"}, []string{jobURL})
	pod := startWorkerProcess(t, workerArgs(natsURL, t.TempDir(), "--target", t.TempDir(),
		"--max-in-flight", "1", "--log-level", "info")...)
	waitFor(t, 60*time.Second, "the job's request", func() bool { return len(origin.arrivals()) > 0 })
	t429 := origin.arrivals()[0].at

	out := filepath.Join(t.TempDir(), "other.txt")
	var stdout, stderr bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	err := run(ctx, []string{"get", "--nats-url", natsURL, "--allow-private-networks", "-o", out, "http://" + origin.addr + "/other"},
		func(string) string { return "" }, strings.NewReader(""), &stdout, &stderr)
	if err != nil {
		t.Fatalf("get: %v\nstderr:\n%s\npod log:\n%s", err, &stderr, pod.log)
	}
	if b, err := os.ReadFile(out); err != nil || string(b) != "body of /other\n" {
		t.Errorf("-o file: %q, %v", b, err)
	}
	if !strings.Contains(stderr.String(), "waiting") || !strings.Contains(stderr.String(), origin.addr+" cooling until") {
		t.Errorf("get's stderr does not say it waits for the cooldown:\n%s", &stderr)
	}
	var early, gets int
	for _, a := range origin.arrivals()[1:] {
		if a.at.Before(t429.Add(retryAfter * time.Second)) {
			early++
			t.Errorf("%s arrived %s after the 429, within its Retry-After of %ds", a.path, a.at.Sub(t429), retryAfter)
		}
		if a.path == "/other" {
			gets++
			t.Logf("get's request arrived %s after the 429 (Retry-After %ds)", a.at.Sub(t429).Round(time.Millisecond), retryAfter)
		}
	}
	if gets != 1 {
		t.Errorf("the origin saw %d requests of get, want 1", gets)
	}
	t.Logf("get's stderr:\n%s", &stderr)
	if _, err := pod.signalAndWait(t, syscall.SIGTERM, 30*time.Second); err != nil {
		t.Errorf("pod exit after SIGTERM: %v", err)
	}
}

// TestGetWithNoPod: with a NATS server and no pod serving grants, get
// fails at once and says what to do.
func TestGetWithNoPod(t *testing.T) {
	t.Parallel()
	natsURL := externalNATS(t)
	var stdout, stderr bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	err := run(ctx, []string{"get", "--nats-url", natsURL, "--allow-private-networks", "http://127.0.0.1:1/x"},
		func(string) string { return "" }, strings.NewReader(""), &stdout, &stderr)
	if err == nil || !strings.Contains(err.Error(), "no pod serves grants") || !strings.Contains(err.Error(), "mirrorworker run") {
		t.Fatalf("get with no pod: %v; want an error saying to start 'mirrorworker run'", err)
	}
}
