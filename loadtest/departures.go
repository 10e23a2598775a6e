package loadtest

import (
	"context"
	"sort"
	"sync"
	"time"

	"github.com/mirrorworker/mirrorworker/authority"
	"github.com/mirrorworker/mirrorworker/fetch"
	"github.com/mirrorworker/mirrorworker/worker"
)

// departures records when each request actually left a worker, per
// authority, so the report can tell a pacer that granted two starts too
// close (a politeness bug) from arrivals that the origin timed too close
// because one request left or was handled late (CPU contention, a new
// connection). Safe for concurrent use.
type departures struct {
	mu sync.Mutex
	at map[string][]time.Time
}

func newDepartures() *departures { return &departures{at: map[string][]time.Time{}} }

// fetcher wraps f so that every hop admitted by the worker's gate is
// recorded the moment the gate lets it go.
func (d *departures) fetcher(f worker.Fetcher) worker.Fetcher { return recordingFetcher{f: f, d: d} }

type recordingFetcher struct {
	f worker.Fetcher
	d *departures
}

func (r recordingFetcher) Do(ctx context.Context, req fetch.Request, g fetch.Gate) (*fetch.Response, error) {
	return r.f.Do(ctx, req, func(ctx context.Context, hop int, a authority.Authority) (func(fetch.Result), error) {
		done, err := g(ctx, hop, a)
		if err == nil {
			r.d.record(a.String(), time.Now())
		}
		return done, err
	})
}

func (d *departures) record(auth string, t time.Time) {
	d.mu.Lock()
	d.at[auth] = append(d.at[auth], t)
	d.mu.Unlock()
}

// belowFloor counts consecutive departures to one authority closer than
// floor, and returns the smallest gap seen (-1 when there is none).
func (d *departures) belowFloor(floor time.Duration) (n int64, minGap time.Duration) {
	d.mu.Lock()
	defer d.mu.Unlock()
	minGap = -1
	for _, ts := range d.at {
		sort.Slice(ts, func(i, j int) bool { return ts[i].Before(ts[j]) })
		for i := 1; i < len(ts); i++ {
			g := ts[i].Sub(ts[i-1])
			if minGap < 0 || g < minGap {
				minGap = g
			}
			if g < floor {
				n++
			}
		}
	}
	return n, minGap
}
