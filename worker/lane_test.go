package worker_test

import (
	"context"
	"strings"
	"testing"

	"github.com/mirrorworker/mirrorworker/authority"
	"github.com/mirrorworker/mirrorworker/jobs"
)

// laneConsumers returns the lane and catch-up consumers on MIRROR_JOBS and
// the jobs waiting in the lanes.
func laneConsumers(t testing.TB, e *env) (lanes, catchups int, waiting uint64) {
	t.Helper()
	s, err := e.js.Stream(context.Background(), jobs.JobsStream)
	if err != nil {
		t.Fatal(err)
	}
	l := s.ListConsumers(context.Background())
	for ci := range l.Info() {
		switch {
		case strings.HasPrefix(ci.Name, jobs.LaneConsumerPrefix):
			lanes++
			waiting += ci.NumPending + uint64(ci.NumAckPending)
		case strings.HasPrefix(ci.Name, jobs.CatchupConsumerPrefix):
			catchups++
		}
	}
	if err := l.Err(); err != nil {
		t.Fatal(err)
	}
	return lanes, catchups, waiting
}

// parkedTotal is every job waiting out a cooldown: parked one by one in
// MIRROR_PARKED or in a lane.
func parkedTotal(t testing.TB, e *env) uint64 {
	_, _, inLanes := laneConsumers(t, e)
	return streamMsgs(t, e, jobs.ParkStream) + inLanes
}

// originInPartition returns a new origin whose authority falls into
// partition p (of jobs.DefaultPartitions).
func originInPartition(t testing.TB, p int) *origin {
	t.Helper()
	for range 2000 {
		o := newOrigin(t)
		if jobs.Partition(authority.KeyOf(o.auth), jobs.DefaultPartitions) == p {
			return o
		}
		o.srv.Close()
	}
	t.Fatalf("no loopback port found in partition %d", p)
	return nil
}
