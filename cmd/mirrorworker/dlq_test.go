package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/mirrorworker/mirrorworker/deadletter"
	"github.com/mirrorworker/mirrorworker/jobs"
)

// switchOrigin answers 404 until fixed, then 200; it counts requests per path.
type switchOrigin struct {
	*httptest.Server
	fixed atomic.Bool
	mu    sync.Mutex
	hits  map[string]int
}

func newSwitchOrigin(t *testing.T) *switchOrigin {
	o := &switchOrigin{hits: map[string]int{}}
	o.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		o.mu.Lock()
		o.hits[r.URL.Path]++
		o.mu.Unlock()
		if !o.fixed.Load() {
			http.NotFound(w, r)
			return
		}
		fmt.Fprintf(w, "body of %s\n", r.URL.Path)
	}))
	t.Cleanup(o.Close)
	return o
}

func (o *switchOrigin) count(path string) int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.hits[path]
}

// dlqCmd runs `mirrorworker dlq args...` and returns its stdout.
func dlqCmd(t *testing.T, natsURL string, args ...string) (string, error) {
	t.Helper()
	var out, errOut strings.Builder
	full := append([]string{"dlq", args[0], "--nats-url", natsURL}, args[1:]...)
	err := run(context.Background(), full, noEnv, strings.NewReader(""), &out, &errOut)
	if err != nil {
		return out.String() + errOut.String(), err
	}
	return out.String(), nil
}

func listJSON(t *testing.T, natsURL string, args ...string) []deadletter.Record {
	t.Helper()
	out, err := dlqCmd(t, natsURL, append([]string{"list", "--output", "json"}, args...)...)
	if err != nil {
		t.Fatalf("dlq list %v: %v\n%s", args, err, out)
	}
	var recs []deadletter.Record
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		if line == "" {
			continue
		}
		var r deadletter.Record
		if err := json.Unmarshal([]byte(line), &r); err != nil {
			t.Fatalf("dlq list json line %q: %v", line, err)
		}
		recs = append(recs, r)
	}
	return recs
}

// TestDLQListShowRequeue: dead letters are listed with filters, shown,
// requeued under a fresh id with their provenance (a dry run publishing
// nothing); a requeued job that fails again is dead-lettered again and not
// retried on its own; once the origin works a requeue stores it.
func TestDLQListShowRequeue(t *testing.T) {
	t.Parallel()
	origin := newSwitchOrigin(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	si, log, done := runInProcess(t, ctx,
		"--data-dir", t.TempDir(), "--embedded-listen", "127.0.0.1:0", "--admin-addr", "127.0.0.1:0",
		"--allow-private-networks", "--floor", "0")
	url := si.NATSURL

	var lines strings.Builder
	for _, j := range []struct{ tenant, path string }{{"acme", "/gone/a"}, {"acme", "/gone/b"}, {"other", "/gone/c"}} {
		fmt.Fprintf(&lines, `{"url":%q,"tenant":%q}`+"\n", origin.URL+j.path, j.tenant)
	}
	var out, errOut strings.Builder
	if err := run(ctx, []string{"enqueue", "--nats-url", url}, noEnv, strings.NewReader(lines.String()), &out, &errOut); err != nil {
		t.Fatalf("enqueue: %v\n%s", err, errOut.String())
	}
	waitFor(t, 30*time.Second, "3 dead letters", func() bool { return len(listJSON(t, url)) == 3 })

	acme := listJSON(t, url, "--tenant", "acme")
	if len(acme) != 2 {
		t.Fatalf("--tenant acme listed %d, want 2: %+v", len(acme), acme)
	}
	for _, r := range acme {
		if r.Record.Reason != "http_404" || r.Record.Tenant != "acme" || r.Record.LastStatus != 404 || r.Generation != 0 {
			t.Errorf("record %+v, want an acme http_404 of generation 0", r)
		}
	}
	if n := len(listJSON(t, url, "--reason", "budget_exhausted")); n != 0 {
		t.Errorf("--reason budget_exhausted listed %d, want 0", n)
	}
	if n := len(listJSON(t, url, "--authority", origin.URL, "--reason", "http_404")); n != 3 {
		t.Errorf("--authority %s listed %d, want 3", origin.URL, n)
	}
	if n := len(listJSON(t, url, "--until", "2000-01-01T00:00:00Z")); n != 0 {
		t.Errorf("--until 2000 listed %d, want 0", n)
	}
	if n := len(listJSON(t, url, "--since", "1h")); n != 3 {
		t.Errorf("--since 1h listed %d, want 3", n)
	}
	if n := len(listJSON(t, url, "--since", "7d")); n != 3 { // as replay's --since
		t.Errorf("--since 7d listed %d, want 3", n)
	}
	table, err := dlqCmd(t, url, "list")
	if err != nil || !strings.Contains(table, "REASON") || strings.Count(table, "http_404") != 3 || !strings.Contains(table, "3 dead letters") {
		t.Errorf("dlq list table (err %v):\n%s", err, table)
	}

	var a deadletter.Record
	for _, r := range acme {
		if strings.HasSuffix(jobURL(r.Record), "/gone/a") {
			a = r
		}
	}
	shown, err := dlqCmd(t, url, "show", fmt.Sprint(a.Seq))
	if err != nil || !strings.Contains(shown, a.Record.JobID) || !strings.Contains(shown, `"reason": "http_404"`) {
		t.Errorf("dlq show %d (err %v):\n%s", a.Seq, err, shown)
	}

	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	jobsLast := func() uint64 {
		s, err := js.Stream(context.Background(), jobs.JobsStream)
		if err != nil {
			t.Fatal(err)
		}
		return s.CachedInfo().State.LastSeq
	}
	before := jobsLast()
	dry, err := dlqCmd(t, url, "requeue", "--dry-run", "--tenant", "acme")
	if err != nil || strings.Count(dry, "would requeue") != 2 {
		t.Errorf("requeue --dry-run (err %v):\n%s", err, dry)
	}
	if got := jobsLast(); got != before {
		t.Errorf("a dry run published: %s last sequence %d -> %d", jobs.JobsStream, before, got)
	}
	if _, err := dlqCmd(t, url, "requeue"); err == nil {
		t.Error("requeue without SEQ, filter or --all succeeded")
	}

	// Requeued while the origin still fails: dead-lettered again, once.
	if out, err := dlqCmd(t, url, "requeue", fmt.Sprint(a.Seq)); err != nil || !strings.Contains(out, a.Record.JobID+".rq1") {
		t.Fatalf("requeue %d (err %v):\n%s", a.Seq, err, out)
	}
	m, err := js.Stream(context.Background(), jobs.JobsStream)
	if err != nil {
		t.Fatal(err)
	}
	raw, err := m.GetLastMsgForSubject(context.Background(), jobs.JobsSubjectPrefix+"acme.>")
	if err != nil {
		t.Fatal(err)
	}
	if got, want := raw.Header.Get(deadletter.HeaderRequeuedFrom), fmt.Sprintf("%s:%d", jobs.DLQStream, a.Seq); got != want {
		t.Errorf("requeued job header %s = %q, want %q", deadletter.HeaderRequeuedFrom, got, want)
	}
	if got := raw.Header.Get(deadletter.HeaderOriginalJobID); got != a.Record.JobID {
		t.Errorf("requeued job header %s = %q, want %q", deadletter.HeaderOriginalJobID, got, a.Record.JobID)
	}
	var again deadletter.Record
	waitFor(t, 30*time.Second, "the requeued job dead-lettered again", func() bool {
		for _, r := range listJSON(t, url, "--tenant", "acme") {
			if r.Generation == 1 {
				again = r
				return true
			}
		}
		return false
	})
	if again.Record.JobID != a.Record.JobID+".rq1" || again.Record.Reason != "http_404" {
		t.Errorf("second dead letter %+v", again)
	}
	waitDrainedQueue(t, js)
	if n := origin.count("/gone/a"); n != 2 {
		t.Errorf("origin saw /gone/a %d times, want 2 (the job and its one requeue): a requeued job must not loop", n)
	}
	if n := len(listJSON(t, url)); n != 4 {
		t.Errorf("%d dead letters, want 4", n)
	}
	// The table: the requeued record says it was requeued once, the one
	// that was not says 0, and a 404 cost one request (no retry recorded).
	table, err = dlqCmd(t, url, "list", "--tenant", "acme")
	if err != nil {
		t.Fatal(err)
	}
	for seq, want := range map[uint64]string{a.Seq: "1", again.Seq: "0"} {
		f := tableRow(t, table, seq)
		if f[6] != "1" || f[7] != want {
			t.Errorf("dead letter %d: ATTEMPTS %s REQUEUED %s, want 1 and %s:\n%s", seq, f[6], f[7], want, table)
		}
	}
	if shown, err := dlqCmd(t, url, "show", fmt.Sprint(a.Seq)); err != nil || !strings.Contains(shown, `"requeued": 1`) {
		t.Errorf("dlq show %d after its requeue (err %v):\n%s", a.Seq, err, shown)
	}

	// Fixed origin: requeueing the second record stores the object.
	origin.fixed.Store(true)
	if out, err := dlqCmd(t, url, "requeue", fmt.Sprint(again.Seq)); err != nil || !strings.Contains(out, a.Record.JobID+".rq2") {
		t.Fatalf("requeue %d (err %v):\n%s", again.Seq, err, out)
	}
	host := strings.TrimPrefix(origin.URL, "http://")
	stored := filepath.Join(si.Mirror, strings.ReplaceAll(host, ":", "_"), "gone", "a")
	waitFor(t, 30*time.Second, "the requeued job stored at "+stored, func() bool {
		_, err := os.Stat(stored)
		return err == nil
	})
	if n := origin.count("/gone/a"); n != 3 {
		t.Errorf("origin saw /gone/a %d times, want 3", n)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("run: %v\n%s", err, log)
	}
}

// waitDrainedQueue waits until the consumer has nothing pending or unacked.
func waitDrainedQueue(t *testing.T, js jetstream.JetStream) {
	t.Helper()
	waitFor(t, 30*time.Second, "the consumer drained", func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		q, err := readQueue(ctx, js)
		return err == nil && q.pending == 0 && q.ackPending == 0
	})
}

// tableRow returns the fields of the row of dead letter seq in a dlq list
// table: SEQ TIME TENANT AUTHORITY REASON STATUS ATTEMPTS REQUEUED JOB URL.
func tableRow(t *testing.T, table string, seq uint64) []string {
	t.Helper()
	for _, line := range strings.Split(table, "\n") {
		if f := strings.Fields(line); len(f) == 10 && f[0] == fmt.Sprint(seq) {
			return f
		}
	}
	t.Fatalf("no row for dead letter %d in:\n%s", seq, table)
	return nil
}

func TestJobURLMarksDeletes(t *testing.T) {
	for _, tc := range []struct {
		name, job, want string
	}{
		{name: "fetch", job: `{"url":"http://h.example/a?x=1"}`, want: "http://h.example/a"},
		{name: "delete", job: `{"v":2,"op":"delete","url":"http://h.example/a"}`, want: "delete http://h.example/a"},
		{name: "not a job", job: `nope`, want: ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := jobURL(jobs.DeadLetter{Job: []byte(tc.job)}); got != tc.want {
				t.Errorf("jobURL(%s) = %q, want %q", tc.job, got, tc.want)
			}
		})
	}
}
