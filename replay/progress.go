package replay

import (
	"fmt"
	"io"
	"time"

	"github.com/mirrorworker/mirrorworker/clock"
	"github.com/schollz/progressbar/v3"
)

// Progress shows how far a replay is. Run calls Begin once, Set from one
// goroutine as jobs are handled, and End once; implementations need not be
// safe for concurrent use.
type Progress interface {
	Begin(total int64)
	Set(done int64)
	End()
}

// NewBar returns a Progress that draws a bar with count, rate and ETA on w,
// for a terminal (github.com/schollz/progressbar).
func NewBar(w io.Writer) Progress { return &bar{w: w} }

type bar struct {
	w io.Writer
	b *progressbar.ProgressBar
}

func (b *bar) Begin(total int64) {
	b.b = progressbar.NewOptions64(total,
		progressbar.OptionSetWriter(b.w),
		progressbar.OptionSetDescription("replay"),
		progressbar.OptionShowCount(),
		progressbar.OptionShowIts(),
		progressbar.OptionSetItsString("jobs"),
		progressbar.OptionSetPredictTime(true),
		progressbar.OptionSetElapsedTime(true),
		progressbar.OptionThrottle(100*time.Millisecond),
		progressbar.OptionSetWidth(30),
		progressbar.OptionOnCompletion(func() { fmt.Fprintln(b.w) }),
	)
}

func (b *bar) Set(done int64) { _ = b.b.Set64(done) }

func (b *bar) End() { _ = b.b.Finish() }

// NewLines returns a Progress that writes one plain line to w every interval
// (and a last one at the end), for logs and pipes: count, percentage, rate
// and ETA. A nil clk means the wall clock.
func NewLines(w io.Writer, every time.Duration, clk clock.Clock) Progress {
	if clk == nil {
		clk = clock.Real{}
	}
	return &lines{w: w, every: every, clk: clk}
}

type lines struct {
	w      io.Writer
	every  time.Duration
	clk    clock.Clock
	total  int64
	done   int64
	began  time.Time
	last   time.Time
	closed bool
}

func (l *lines) Begin(total int64) {
	l.total = total
	l.began = l.clk.Now()
	l.last = l.began
	fmt.Fprintf(l.w, "replay: %d jobs to handle\n", total)
}

func (l *lines) Set(done int64) {
	l.done = done
	if now := l.clk.Now(); now.Sub(l.last) >= l.every {
		l.last = now
		l.print(now)
	}
}

func (l *lines) End() {
	if !l.closed {
		l.closed = true
		l.print(l.clk.Now())
	}
}

func (l *lines) print(now time.Time) {
	fmt.Fprintln(l.w, progressLine(l.done, l.total, now.Sub(l.began)))
}

// progressLine renders "replay: 500/1000 jobs (50%), 120.0 jobs/s, ETA 4s".
func progressLine(done, total int64, elapsed time.Duration) string {
	pct := 100.0
	if total > 0 {
		pct = 100 * float64(done) / float64(total)
	}
	s := fmt.Sprintf("replay: %d/%d jobs (%.0f%%)", done, total, pct)
	if elapsed <= 0 || done <= 0 {
		return s
	}
	rate := float64(done) / elapsed.Seconds()
	s += fmt.Sprintf(", %.1f jobs/s", rate)
	if done < total {
		eta := time.Duration(float64(total-done) / rate * float64(time.Second))
		s += ", ETA " + eta.Round(time.Second).String()
	} else {
		s += ", took " + elapsed.Round(time.Millisecond).String()
	}
	return s
}
