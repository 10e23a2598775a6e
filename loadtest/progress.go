package loadtest

import (
	"fmt"
	"io"
	"time"
)

// progress writes the live progress of one strategy's run: on a terminal
// one line rewritten in place, otherwise a line every few seconds (logs and
// CI output stay readable).
type progress struct {
	w       io.Writer
	live    bool
	every   time.Duration
	name    string
	ordinal string
	total   int
	start   time.Time

	next     time.Time
	lastT    time.Time
	lastDone int
	rate     float64 // jobs/s, smoothed
}

func (p *progress) due(now time.Time) bool {
	if p.live {
		return !now.Before(p.next)
	}
	if p.next.IsZero() {
		p.next = p.start.Add(p.every)
	}
	return !now.Before(p.next)
}

func (p *progress) update(now time.Time, s queueSnap) {
	if p.live {
		p.next = now.Add(500 * time.Millisecond)
	} else {
		p.next = now.Add(p.every)
	}
	done := s.finished(p.total)
	if p.lastT.IsZero() {
		// The first line measures from the start, so it shows a rate (and
		// an ETA) as soon as anything is done, not 0.0 for an interval.
		p.lastT = p.start
	}
	if dt := now.Sub(p.lastT).Seconds(); dt > 0 {
		inst := float64(done-p.lastDone) / dt
		if p.rate == 0 {
			p.rate = inst
		} else {
			p.rate = 0.7*p.rate + 0.3*inst
		}
	}
	p.lastT, p.lastDone = now, done
	eta := "? (nothing finished yet)"
	if p.rate > 0 {
		eta = time.Duration(float64(p.total-done) / p.rate * float64(time.Second)).Round(time.Second).String()
	}
	bans := ""
	if s.bans > 0 {
		bans = fmt.Sprintf(" · banned %d times", s.bans)
	}
	line := fmt.Sprintf("[%s %s] %d/%d stored, %d dead · %.1f jobs/s · 429s %d · 503s %d%s · ETA %s · %s",
		p.ordinal, p.name, done-s.dead, p.total, s.dead, p.rate, s.rateLimited, s.unavailable, bans, eta,
		now.Sub(p.start).Round(time.Second))
	if p.live {
		fmt.Fprintf(p.w, "\r\033[K%s", line)
	} else {
		fmt.Fprintln(p.w, line)
	}
}

func (p *progress) finish(s queueSnap, drained bool) {
	state := "drained"
	if !drained {
		state = "time limit reached"
	}
	line := fmt.Sprintf("[%s %s] %s after %s: %d/%d stored, %d dead",
		p.ordinal, p.name, state, time.Since(p.start).Round(100*time.Millisecond), s.finished(p.total)-s.dead, p.total, s.dead)
	if p.live {
		fmt.Fprintf(p.w, "\r\033[K%s\n", line)
	} else {
		fmt.Fprintln(p.w, line)
	}
}
