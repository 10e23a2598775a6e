package worker

import (
	"bytes"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/mirrorworker/mirrorworker/clock"
	"github.com/mirrorworker/mirrorworker/jobs"
)

// syncBuffer is a log sink safe for the waiting goroutine and the test.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) lines() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return strings.Split(strings.TrimSpace(s.b.String()), "\n")
}

// TestAwaitFetchesSaysWhatItWaitsFor: the stop's wait names each fetch in
// flight with its bytes so far of its size and the grace left, at once and
// every ShutdownReportEvery of the clock; StopNow cancels the fetches at
// once; the end of the grace cancels them too (issue 36 item 3).
func TestAwaitFetchesSaysWhatItWaitsFor(t *testing.T) {
	t0 := time.Date(2026, 12, 3, 12, 0, 0, 0, time.UTC)
	for _, tt := range []struct {
		name    string
		stopNow bool // close StopNow after the second report; else let the grace run out
		want    string
	}{
		{"a second signal", true, "stopping now"},
		{"the grace runs out", false, "cancelled at the end of the grace period"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			clk := clock.NewFake(t0)
			var logs syncBuffer
			now := make(chan struct{})
			w := &Worker{clk: clk, log: zerolog.New(&logs), o: Options{ShutdownGrace: 12 * time.Second, StopNow: now}}
			size := int64(500_000_000)
			tr := w.transfers.start(&heldJob{job: jobs.Job{URL: "http://o.example/big.iso", Size: &size}}, t0)
			tr.body(t0, "", size)
			tr.bytes.Store(312_000_000)

			done := make(chan struct{})
			cancelled := make(chan struct{})
			returned := make(chan struct{})
			go func() {
				w.awaitFetches(done, func() { close(cancelled); close(done) })
				close(returned)
			}()
			waitTimer := func() {
				for clk.Timers() == 0 {
					runtime.Gosched() // until the goroutine arms its timer
				}
			}
			waitTimer()
			clk.Advance(ShutdownReportEvery)
			waitTimer()
			lines := logs.lines()
			if len(lines) != 2 {
				t.Fatalf("%d log lines after %s, want 2:\n%s", len(lines), ShutdownReportEvery, strings.Join(lines, "\n"))
			}
			for i, want := range []string{
				"waiting up to 12s for 1 fetch in flight: http://o.example/big.iso (297.5 MiB of 476.8 MiB)",
				"waiting up to 7s for 1 fetch in flight",
			} {
				if !strings.Contains(lines[i], want) {
					t.Errorf("line %d %s, want %q", i, lines[i], want)
				}
			}
			if tt.stopNow {
				close(now)
			} else {
				clk.Advance(7 * time.Second)
			}
			<-cancelled
			<-returned
			if last := logs.lines()[len(logs.lines())-1]; !strings.Contains(last, tt.want) {
				t.Errorf("last line %s, want %q", last, tt.want)
			}
		})
	}
}
