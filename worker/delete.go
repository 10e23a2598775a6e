package worker

import (
	"cmp"
	"context"
	"errors"
	"io"
	"sync"
	"time"

	"github.com/mirrorworker/mirrorworker/authority"
	"github.com/mirrorworker/mirrorworker/clock"
	"github.com/mirrorworker/mirrorworker/fetch"
	"github.com/mirrorworker/mirrorworker/jobs"
	"github.com/mirrorworker/mirrorworker/mirror"
	"github.com/rs/zerolog"
)

// This file is the delete job (jobs.OpDelete) and the order of a key's
// fetches and deletes
// (docs/adr/0033-deletes-ordered-by-enqueue-time-and-tombstones.md): every
// store and every delete of a key happens under the key's lock in this pod,
// and is skipped (acked "superseded") when the key's state in the target
// comes from a job enqueued later. A key's jobs share their URL's authority,
// so one pod owns them all; the enqueue instant, carried by every copy of a
// job, keeps the order across redeliveries, parking and restarts.

// Deleter is what a target needs for delete jobs: removal with a
// tombstone (mirror.FileTarget and bucket.Target). A Target without it
// dead-letters delete jobs delete_unsupported.
type Deleter interface {
	Delete(ctx context.Context, key string, ts mirror.Tombstone) error
	Tombstone(ctx context.Context, key string) (mirror.Tombstone, error)
	ClearTombstone(ctx context.Context, key string) error
}

// keyLocks serialise the stores and deletes of one target key in this pod.
// The lock is a channel so that a waiter can give up with its context.
// Safe for concurrent use; the zero value is ready.
type keyLocks struct {
	mu   sync.Mutex
	held map[string]*keyLock
}

type keyLock struct {
	ch   chan struct{} // a token while held
	refs int           // holders and waiters; guarded by keyLocks.mu
}

// lock takes key's lock, or returns ctx's error. The caller calls the
// returned function once to release it.
func (k *keyLocks) lock(ctx context.Context, key string) (func(), error) {
	k.mu.Lock()
	if k.held == nil {
		k.held = map[string]*keyLock{}
	}
	l := k.held[key]
	if l == nil {
		l = &keyLock{ch: make(chan struct{}, 1)}
		k.held[key] = l
	}
	l.refs++
	k.mu.Unlock()
	select {
	case l.ch <- struct{}{}:
		return func() { <-l.ch; k.drop(key, l) }, nil
	case <-ctx.Done():
		k.drop(key, l)
		return nil, ctx.Err()
	}
}

func (k *keyLocks) drop(key string, l *keyLock) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if l.refs--; l.refs == 0 {
		delete(k.held, key)
	}
}

// deletes carries out delete jobs and guards the stores of fetches: a
// key's stores and deletes happen one at a time in this pod (keys), in
// the order of their jobs' enqueue instants, and deletes within the pod's
// limit (limit). Safe for concurrent use.
type deletes struct {
	clk        clock.Clock
	log        zerolog.Logger
	m          *Metrics
	sched      *scheduler
	settler    *settler
	health     *targetHealth
	slots      *sync.WaitGroup       // the Worker's: Run waits for deletes as for fetches
	target     func(*heldJob) Target // where a job is stored (its replay's target, or the worker's)
	inProgress func(*heldJob)        // extends a job's ack wait unless it is settled
	ackWait    time.Duration

	keys  keyLocks
	limit deleteLimit
}

// storeGuard is a fetch's hold on its key while it stores: release it
// with done, telling whether the object was stored.
type storeGuard struct {
	d       *deletes
	j       *heldJob
	unlock  func()
	cleared bool // a tombstone older than the job lies on the key
}

// guardStore takes j's key for its store. superseded is true when a delete
// enqueued after j removed the key: j must not bring it back, and is
// acked as superseded by the caller (the key's lock is released then).
func (w *deletes) guardStore(ctx context.Context, j *heldJob, enq time.Time) (g *storeGuard, superseded bool, err error) {
	unlock, err := w.keys.lock(ctx, j.job.Target)
	if err != nil {
		return nil, false, err
	}
	g = &storeGuard{d: w, j: j, unlock: unlock}
	d, ok := w.target(j).(Deleter)
	if !ok {
		return g, false, nil
	}
	ts, err := d.Tombstone(ctx, j.job.Target)
	switch {
	case errors.Is(err, mirror.ErrNotFound):
	case err != nil:
		// Unreadable: storing may bring back a deleted key; not storing
		// may lose a fetch. The store is retried.
		unlock()
		return nil, false, err
	case mirror.Supersedes(ts.Enqueued, enq):
		unlock()
		return nil, true, nil
	default:
		g.cleared = true
	}
	return g, false, nil
}

// done releases the key; a stored object replaces an older tombstone.
func (g *storeGuard) done(ctx context.Context, stored bool) {
	defer g.unlock()
	if !stored || !g.cleared {
		return
	}
	if err := g.d.target(g.j).(Deleter).ClearTombstone(ctx, g.j.job.Target); err != nil {
		// The object is newer than the tombstone (Meta.Enqueued): readers
		// take the object; a later fetch clears it.
		g.d.log.Warn().Err(err).Str("job", g.j.job.ID).Str("key", g.j.job.Target).Msg("clear the tombstone of a key stored again")
	}
}

// superseded acks a job that a job enqueued after it made moot.
func (w *deletes) superseded(j *heldJob, why string) {
	w.m.Deletes.WithLabelValues(OutcomeSuperseded).Inc()
	w.log.Info().Str("job", j.job.ID).Str("key", j.job.Target).Str("op", cmp.Or(j.job.Op, jobs.OpFetch)).
		Msg("job superseded: " + why)
	w.settler.complete(j, OutcomeSuperseded)
}

// supersededStore acks j, whose fetched body a delete enqueued after it
// made moot, without storing the body.
func (w *deletes) supersededStore(j *heldJob, resp *fetch.Response, kept mirror.Kept) {
	discard(resp.Body)
	resp.Body.Close()
	if kept != nil { // the key is deleted: its start is moot
		kept.Discard()
	}
	w.superseded(j, "a delete enqueued after the fetch removed the key")
}

// unguarded settles j, whose key's tombstone could not be read (err), for
// a later attempt: storing now might bring back a deleted key.
func (w *deletes) unguarded(ctx context.Context, j *heldJob, resp *fetch.Response, kept mirror.Kept, err error) {
	resp.Body.Close()
	if kept != nil {
		kept.Release()
	}
	switch {
	case ctx.Err() != nil:
		w.settler.handBack(j)
	case mirror.FailureCode(err) != "":
		// The tombstone could not be read because the target failed
		// (down, full, read-only): as for a failed write, the worker's
		// problem, not the job's (targethealth.go).
		w.health.writeFailed(j, mirror.FailureCode(err), err)
	default:
		w.settler.transient(ctx, j, jobs.ReasonTargetWrite, resp.Status, err.Error())
	}
}

// startDelete takes a delete job from the intake: within the pod's delete
// limit it runs at once, in its own goroutine (it may wait for its key's
// lock while a fetch stores); past the limit it waits in the stream,
// unacked and not failed (a NAK with delay), while fetches go on.
func (w *deletes) start(ctx context.Context, j *heldJob) {
	now := w.clk.Now()
	wait, ok, first := w.limit.take(now)
	if !ok {
		w.m.DeleteLimitReached.Set(1)
		w.m.Deletes.WithLabelValues("limited").Inc()
		if first {
			w.log.Warn().Int("max_deletes_per_minute", w.limit.max).Str("job", j.job.ID).
				Msgf("delete limit reached: %d deletes in the last minute; further deletes wait in the stream (fetches go on). If these deletes are expected, raise --max-deletes-per-minute (0: no limit); if not, stop the producer and purge its delete jobs", w.limit.max)
		}
		w.settler.nakDeferred(deferral{job: j, delay: wait, reason: reasonDeleteLimit})
		return
	}
	w.slots.Add(1)
	go func() {
		defer w.slots.Done()
		w.run(ctx, j)
	}()
}

// runDelete carries out one delete job under its key's lock.
func (w *deletes) run(ctx context.Context, j *heldJob) {
	key := j.job.Target
	enq := enqueuedOf(w.sched.msgOf(j))
	tgt := w.target(j)
	d, ok := tgt.(Deleter)
	if !ok {
		w.settler.deadLetter(ctx, j, jobs.ReasonDeleteUnsupported, "the mirror target keeps no tombstones", 0, nil)
		return
	}
	lctx, stop := context.WithCancel(ctx)
	// The in-progress acks end with the delete: nothing of it outlives its
	// slot, which the stop's drain waits for.
	kept := make(chan struct{})
	go func() { defer close(kept); w.keepInProgress(lctx, j) }()
	defer func() { stop(); <-kept }()
	unlock, err := w.keys.lock(lctx, key)
	if err != nil {
		w.settler.handBack(j)
		return
	}
	defer unlock()
	if m, err := tgt.Stat(ctx, key); err == nil && mirror.Supersedes(m.Enqueued, enq) {
		w.superseded(j, "a fetch enqueued after the delete stored the key")
		return
	} else if err != nil && !errors.Is(err, mirror.ErrNotFound) {
		w.failed(ctx, j, err)
		return
	}
	ts := mirror.Tombstone{URL: authority.StripUserinfo(j.job.URL), JobID: j.job.ID, Enqueued: enq, DeletedAt: w.clk.Now().UTC()}
	if old, err := d.Tombstone(ctx, key); err == nil && mirror.Supersedes(old.Enqueued, enq) {
		ts = old // a later delete's tombstone stays
	}
	if err := d.Delete(ctx, key, ts); err != nil {
		w.failed(ctx, j, err)
		return
	}
	// A start of the key's body that a failed fetch kept (resume.go) would
	// otherwise wait out its 24 h: the key is gone, so are its bytes.
	if r, ok := tgt.(Resumer); ok {
		if k, err := r.Resume(ctx, key, jobURL(j)); err == nil && k != nil {
			k.Discard()
		}
	}
	w.m.Deletes.WithLabelValues(OutcomeDeleted).Inc()
	w.log.Info().Str("job", j.job.ID).Str("key", key).Str("url", logURL(j.job.URL)).Msg("deleted")
	w.settler.complete(j, OutcomeDeleted)
}

// deleteFailed settles a delete the target could not carry out.
func (w *deletes) failed(ctx context.Context, j *heldJob, err error) {
	switch {
	case ctx.Err() != nil:
		w.settler.handBack(j)
	case mirror.FailureCode(err) != "":
		w.health.writeFailed(j, mirror.FailureCode(err), err)
	case errors.Is(err, mirror.ErrInvalidKey):
		w.settler.deadLetter(ctx, j, jobs.ReasonInvalidTarget, err.Error(), 0, nil)
	case errors.Is(err, mirror.ErrKeyConflict):
		w.settler.deadLetter(ctx, j, jobs.ReasonTargetConflict, err.Error(), 0, nil)
	default:
		w.settler.transient(ctx, j, jobs.ReasonTargetWrite, 0, err.Error())
	}
}

// keepInProgress extends j's ack wait until ctx ends: a delete waiting for
// its key's lock is in no scheduler queue, which the heartbeat covers.
func (w *deletes) keepInProgress(ctx context.Context, j *heldJob) {
	period := max(w.ackWait/4, 10*time.Millisecond)
	for {
		t := w.clk.NewTimer(period)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C():
			w.inProgress(j)
		}
	}
}

// discard drains what is left of a body that will not be stored, so that
// its connection can be reused (up to a bound; the rest is cut).
func discard(r io.Reader) {
	_, _ = io.Copy(io.Discard, io.LimitReader(r, 256<<10))
}

// DeleteStatus is the delete limit in a PodStatus.
type DeleteStatus struct {
	// Limit is --max-deletes-per-minute (0: none); LastMinute the deletes
	// this pod started in the last minute.
	Limit      int `json:"limit"`
	LastMinute int `json:"last_minute"`
	// ReachedSince is set while the limit holds deletes back.
	ReachedSince *time.Time `json:"reached_since,omitempty"`
}

// deleteStatus returns the delete limit's state at now.
func (w *deletes) status(now time.Time) DeleteStatus {
	n, at := w.limit.state(now)
	st := DeleteStatus{Limit: max(w.limit.max, 0), LastMinute: n}
	if !at.IsZero() {
		at = at.UTC()
		st.ReachedSince = &at
	} else {
		w.m.DeleteLimitReached.Set(0)
	}
	return st
}
