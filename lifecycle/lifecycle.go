// Package lifecycle runs a process's long-running parts as one group of
// actors and stops them in stages: a part of a later stage is told to stop
// only once every part of the earlier stages has returned (the worker has
// handed its jobs back before the NATS connection closes; the metrics
// endpoint serves until the end).
//
// It is oklog/run's model (each part is an actor with a run function, the
// first to return stops the group) with two things oklog/run has not: the
// order of the stop, and actors added while the group runs (a part built
// once NATS is reached joins the group that already serves the admin
// endpoint). The order itself is not here: the package that wires the
// parts names the stages (pipeline.Stages).
//
// It does not: handle signals (the caller's context is the stop), retry a
// part, or bound how long a part may take to stop (each part owns its
// grace).
package lifecycle

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/rs/zerolog"
)

// Stage is a part's place in the stop order: the parts of stage 0 are told
// to stop first.
type Stage int

// ErrStopping is returned by Add once the stop has passed the actor's
// stage: the part is not started.
var ErrStopping = errors.New("lifecycle: stopping")

// Group is a set of actors stopped in stages. Build it with New; the zero
// value is not usable. Add is safe for concurrent use, also from an
// actor while Run runs; Run is called once.
type Group struct {
	names []string // of the stages, for the log
	work  Stage    // whose errors while stopping are Run's
	log   zerolog.Logger

	mu       sync.Mutex
	stages   []stageState
	pending  []actor // added before Run
	base     context.Context
	running  int // actors started and not returned
	began    bool
	cause    error         // the error of the actor whose return began the stop
	stopErr  error         // the first error of a work actor during the stop
	stopping chan struct{} // closed when the stop begins
	idle     chan struct{} // closed when running drops to 0 after the stop began
}

type stageState struct {
	ctx     context.Context
	cancel  context.CancelFunc
	running int
	told    bool // cancel called: no actor of this stage starts any more
}

type actor struct {
	stage Stage
	name  string
	run   func(ctx context.Context) error
}

// New is a group whose stages are named by names, in stop order (names[0]
// stops first). work is the stage of the process's work (a worker): its
// parts failing to stop cleanly fail the run, while the other parts'
// errors during a stop are only logged. log gets one debug line as each
// stage is told to stop and as each part returns.
func New(log zerolog.Logger, work Stage, names ...string) *Group {
	return &Group{names: names, work: work, log: log, stages: make([]stageState, len(names)),
		stopping: make(chan struct{}), idle: make(chan struct{})}
}

// Add runs fn as the actor name of stage s: fn gets a context that ends
// when the stop reaches s, and must return soon after. An actor that
// returns before the stop begins (with an error or nil) begins it. Added
// before Run, fn starts with Run; added while Run runs, at once; added
// once s was told to stop, it is not started and Add returns ErrStopping.
func (g *Group) Add(s Stage, name string, fn func(ctx context.Context) error) error {
	if int(s) < 0 || int(s) >= len(g.stages) {
		return fmt.Errorf("lifecycle: %s: no stage %d", name, s)
	}
	a := actor{stage: s, name: name, run: fn}
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.base == nil {
		g.pending = append(g.pending, a)
		return nil
	}
	return g.startLocked(a)
}

// startLocked starts a; g.mu is held.
func (g *Group) startLocked(a actor) error {
	st := &g.stages[a.stage]
	if st.told {
		return ErrStopping
	}
	st.running++
	g.running++
	go g.runActor(a, st.ctx)
	return nil
}

func (g *Group) runActor(a actor, ctx context.Context) {
	err := a.run(ctx)
	g.mu.Lock()
	defer g.mu.Unlock()
	g.log.Debug().Err(err).Str("stage", g.names[a.stage]).Str("part", a.name).Msg("part stopped")
	switch {
	case !g.began:
		g.cause = err
		g.beginLocked()
	case err != nil && a.stage == g.work:
		if g.stopErr == nil {
			g.stopErr = err
		}
	case err != nil && !errors.Is(err, context.Canceled):
		g.log.Warn().Err(err).Str("part", a.name).Msg("stopping")
	}
	g.stages[a.stage].running--
	g.running--
	g.advanceLocked()
}

// beginLocked begins the stop; g.mu is held.
func (g *Group) beginLocked() {
	if g.began {
		return
	}
	g.began = true
	close(g.stopping)
	g.advanceLocked()
}

// advanceLocked tells the next stages to stop while every earlier one has
// returned, and closes idle once nothing runs; g.mu is held.
func (g *Group) advanceLocked() {
	if !g.began {
		return
	}
	for i := range g.stages {
		st := &g.stages[i]
		if !st.told {
			g.log.Debug().Str("stage", g.names[i]).Int("parts", st.running).Msg("stopping")
			st.told = true
			st.cancel()
		}
		if st.running > 0 {
			return
		}
	}
	if g.running == 0 {
		select {
		case <-g.idle:
		default:
			close(g.idle)
		}
	}
}

// Run starts the actors added so far and runs until ctx ends or an actor
// returns, then stops them stage by stage and returns once every actor has
// returned. The actors' contexts carry ctx's values but not its end: the
// stop reaches each stage in order, not all at once.
//
// It returns the error of the actor whose return began the stop (nil if it
// returned nil, as with oklog/run: a part that must not end on its own says
// so by returning an error); after a stop asked for by ctx, the first error
// an actor of the work stage returned while stopping (it failed to stop
// cleanly), or nil.
func (g *Group) Run(ctx context.Context) error {
	g.mu.Lock()
	if g.base != nil {
		g.mu.Unlock()
		return errors.New("lifecycle: Run called twice")
	}
	// The one detached context: each stage's end is the group's to give.
	g.base = context.WithoutCancel(ctx)
	for i := range g.stages {
		g.stages[i].ctx, g.stages[i].cancel = context.WithCancel(g.base)
	}
	for _, a := range g.pending {
		_ = g.startLocked(a) // no stage is told before the stop
	}
	g.pending = nil
	if g.running == 0 {
		g.beginLocked()
	}
	g.mu.Unlock()
	select {
	case <-ctx.Done():
		g.mu.Lock()
		g.beginLocked()
		g.mu.Unlock()
	case <-g.stopping:
	}
	<-g.idle
	g.mu.Lock()
	defer g.mu.Unlock()
	for i := range g.stages {
		g.stages[i].cancel()
	}
	if g.cause != nil {
		return g.cause
	}
	return g.stopErr
}
