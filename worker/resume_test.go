package worker_test

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sync"
	"testing"
	"testing/iotest"
	"time"

	"github.com/mirrorworker/mirrorworker/jobs"
	"github.com/mirrorworker/mirrorworker/mirror"
	"github.com/mirrorworker/mirrorworker/worker"
)

// TestRetryResumesWhatWasKept: a 2 MiB body cut after 1.5 MiB (the origin
// aborts the connection) is kept by the file target; what the retry costs
// the origin and stores depends on how the origin answers its Range and
// If-Range: the rest (206), the whole body (the range ignored, or the
// object changed: 200), or 416 (the start dropped, the next retry whole).
// Every case stores the body the origin holds last, and says so in
// resumes_total.
func TestRetryResumesWhatWasKept(t *testing.T) {
	const size, cut = 2 << 20, 3 << 19
	v1 := bytes.Repeat([]byte("version one\n"), size/12+1)[:size]
	v2 := bytes.Repeat([]byte("version two\n"), size/12+1)[:size]
	serve := func(w http.ResponseWriter, r *http.Request, tag string, b []byte) {
		w.Header().Set("ETag", tag)
		http.ServeContent(w, r, "obj", time.Time{}, bytes.NewReader(b))
	}
	tests := []struct {
		name string
		// retry answers the n-th request (n >= 2).
		retry      func(w http.ResponseWriter, r *http.Request, n int)
		want       []byte
		withDigest bool
		result     string // resumes_total{result} counted once
		wantSent   int    // body bytes the origin sends after the cut, at most
		requests   int
	}{
		{name: "rest", retry: func(w http.ResponseWriter, r *http.Request, _ int) { serve(w, r, `"v1"`, v1) },
			want: v1, withDigest: true, result: worker.ResumeResumed, wantSent: size - cut, requests: 2},
		{name: "range ignored", retry: func(w http.ResponseWriter, r *http.Request, _ int) {
			w.Header().Set("ETag", `"v1"`)
			w.Header().Set("Content-Length", fmt.Sprint(size))
			w.Write(v1)
		}, want: v1, withDigest: true, result: worker.ResumeWhole, wantSent: size, requests: 2},
		{name: "changed object", retry: func(w http.ResponseWriter, r *http.Request, _ int) { serve(w, r, `"v2"`, v2) },
			want: v2, result: worker.ResumeWhole, wantSent: size, requests: 2},
		{name: "unsatisfiable", retry: func(w http.ResponseWriter, r *http.Request, n int) {
			if n == 2 {
				w.WriteHeader(http.StatusRequestedRangeNotSatisfiable)
				return
			}
			serve(w, r, `"v1"`, v1)
		}, want: v1, withDigest: true, result: worker.ResumeUnsatisfiable, wantSent: size, requests: 3},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, 30*time.Second)
			o := newOrigin(t)
			var mu sync.Mutex
			var ranges []string
			sent := 0
			o.setBehave(func(w http.ResponseWriter, r *http.Request, n int) bool {
				mu.Lock()
				ranges = append(ranges, r.Header.Get("Range"))
				mu.Unlock()
				cw := &countingWriter{ResponseWriter: w}
				if n == 1 {
					cw.Header().Set("ETag", `"v1"`)
					cw.Header().Set("Content-Length", fmt.Sprint(size))
					cw.Write(v1[:cut])
					cw.Flush()
					panic(http.ErrAbortHandler) // the connection is cut
				}
				tc.retry(cw, r, n)
				mu.Lock()
				sent += cw.n
				mu.Unlock()
				return true
			})
			r := e.start(testPacer(0, 2, nil, 0, nil), worker.Options{BackoffInitial: 10 * time.Millisecond, BackoffMax: 50 * time.Millisecond})
			defer r.stop(t)
			job := jobs.Job{ID: "big", URL: o.url("/big.iso"), Target: "big.iso"}
			if tc.withDigest {
				job.SHA256 = hexSum(tc.want)
			}
			e.publish(job)
			r.f.waitFor(t, 1, isOutcome(worker.OutcomeStored), 30*time.Second)
			e.checkStored("big.iso", tc.want)
			mu.Lock()
			defer mu.Unlock()
			if len(ranges) != tc.requests || ranges[0] != "" || ranges[1] == "" {
				t.Errorf("requests' Range headers %q, want %d requests, the second with a range", ranges, tc.requests)
			}
			if tc.requests > 2 && ranges[2] != "" {
				t.Errorf("the request after a 416 asked for %q, want the whole body", ranges[2])
			}
			resumed := counter(t, r.reg, "mirrorworker_resumed_bytes_total", nil)
			if sent > tc.wantSent {
				t.Errorf("the origin sent %d body bytes after the cut, want at most %d", sent, tc.wantSent)
			}
			if got := counter(t, r.reg, "mirrorworker_resumes_total", map[string]string{"result": tc.result}); got != 1 {
				t.Errorf("resumes_total{result=%q} %v, want 1", tc.result, got)
			}
			// A resumed retry starts where the kept bytes end (all the cut
			// sent, unless the abort lost some on the way) and the origin
			// sends only the rest.
			switch {
			case tc.result == worker.ResumeResumed && (resumed <= 0 || resumed > cut || sent != size-int(resumed)):
				t.Errorf("resumed_bytes_total %v with %d bytes sent after the cut, want the two to make the %d-byte body", resumed, sent, size)
			case tc.result != worker.ResumeResumed && resumed != 0:
				t.Errorf("resumed_bytes_total %v, want 0", resumed)
			}
			if k, err := e.target.Resume(t.Context(), "big.iso", o.url("/big.iso")); err != nil || k != nil {
				t.Errorf("a start is still kept after the store (%v)", err)
			}
		})
	}
}

// countingWriter counts the body bytes a handler writes.
type countingWriter struct {
	http.ResponseWriter
	n int
}

func (c *countingWriter) Write(p []byte) (int, error) {
	n, err := c.ResponseWriter.Write(p)
	c.n += n
	return n, err
}

func (c *countingWriter) Flush() { c.ResponseWriter.(http.Flusher).Flush() }

func hexSum(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

// TestKeptStartIsDroppedWithItsJob: the start of a cut body is kept for a
// retry, and dropped when no retry will use it: when the retry is answered
// 404 (the job is dead-lettered), and when a delete job removes the key.
func TestKeptStartIsDroppedWithItsJob(t *testing.T) {
	const size, cut = 2 << 20, 3 << 19
	body := bytes.Repeat([]byte("version one\n"), size/12+1)[:size]
	t.Run("dead-lettered", func(t *testing.T) {
		e := newEnv(t, 30*time.Second)
		o := newOrigin(t)
		o.setBehave(func(w http.ResponseWriter, r *http.Request, n int) bool {
			if n == 1 {
				w.Header().Set("ETag", `"v1"`)
				w.Header().Set("Content-Length", fmt.Sprint(size))
				w.Write(body[:cut])
				w.(http.Flusher).Flush()
				panic(http.ErrAbortHandler)
			}
			if r.Header.Get("Range") == "" {
				t.Errorf("request %d asked for no range: the start was not kept", n)
			}
			w.WriteHeader(http.StatusNotFound)
			return true
		})
		r := e.start(testPacer(0, 2, nil, 0, nil), worker.Options{BackoffInitial: 10 * time.Millisecond, BackoffMax: 50 * time.Millisecond})
		defer r.stop(t)
		e.publish(jobs.Job{ID: "gone", URL: o.url("/gone.iso"), Target: "gone.iso"})
		r.f.waitFor(t, 1, isOutcome(worker.OutcomeDeadLettered), 30*time.Second)
		if k, err := e.target.Resume(t.Context(), "gone.iso", o.url("/gone.iso")); err != nil || k != nil {
			t.Errorf("a start is still kept for a dead-lettered job (%v)", err)
		}
	})
	t.Run("deleted", func(t *testing.T) {
		e := newEnv(t, 30*time.Second)
		o := newOrigin(t)
		url := o.url("/old.iso")
		// What a cut transfer leaves: the target keeps the start.
		cutBody := io.MultiReader(bytes.NewReader(body[:cut]), iotest.ErrReader(errors.New("connection reset")))
		if _, err := e.target.Put(t.Context(), "old.iso", cutBody, mirror.Expect{}, mirror.Meta{URL: url, ETag: `"v1"`}); err == nil {
			t.Fatal("a cut body was stored")
		}
		k, err := e.target.Resume(t.Context(), "old.iso", url)
		if err != nil || k == nil {
			t.Fatalf("the cut body's start was not kept (%v)", err)
		}
		k.Release()
		r := e.start(testPacer(0, 2, nil, 0, nil), worker.Options{})
		defer r.stop(t)
		e.publish(jobs.Job{Op: jobs.OpDelete, URL: url, Target: "old.iso"})
		r.f.waitFor(t, 1, isOutcome(worker.OutcomeDeleted), 30*time.Second)
		if k, err := e.target.Resume(t.Context(), "old.iso", url); err != nil || k != nil {
			t.Errorf("a start is still kept for a deleted key (%v)", err)
		}
		if len(o.log()) != 0 {
			t.Errorf("%d requests to the origin, want none", len(o.log()))
		}
	})
}
