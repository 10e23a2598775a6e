package loadtest

import (
	"testing"
	"time"

	"github.com/mirrorworker/mirrorworker/stuborigin"
)

// TestFillOriginKeepsTheRunsLastSecond: a run that starts late in the
// origin's second 0 and ends in its second 2 has requests in all three; the
// series holds them all.
func TestFillOriginKeepsTheRunsLastSecond(t *testing.T) {
	t0 := time.Unix(1_000_000, 0)
	st := stuborigin.Stats{Start: t0, Authorities: []stuborigin.AuthorityStats{{
		Counts: stuborigin.Counts{Requests: 3, Admitted: 3},
		Timeline: []stuborigin.Second{
			{T: 0, Counts: stuborigin.Counts{Requests: 1, Admitted: 1}},
			{T: 1, Counts: stuborigin.Counts{Requests: 1, Admitted: 1}},
			{T: 2, Counts: stuborigin.Counts{Requests: 1, Admitted: 1}},
		},
	}}}
	var res Result
	fillOrigin(&res, st, t0.Add(900*time.Millisecond), 1500*time.Millisecond) // the run: 0.9 s to 2.4 s
	var admitted int64
	for _, p := range res.Series {
		admitted += p.Admitted
	}
	if admitted != 3 || len(res.Series) != 3 {
		t.Errorf("series of %d seconds holds %d admitted requests, want 3 seconds and 3", len(res.Series), admitted)
	}
}
