package replay

import (
	"strings"
	"testing"
	"time"

	"github.com/mirrorworker/mirrorworker/clock"
	"github.com/mirrorworker/mirrorworker/pacer"
	"github.com/nats-io/nats.go/jetstream"
)

func TestProgressLine(t *testing.T) {
	tests := []struct {
		done, total   int64
		elapsed, idle time.Duration
		want          string
	}{
		{0, 1000, 0, 0, "replay: 0/1000 jobs (0%)"},
		{500, 1000, 5 * time.Second, 0, "replay: 500/1000 jobs (50%), 100.0 jobs/s, ETA 5s"},
		{500, 1000, 5 * time.Second, 9 * time.Second, "replay: 500/1000 jobs (50%), 100.0 jobs/s, ETA 5s"},
		{1000, 1000, 8 * time.Second, 0, "replay: 1000/1000 jobs (100%), 125.0 jobs/s, took 8s"},
		{0, 0, time.Second, 0, "replay: 0/0 jobs (100%)"},
		// Issue 37: the last job waits behind a backoff; the pace so far
		// would promise it in seconds, for minutes.
		{47, 48, 12 * time.Minute, 11 * time.Minute, "replay: 47/48 jobs (98%), 0.1 jobs/s, 1 job left, none done for 11m0s"},
		{40, 48, 40 * time.Second, 10 * time.Second, "replay: 40/48 jobs (83%), 1.0 jobs/s, 8 jobs left, none done for 10s"},
		// A slow replay, one job a minute, keeps its ETA between jobs.
		{5, 10, 5 * time.Minute, 50 * time.Second, "replay: 5/10 jobs (50%), 0.0 jobs/s, ETA 5m0s"},
	}
	for _, tt := range tests {
		if got := progressLine(tt.done, tt.total, tt.elapsed, tt.idle, ""); got != tt.want {
			t.Errorf("progressLine(%d, %d, %s) = %q, want %q", tt.done, tt.total, tt.elapsed, got, tt.want)
		}
	}
}

func TestLinesEveryInterval(t *testing.T) {
	clk := clock.NewFake(t0)
	var b strings.Builder
	p := NewLines(&b, 10*time.Second, clk)
	p.Begin(100)
	for i := int64(1); i <= 100; i++ {
		clk.Advance(time.Second)
		p.Set(i)
	}
	p.End()
	want := []string{
		"replay: 100 jobs to handle",
		"replay: 10/100 jobs (10%), 1.0 jobs/s, ETA 1m30s",
	}
	got := strings.Split(strings.TrimSpace(b.String()), "\n")
	if len(got) != 12 { // the header, one line per 10 s, and the last
		t.Fatalf("got %d lines, want 12:\n%s", len(got), b.String())
	}
	for i, w := range want {
		if got[i] != w {
			t.Errorf("line %d = %q, want %q", i, got[i], w)
		}
	}
	if last := got[len(got)-1]; last != "replay: 100/100 jobs (100%), 1.0 jobs/s, took 1m40s" {
		t.Errorf("last line = %q", last)
	}
}

func TestComplete(t *testing.T) {
	info := func(pending uint64, ackPending int, floor uint64) *jetstream.ConsumerInfo {
		return &jetstream.ConsumerInfo{NumPending: pending, NumAckPending: ackPending, AckFloor: jetstream.SequenceInfo{Stream: floor}}
	}
	tests := []struct {
		name    string
		info    *jetstream.ConsumerInfo
		lastSeq uint64
		want    bool
	}{
		{"just created", info(10, 0, 0), 10, false},
		{"all delivered, some unacked", info(0, 3, 7), 10, false},
		{"deferred jobs hold ack-pending slots", info(0, 1, 9), 10, false},
		{"all handled", info(0, 0, 10), 10, true},
		{"nothing pending on a filtered consumer whose floor lags", info(0, 0, 4), 10, true},
		{"newer jobs arrive, the old ones are done", info(5, 2, 10), 10, true},
		{"empty stream", info(0, 0, 0), 0, true},
		{"start after the last sequence", info(0, 0, 20), 10, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := complete(tt.info, tt.lastSeq); got != tt.want {
				t.Errorf("complete = %v, want %v", got, tt.want)
			}
		})
	}
}

func TestBar(t *testing.T) {
	for _, total := range []int64{0, 10} {
		var b strings.Builder
		p := NewBar(&b)
		p.Begin(total)
		p.Set(total / 2)
		p.Set(total)
		p.End()
		if total > 0 && !strings.Contains(b.String(), "10/10") {
			t.Errorf("bar for %d jobs drew %q", total, b.String())
		}
	}
}

// TestWaitLine: what a stalled replay's jobs wait for, busiest authority
// first, from the owners' pacer states.
func TestWaitLine(t *testing.T) {
	at := time.Date(2026, 12, 3, 14, 59, 2, 0, time.UTC)
	tests := []struct {
		name   string
		left   map[string]int
		states map[string]pacer.State
		want   string
	}{
		{name: "nothing left", left: map[string]int{"a:1": 0}, want: ""},
		{name: "one job in backoff", left: map[string]int{"127.0.0.1:18766": 1},
			states: map[string]pacer.State{"127.0.0.1:18766": {Authority: "127.0.0.1:18766", State: pacer.StateBackoff, BackoffUntil: at}},
			want:   "1 job waits: 127.0.0.1:18766 in backoff until 14:59:02"},
		{name: "cooling and queued", left: map[string]int{"a.example:443": 9, "b.example:443": 3},
			states: map[string]pacer.State{"a.example:443": {State: pacer.StateCooling, CooldownUntil: at}},
			want:   "12 jobs wait: a.example:443 (9) cooling until 14:59:02; b.example:443 (3) in a queue"},
		{name: "paused wins", left: map[string]int{"a:1": 2},
			states: map[string]pacer.State{"a:1": {State: pacer.StateCooling, CooldownUntil: at, PausedUntil: at.Add(time.Hour)}},
			want:   "2 jobs wait: a:1 paused until 15:59:02"},
		{name: "many authorities", left: map[string]int{"a:1": 4, "b:1": 3, "c:1": 2, "d:1": 1, "e:1": 1},
			want: "11 jobs wait: a:1 (4) in a queue; b:1 (3) in a queue; c:1 (2) in a queue; 2 more"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := waitLine(tt.left, tt.states, time.UTC); got != tt.want {
				t.Errorf("waitLine = %q, want %q", got, tt.want)
			}
		})
	}
	// In the progress line: instead of an ETA once stalled, never before.
	w := "1 job waits: 127.0.0.1:18766 in backoff until 14:59:02"
	if got, want := progressLine(47, 48, 12*time.Minute, 11*time.Minute, w), "replay: 47/48 jobs (98%), 0.1 jobs/s, "+w; got != want {
		t.Errorf("stalled: %q, want %q", got, want)
	}
	if got, want := progressLine(0, 1, time.Minute, time.Minute, w), "replay: 0/1 jobs (0%), "+w; got != want {
		t.Errorf("stalled before the first job: %q, want %q", got, want)
	}
	if got, want := progressLine(40, 48, 40*time.Second, time.Second, w), "replay: 40/48 jobs (83%), 1.0 jobs/s, ETA 8s"; got != want {
		t.Errorf("moving: %q, want %q", got, want)
	}
}
