package loadtest

import (
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"sync"
	"time"

	"github.com/mirrorworker/mirrorworker/stuborigin"
)

// An early request (the origin's count: it arrived before a deadline its
// caller had been told) is one of two kinds, and only one is rude:
//
//   - told to wait: the answer that told the deadline had been written by
//     the origin before the request left its client;
//   - crossed a refusal: the request left its client before the origin
//     wrote that answer. It was on its way when the caller was told, and no
//     client could have held it (two requests in flight at a cold start,
//     docs/adr/0029, third look).
//
// The split is measured, and conservative: a request counts as crossed only
// when its departure is known to precede the writing of every answer that
// told it to wait past its arrival; anything unknown counts as told.

// Classes of an early request.
const (
	EarlyTold    = "told"    // the caller had been told before the request left
	EarlyCrossed = "crossed" // the request left before the origin wrote the answer
)

// ClassifyEarly says whether a request that arrived early crossed the
// answer that told its caller to wait or was sent after it: crossed when
// left, the latest instant by which the request had surely left its client,
// is before written, the earliest instant at which the origin wrote any
// answer that told the caller to wait past this request's arrival. A zero
// left or written (not known) is told: only a departure known to precede
// the answer makes a crossing. left and written must be on one clock.
func ClassifyEarly(left, written time.Time) string {
	if left.IsZero() || written.IsZero() || !left.Before(written) {
		return EarlyTold
	}
	return EarlyCrossed
}

// EarlyRequest is one request the origin counted early, as the report
// shows it (Result.EarlyRequests): times in seconds since the run started.
type EarlyRequest struct {
	Authority int `json:"authority"`
	// Class is EarlyTold or EarlyCrossed.
	Class string `json:"class"`
	// Arrived is when the origin's kernel received it (its handler's clock
	// where unstamped): it had left its client by then.
	Arrived float64 `json:"arrived"`
	// RefusalWritten is when the origin began to write the first answer
	// that told the caller to wait past Arrived; MarginMs is Arrived minus
	// RefusalWritten in milliseconds (negative: it arrived before the answer
	// was written, so it left before; positive: it left at some point before
	// it arrived, which may be after).
	RefusalWritten float64 `json:"refusal_written"`
	MarginMs       float64 `json:"margin_ms"`
	// LastStartMs is the latest start the clients logged to its authority
	// before Arrived (a pacer's confirm: the request left no sooner), in
	// milliseconds after RefusalWritten; absent without departure logs.
	LastStartMs *float64 `json:"last_start_ms,omitempty"`
}

// refusalLog collects, from the origin's hooks, the arrivals and the
// answers that told a caller to wait, to split the early requests. Safe
// for concurrent use.
type refusalLog struct {
	mu       sync.Mutex
	arrivals map[int][]time.Time // per authority, every arrival
	early    []stuborigin.Arrival
	told     []stuborigin.Told
}

func newRefusalLog() *refusalLog { return &refusalLog{arrivals: map[int][]time.Time{}} }

func (l *refusalLog) arrival(a stuborigin.Arrival) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.arrivals[a.Authority] = append(l.arrivals[a.Authority], a.Arrived)
	if a.Early {
		l.early = append(l.early, a)
	}
}

func (l *refusalLog) toldHook(t stuborigin.Told) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.told = append(l.told, t)
}

// firstWritten is the earliest Written among the answers to a's caller
// that could have made it early: decided no later than a was handled, with
// a deadline past it. Counting one that did not (a tie on the clock) can
// only make the instant earlier, and a crossing harder. Zero when none.
func firstWritten(told []stuborigin.Told, a stuborigin.Arrival) time.Time {
	var w time.Time
	for _, t := range told {
		if t.Authority != a.Authority || t.Identity != a.Identity ||
			t.Decided.After(a.Handled) || !t.Until.After(a.Handled) {
			continue
		}
		if w.IsZero() || t.Written.Before(w) {
			w = t.Written
		}
	}
	return w
}

// split classifies every early arrival. starts holds the clients' logged
// departures per authority index (nil: the strategy logged none, and every
// early request stays told, the origin's count). A request's departure is
// bounded above by its arrival at the origin (bytes do not arrive before
// they leave; one host, one clock): that is the instant ClassifyEarly
// takes. The clients' logs must agree: a crossing needs at least as many
// starts logged before the answer was written as arrivals before it, else
// a clock or a log is wrong and the request counts as told.
func (l *refusalLog) split(starts map[int][]time.Time, t0 time.Time) (told, crossed int64, out []EarlyRequest) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, ts := range l.arrivals {
		sortTimes(ts)
	}
	for _, ts := range starts {
		sortTimes(ts)
	}
	secs := func(t time.Time) float64 { return t.Sub(t0).Seconds() }
	for _, a := range l.early {
		w := firstWritten(l.told, a)
		left := a.Arrived
		var last *float64
		if starts == nil {
			left = time.Time{} // no departures: unknown
		} else if !w.IsZero() {
			ss := starts[a.Authority]
			if countBefore(ss, w) < countBefore(l.arrivals[a.Authority], w) {
				left = time.Time{}
			}
			if i := countBefore(ss, a.Arrived.Add(1)); i > 0 {
				ms := float64(ss[i-1].Sub(w)) / float64(time.Millisecond)
				last = &ms
			}
		}
		c := ClassifyEarly(left, w)
		if c == EarlyCrossed {
			crossed++
		} else {
			told++
		}
		e := EarlyRequest{Authority: a.Authority, Class: c, Arrived: secs(a.Arrived), LastStartMs: last}
		if !w.IsZero() {
			e.RefusalWritten = secs(w)
			e.MarginMs = float64(a.Arrived.Sub(w)) / float64(time.Millisecond)
		}
		out = append(out, e)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Arrived < out[j].Arrived })
	return told, crossed, out
}

// writeTrace writes early.log into dir: one line per early request, and
// one per answer that told a deadline, in the origin's unix nanoseconds.
func (l *refusalLog) writeTrace(dir string, early []EarlyRequest) error {
	if dir == "" {
		return nil
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	var b []byte
	for _, t := range l.told {
		b = fmt.Appendf(b, "told %d %d %d %d %s\n", t.Decided.UnixNano(), t.Written.UnixNano(), t.Until.UnixNano(), t.Authority, t.Identity)
	}
	for _, e := range early {
		last := "-"
		if e.LastStartMs != nil {
			last = fmt.Sprintf("%.3f", *e.LastStartMs)
		}
		b = fmt.Appendf(b, "early %s authority %d arrived %.6f s refusal written %.6f s margin %.3f ms last start %s ms\n",
			e.Class, e.Authority, e.Arrived, e.RefusalWritten, e.MarginMs, last)
	}
	if err := os.WriteFile(filepath.Join(dir, "early.log"), b, 0o644); err != nil {
		return fmt.Errorf("trace: %w", err)
	}
	return nil
}

func sortTimes(ts []time.Time) {
	sort.Slice(ts, func(i, j int) bool { return ts[i].Before(ts[j]) })
}

// countBefore is how many of the sorted ts are before t.
func countBefore(ts []time.Time, t time.Time) int {
	return sort.Search(len(ts), func(i int) bool { return !ts[i].Before(t) })
}
