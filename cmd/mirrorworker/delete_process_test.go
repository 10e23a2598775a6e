package main

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/mirrorworker/mirrorworker/mirror"
	"github.com/mirrorworker/mirrorworker/mirror/bucket/buckettest"
)

// gatedOrigin serves "body of <path>" for every path on loopback; a path
// in held waits until its gate is opened, counting the request in
// arrived, so that a test can hold a fetch in flight.
type gatedOrigin struct {
	URL string

	mu      sync.Mutex
	held    map[string]chan struct{}
	arrived map[string]int
}

func newGatedOrigin(t *testing.T, held ...string) *gatedOrigin {
	t.Helper()
	o := &gatedOrigin{held: map[string]chan struct{}{}, arrived: map[string]int{}}
	for _, p := range held {
		o.held[p] = make(chan struct{})
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		o.mu.Lock()
		o.arrived[r.URL.Path]++
		gate := o.held[r.URL.Path]
		o.mu.Unlock()
		if gate != nil {
			select {
			case <-gate:
			case <-r.Context().Done():
				return
			}
		}
		io.WriteString(w, "body of "+r.URL.Path)
	}))
	srv.Listener = ln
	srv.Start()
	t.Cleanup(srv.Close)
	t.Cleanup(func() { // a gate still shut would hold srv.Close
		o.mu.Lock()
		defer o.mu.Unlock()
		for p, g := range o.held {
			select {
			case <-g:
			default:
				close(g)
			}
			delete(o.held, p)
		}
	})
	o.URL = srv.URL
	return o
}

func (o *gatedOrigin) open(path string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	close(o.held[path])
	delete(o.held, path)
}

func (o *gatedOrigin) requests(path string) int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.arrived[path]
}

// enqueueOK runs `mirrorworker enqueue args...` and fails the test unless
// it accepted every job.
func enqueueOK(t *testing.T, natsURL string, args ...string) {
	t.Helper()
	r := runEnqueue(t, nil, "", append([]string{"--nats-url", natsURL}, args...)...)
	if r.err != nil || !strings.HasPrefix(r.stdout, "accepted") {
		t.Fatalf("enqueue %v: %v\nstdout %s\nstderr %s", args, r.err, r.stdout, r.stderr)
	}
}

// TestProcessDeleteRacesFetch is issue 39's "a delete racing a fetch of the
// same key, in both orders", with a real `mirrorworker run`, on a file
// target and on a bucket (the real versitygw):
//
//   - fetch first: the fetch of /first is in flight at the origin when the
//     delete of its key is enqueued; the fetch finishes after the delete
//     was taken, and must not bring the key back.
//   - delete first: the delete of /second's key is enqueued, then its
//     fetch; whichever the worker carries out first, the fetch wins.
func TestProcessDeleteRacesFetch(t *testing.T) {
	if testing.Short() {
		t.Skip("starts worker processes")
	}
	t.Parallel()
	for _, kind := range []string{"file", "s3"} {
		t.Run(kind, func(t *testing.T) {
			t.Parallel()
			natsURL := externalNATS(t)
			origin := newGatedOrigin(t, "/first")
			dataDir := t.TempDir()
			args := workerArgs(natsURL, dataDir)
			var env []string
			var objPath, tombPath func(key string) string
			if kind == "s3" {
				srv := buckettest.Start(t)
				srv.CreateBucket(t, "mirror")
				args = append(args, s3Args(srv, "s3://mirror/m")...)
				env = srv.Env()
				objPath = func(key string) string { return filepath.Join(srv.Root, "mirror", "m", filepath.FromSlash(key)) }
				tombPath = func(key string) string {
					return filepath.Join(srv.Root, "mirror", "m", mirror.ReservedDir, mirror.TombstoneDir, filepath.FromSlash(key))
				}
			}
			w := startWorkerProcessEnv(t, env, args...)
			if kind == "file" {
				root := w.start.Mirror
				objPath = func(key string) string { return filepath.Join(root, filepath.FromSlash(key)) }
				tombPath = func(key string) string {
					return filepath.Join(root, mirror.ReservedDir, mirror.TombstoneDir, filepath.FromSlash(key)+".json")
				}
			}
			first, second := origin.URL+"/first", origin.URL+"/second"
			firstKey := strings.TrimPrefix(strings.ReplaceAll(first, ":", "_"), "http_//")
			secondKey := strings.TrimPrefix(strings.ReplaceAll(second, ":", "_"), "http_//")

			// Fetch first, held at the origin; then its delete.
			enqueueOK(t, natsURL, first)
			waitFor(t, 20*time.Second, "the fetch of /first at the origin", func() bool { return origin.requests("/first") == 1 })
			enqueueOK(t, natsURL, "--delete", first)
			waitFor(t, 20*time.Second, "the delete taken by the worker", func() bool {
				return len(w.log.messages("deleted")) == 1 || strings.Contains(w.log.String(), `"job superseded`)
			})
			origin.open("/first")

			// Delete first, then the fetch of the same key.
			enqueueOK(t, natsURL, "--delete", second)
			enqueueOK(t, natsURL, second)

			js, closeConn := connectJS(t, natsURL)
			defer closeConn()
			waitFor(t, 30*time.Second, "every job settled", func() bool {
				_, err := os.Stat(objPath(secondKey))
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				defer cancel()
				q, qerr := readQueue(ctx, js)
				return err == nil && qerr == nil && q.pending == 0 && q.ackPending == 0
			})
			if _, err := os.Stat(objPath(firstKey)); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("%s was deleted but is there: a fetch enqueued before the delete brought it back (%v)", firstKey, err)
			}
			data, err := os.ReadFile(tombPath(firstKey))
			if ts, derr := mirror.DecodeTombstone(data); err != nil || derr != nil || ts.Enqueued.IsZero() {
				t.Errorf("tombstone of %s: %+v, %v, %v", firstKey, ts, err, derr)
			}
			got, err := os.ReadFile(objPath(secondKey))
			if err != nil || string(got) != "body of /second" {
				t.Errorf("%s = %q, %v; the fetch enqueued after the delete must win", secondKey, got, err)
			}
			if _, err := w.signalAndWait(t, syscall.SIGTERM, 15*time.Second); err != nil {
				t.Fatalf("worker exit: %v", err)
			}
		})
	}
}

// TestProcessDeleteLimitReached: a pod with --max-deletes-per-minute 2 given
// five deletes carries out two, says in its log, in MIRROR_PODS (status)
// and in mirrorworker_delete_limit_reached that the limit holds the rest
// back, keeps them in the stream unacked, and goes on fetching.
func TestProcessDeleteLimitReached(t *testing.T) {
	if testing.Short() {
		t.Skip("starts worker processes")
	}
	t.Parallel()
	natsURL := externalNATS(t)
	origin := newGatedOrigin(t)
	w := startWorkerProcess(t, workerArgs(natsURL, t.TempDir(), "--max-deletes-per-minute", "2")...)
	root := w.start.Mirror
	var dels []string
	for _, p := range []string{"/d1", "/d2", "/d3", "/d4", "/d5"} {
		dels = append(dels, origin.URL+p)
	}
	enqueueOK(t, natsURL, append([]string{"--delete"}, dels...)...)
	waitFor(t, 20*time.Second, "the delete limit reached", func() bool {
		return len(w.log.messages("deleted")) == 2 && strings.Contains(w.log.String(), "delete limit reached")
	})
	// Fetches go on while deletes wait.
	enqueueOK(t, natsURL, origin.URL+"/after")
	waitFor(t, 20*time.Second, "a fetch stored while deletes wait", func() bool {
		_, err := os.Stat(filepath.Join(root, strings.TrimPrefix(strings.ReplaceAll(origin.URL, ":", "_"), "http_//"), "after"))
		return err == nil
	})
	js, closeConn := connectJS(t, natsURL)
	defer closeConn()
	waitFor(t, 20*time.Second, "status to show the delete limit", func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		pods, err := readPods(ctx, js)
		if err != nil || len(pods) != 1 {
			return false
		}
		d := pods[0].Deletes
		return d.Limit == 2 && d.LastMinute == 2 && d.ReachedSince != nil
	})
	resp, err := http.Get(w.start.AdminURL + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	page, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if v := metricValue(string(page), "mirrorworker_delete_limit_reached"); v != 1 {
		t.Errorf("mirrorworker_delete_limit_reached = %v, want 1", v)
	}
	if n := len(w.log.messages("deleted")); n != 2 {
		t.Errorf("%d deletes carried out within the limit of 2 a minute", n)
	}
	if strings.Contains(w.log.String(), `"dead_lettered"`) || strings.Contains(w.log.String(), "dead letter") {
		t.Errorf("a delete held back by the limit was failed, not kept waiting")
	}
	if _, err := w.signalAndWait(t, syscall.SIGTERM, 15*time.Second); err != nil {
		t.Fatalf("worker exit: %v", err)
	}
}
