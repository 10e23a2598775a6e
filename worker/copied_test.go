package worker_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/mirrorworker/mirrorworker/fetch"
	"github.com/mirrorworker/mirrorworker/jobs"
	"github.com/mirrorworker/mirrorworker/mirror"
	"github.com/mirrorworker/mirrorworker/mirror/sumindex"
	"github.com/mirrorworker/mirrorworker/pacer"
	"github.com/mirrorworker/mirrorworker/worker"
)

// acquireCounter is a pacer that counts the grants asked of it.
type acquireCounter struct {
	*pacer.Pacer
	n atomic.Int64
}

func (p *acquireCounter) Acquire(now time.Time, auth string, maxWait time.Duration) (pacer.Permit, error) {
	p.n.Add(1)
	return p.Pacer.Acquire(now, auth, maxWait)
}

func hexSHA(b []byte) string { s := sha256.Sum256(b); return hex.EncodeToString(s[:]) }

// TestCopiedFromAnotherKey: a job whose sha256 the target holds under
// another key is stored by a copy, with no request to the origin and no
// grant asked of the pacer; an index entry whose key holds other bytes
// now is stale, and the job is fetched.
func TestCopiedFromAnotherKey(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 30*time.Second)
	o := newOrigin(t)
	idx, err := sumindex.OpenBolt(sumindex.BoltPath(e.root), 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { idx.Close() })
	target := sumindex.Wrap(e.target, idx, zerolog.Nop())
	p := &acquireCounter{Pacer: testPacer(0, 4, nil, 0, nil)}
	r := e.startWith(p, worker.Options{Concurrency: 4}, fetch.New(&fetch.Options{AllowPrivate: true}), target)
	e.waitReady(r.w)

	a := body("/a")
	e.publish(jobs.Job{ID: "a", URL: o.url("/a"), Target: "pkgs/a.tgz", SHA256: hexSHA(a)})
	r.f.waitFor(t, 1, isOutcome(worker.OutcomeStored), 30*time.Second)

	// The same bytes under three other names (from URLs whose bodies
	// differ: a fetch would fail the digest).
	for _, k := range []string{"b1", "b2", "mirror2/a.tgz"} {
		e.publish(jobs.Job{ID: strings.ReplaceAll(k, "/", "-"), URL: o.url("/" + k), Target: k, SHA256: strings.ToUpper(hexSHA(a))})
	}
	r.f.waitFor(t, 3, isOutcome(worker.OutcomeCopied), 30*time.Second)
	for _, k := range []string{"b1", "b2", "mirror2/a.tgz"} {
		e.checkStored(k, a)
		m, err := e.target.Stat(context.Background(), k)
		if err != nil || m.SHA256 != hexSHA(a) || m.URL != o.url("/"+k) || m.JobID != strings.ReplaceAll(k, "/", "-") || m.ETag != "" {
			t.Errorf("%s: meta %+v, %v; want its own URL and job, no validator", k, m, err)
		}
	}
	if n := len(o.log()); n != 1 {
		t.Errorf("origin got %d requests, want 1 (the copies cost none)", n)
	}
	if n := p.n.Load(); n != 1 {
		t.Errorf("pacer asked for %d grants, want 1", n)
	}
	if got := counter(t, r.reg, "mirrorworker_jobs_total", map[string]string{"outcome": "copied"}); got != 3 {
		t.Errorf("jobs_total{outcome=copied} = %v, want 3", got)
	}
	if r.w.Copied() != 3 || r.w.Status("pod", "", nil, nil).Copied != 3 {
		t.Errorf("Copied() = %d, want 3 in the status too", r.w.Copied())
	}

	// The key the entry names is replaced behind the index's back: the
	// next job for those bytes finds the entry stale and is fetched.
	if _, err := e.target.Put(context.Background(), "pkgs/a.tgz", strings.NewReader("other bytes"), mirror.Expect{}, mirror.Meta{}); err != nil {
		t.Fatal(err)
	}
	e.publish(jobs.Job{ID: "c", URL: o.url("/a"), Target: "c", SHA256: hexSHA(a)})
	r.f.waitFor(t, 2, isOutcome(worker.OutcomeStored), 30*time.Second)
	e.checkStored("c", a)
	if n := len(o.log()); n != 2 {
		t.Errorf("origin got %d requests, want 2 (the stale entry fetched)", n)
	}
	if k, err := idx.Lookup(context.Background(), hexSHA(a)); err != nil || k != "c" {
		t.Errorf("index names %q (%v) after the fetch, want c", k, err)
	}
}

// TestSameBytesAtOnceFetchedOnce: jobs for the same bytes that arrive
// together cost the origin one request: the first fetches them, the others
// wait for it (deferred, no failure budget) and are copied.
func TestSameBytesAtOnceFetchedOnce(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 30*time.Second)
	o := newOrigin(t)
	shared := []byte(strings.Repeat("one artifact, many paths\n", 100))
	o.setBehave(func(w http.ResponseWriter, r *http.Request, _ int) bool {
		w.Write(shared)
		return true
	})
	idx, err := sumindex.OpenBolt(sumindex.BoltPath(e.root), 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { idx.Close() })
	p := &acquireCounter{Pacer: testPacer(0, 8, nil, 0, nil)}
	r := e.startWith(p, worker.Options{Concurrency: 8}, fetch.New(&fetch.Options{AllowPrivate: true}), sumindex.Wrap(e.target, idx, zerolog.Nop()))
	e.waitReady(r.w)
	const n = 10
	var js []jobs.Job
	for i := range n {
		k := fmt.Sprintf("path%d/artifact.tgz", i)
		js = append(js, jobs.Job{ID: fmt.Sprintf("j%d", i), URL: o.url("/" + k), Target: k, SHA256: hexSHA(shared)})
	}
	e.publish(js...)
	r.f.waitFor(t, n, func(f worker.Final) bool {
		return f.Outcome == worker.OutcomeStored || f.Outcome == worker.OutcomeCopied
	}, 60*time.Second)
	for _, j := range js {
		e.checkStored(j.Target, shared)
	}
	if got := len(o.log()); got != 1 {
		t.Errorf("origin got %d requests for one body, want 1", got)
	}
	if got := r.f.count(isOutcome(worker.OutcomeCopied)); got != n-1 {
		t.Errorf("%d copied, want %d", got, n-1)
	}
	if got := p.n.Load(); got != 1 {
		t.Errorf("pacer asked for %d grants, want 1", got)
	}
}
