package worker_test

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/mirrorworker/mirrorworker/credentials"
	"github.com/mirrorworker/mirrorworker/fetch"
	"github.com/mirrorworker/mirrorworker/jobs"
	"github.com/mirrorworker/mirrorworker/pacer"
	"github.com/mirrorworker/mirrorworker/worker"
)

// TestAuthHoldParksAndLifts: in partitioned mode with a hold longer than
// --park-after (as the 1 min default is), an authority answering 401 is
// held after two answers: its backlog is parked and no request reaches it;
// a change of its credential lifts the hold at once (long before it would
// end), the parked jobs come back, and every job is stored, none
// dead-lettered.
func TestAuthHoldParksAndLifts(t *testing.T) {
	t.Parallel()
	const n = 12
	e := newEnv(t, 30*time.Second)
	o := newOrigin(t)
	var want atomic.Pointer[string]
	good := "Bearer new-token"
	want.Store(&good)
	var refused atomic.Int64
	o.setBehave(func(w http.ResponseWriter, r *http.Request, _ int) bool {
		if r.Header.Get("Authorization") != *want.Load() {
			refused.Add(1)
			w.WriteHeader(http.StatusUnauthorized)
			return true
		}
		return false
	})
	dir := t.TempDir()
	writeCreds := func(tok string) {
		t.Helper()
		b := fmt.Sprintf(`{"authorities": {%q: {"bearer": %q}}}`, o.auth, tok)
		if err := os.WriteFile(filepath.Join(dir, "c.json"), []byte(b), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	writeCreds("old-token")
	store, err := credentials.Open(dir, nil)
	if err != nil {
		t.Fatal(err)
	}

	ctx := context.Background()
	parts, err := jobs.EnsureWork(ctx, e.js, &jobs.WorkOptions{Consumer: &jobs.ConsumerOptions{AckWait: 30 * time.Second}})
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	f := fetch.New(&fetch.Options{AllowPrivate: true, Credentials: store})
	const hold = 2 * time.Minute
	pc := testPacer(50*time.Millisecond, 2, nil, 0, nil)
	w, err := worker.New(worker.Deps{JS: e.js, Fetcher: f, Target: e.target, Pacer: pc,
		Owns: func(int) bool { return true }},
		&worker.Options{Partitions: parts, ParkAfter: time.Second, Registerer: reg, Logger: testLogger(t),
			PullWait: testPullWait(0), Auth: worker.AuthRule{Hold: hold}})
	if err != nil {
		t.Fatal(err)
	}
	store.OnChange(w.CredentialsChanged)
	r := e.launch(w, reg, f)
	e.waitReady(w)
	for i := range parts {
		c, err := jobs.EnsurePartitionConsumer(ctx, e.js, i, &jobs.ConsumerOptions{AckWait: 30 * time.Second}, 0)
		if err != nil {
			t.Fatal(err)
		}
		if err := w.AddPartition(i, c, time.Now()); err != nil {
			t.Fatal(err)
		}
	}
	var js []jobs.Job
	for i := range n {
		js = append(js, jobs.Job{ID: fmt.Sprint("j", i), URL: o.url(fmt.Sprint("/o/", i)), Target: fmt.Sprint("o/", i)})
	}
	e.publish(js...)

	waitCond(t, 30*time.Second, "the authority refusing twice", func() bool { return refused.Load() >= 2 })
	waitCond(t, 30*time.Second, "the backlog parked", func() bool {
		return counter(t, reg, "mirrorworker_parks_total", map[string]string{"op": "parked"}) > 0
	})
	// The hold made observable instead of watched for a while: the pacer
	// holds the authority until the hold's end, and every job, the two
	// refused ones too, waits in MIRROR_PARKED, from where the owner brings
	// a job back only when the pacer says the authority takes a request
	// within HoldMax. A hold that let requests through would have them
	// refused again (and counted) before the whole backlog could be parked.
	parking := time.Now()
	waitCond(t, 30*time.Second, "the whole backlog parked", func() bool {
		return refused.Load() > 3 || counter(t, reg, "mirrorworker_parked_jobs", nil) == n
	})
	if got := refused.Load(); got > 3 { // two to hold it, one may have been in flight
		t.Fatalf("%d requests reached the authority, want 2 and at most one in flight when the hold began", got)
	}
	t.Logf("the whole backlog parked %v after it began to park", time.Since(parking).Round(time.Millisecond))
	if wait, _, reason := pc.ReadyIn(time.Now(), o.auth); reason != pacer.ReasonPaused || wait < hold/2 {
		t.Fatalf("the pacer gives the held authority a request in %v (%s), want a pause of about %v", wait, reason, hold)
	}
	if s := o.served.Load(); s != refused.Load() {
		t.Fatalf("%d answers, %d refused: a job was stored with the old token", s, refused.Load())
	}

	lifted := time.Now()
	writeCreds("new-token")
	if err := store.Reload(); err != nil {
		t.Fatal(err)
	}
	r.f.waitFor(t, n, isOutcome(worker.OutcomeStored), 60*time.Second)
	if took := time.Since(lifted); took >= hold {
		t.Errorf("the jobs came back %v after the change: the hold was not lifted", took)
	}
	if d := e.deadLetters(); len(d) != 0 {
		t.Errorf("%d jobs dead-lettered during a rotation: %+v", len(d), d[0])
	}
	if got := counter(t, reg, "mirrorworker_upstream_requests_total", map[string]string{"outcome": "auth_failed"}); got != float64(refused.Load()) {
		t.Errorf("auth_failed counted %v, the origin refused %d", got, refused.Load())
	}
	t.Logf("%d refused answers, then all %d stored %v after the credential changed", refused.Load(), n, time.Since(lifted).Round(time.Millisecond))
}
