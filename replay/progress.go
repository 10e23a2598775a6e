package replay

import (
	"fmt"
	"io"
	"time"

	"github.com/mirrorworker/mirrorworker/clock"
	"github.com/schollz/progressbar/v3"
)

// Progress shows how far a replay is. Run calls Begin once, Set and Waiting
// from one goroutine as jobs are handled, and End once; implementations
// need not be safe for concurrent use.
type Progress interface {
	Begin(total int64)
	Set(done int64)
	// Waiting says what the jobs left wait for while none is being done
	// ("1 job waits: 127.0.0.1:18766 in backoff until 14:59:02"); "" when
	// jobs are being done again, or nothing is known.
	Waiting(what string)
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
		// No ETA: the bar's is the pace so far, which says nothing of
		// the last jobs waiting behind a cooldown or a backoff (the lines
		// leave theirs out then; a bar cannot).
		progressbar.OptionSetPredictTime(false),
		progressbar.OptionSetElapsedTime(true),
		progressbar.OptionThrottle(100*time.Millisecond),
		progressbar.OptionSetWidth(30),
		progressbar.OptionOnCompletion(func() { fmt.Fprintln(b.w) }),
	)
}

func (b *bar) Set(done int64) { _ = b.b.Set64(done) }

func (b *bar) Waiting(what string) {
	if what == "" {
		b.b.Describe("replay")
		return
	}
	b.b.Describe("replay (" + what + ")")
}

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
	moved  time.Time // when done last grew
	waits  string    // Waiting's
	closed bool
}

func (l *lines) Waiting(what string) { l.waits = what }

func (l *lines) Begin(total int64) {
	l.total = total
	l.began = l.clk.Now()
	l.last, l.moved = l.began, l.began
	fmt.Fprintf(l.w, "replay: %d jobs to handle\n", total)
}

func (l *lines) Set(done int64) {
	now := l.clk.Now()
	if done > l.done {
		l.moved = now
	}
	l.done = done
	if now.Sub(l.last) >= l.every {
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
	fmt.Fprintln(l.w, progressLine(l.done, l.total, now.Sub(l.began), now.Sub(l.moved), l.waits))
}

// MinStall is how long no job may have been done before a replay's progress
// stops showing an ETA: the pace so far says nothing of jobs that wait (a
// cooldown, a backoff, a pod that is gone). Longer when jobs were done more
// slowly than that: three times the time one job took until the last one.
const MinStall = 10 * time.Second

// stalled reports whether a replay that did done jobs in elapsed, the last
// one idle ago, is held up: no ETA can be known then.
func stalled(done int64, elapsed, idle time.Duration) bool {
	if done <= 0 {
		return idle >= MinStall
	}
	return idle >= max(MinStall, 3*(elapsed-idle)/time.Duration(done))
}

// ETA is the time left of a replay that did done of total jobs in
// elapsed, the last one idle ago, at its pace so far; 0 when none can be
// known: nothing done yet, all done, or stalled.
func ETA(done, total int64, elapsed, idle time.Duration) time.Duration {
	if done <= 0 || done >= total || elapsed <= 0 || stalled(done, elapsed, idle) {
		return 0
	}
	return time.Duration(float64(elapsed) / float64(done) * float64(total-done))
}

// progressLine renders "replay: 500/1000 jobs (50%), 120.0 jobs/s, ETA 4s",
// or, when no job was done for a while (stalled), no ETA but what the jobs
// left wait for, if waits says ("..., 1 job waits: 127.0.0.1:18766 in
// backoff until 14:59:02"), else "..., 1 job left, none done for 12m0s".
func progressLine(done, total int64, elapsed, idle time.Duration, waits string) string {
	pct := 100.0
	if total > 0 {
		pct = 100 * float64(done) / float64(total)
	}
	s := fmt.Sprintf("replay: %d/%d jobs (%.0f%%)", done, total, pct)
	if elapsed <= 0 || done <= 0 {
		if done < total && waits != "" && stalled(done, elapsed, idle) {
			s += ", " + waits
		}
		return s
	}
	rate := float64(done) / elapsed.Seconds()
	s += fmt.Sprintf(", %.1f jobs/s", rate)
	switch {
	case done < total && stalled(done, elapsed, idle) && waits != "":
		s += ", " + waits
	case done < total && stalled(done, elapsed, idle):
		left := total - done
		unit := "jobs"
		if left == 1 {
			unit = "job"
		}
		s += fmt.Sprintf(", %d %s left, none done for %s", left, unit, idle.Round(time.Second))
	case done < total:
		s += ", ETA " + ETA(done, total, elapsed, idle).Round(time.Second).String()
	default:
		s += ", took " + elapsed.Round(time.Millisecond).String()
	}
	return s
}
