package worker

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/cenkalti/backoff/v4"
	"github.com/mirrorworker/mirrorworker/clock"
	"github.com/mirrorworker/mirrorworker/mirror"
	"github.com/mirrorworker/mirrorworker/pacer"
)

// A failure of the mirror target itself (a full disk, a quota, a read-only
// or broken file system: mirror.FailureCode) is the worker's problem, not
// the job's (SPEC section 5 as changed by issue 13). On the first one the
// worker marks the target down: it pulls no more jobs, /readyz names the
// cause, every job that reaches a slot or a write is handed back without
// using its failure budget and without a request to its origin, and a probe
// loop tests the target with backoff until it takes writes again; then the
// worker resumes by itself. The hooks are narrow: store settles a failed
// Put here, runSlot asks before a fetch, the intake asks before a pull,
// and Ready reports the cause.

// targetHealth is whether the mirror target takes writes. The zero value
// is a target that is up. Safe for concurrent use.
type targetHealth struct {
	mu      sync.Mutex
	down    bool
	code    string // mirror.FailureCode of cause
	cause   error
	since   time.Time
	changed chan struct{} // closed, and replaced, when down changes
}

// fail marks the target down because of err; it reports whether the target
// was up until now. A later failure while down replaces the cause (the
// latest error is the one an operator needs) but not since.
func (h *targetHealth) fail(now time.Time, code string, err error) (wasUp bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.code, h.cause = code, err
	if h.down {
		return false
	}
	h.down, h.since = true, now
	h.notifyLocked()
	return true
}

// recover marks the target up; it returns how long it was down, and
// whether it was.
func (h *targetHealth) recover(now time.Time) (downFor time.Duration, wasDown bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if !h.down {
		return 0, false
	}
	h.down, h.code, h.cause = false, "", nil
	h.notifyLocked()
	return now.Sub(h.since), true
}

// notifyLocked wakes everyone waiting for a change. h.mu is held.
func (h *targetHealth) notifyLocked() {
	if h.changed != nil {
		close(h.changed)
		h.changed = nil
	}
}

// state returns whether the target is down and a channel closed at the
// next change.
func (h *targetHealth) state() (down bool, changed <-chan struct{}) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.changed == nil {
		h.changed = make(chan struct{})
	}
	return h.down, h.changed
}

func (h *targetHealth) isDown() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.down
}

// err describes a target that is down for readiness, nil when it is up.
func (h *targetHealth) err(now time.Time) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if !h.down {
		return nil
	}
	return fmt.Errorf("mirror target failing for %s (%s): %v; not pulling jobs until it takes writes again",
		now.Sub(h.since).Round(time.Second), h.code, h.cause)
}

// targetFailed settles a job whose write failed because of the target
// itself: it marks the target down and hands the job back. No failure is
// recorded against the job.
func (w *Worker) targetFailed(j *heldJob, code string, err error) {
	now := w.clk.Now()
	w.m.TargetFailures.WithLabelValues(code).Inc()
	if w.health.fail(now, code, err) {
		w.m.TargetUp.Set(0)
		w.log.Error().Str("error_code", code).Str("error", err.Error()).Str("job", j.job.ID).
			Str("probe_first_in", w.o.TargetProbeInitial.String()).
			Msg("mirror target failing: pulling no jobs and handing held ones back, at no cost to their failure budget, until a probe write succeeds")
	}
	w.handBackTargetDown(j)
}

// handBackTargetDown returns a job to the stream while the target is down.
// The short delay keeps a job from circling through a pull that was
// already in flight; it counts one delivery and no failure.
func (w *Worker) handBackTargetDown(j *heldJob) {
	if err := w.settler.settle(j, func(m Msg) error { return m.NakWithDelay(w.o.TargetProbeInitial) }); err != nil {
		w.log.Warn().Err(err).Str("job", j.job.ID).Msg("nak job while the mirror target fails")
	}
	w.log.Debug().Str("job", j.job.ID).Str("authority", j.auth).Msg("job handed back: mirror target failing")
}

// skipWhileTargetDown is runSlot's hook before a fetch: while the target
// is down, the granted permit is given back unused and the job handed
// back, so that no origin is asked for bytes that cannot be stored.
func (w *Worker) skipWhileTargetDown(j *heldJob, pm pacer.Permit) bool {
	if !w.health.isDown() {
		return false
	}
	w.d.Pacer.Done(w.clk.Now(), pm, pacer.Response{Cancelled: true})
	w.handBackTargetDown(j)
	return true
}

// waitTargetUp is the intake's hook before a pull: it returns at once
// while the target is up, else waits until it is up again (true) or ctx
// is done (false).
func (w *Worker) waitTargetUp(ctx context.Context) bool {
	for {
		down, changed := w.health.state()
		if !down {
			return true
		}
		select {
		case <-ctx.Done():
			return false
		case <-changed:
		}
	}
}

// targetProbeLoop waits for the target to go down, then probes it with
// exponential backoff (TargetProbeInitial doubling up to TargetProbeMax,
// with jitter) until a probe succeeds, and marks it up. It returns when
// ctx is done.
func (w *Worker) targetProbeLoop(ctx context.Context) {
	b := backoff.NewExponentialBackOff(
		backoff.WithInitialInterval(w.o.TargetProbeInitial),
		backoff.WithMaxInterval(w.o.TargetProbeMax),
		backoff.WithMultiplier(2),
		backoff.WithRandomizationFactor(0.2),
		backoff.WithMaxElapsedTime(0),
	)
	var upAt time.Time // when the target last recovered
	for {
		down, changed := w.health.state()
		if !down {
			select {
			case <-ctx.Done():
				return
			case <-changed:
				continue
			}
		}
		// A target that fails again soon after it recovered (a probe fits
		// on a nearly full disk, objects do not) keeps its longer delay, so
		// that a flapping target does not cost origins a round of requests
		// every TargetProbeInitial.
		if upAt.IsZero() || w.clk.Now().Sub(upAt) > w.o.TargetProbeMax {
			b.Reset()
		}
		delay := b.NextBackOff()
		for probes := 1; ; probes++ {
			if !clock.Sleep(w.clk, delay, ctx.Done()) {
				return
			}
			pctx, cancel := context.WithTimeout(ctx, time.Minute)
			err := w.d.Target.Probe(pctx)
			cancel()
			if ctx.Err() != nil {
				return
			}
			if err == nil {
				upAt = w.clk.Now()
				downFor, _ := w.health.recover(upAt)
				w.m.TargetUp.Set(1)
				w.log.Info().Str("down_for", downFor.Round(time.Millisecond).String()).Int("probes", probes).
					Msg("mirror target takes writes again: pulling jobs")
				w.wakeIntake()
				break
			}
			code := mirror.FailureCode(err)
			if code == "" {
				code = "other"
			}
			w.m.TargetFailures.WithLabelValues(code).Inc()
			w.health.fail(w.clk.Now(), code, err)
			delay = b.NextBackOff()
			w.log.Warn().Str("error_code", code).Str("error", err.Error()).Int("probes", probes).
				Str("next_probe_in", delay.String()).Msg("mirror target still failing")
		}
	}
}
