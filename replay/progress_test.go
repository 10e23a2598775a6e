package replay

import (
	"strings"
	"testing"
	"time"

	"github.com/mirrorworker/mirrorworker/clock"
	"github.com/nats-io/nats.go/jetstream"
)

func TestProgressLine(t *testing.T) {
	tests := []struct {
		done, total int64
		elapsed     time.Duration
		want        string
	}{
		{0, 1000, 0, "replay: 0/1000 jobs (0%)"},
		{500, 1000, 5 * time.Second, "replay: 500/1000 jobs (50%), 100.0 jobs/s, ETA 5s"},
		{1000, 1000, 8 * time.Second, "replay: 1000/1000 jobs (100%), 125.0 jobs/s, took 8s"},
		{0, 0, time.Second, "replay: 0/0 jobs (100%)"},
	}
	for _, tt := range tests {
		if got := progressLine(tt.done, tt.total, tt.elapsed); got != tt.want {
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
		handled int64 // of 10
	}{
		{"just created", info(10, 0, 0), 10, false, 0},
		{"all delivered, some unacked", info(0, 3, 7), 10, false, 7},
		{"deferred jobs hold ack-pending slots", info(0, 1, 9), 10, false, 9},
		{"all handled", info(0, 0, 10), 10, true, 10},
		{"nothing pending on a filtered consumer whose floor lags", info(0, 0, 4), 10, true, 10},
		{"newer jobs arrive, the old ones are done", info(5, 2, 10), 10, true, 3},
		{"empty stream", info(0, 0, 0), 0, true, 10},
		{"start after the last sequence", info(0, 0, 20), 10, true, 10},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := complete(tt.info, tt.lastSeq); got != tt.want {
				t.Errorf("complete = %v, want %v", got, tt.want)
			}
			if got := handled(10, tt.info); got != tt.handled {
				t.Errorf("handled = %d, want %d", got, tt.handled)
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
