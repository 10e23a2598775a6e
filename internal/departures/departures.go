// Package departures times the requests a worker sends at the instant its
// pacer confirmed each start, and keeps the one file format in which a
// `mirrorworker run` process started by the load test logs them (Log,
// ReadFile). It is a test hook: production runs never set Env, and then
// nothing is wrapped or written. It does not judge the departures (the load
// test's report does).
package departures

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/mirrorworker/mirrorworker/authority"
	"github.com/mirrorworker/mirrorworker/fetch"
	"github.com/mirrorworker/mirrorworker/grant"
	"github.com/mirrorworker/mirrorworker/pacer"
)

// Env names the file to which a `mirrorworker run` process started by the
// load test appends the instant of every request it sends (see Log). Only
// the load test sets it, for its own pods: it is not a MIRRORWORKER_
// variable, so it can never be read as a flag.
const Env = "MW_LOADTEST_DEPARTURES"

// Recorder takes one departure: a request to auth whose start the pacer
// confirmed at t. Implementations are safe for concurrent use.
type Recorder interface {
	Record(auth string, t time.Time)
}

// Fetcher is a worker's fetcher (worker.Fetcher).
type Fetcher interface {
	Do(ctx context.Context, r fetch.Request, g fetch.Gate) (*fetch.Response, error)
}

// Pacer is a worker's pacer (worker.Pacer), as grant.Local already states
// it below the worker: this package wraps one without importing the worker
// (the tests hold the method sets equal). Wrap watches Confirm and Sent
// and passes the rest on.
type Pacer = grant.Local

// Wrap returns a worker's fetcher f and pacer p recording every request
// the worker sends to rec, at the instant p confirmed the start (see
// recorder): the worker is built with the two it returns
// (d.Fetcher, d.Pacer = departures.Wrap(d.Fetcher, d.Pacer, rec)).
func Wrap(f Fetcher, p Pacer, rec Recorder) (Fetcher, Pacer) {
	r := &recorder{log: rec, confirmed: map[string][]time.Time{}}
	return recordingFetcher{f: f, r: r}, recordingPacer{Pacer: p, r: r}
}

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
	log       Recorder
	mu        sync.Mutex
	confirmed map[string][]time.Time // per authority, oldest first
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
	r.log.Record(auth, at)
}

type recordingFetcher struct {
	f Fetcher
	r *recorder
}

func (f recordingFetcher) Do(ctx context.Context, req fetch.Request, g fetch.Gate) (*fetch.Response, error) {
	return f.f.Do(ctx, req, g.Admitted(func(a authority.Authority) { f.r.sent(a.String()) }))
}

// recordingPacer notes every start its pacer confirms, and passes each
// write the worker reports (Sent) to a log that keeps them (WriteRecorder).
type recordingPacer struct {
	Pacer
	r *recorder
}

// WriteRecorder is a Recorder that also keeps the instant the worker
// reported each request written (Pacer.Sent, the instant the pacer
// spaces the next start from): a trace to set beside the origin's arrivals.
type WriteRecorder interface {
	RecordWrite(auth string, t time.Time)
}

func (p recordingPacer) Sent(now time.Time, pm pacer.Permit) {
	p.Pacer.Sent(now, pm)
	if w, ok := p.r.log.(WriteRecorder); ok {
		w.RecordWrite(pm.Authority, now)
	}
}

func (p recordingPacer) Confirm(now time.Time, pm pacer.Permit) (pacer.Permit, error) {
	cpm, err := p.Pacer.Confirm(now, pm)
	if err == nil && !cpm.Start.After(now) { // may start now: pacer.Wait starts it
		p.r.confirm(pm.Authority, now)
	}
	return cpm, err
}

// Log appends one line per request a process sends, "<unix ns>
// <authority>\n", so that the load test can time the departures of pods
// that run as separate processes as it times its in-process workers'. Every
// line is one write to a file opened for appending: a pod killed mid-run
// loses none of the lines it wrote. A nil *Log records nothing. Safe for
// concurrent use.
type Log struct {
	mu     sync.Mutex
	f      *os.File
	writes *os.File // path+WritesSuffix (RecordWrite)
}

// WritesSuffix names the file beside a Log's path in which it keeps the
// writes the worker reported (RecordWrite), in the same line format.
const WritesSuffix = ".writes"

// Open opens path and path+WritesSuffix for appending; an empty path
// returns nil (no recording).
func Open(path string) (*Log, error) {
	if path == "" {
		return nil, nil
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		return nil, fmt.Errorf("departure log: %w", err)
	}
	w, err := os.OpenFile(path+WritesSuffix, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("departure log: %w", err)
	}
	return &Log{f: f, writes: w}, nil
}

// Wrap is Wrap into l; on a nil Log it returns f and p unchanged.
func (l *Log) Wrap(f Fetcher, p Pacer) (Fetcher, Pacer) {
	if l == nil {
		return f, p
	}
	return Wrap(f, p, l)
}

// Record appends one line.
func (l *Log) Record(auth string, t time.Time) { l.append(&l.f, auth, t) }

// RecordWrite appends one line to the writes file (WritesSuffix).
func (l *Log) RecordWrite(auth string, t time.Time) { l.append(&l.writes, auth, t) }

// append writes "<unix ns> <auth>" to *f unless the log is closed; best
// effort: a lost line shows as a pod with fewer requests.
func (l *Log) append(f **os.File, auth string, t time.Time) {
	line := strconv.AppendInt(nil, t.UnixNano(), 10)
	line = append(append(append(line, ' '), auth...), '\n')
	l.mu.Lock()
	defer l.mu.Unlock()
	if *f != nil {
		(*f).Write(line)
	}
}

// Close closes the file; nil is a no-op.
func (l *Log) Close() error {
	if l == nil {
		return nil
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	err := l.f.Close()
	l.writes.Close()
	l.f, l.writes = nil, nil
	return err
}

// ReadFile passes every departure logged in path to rec and returns how
// many there were. A missing file is no departures (the pod sent nothing);
// a line cut short by a kill is skipped.
func ReadFile(path string, rec Recorder) (int64, error) {
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
			continue
		}
		rec.Record(auth, time.Unix(0, v))
		n++
	}
	return n, nil
}
