package loadtest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/mirrorworker/mirrorworker/authority"
	"github.com/mirrorworker/mirrorworker/fetch"
	"github.com/mirrorworker/mirrorworker/pacer"
	"github.com/mirrorworker/mirrorworker/worker"
)

// departures records when each request left a worker, as its pacer
// confirmed the start (recorder), per authority, so the report can tell a
// pacer that granted two starts too close (a politeness bug) from arrivals
// that the origin timed too close because one request left or was handled
// late (CPU contention, a new connection). Safe for concurrent use.
type departures struct {
	mu sync.Mutex
	at map[string][]time.Time
}

func newDepartures() *departures { return &departures{at: map[string][]time.Time{}} }

// wrap makes the worker of d record its departures (see recorder).
func (d *departures) wrap(wd *worker.Deps) { newRecorder(d).wrap(wd) }

// recorder times each request a worker sends at the instant its pacer
// confirmed the start: the instant Confirm recorded as the actual start and
// spaces every later start from (pacer.Confirm). A time read when the
// fetcher's gate returns would be later by however long the slot took from
// the confirm to the request (a busy CPU, a handed-back check), and by a
// different amount for each request, so two starts the pacer spaced by the
// floor plus the guard could be recorded closer than the floor. What the
// origin sees beyond that (the request's way to its socket, its handler run
// late) it times itself.
//
// The pacer wrapper notes each confirmed start per authority; the fetcher's
// gate, when it admits a hop (the request then leaves), takes the latest
// noted start of that authority and records it. Which of two slots' starts a
// hop takes does not change the set recorded; a start confirmed and then
// given back unsent (the partition lost, the target down) is older than
// every later one, never taken, and dropped after a minute. Safe for
// concurrent use.
type recorder struct {
	log interface {
		record(auth string, t time.Time)
	}
	mu        sync.Mutex
	confirmed map[string][]time.Time // per authority, oldest first
}

func newRecorder(log interface{ record(string, time.Time) }) *recorder {
	return &recorder{log: log, confirmed: map[string][]time.Time{}}
}

// wrap puts the recorder around the worker's fetcher and pacer.
func (r *recorder) wrap(d *worker.Deps) {
	d.Fetcher = recordingFetcher{f: d.Fetcher, r: r}
	d.Pacer = r.pacer(d.Pacer)
}

func (r *recorder) confirm(auth string, at time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	ts := r.confirmed[auth]
	for len(ts) > 0 && at.Sub(ts[0]) > time.Minute {
		ts = ts[1:]
	}
	r.confirmed[auth] = append(ts, at)
}

// sent records a request to auth that the gate has just admitted.
func (r *recorder) sent(auth string) {
	r.mu.Lock()
	at, ts := time.Time{}, r.confirmed[auth]
	if n := len(ts); n > 0 {
		at, r.confirmed[auth] = ts[n-1], ts[:n-1]
	}
	r.mu.Unlock()
	if at.IsZero() {
		at = time.Now() // no confirm seen: a pacer that is not the worker's own
	}
	r.log.record(auth, at)
}

type recordingFetcher struct {
	f worker.Fetcher
	r *recorder
}

func (f recordingFetcher) Do(ctx context.Context, req fetch.Request, g fetch.Gate) (*fetch.Response, error) {
	return f.f.Do(ctx, req, g.Admitted(func(a authority.Authority) { f.r.sent(a.String()) }))
}

// recordingPacer notes every start its pacer confirms.
type recordingPacer struct {
	worker.Pacer
	r *recorder
}

func (p recordingPacer) Confirm(now time.Time, pm pacer.Permit) (pacer.Permit, error) {
	cpm, err := p.Pacer.Confirm(now, pm)
	if err == nil && !cpm.Start.After(now) { // may start now: pacer.Wait starts it
		p.r.confirm(pm.Authority, now)
	}
	return cpm, err
}

// applier is the method the worker looks for on its pacer beyond
// worker.Pacer (an operator's pause, authfail.go): the wrapper keeps it.
type applier interface {
	Apply(now time.Time, ev pacer.Event)
}

type recordingApplier struct {
	recordingPacer
	a applier
}

func (p recordingApplier) Apply(now time.Time, ev pacer.Event) { p.a.Apply(now, ev) }

func (r *recorder) pacer(p worker.Pacer) worker.Pacer {
	rp := recordingPacer{Pacer: p, r: r}
	if a, ok := p.(applier); ok {
		return recordingApplier{recordingPacer: rp, a: a}
	}
	return rp
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

// DeparturesEnv names the file to which a `mirrorworker run` process started
// by the load test appends the instant of every request it sends, as its
// pacer confirmed the start (see
// DepartureLog). Only the load test sets it, for its own pods: it is not a
// MIRRORWORKER_ variable, so it can never be read as a flag.
const DeparturesEnv = "MW_LOADTEST_DEPARTURES"

// DepartureLog appends one line per request a process sends, "<unix ns>
// <authority>\n", so that the load test can time the departures of pods
// that run as separate processes as it times its in-process workers'. Every
// line is one write to a file opened for appending: a pod killed mid-run
// loses none of the lines it wrote. A nil *DepartureLog records nothing.
// Safe for concurrent use.
type DepartureLog struct {
	mu sync.Mutex
	f  *os.File
}

// OpenDepartureLog opens path for appending; an empty path returns nil (no
// recording).
func OpenDepartureLog(path string) (*DepartureLog, error) {
	if path == "" {
		return nil, nil
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		return nil, fmt.Errorf("departure log: %w", err)
	}
	return &DepartureLog{f: f}, nil
}

// Wrap makes the worker of d record every request it sends, at the
// instant its pacer confirmed the start (see recorder); on a nil
// DepartureLog it changes nothing.
func (d *DepartureLog) Wrap(wd *worker.Deps) {
	if d == nil {
		return
	}
	newRecorder(d).wrap(wd)
}

func (d *DepartureLog) record(auth string, t time.Time) {
	line := strconv.AppendInt(nil, t.UnixNano(), 10)
	line = append(append(append(line, ' '), auth...), '\n')
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.f != nil {
		d.f.Write(line) // best effort: a lost line shows as a pod with fewer requests
	}
}

// Close closes the file; nil is a no-op.
func (d *DepartureLog) Close() error {
	if d == nil {
		return nil
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	err := d.f.Close()
	d.f = nil
	return err
}

// readDepartureLog adds the departures in path to d and returns how many
// there were. A missing file is no departures (the pod sent nothing).
func (d *departures) readDepartureLog(path string) (int64, error) {
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("departure log: %w", err)
	}
	var n int64
	for line := range bytes.Lines(b) {
		ns, auth, ok := strings.Cut(strings.TrimSuffix(string(line), "\n"), " ")
		v, err := strconv.ParseInt(ns, 10, 64)
		if !ok || err != nil || auth == "" || !bytes.HasSuffix(line, []byte("\n")) {
			continue // a line cut short by a kill
		}
		d.record(auth, time.Unix(0, v))
		n++
	}
	return n, nil
}
