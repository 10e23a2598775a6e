package worker

import (
	"context"
	"errors"
	"sync"
)

// servedParts is the set of MIRROR_JOBS partitions this worker serves
// (partitioned mode), with the lifetime contexts every partition's intake
// and fetches derive from. Which partitions it may serve is the lease
// manager's answer (Deps.Owns); which it does serve is this set. Safe for
// concurrent use.
type servedParts struct {
	partitioned bool
	owner       func(p int) bool // Deps.Owns; nil: one consumer, every job is ours

	mu      sync.Mutex
	parts   map[int]*partition
	runCtx  context.Context // Run's context; nil before Run
	fetchCt context.Context // the fetches' context, which outlives runCtx by the grace period
}

// partition is one partition of MIRROR_JOBS this worker serves.
type partition struct {
	ictx        context.Context    // its intake's context
	stop        context.CancelFunc // ends its intake
	done        chan struct{}      // closed when its intake has returned
	fctx        context.Context    // its fetches' context
	cancelFetch context.CancelFunc
}

func newServedParts(partitioned bool, owner func(p int) bool) *servedParts {
	return &servedParts{partitioned: partitioned, owner: owner, parts: map[int]*partition{}}
}

// begin records Run's contexts: partitions can be added from now on.
func (s *servedParts) begin(runCtx, fetchCt context.Context) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.runCtx, s.fetchCt = runCtx, fetchCt
}

// add starts serving p with contexts of its own; nil when p is already
// served.
func (s *servedParts) add(p int) (*partition, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.runCtx == nil || s.runCtx.Err() != nil {
		return nil, errors.New("worker: not running")
	}
	if _, ok := s.parts[p]; ok {
		return nil, nil
	}
	ictx, stop := context.WithCancel(s.runCtx)
	fctx, cancelFetch := context.WithCancel(s.fetchCt)
	pt := &partition{ictx: ictx, stop: stop, done: make(chan struct{}), fctx: fctx, cancelFetch: cancelFetch}
	s.parts[p] = pt
	return pt, nil
}

// remove stops serving p and returns it; nil when it was not served.
func (s *servedParts) remove(p int) *partition {
	s.mu.Lock()
	defer s.mu.Unlock()
	pt := s.parts[p]
	delete(s.parts, p)
	return pt
}

// lookup returns p when it is served, else nil.
func (s *servedParts) lookup(p int) *partition {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.parts[p]
}

// owns reports whether requests of partition p may start.
func (s *servedParts) owns(p int) bool {
	return s.owner == nil || s.owner(p)
}

// fetchContext returns the context for a fetch of partition p: the
// worker's own, or the partition's when it is served (so giving p up can
// cancel it).
func (s *servedParts) fetchContext(fctx context.Context, p int) context.Context {
	if !s.partitioned {
		return fctx
	}
	if pt := s.lookup(p); pt != nil {
		return pt.fctx
	}
	return fctx
}

// list returns the partitions served now.
func (s *servedParts) list() []int {
	s.mu.Lock()
	defer s.mu.Unlock()
	parts := make([]int, 0, len(s.parts))
	for part := range s.parts {
		parts = append(parts, part)
	}
	return parts
}

// count is how many partitions are served now.
func (s *servedParts) count() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.parts)
}

// lifetime returns the context Run was given, or a background one before
// Run: background work of the partitions (a lane's skip) ends with it.
func (s *servedParts) lifetime() context.Context {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.runCtx != nil {
		return s.runCtx
	}
	return context.Background()
}
