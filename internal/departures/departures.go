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
// (the tests hold the method sets equal). Wrap watches Confirm, Sent and
// Done and passes the rest on.
type Pacer = grant.Local

// Wrap returns a worker's fetcher f and pacer p recording every request
// the worker sends to rec, at the instant p confirmed the start (see
// recorder): the worker is built with the two it returns
// (d.Fetcher, d.Pacer = departures.Wrap(d.Fetcher, d.Pacer, rec)).
func Wrap(f Fetcher, p Pacer, rec Recorder) (Fetcher, Pacer) {
	r := &recorder{log: rec, confirmed: map[string][]confirmed{}}
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
	confirmed map[string][]confirmed // per authority, oldest first
}

// confirmed is one start: at, the instant Confirm was given; returned, the
// clock read once Confirm had returned (the pacer had granted it by then).
type confirmed struct{ at, returned time.Time }

func (r *recorder) confirm(auth string, c confirmed) {
	r.mu.Lock()
	defer r.mu.Unlock()
	ts := r.confirmed[auth]
	for len(ts) > 0 && c.at.Sub(ts[0].at) > time.Minute {
		ts = ts[1:]
	}
	r.confirmed[auth] = append(ts, c)
}

// sent records a request to auth that the gate has just admitted.
func (r *recorder) sent(auth string) {
	r.mu.Lock()
	var c confirmed
	if ts := r.confirmed[auth]; len(ts) > 0 {
		c, r.confirmed[auth] = ts[len(ts)-1], ts[:len(ts)-1]
	}
	r.mu.Unlock()
	if c.at.IsZero() {
		r.log.Record(auth, time.Now()) // no confirm seen: a pacer that is not the worker's own
		return
	}
	if s, ok := r.log.(StartRecorder); ok {
		s.RecordStart(auth, c.at, c.returned)
		return
	}
	r.log.Record(auth, c.at)
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
		p.r.confirm(pm.Authority, confirmed{at: now, returned: time.Now()})
	}
	return cpm, err
}

// StartRecorder is a Recorder that also keeps, for each start, the clock
// read once the pacer's Confirm had returned (Record gets only the
// instant Confirm was given): a start whose Confirm returned before the
// pacer was told an answer (Read.Called) was granted without it.
type StartRecorder interface {
	RecordStart(auth string, at, returned time.Time)
}

// Read is one answer the worker read and told its pacer (Pacer.Done): the
// instant the pacer is told the response, as the load test sets it beside
// the starts of the same worker.
type Read struct {
	// Called is the instant the worker gave Done (its clock read just
	// before the call); Returned is the clock read once Done had
	// returned. The pacer took the answer in between, under its lock: a
	// Confirm that returned before Called was granted without it, one
	// given after Returned with it.
	Called, Returned time.Time
	// Status is the answer's HTTP status; Throttled is the pacer's
	// verdict (a refusal for rate reasons).
	Status    int
	Throttled bool
}

// Refusal reports whether r could be an answer telling a wait: the pacer
// read it as throttling, or its status is 4xx or 5xx. Broader than the
// pacer's own rule on purpose: the load test counts a start after any of
// them as one after a refusal.
func (r Read) Refusal() bool { return r.Throttled || r.Status >= 400 }

// ReadRecorder is a Recorder that also keeps every answer the worker
// read (Pacer.Done with a response; a request given back unsent is no
// answer).
type ReadRecorder interface {
	RecordRead(auth string, r Read)
}

func (p recordingPacer) Done(now time.Time, pm pacer.Permit, r pacer.Response) pacer.Verdict {
	v := p.Pacer.Done(now, pm, r)
	if rr, ok := p.r.log.(ReadRecorder); ok && !r.Cancelled && (r.Status != 0 || r.Err != nil) {
		rr.RecordRead(pm.Authority, Read{Called: now, Returned: time.Now(), Status: r.Status, Throttled: v.Throttled})
	}
	return v
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
	reads  *os.File // path+ReadsSuffix (RecordRead)
}

// WritesSuffix names the file beside a Log's path in which it keeps the
// writes the worker reported (RecordWrite), in the same line format.
const WritesSuffix = ".writes"

// ReadsSuffix names the file beside a Log's path in which it keeps the
// answers the worker read (RecordRead): "<called unix ns> <returned unix
// ns> <status> <throttled 0|1> <authority>\n" (ReadReads).
const ReadsSuffix = ".reads"

// Open opens path, path+WritesSuffix and path+ReadsSuffix for appending;
// an empty path returns nil (no recording).
func Open(path string) (*Log, error) {
	if path == "" {
		return nil, nil
	}
	var fs [3]*os.File
	for i, p := range []string{path, path + WritesSuffix, path + ReadsSuffix} {
		f, err := os.OpenFile(p, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
		if err != nil {
			for _, f := range fs[:i] {
				f.Close()
			}
			return nil, fmt.Errorf("departure log: %w", err)
		}
		fs[i] = f
	}
	return &Log{f: fs[0], writes: fs[1], reads: fs[2]}, nil
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

// RecordStart appends one line with the instant Confirm returned after the
// authority: "<unix ns> <authority> <returned unix ns>\n".
func (l *Log) RecordStart(auth string, at, returned time.Time) {
	line := strconv.AppendInt(nil, at.UnixNano(), 10)
	line = append(append(line, ' '), auth...)
	line = strconv.AppendInt(append(line, ' '), returned.UnixNano(), 10)
	l.appendLine(&l.f, append(line, '\n'))
}

// RecordRead appends one line to the reads file (ReadsSuffix).
func (l *Log) RecordRead(auth string, r Read) {
	line := strconv.AppendInt(nil, r.Called.UnixNano(), 10)
	line = strconv.AppendInt(append(line, ' '), r.Returned.UnixNano(), 10)
	line = strconv.AppendInt(append(line, ' '), int64(r.Status), 10)
	th := " 0 "
	if r.Throttled {
		th = " 1 "
	}
	line = append(append(append(line, th...), auth...), '\n')
	l.appendLine(&l.reads, line)
}

// RecordWrite appends one line to the writes file (WritesSuffix).
func (l *Log) RecordWrite(auth string, t time.Time) { l.append(&l.writes, auth, t) }

// append writes "<unix ns> <auth>" to *f unless the log is closed; best
// effort: a lost line shows as a pod with fewer requests.
func (l *Log) append(f **os.File, auth string, t time.Time) {
	line := strconv.AppendInt(nil, t.UnixNano(), 10)
	l.appendLine(f, append(append(append(line, ' '), auth...), '\n'))
}

func (l *Log) appendLine(f **os.File, line []byte) {
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
	l.reads.Close()
	l.f, l.writes, l.reads = nil, nil, nil
	return err
}

// ReadFile passes every departure logged in path to rec and returns how
// many there were: to its RecordStart where rec is a StartRecorder and the
// line has the instant Confirm returned, else to Record. A missing file is
// no departures (the pod sent nothing); a line cut short by a kill is
// skipped.
func ReadFile(path string, rec Recorder) (int64, error) {
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("departure log: %w", err)
	}
	sr, _ := rec.(StartRecorder)
	var n int64
	for line := range bytes.Lines(b) {
		f := strings.Fields(string(line))
		if len(f) < 2 || len(f) > 3 || !bytes.HasSuffix(line, []byte("\n")) {
			continue
		}
		v, err := strconv.ParseInt(f[0], 10, 64)
		if err != nil {
			continue
		}
		if len(f) == 3 {
			ret, err := strconv.ParseInt(f[2], 10, 64)
			if err != nil {
				continue
			}
			if sr != nil {
				sr.RecordStart(f[1], time.Unix(0, v), time.Unix(0, ret))
				n++
				continue
			}
		}
		rec.Record(f[1], time.Unix(0, v))
		n++
	}
	return n, nil
}

// ReadReads passes every answer logged in path (a Log's path+ReadsSuffix)
// to rec and returns how many there were, and whether the file exists (a
// pod that logs reads creates it when it starts, so a missing file is a
// pod that did not log them, not one that read nothing). A line cut short
// by a kill is skipped.
func ReadReads(path string, rec ReadRecorder) (n int64, exists bool, err error) {
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return 0, false, nil
	}
	if err != nil {
		return 0, false, fmt.Errorf("departure log: %w", err)
	}
	for line := range bytes.Lines(b) {
		f := strings.Fields(string(line))
		if len(f) != 5 || !bytes.HasSuffix(line, []byte("\n")) {
			continue
		}
		called, err1 := strconv.ParseInt(f[0], 10, 64)
		returned, err2 := strconv.ParseInt(f[1], 10, 64)
		status, err3 := strconv.Atoi(f[2])
		if err1 != nil || err2 != nil || err3 != nil || (f[3] != "0" && f[3] != "1") {
			continue
		}
		rec.RecordRead(f[4], Read{Called: time.Unix(0, called), Returned: time.Unix(0, returned), Status: status, Throttled: f[3] == "1"})
		n++
	}
	return n, true, nil
}
