package worker_test

import (
	"context"
	"errors"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/mirrorworker/mirrorworker/jobs"
	"github.com/mirrorworker/mirrorworker/mirror"
	"github.com/mirrorworker/mirrorworker/worker"
)

// A fetch enqueued before a delete, failed once (a 503: retried, so
// redelivered) and answered only after the delete is done, is not stored:
// the key stays deleted, with its tombstone, and the fetch is superseded.
func TestFetchRedeliveredAfterLaterDeleteIsSuperseded(t *testing.T) {
	e := newEnv(t, 5*time.Second)
	o := newOrigin(t)
	deleted := make(chan struct{})
	o.setBehave(func(w http.ResponseWriter, r *http.Request, n int) bool {
		if n == 1 {
			w.WriteHeader(http.StatusServiceUnavailable)
			return true
		}
		<-deleted // the retry's answer comes after the delete
		return false
	})
	r := e.start(testPacer(0, 2, nil, 0, nil), worker.Options{BackoffInitial: 10 * time.Millisecond, BackoffMax: 20 * time.Millisecond})
	fetchJob := jobs.Job{URL: o.url("/a"), Target: "k/a"}
	e.publish(fetchJob)
	waitCond(t, 10*time.Second, "the first attempt answered 503", func() bool { return len(o.log()) >= 1 })
	e.publish(jobs.Job{Op: jobs.OpDelete, URL: o.url("/a"), Target: "k/a"})
	r.f.waitFor(t, 1, isOutcome(worker.OutcomeDeleted), 10*time.Second)
	close(deleted)
	r.f.waitFor(t, 1, isOutcome(worker.OutcomeSuperseded), 10*time.Second)
	e.waitDrained(10 * time.Second)
	if _, err := os.Stat(filepath.Join(e.root, "k", "a")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("k/a is back after its delete: %v", err)
	}
	if ts, err := e.target.Tombstone(context.Background(), "k/a"); err != nil || ts.Enqueued.IsZero() || !strings.Contains(ts.URL, "/a") {
		t.Errorf("tombstone %+v, %v", ts, err)
	}
	if n := r.f.count(isOutcome(worker.OutcomeStored)); n != 0 {
		t.Errorf("%d stored outcomes, want none", n)
	}
}

// A delete whose key holds an object stored by a job enqueued after it is
// not carried out (superseded); one whose key holds an older object, or
// nothing, removes it and leaves a tombstone.
func TestDeleteAgainstTheStoredObject(t *testing.T) {
	for _, tc := range []struct {
		name     string
		stored   bool
		enqueued time.Time // of the stored object
		outcome  string
		remains  bool
	}{
		{name: "nothing stored", outcome: worker.OutcomeDeleted},
		{name: "older object", stored: true, enqueued: time.Now().Add(-time.Hour), outcome: worker.OutcomeDeleted},
		{name: "object of an earlier version", stored: true, outcome: worker.OutcomeDeleted},
		{name: "newer object", stored: true, enqueued: time.Now().Add(time.Hour), outcome: worker.OutcomeSuperseded, remains: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, 5*time.Second)
			o := newOrigin(t)
			if tc.stored {
				if _, err := e.target.Put(context.Background(), "k/b", strings.NewReader("kept"), mirror.Expect{}, mirror.Meta{JobID: "f", Enqueued: tc.enqueued}); err != nil {
					t.Fatal(err)
				}
			}
			r := e.start(testPacer(0, 2, nil, 0, nil), worker.Options{})
			e.publish(jobs.Job{Op: jobs.OpDelete, URL: o.url("/b"), Target: "k/b"})
			r.f.waitFor(t, 1, isOutcome(tc.outcome), 10*time.Second)
			e.waitDrained(10 * time.Second)
			_, err := os.Stat(filepath.Join(e.root, "k", "b"))
			if remains := err == nil; remains != tc.remains {
				t.Errorf("object remains %v, want %v", remains, tc.remains)
			}
			_, terr := e.target.Tombstone(context.Background(), "k/b")
			if hasTomb := terr == nil; hasTomb == tc.remains {
				t.Errorf("tombstone %v with the object remaining %v", terr, tc.remains)
			}
			if len(o.log()) != 0 {
				t.Errorf("a delete sent %d requests to the origin", len(o.log()))
			}
		})
	}
}
