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
	d interface {
		record(auth string, t time.Time)
	}
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

// DeparturesEnv names the file to which a `mirrorworker run` process started
// by the load test appends the instant of every request it sends (see
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

// Fetcher wraps f so that every hop the worker's gate admits is recorded
// the moment the gate lets it go; on a nil DepartureLog it returns f.
func (d *DepartureLog) Fetcher(f worker.Fetcher) worker.Fetcher {
	if d == nil {
		return f
	}
	return recordingFetcher{f: f, d: d}
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
