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
	"github.com/rs/zerolog"
)

// A failure of the mirror target itself (a full disk, a quota, a read-only
// or broken file system: mirror.FailureCode) is the worker's problem, not
// the job's (docs/contract.md, docs/adr/0011). On the first one the
// worker marks the target down: it pulls no more jobs, /readyz names the
// cause, every job that reaches a slot or a write is handed back without
// using its failure budget and without a request to its origin, and a probe
// loop tests the target with backoff until it takes writes again; then the
// worker resumes by itself. The hooks are narrow: store settles a failed
// Put here, runSlot asks before a fetch, the intake asks before a pull,
// and Ready reports the cause.

// targetHealth is whether the mirror target takes writes, and what is done
// about it: jobs handed back while it fails, the probe loop. The zero value
// is a target that is up (its state alone); the rest needs its deps. Safe
// for concurrent use.
type targetHealth struct {
	d healthDeps

	mu      sync.Mutex
	down    bool
	code    string // mirror.FailureCode of cause
	cause   error
	since   time.Time
	changed chan struct{} // closed, and replaced, when down changes
}

// healthDeps are what targetHealth probes the target and hands jobs back
// with.
type healthDeps struct {
	target     Target
	pacer      Pacer // takes back the permit of a job that does not go
	clk        clock.Clock
	log        zerolog.Logger
	m          *Metrics
	settler    *settler
	probeFirst time.Duration // Options.TargetProbeInitial
	probeMax   time.Duration // Options.TargetProbeMax
	resume     func()        // tells the intake that the target is up again
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

// writeFailed settles a job whose write failed because of the target
// itself: it marks the target down and hands the job back. No failure is
// recorded against the job.
func (h *targetHealth) writeFailed(j *heldJob, code string, err error) {
	now := h.d.clk.Now()
	h.d.m.TargetFailures.WithLabelValues(code).Inc()
	if h.fail(now, code, err) {
		h.d.m.TargetUp.Set(0)
		h.d.log.Error().Str("error_code", code).Str("error", err.Error()).Str("job", j.job.ID).
			Str("probe_first_in", h.d.probeFirst.String()).
			Msg("mirror target failing: pulling no jobs and handing held ones back, at no cost to their failure budget, until a probe write succeeds")
	}
	h.handBack(j)
}

// handBack returns a job to the stream while the target is down.
// The short delay keeps a job from circling through a pull that was
// already in flight; it counts one delivery and no failure.
func (h *targetHealth) handBack(j *heldJob) {
	if err := h.d.settler.settle(j, func(m Msg) error { return m.NakWithDelay(h.d.probeFirst) }); err != nil {
		h.d.log.Warn().Err(err).Str("job", j.job.ID).Msg("nak job while the mirror target fails")
	}
	h.d.log.Debug().Str("job", j.job.ID).Str("authority", j.auth).Msg("job handed back: mirror target failing")
}

// skipWhileDown is runSlot's hook before a fetch: while the target
// is down, the granted permit is given back unused and the job handed
// back, so that no origin is asked for bytes that cannot be stored.
func (h *targetHealth) skipWhileDown(j *heldJob, pm pacer.Permit) bool {
	if !h.isDown() {
		return false
	}
	h.d.pacer.Done(h.d.clk.Now(), pm, pacer.Response{Cancelled: true})
	h.handBack(j)
	return true
}

// waitUp is the intake's hook before a pull: it returns at once
// while the target is up, else waits until it is up again (true) or ctx
// is done (false).
func (h *targetHealth) waitUp(ctx context.Context) bool {
	for {
		down, changed := h.state()
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

// probeLoop waits for the target to go down, then probes it with
// exponential backoff (TargetProbeInitial doubling up to TargetProbeMax,
// with jitter) until a probe succeeds, and marks it up. It returns when
// ctx is done.
func (h *targetHealth) probeLoop(ctx context.Context) {
	b := backoff.NewExponentialBackOff(
		backoff.WithInitialInterval(h.d.probeFirst),
		backoff.WithMaxInterval(h.d.probeMax),
		backoff.WithMultiplier(2),
		backoff.WithRandomizationFactor(0.2),
		backoff.WithMaxElapsedTime(0),
	)
	var upAt time.Time // when the target last recovered
	for {
		down, changed := h.state()
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
		if upAt.IsZero() || h.d.clk.Now().Sub(upAt) > h.d.probeMax {
			b.Reset()
		}
		delay := b.NextBackOff()
		for probes := 1; ; probes++ {
			if !clock.Sleep(h.d.clk, delay, ctx.Done()) {
				return
			}
			pctx, cancel := context.WithTimeout(ctx, time.Minute)
			err := h.d.target.Probe(pctx)
			cancel()
			if ctx.Err() != nil {
				return
			}
			if err == nil {
				upAt = h.d.clk.Now()
				downFor, _ := h.recover(upAt)
				h.d.m.TargetUp.Set(1)
				h.d.log.Info().Str("down_for", downFor.Round(time.Millisecond).String()).Int("probes", probes).
					Msg("mirror target takes writes again: pulling jobs")
				h.d.resume()
				break
			}
			code := mirror.FailureCode(err)
			if code == "" {
				code = "other"
			}
			h.d.m.TargetFailures.WithLabelValues(code).Inc()
			h.fail(h.d.clk.Now(), code, err)
			delay = b.NextBackOff()
			h.d.log.Warn().Str("error_code", code).Str("error", err.Error()).Int("probes", probes).
				Str("next_probe_in", delay.String()).Msg("mirror target still failing")
		}
	}
}
