package loadtest

import (
	"sort"
	"sync"
	"time"

	departlog "github.com/mirrorworker/mirrorworker/internal/departures"
	"github.com/mirrorworker/mirrorworker/worker"
)

// departures records when each request left a worker, as its pacer
// confirmed the start (departlog.Wrap), per authority, so the report can tell a
// pacer that granted two starts too close (a politeness bug) from arrivals
// that the origin timed too close because one request left or was handled
// late (CPU contention, a new connection). Safe for concurrent use.
type departures struct {
	mu sync.Mutex
	at map[string][]time.Time
}

func newDepartures() *departures { return &departures{at: map[string][]time.Time{}} }

// wrap makes the worker of d record its departures, at the instants its
// pacer confirmed the starts (departlog.Wrap).
func (d *departures) wrap(wd *worker.Deps) {
	wd.Fetcher, wd.Pacer = departlog.Wrap(wd.Fetcher, wd.Pacer, d)
}

// Record takes one departure (departlog.Recorder).
func (d *departures) Record(auth string, t time.Time) {
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

// byIndex is a copy of the departures by the index of their authority in
// auths, nil when none was recorded (the strategy logs no departures).
func (d *departures) byIndex(auths []string) map[int][]time.Time {
	d.mu.Lock()
	defer d.mu.Unlock()
	if len(d.at) == 0 {
		return nil
	}
	out := make(map[int][]time.Time, len(auths))
	for i, a := range auths {
		out[i] = append([]time.Time(nil), d.at[a]...)
	}
	return out
}

// readDepartureLog adds the departures in path to d and returns how many
// there were. A missing file is no departures (the pod sent nothing).
func (d *departures) readDepartureLog(path string) (int64, error) {
	return departlog.ReadFile(path, d)
}
