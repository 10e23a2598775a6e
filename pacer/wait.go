package pacer

import (
	"context"
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
