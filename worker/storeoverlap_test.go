package worker_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"sync"
	"testing"
	"time"

	"github.com/mirrorworker/mirrorworker/fetch"
	"github.com/mirrorworker/mirrorworker/jobs"
	"github.com/mirrorworker/mirrorworker/mirror"
	"github.com/mirrorworker/mirrorworker/worker"
)

// heldPut is a file target whose Put of one key waits, once its body is
// read, until release is closed: a slow disk under one job.
type heldPut struct {
	*mirror.FileTarget
	key     string
	entered chan struct{} // closed once the held Put has read its body
	release chan struct{}
	once    sync.Once
}

func (h *heldPut) Put(ctx context.Context, key string, body io.Reader, want mirror.Expect, m mirror.Meta) (mirror.Meta, error) {
	if key != h.key {
		return h.FileTarget.Put(ctx, key, body, want, m)
	}
	b, err := io.ReadAll(body)
	if err != nil {
		return mirror.Meta{}, err
	}
	h.once.Do(func() { close(h.entered) })
	select {
	case <-h.release:
	case <-ctx.Done():
		return mirror.Meta{}, ctx.Err()
	}
	return h.FileTarget.Put(ctx, key, bytes.NewReader(b), want, m)
}

// Issue 40: a request is in flight until its body has been read to the
// end (docs/contract.md), so writing the body to the target, with its
// fsyncs, does not hold the authority's in-flight place: with a cap of 1,
// the authority's next request starts while the previous job's store is
// still running. At 10 authorities this is what keeps the disk's latency
// out of the politeness cap (ADR 0036). countingReader closes the body at
// its end; without that, this test times out.
func TestTheNextRequestDoesNotWaitForTheStore(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 30*time.Second)
	o := newOrigin(t)
	target := &heldPut{FileTarget: e.target, key: "o/0", entered: make(chan struct{}), release: make(chan struct{})}
	var released sync.Once
	release := func() { released.Do(func() { close(target.release) }) }
	t.Cleanup(release)
	r := e.startWith(testPacer(0, 1, nil, 0, nil), worker.Options{Concurrency: 4}, fetch.New(&fetch.Options{AllowPrivate: true}), target)
	e.waitReady(r.w)
	var js []jobs.Job
	for i := range 2 {
		js = append(js, jobs.Job{ID: fmt.Sprint(i), URL: o.url(fmt.Sprintf("/obj/%d", i)), Target: fmt.Sprintf("o/%d", i)})
	}
	e.publish(js...)
	select {
	case <-target.entered:
	case <-time.After(30 * time.Second):
		t.Fatal("the first job's Put never started")
	}
	// The first job's store is held: the second request must reach the
	// origin regardless (the cap of 1 is the origin's, not the disk's).
	waitCond(t, 10*time.Second, "the second request while the first job is stored", func() bool { return len(o.log()) >= 2 })
	release()
	r.f.waitFor(t, 2, isOutcome(worker.OutcomeStored), 30*time.Second)
	for i := range 2 {
		e.checkStored(fmt.Sprintf("o/%d", i), body(fmt.Sprintf("/obj/%d", i)))
	}
}
