package worker_test

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/mirrorworker/mirrorworker/fetch"
	"github.com/mirrorworker/mirrorworker/jobs"
	"github.com/mirrorworker/mirrorworker/worker"
)

// lockedBuffer is a log sink safe for the worker's goroutines.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

// lines returns the JSON log lines with message msg.
func (l *lockedBuffer) lines(t *testing.T, msg string) []map[string]any {
	t.Helper()
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []map[string]any
	sc := bufio.NewScanner(bytes.NewReader(l.b.Bytes()))
	for sc.Scan() {
		var m map[string]any
		if err := json.Unmarshal(sc.Bytes(), &m); err != nil {
			t.Fatalf("log line %q: %v", sc.Text(), err)
		}
		if m["message"] == msg {
			out = append(out, m)
		}
	}
	return out
}

// TestStoredObjectsAreLogged (issue 26): each stored object is logged at
// debug with its key, bytes, duration and status (200, or 304 when it was
// unchanged), and the objects stored are summed up at info, so that a
// newcomer at the default level sees the worker store.
func TestStoredObjectsAreLogged(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 30*time.Second)
	o := newOrigin(t)
	var logs lockedBuffer
	reg := prometheus.NewRegistry()
	f := fetch.New(&fetch.Options{AllowPrivate: true})
	w, err := worker.New(worker.Deps{JS: e.js, Consumer: e.cons, Fetcher: f, Target: e.target, Pacer: testPacer(0, 2, nil, 0, nil)},
		&worker.Options{Concurrency: 2, PullWait: testPullWait(0), Registerer: reg, Logger: zerolog.New(&logs).Level(zerolog.DebugLevel)})
	if err != nil {
		t.Fatal(err)
	}
	r := e.launch(w, reg, f)
	e.waitReady(w)
	const n = 3
	mk := func(round string) []jobs.Job {
		var js []jobs.Job
		for i := range n {
			js = append(js, jobs.Job{ID: fmt.Sprintf("%s-%d", round, i), URL: o.url(fmt.Sprintf("/obj/%d", i)), Target: fmt.Sprintf("logged/obj%d", i), Tenant: "t"})
		}
		return js
	}
	e.publish(mk("first")...)
	r.f.waitFor(t, n, nil, 60*time.Second)
	e.publish(mk("second")...) // the same URLs again: conditional requests, 304
	r.f.waitFor(t, 2*n, nil, 60*time.Second)
	r.stop(t) // the last summary is written when the worker stops

	objects := logs.lines(t, "object stored")
	if len(objects) != 2*n {
		t.Fatalf("%d \"object stored\" lines, want %d", len(objects), 2*n)
	}
	byStatus := map[float64]int{}
	for _, l := range objects {
		byStatus[l["status"].(float64)]++
		if l["level"] != "debug" {
			t.Errorf("object line at %v, want debug: %v", l["level"], l)
		}
		key, _ := l["key"].(string)
		var i int
		if _, err := fmt.Sscanf(key, "logged/obj%d", &i); err != nil {
			t.Errorf("object line key %q: %v", key, err)
			continue
		}
		want := float64(len(body(fmt.Sprintf("/obj/%d", i))))
		if l["status"] == float64(304) {
			want = 0
		}
		if l["bytes"] != want {
			t.Errorf("object line bytes %v, want %v: %v", l["bytes"], want, l)
		}
		if d, err := time.ParseDuration(fmt.Sprint(l["took"])); err != nil || d < 0 {
			t.Errorf("object line took %v: want a duration (%v)", l["took"], err)
		}
	}
	if byStatus[200] != n || byStatus[304] != n {
		t.Errorf("object lines by status %v, want %d of 200 and %d of 304", byStatus, n, n)
	}

	var total, unchanged float64
	for _, l := range logs.lines(t, "objects stored (each one is logged at debug)") {
		if l["level"] != "info" {
			t.Errorf("summary at %v, want info: %v", l["level"], l)
		}
		total += l["objects"].(float64)
		unchanged += l["unchanged"].(float64)
	}
	if total != 2*n || unchanged != n {
		t.Errorf("summaries count %v objects, %v unchanged; want %d and %d", total, unchanged, 2*n, n)
	}
}
