package cluster

import (
	"testing"
	"time"
)

// TestTakeOverFence: the instant a take fences its partition's authorities
// from (Hooks.Acquired's since) is the Create's send, and the hold's end
// only for a lease another pod was seen holding lately that expired rather
// than being given back.
func TestTakeOverFence(t *testing.T) {
	const ttl, hold = 2 * time.Second, 4 * time.Second
	sent := time.Date(2026, 12, 4, 3, 0, 0, 0, time.UTC)
	tests := []struct {
		name    string
		seen    time.Duration // the last sighting held elsewhere, before sent
		sighted bool
		given   bool // the key's last entry is a deletion marker
		hold    time.Duration
		want    time.Duration // since, from sent
		held    bool
	}{
		{name: "cold start: never seen held", hold: hold},
		{name: "given back", sighted: true, seen: time.Second, given: true, hold: hold},
		{name: "expired, seen a round ago", sighted: true, seen: ttl / 4, hold: hold, want: hold, held: true},
		{name: "expired, seen at the edge of heldRecently", sighted: true, seen: 2*ttl + hold, hold: hold, want: hold, held: true},
		{name: "seen too long ago", sighted: true, seen: 2*ttl + hold + time.Millisecond, hold: hold},
		{name: "no hold configured", sighted: true, seen: ttl / 4},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			since, held := takeOverFence(sent, sent.Add(-tt.seen), tt.sighted, tt.given, ttl, tt.hold)
			if got := since.Sub(sent); got != tt.want || held != tt.held {
				t.Errorf("takeOverFence = sent+%s held %v, want sent+%s held %v", got, held, tt.want, tt.held)
			}
		})
	}
}
