package worker

import (
	"context"
	"net/http"
	"sync"
	"time"

	"github.com/rs/zerolog"

	"github.com/mirrorworker/mirrorworker/clock"
)

// storedSummaryEvery is how often the worker logs, at info, a
// summary of the objects it stored (docs/adr/0008): each object is logged
// at debug.
const storedSummaryEvery = 10 * time.Second

// storedLog writes what the worker stored: each object at debug ("object
// stored": key, bytes, took, status 200 or 304), and at info a summary of
// the objects stored since the last one ("objects stored"), every
// storedSummaryEvery when there were any, and once more when the
// worker stops. Safe for concurrent use.
type storedLog struct {
	log   zerolog.Logger
	clk   clock.Clock
	every time.Duration

	mu        sync.Mutex // guards the counts below
	objects   int        // stored or unchanged since the last summary
	unchanged int        // of which 304s
	copiedN   int        // of which copies within the target (copied.go)
	bytes     int64
	since     time.Time // the start of the summary's period
}

// add records one object of j's job stored (status 2xx, bytes written) or
// found unchanged (status 304), began being when its fetch started.
func (l *storedLog) add(j *heldJob, status int, bytes int64, began time.Time) {
	now := l.clk.Now()
	if l.log.GetLevel() <= zerolog.DebugLevel {
		l.log.Debug().Str("key", j.job.Target).Int64("bytes", bytes).Str("took", now.Sub(began).Round(time.Millisecond).String()).
			Int("status", status).Str("job", j.job.ID).Str("authority", j.auth).Msg("object stored")
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.objects == 0 {
		l.since = now
	}
	l.objects++
	l.bytes += bytes
	if status == http.StatusNotModified {
		l.unchanged++
	}
}

// run writes the summary every l.every until ctx ends, then the last one.
func (l *storedLog) run(ctx context.Context) {
	t := l.clk.NewTimer(l.every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			l.summary()
			return
		case <-t.C():
			l.summary()
			t.Reset(l.every)
		}
	}
}

// summary logs the objects stored since the last summary, if any.
func (l *storedLog) summary() {
	l.mu.Lock()
	n, unchanged, copied, bytes, since := l.objects, l.unchanged, l.copiedN, l.bytes, l.since
	l.objects, l.unchanged, l.copiedN, l.bytes = 0, 0, 0, 0
	l.mu.Unlock()
	if n == 0 {
		return
	}
	e := l.log.Info().Int("objects", n).Int("new", n-unchanged-copied).Int("unchanged", unchanged)
	if copied > 0 {
		e = e.Int("copied", copied) // stored from another key, no request
	}
	e.Int64("bytes", bytes).
		Str("period", l.clk.Now().Sub(since).Round(time.Millisecond).String()).
		Msg("objects stored (each one is logged at debug)")
}
