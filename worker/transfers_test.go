package worker_test

import (
	"bytes"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/mirrorworker/mirrorworker/jobs"
	"github.com/mirrorworker/mirrorworker/worker"
)

// TestFetchInFlightShowsProgress: while a body streams (half sent, the
// origin then holding the rest), the fetch is in Fetches and the pod's
// Status with its bytes so far of the Content-Length, and
// fetched_bytes_total has moved by those bytes before the body ends; once
// stored, the fetch is gone and the counter holds the whole body.
func TestFetchInFlightShowsProgress(t *testing.T) {
	t.Parallel()
	const size, half = 1 << 20, 1 << 19
	e := newEnv(t, 30*time.Second)
	o := newOrigin(t)
	body := bytes.Repeat([]byte("m"), size)
	release := make(chan struct{})
	o.setBehave(func(w http.ResponseWriter, r *http.Request, _ int) bool {
		w.Header().Set("Content-Length", fmt.Sprint(size))
		w.WriteHeader(http.StatusOK)
		w.Write(body[:half])
		w.(http.Flusher).Flush()
		select {
		case <-release:
		case <-r.Context().Done():
			return true
		}
		w.Write(body[half:])
		return true
	})
	r := e.start(testPacer(0, 2, nil, 0, nil), worker.Options{})
	defer r.stop(t)
	e.publish(jobs.Job{ID: "big", URL: o.url("/big.iso"), Target: "big.iso"})

	waitCond(t, 30*time.Second, "the fetch in flight with half its body", func() bool {
		fs := r.w.Fetches(time.Now())
		return len(fs) == 1 && fs[0].Bytes == half
	})
	fs := r.w.Fetches(time.Now())
	if f := fs[0]; f.URL != o.url("/big.iso") || f.Target != "big.iso" || f.Authority != o.auth || f.Expected != size || f.Rate <= 0 || f.Elapsed <= 0 {
		t.Errorf("fetch in flight: %+v", f)
	}
	if got := counter(t, r.reg, "mirrorworker_fetched_bytes_total", nil); got != half {
		t.Errorf("fetched_bytes_total while the body streams: %v, want %d", got, half)
	}
	if st := r.w.Status("p", "v", nil, nil); len(st.Fetches) != 1 || st.Fetches[0].Bytes != half {
		t.Errorf("Status().Fetches: %+v", st.Fetches)
	}
	close(release)
	r.f.waitFor(t, 1, isOutcome(worker.OutcomeStored), 30*time.Second)
	e.checkStored("big.iso", body)
	if fs := r.w.Fetches(time.Now()); len(fs) != 0 {
		t.Errorf("fetches after the store: %+v", fs)
	}
	if got := counter(t, r.reg, "mirrorworker_fetched_bytes_total", nil); got != size {
		t.Errorf("fetched_bytes_total after the body: %v, want %d", got, size)
	}
}

// Flush lets an origin's handler send part of a body and hold the rest.
func (s *statusRecorder) Flush() {
	if f, ok := s.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}
