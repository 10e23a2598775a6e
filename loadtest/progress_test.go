package loadtest

import (
	"bytes"
	"strings"
	"testing"
	"time"
)

// TestProgressFirstLineHasARate: the first progress line measures from the
// start of the run, so it shows the rate and an ETA rather than 0.0 jobs/s
// and "?" for its whole first interval.
func TestProgressFirstLineHasARate(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	var b bytes.Buffer
	p := &progress{w: &b, every: 5 * time.Second, name: "hostpacer", ordinal: "1/1", total: 1000, start: t0}
	tests := []struct {
		at      time.Duration
		pending uint64 // jobs not finished
		want    string
	}{
		{at: 5 * time.Second, pending: 1000, want: "0/1000 stored, 0 dead · 0.0 jobs/s · 429s 0 · 503s 0 · ETA ? (nothing finished yet) · 5s"},
		{at: 10 * time.Second, pending: 900, want: "100/1000 stored, 0 dead · 20.0 jobs/s · 429s 0 · 503s 0 · ETA 45s · 10s"},
	}
	for _, tt := range tests {
		b.Reset()
		p.update(t0.Add(tt.at), queueSnap{pending: tt.pending})
		if got := strings.TrimSpace(b.String()); got != "[1/1 hostpacer] "+tt.want {
			t.Errorf("at %s: %q, want %q", tt.at, got, "[1/1 hostpacer] "+tt.want)
		}
	}

	// A first line after jobs were stored already has their rate.
	b.Reset()
	q := &progress{w: &b, every: 5 * time.Second, name: "fixed", ordinal: "2/2", total: 1000, start: t0}
	q.update(t0.Add(5*time.Second), queueSnap{pending: 950})
	if want := "[2/2 fixed] 50/1000 stored, 0 dead · 10.0 jobs/s · 429s 0 · 503s 0 · ETA 1m35s · 5s"; strings.TrimSpace(b.String()) != want {
		t.Errorf("first line %q, want %q", strings.TrimSpace(b.String()), want)
	}

	// Bans, once there are any, are on the line.
	b.Reset()
	q.update(t0.Add(10*time.Second), queueSnap{pending: 900, rateLimited: 40, bans: 2})
	if !strings.Contains(b.String(), "429s 40 · 503s 0 · banned 2 times · ETA") {
		t.Errorf("line with bans %q", strings.TrimSpace(b.String()))
	}
}
