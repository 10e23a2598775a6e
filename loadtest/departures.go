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
	// clients holds each client's own starts and reads (a pod, an
	// in-process worker), by name: what the pod-side split of the early
	// requests sets side by side (refusals.go).
	clients map[string]*clientLog
}

// clientLog is one client's starts, each with the instant its pacer's
// Confirm returned (zero: not logged), and the answers it read, per
// authority; readsLogged says the client logs its reads at all.
type clientLog struct {
	starts      map[string][]clientStart
	reads       map[string][]departlog.Read
	readsLogged bool
}

type clientStart struct{ at, returned time.Time }

func newDepartures() *departures {
	return &departures{at: map[string][]time.Time{}, clients: map[string]*clientLog{}}
}

// wrap makes the worker of d record its departures, at the instants its
// pacer confirmed the starts, and the answers it read (departlog.Wrap),
// as the client name.
func (d *departures) wrap(name string, wd *worker.Deps) {
	wd.Fetcher, wd.Pacer = departlog.Wrap(wd.Fetcher, wd.Pacer, d.client(name, true))
}

// client returns the recorder of one client's departures and reads: it
// adds each start to d's merged departures too.
func (d *departures) client(name string, readsLogged bool) *clientRecorder {
	d.mu.Lock()
	defer d.mu.Unlock()
	c := d.clients[name]
	if c == nil {
		c = &clientLog{starts: map[string][]clientStart{}, reads: map[string][]departlog.Read{}}
		d.clients[name] = c
	}
	c.readsLogged = c.readsLogged || readsLogged
	return &clientRecorder{d: d, c: c}
}

// clientRecorder records into one client's log (departlog.StartRecorder,
// departlog.ReadRecorder). Safe for concurrent use.
type clientRecorder struct {
	d *departures
	c *clientLog
}

func (r *clientRecorder) Record(auth string, t time.Time) { r.RecordStart(auth, t, time.Time{}) }

func (r *clientRecorder) RecordStart(auth string, at, returned time.Time) {
	r.d.mu.Lock()
	defer r.d.mu.Unlock()
	r.d.at[auth] = append(r.d.at[auth], at)
	r.c.starts[auth] = append(r.c.starts[auth], clientStart{at: at, returned: returned})
}

func (r *clientRecorder) RecordRead(auth string, rd departlog.Read) {
	r.d.mu.Lock()
	defer r.d.mu.Unlock()
	r.c.reads[auth] = append(r.c.reads[auth], rd)
}

// clientView is one client's starts and reads by the index of their
// authority (departures.byClient).
type clientView struct {
	name        string
	starts      map[int][]clientStart
	reads       map[int][]departlog.Read
	readsLogged bool
}

// byClient is a copy of every client's starts and reads by the index of
// their authority in auths, by name; nil when no client was recorded.
func (d *departures) byClient(auths []string) []clientView {
	d.mu.Lock()
	defer d.mu.Unlock()
	var out []clientView
	for name, c := range d.clients {
		v := clientView{name: name, starts: map[int][]clientStart{}, reads: map[int][]departlog.Read{}, readsLogged: c.readsLogged}
		for i, a := range auths {
			v.starts[i] = append([]clientStart(nil), c.starts[a]...)
			v.reads[i] = append([]departlog.Read(nil), c.reads[a]...)
		}
		out = append(out, v)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].name < out[j].name })
	return out
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

// readDepartureLog adds the departures in path (and the answers read, in
// path+departlog.ReadsSuffix) to d as client name's, and returns how many
// departures there were. A missing file is no departures (the pod sent
// nothing); a missing reads file is a pod that did not log its reads.
func (d *departures) readDepartureLog(name, path string) (int64, error) {
	n, err := departlog.ReadFile(path, d.client(name, false))
	if err != nil {
		return n, err
	}
	r := d.client(name, false)
	if _, ok, err := departlog.ReadReads(path+departlog.ReadsSuffix, r); err != nil {
		return n, err
	} else if ok {
		d.client(name, true)
	}
	return n, nil
}
