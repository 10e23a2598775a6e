//go:build e2e

package worker_test

import (
	"fmt"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/mirrorworker/mirrorworker/fetch"
	"github.com/mirrorworker/mirrorworker/jobs"
	"github.com/mirrorworker/mirrorworker/worker"
)

// Issue 13, case 2: a full disk is the worker's problem, not the jobs'.
// Writes fail with ENOSPC far more often per job than the failure budget
// allows, yet no job is dead-lettered; the worker is not ready while the
// disk is full and says why; it resumes and stores everything once writes
// succeed again.
func TestFullTargetCostsNoBudget(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 30*time.Second)
	o := newOrigin(t)
	ft := &faultTarget{FileTarget: e.target, putFails: map[string]int{}}
	enospc := error(syscall.ENOSPC)
	ft.putErr.Store(&enospc)
	ft.probeErr.Store(&enospc)
	const budget = 3
	r := e.startWith(testPacer(0, 2, nil, 0, nil), worker.Options{
		FailureBudget: budget, BackoffInitial: 20 * time.Millisecond,
		TargetProbeInitial: 10 * time.Millisecond, TargetProbeMax: 50 * time.Millisecond,
		// The default pull expiry, not the harness's short one: with pulls
		// that short, the two jobs handed back first came back ahead of the
		// others on every pull, and the others rarely met the disk.
		PullWait: worker.DefaultPullWait,
	}, fetch.New(&fetch.Options{AllowPrivate: true}), ft)
	var js []jobs.Job
	var keys []string
	for i := range 10 {
		k := fmt.Sprintf("full/%d", i)
		keys = append(keys, k)
		js = append(js, jobs.Job{ID: fmt.Sprintf("full-%d", i), URL: o.url("/" + k), Target: k})
	}
	e.publish(js...)

	// Phase 1: the disk is full for writes and probes alike.
	waitCond(t, 30*time.Second, "the worker never said the disk is full", func() bool {
		err := r.w.Ready()
		return err != nil && strings.Contains(err.Error(), "no space left on device") && strings.Contains(err.Error(), "ENOSPC")
	})
	waitCond(t, 30*time.Second, "the target was not probed again and again", func() bool { return ft.probes.Load() >= 5 })
	if got := counter(t, r.reg, "mirrorworker_target_up", nil); got != 0 {
		t.Errorf("target_up = %v while the disk is full, want 0", got)
	}
	if err := r.w.Ready(); err == nil {
		t.Error("ready while the disk is full")
	}

	// Phase 2: probes succeed (a little space) but objects still do not
	// fit: the worker resumes, fails, stops again, over and over. Every job
	// meets the full disk more often than its budget.
	ft.probeErr.Store(nil)
	waitCond(t, 60*time.Second, "not every job met the full disk more often than its budget", func() bool {
		return ft.minPutFails(keys) > budget
	})
	if dls := e.deadLetters(); len(dls) != 0 {
		t.Fatalf("%d dead letters while the disk was full, first %+v", len(dls), dls[0])
	}

	// Phase 3: space is freed. Everything is stored, nothing dead-lettered.
	ft.putErr.Store(nil)
	r.f.waitFor(t, 10, isOutcome(worker.OutcomeStored), 60*time.Second)
	e.waitDrained(10 * time.Second)
	for _, k := range keys {
		e.checkStored(k, body("/"+k))
	}
	if dls := e.deadLetters(); len(dls) != 0 {
		t.Fatalf("%d dead letters, first %+v", len(dls), dls[0])
	}
	waitCond(t, 10*time.Second, "not ready after the disk recovered", func() bool { return r.w.Ready() == nil })
	if got := counter(t, r.reg, "mirrorworker_target_up", nil); got != 1 {
		t.Errorf("target_up = %v after recovery, want 1", got)
	}
	if got := counter(t, r.reg, "mirrorworker_target_failures_total", map[string]string{"error": "ENOSPC"}); got < 10*(budget+1) {
		t.Errorf("target_failures_total{error=ENOSPC} = %v, want at least %d", got, 10*(budget+1))
	}
	if got := counter(t, r.reg, "mirrorworker_jobs_total", map[string]string{"outcome": "retried"}); got != 0 {
		t.Errorf("jobs_total{retried} = %v: a full disk was counted as the jobs' failure", got)
	}
}
