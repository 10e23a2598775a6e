package pacer

import (
	"context"
	"errors"
	"time"

	"github.com/mirrorworker/mirrorworker/clock"
)

// Confirmer is what Wait needs of a pacer: *Pacer is one, and so is every
// strategy of package strategy.
type Confirmer interface {
	Confirm(now time.Time, pm Permit) (Permit, error)
	Done(now time.Time, pm Permit, r Response) Verdict
}

var _ Confirmer = (*Pacer)(nil)

// Wait is the one loop between a grant and the request's start, so that no
// caller can skip a step (as golang.org/x/time/rate's Wait owns its loop):
// it sleeps on clk until pm.Start, confirms the permit with c (Confirm may
// revoke it, or move its Start later, which Wait then sleeps for), and
// returns the permit to start the request with, now, and to pass to Done.
// On a refusal, or when ctx ends first, it gives the permit back (Done with
// a cancelled Response) and returns the error (a *RefusedError, or
// ctx.Err()).
func Wait(ctx context.Context, clk clock.Clock, c Confirmer, pm Permit) (Permit, error) {
	for {
		if d := pm.Start.Sub(clk.Now()); d > 0 && !clock.Sleep(clk, d, ctx.Done()) {
			c.Done(clk.Now(), pm, Response{Cancelled: true})
			return Permit{}, ctx.Err()
		}
		now := clk.Now()
		cpm, err := c.Confirm(now, pm)
		if err != nil {
			c.Done(now, cpm, Response{Cancelled: true})
			return Permit{}, err
		}
		if !cpm.Start.After(now) {
			return cpm, nil
		}
		pm = cpm
	}
}

// Acquirer is what AcquireWait needs of a pacer: Acquire besides Confirm
// and Done. *Pacer is one.
type Acquirer interface {
	Confirmer
	Acquire(now time.Time, auth string, maxWait time.Duration) (Permit, error)
}

var _ Acquirer = (*Pacer)(nil)

// AcquireWait is the one loop from asking for a permit for auth to the
// request's start, for a caller that holds its place while it waits (as
// golang.org/x/time/rate's WaitN, which reserves no further than its
// deadline): it waits for at most maxWait in all. Each Acquire may reserve
// a start no further ahead than the time left; a refusal is waited out on
// clk only when hold, given the refusal and the time left, says so (the
// caller's rule: the worker's decideHold), and is returned otherwise;
// Wait then owns the wait from the grant to the start. It returns the
// permit to start the request with, or the refusal, or ctx.Err().
func AcquireWait(ctx context.Context, clk clock.Clock, a Acquirer, auth string, maxWait time.Duration,
	hold func(re *RefusedError, left time.Duration) bool) (Permit, error) {
	deadline := clk.Now().Add(maxWait)
	for {
		now := clk.Now()
		left := max(deadline.Sub(now), 0)
		pm, err := a.Acquire(now, auth, left)
		if err == nil {
			return Wait(ctx, clk, a, pm)
		}
		var re *RefusedError
		if !errors.As(err, &re) {
			return Permit{}, err
		}
		if !hold(re, left) {
			return Permit{}, re
		}
		// A refusal without a wait is asked again after a millisecond, so
		// that a pacer that says "now" and refuses cannot spin.
		if !clock.Sleep(clk, max(re.Wait, time.Millisecond), ctx.Done()) {
			return Permit{}, ctx.Err()
		}
	}
}
