package loadtest

import (
	"testing"
	"time"
)

// The drain's time is the read that found the queue empty: its last jobs
// are watched closely, the rest of the run at the usual pace.
func TestWatchReadsTheLastJobsClosely(t *testing.T) {
	for _, c := range []struct {
		name string
		snap queueSnap
		seen bool
		want time.Duration
	}{
		{"no reading yet", queueSnap{}, false, watchEvery},
		{"many pending", queueSnap{pending: 200, ackPending: 40}, true, watchEvery},
		{"just above the end", queueSnap{pending: watchEndJobs, ackPending: 1}, true, watchEvery},
		{"the last jobs in flight", queueSnap{ackPending: watchEndJobs}, true, watchEveryAtEnd},
		{"one pending", queueSnap{pending: 1}, true, watchEveryAtEnd},
	} {
		if got := watchNext(c.snap, c.seen); got != c.want {
			t.Errorf("%s: next read after %v, want %v", c.name, got, c.want)
		}
	}
	if watchEveryAtEnd >= watchEvery {
		t.Fatalf("the end's reads (%v) are not closer than the run's (%v)", watchEveryAtEnd, watchEvery)
	}
}
