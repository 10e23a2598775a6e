package main

import (
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/mirrorworker/mirrorworker/bytesize"
)

// DefaultVerifyProgressEvery is how often verify writes a progress line
// when its output is not a terminal (a terminal gets a bar redrawn in
// place, verifyBarEvery).
const DefaultVerifyProgressEvery = 5 * time.Second

// verifyBarEvery is how often the bar is redrawn on a terminal.
const verifyBarEvery = 200 * time.Millisecond

// verifyProgress tells what verify has checked so far: objects and bytes
// of the totals the listing found, and the rate, so that reading a
// terabyte is not silence. A bar on a terminal, a plain line every few
// seconds otherwise; a nil *verifyProgress shows nothing. Not safe for
// concurrent use: verify checks one object at a time.
type verifyProgress struct {
	w     io.Writer
	bar   bool
	every time.Duration
	now   func() time.Time

	totalObjects, objects int
	totalBytes, bytes     int64
	start, shown          time.Time
}

// newVerifyProgress writes to w: a bar if it is a terminal, else a line
// every every; nil when every is 0 or less.
func newVerifyProgress(w io.Writer, every time.Duration, now func() time.Time) *verifyProgress {
	if every <= 0 {
		return nil
	}
	p := &verifyProgress{w: w, every: every, now: now, bar: isTerminal(w)}
	if p.bar {
		p.every = verifyBarEvery
	}
	return p
}

// begin starts the count against the totals of the listing.
func (p *verifyProgress) begin(objects int, bytes int64) {
	if p == nil {
		return
	}
	p.totalObjects, p.totalBytes = objects, bytes
	p.start = p.now()
	p.shown = p.start
}

// read counts n bytes checked.
func (p *verifyProgress) read(n int) {
	if p == nil {
		return
	}
	p.bytes += int64(n)
	p.maybeShow()
}

// object counts one object checked.
func (p *verifyProgress) object() {
	if p == nil {
		return
	}
	p.objects++
	p.maybeShow()
}

func (p *verifyProgress) maybeShow() {
	if now := p.now(); now.Sub(p.shown) >= p.every {
		p.shown = now
		p.show(now)
	}
}

// show writes the state at now.
func (p *verifyProgress) show(now time.Time) {
	if p.bar {
		const width = 30
		fill := 0
		if p.totalBytes > 0 {
			fill = int(min(p.bytes*width/p.totalBytes, width))
		}
		fmt.Fprintf(p.w, "\r[%s%s] %s\x1b[K", strings.Repeat("#", fill), strings.Repeat(".", width-fill), p.figures(now))
		return
	}
	fmt.Fprintf(p.w, "verify: %s\n", p.figures(now))
}

// figures is "1203 of 2670 objects, 1.2 GiB of 2.6 GiB (45%), 120.0 MiB/s, 12s left".
func (p *verifyProgress) figures(now time.Time) string {
	s := fmt.Sprintf("%d of %d objects, %s of %s", p.objects, p.totalObjects, bytesize.Approx(p.bytes), bytesize.Approx(p.totalBytes))
	if p.totalBytes > 0 {
		s += fmt.Sprintf(" (%d%%)", min(p.bytes*100/p.totalBytes, 100))
	}
	el := now.Sub(p.start).Seconds()
	if el <= 0 {
		return s
	}
	rate := float64(p.bytes) / el
	s += ", " + bytesize.Approx(int64(rate)) + "/s"
	if left := p.totalBytes - p.bytes; rate > 0 && left > 0 {
		s += ", " + time.Duration(float64(left)/rate*float64(time.Second)).Round(time.Second).String() + " left"
	}
	return s
}

// done writes the last state and ends the bar's line.
func (p *verifyProgress) done() {
	if p == nil {
		return
	}
	now := p.now()
	if p.bar {
		p.show(now)
		fmt.Fprintln(p.w)
	}
	fmt.Fprintf(p.w, "verify: checked %d objects, %s in %s\n", p.objects, bytesize.Approx(p.bytes), now.Sub(p.start).Round(time.Millisecond))
}

// progressReader counts the bytes read through it in p.
type progressReader struct {
	r io.Reader
	p *verifyProgress
}

func (r progressReader) Read(b []byte) (int, error) {
	n, err := r.r.Read(b)
	r.p.read(n)
	return n, err
}
