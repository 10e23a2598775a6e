package loadtest_test

import (
	"context"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/mirrorworker/mirrorworker/loadtest"
	"github.com/mirrorworker/mirrorworker/strategy"
	"github.com/mirrorworker/mirrorworker/stuborigin"
)

// nginxProfile is the nginx-like stub at rate r/s, burst 5, nodelay, 429
// with a fixed Retry-After of 1 s, at real time with floor.
func nginxProfile(rate float64, floor time.Duration) *loadtest.Profile {
	return &loadtest.Profile{
		Name: "nginx", Scale: 1, Floor: floor, MaxInFlight: 2, ObjectSize: 1024,
		Origin: &stuborigin.Profile{Name: "nginx", LimitReq: &stuborigin.LimitReq{
			Rate: rate, Burst: 5, NoDelay: true, Status: 429, RetryAfter: stuborigin.Duration{Duration: time.Second}}},
	}
}

// TestPolitenessOnNginxLikeOrigin is the short form of the politeness
// benchmark (cmd/mirrorworker BenchmarkPoliteness): the worker's pipeline
// at floors 100 ms and 0, and the curl --retry reference, against the
// nginx-like stub at 10 r/s. It asserts only what must hold whatever the
// pace: the worker sends nothing while told to wait, sends nothing closer
// than the floor, and dead-letters nothing; the reference stores every file and,
// honouring each Retry-After, is never early either. Never time or speed.
func TestPolitenessOnNginxLikeOrigin(t *testing.T) {
	if testing.Short() {
		t.Skip("runs load tests")
	}
	tests := []struct {
		name     string
		strategy string
		floor    time.Duration
		jobs     int
		// inFlightRace: with floor 0 two requests leave together (the
		// in-flight cap is 2), and the one answered second may reach the
		// origin just after the first drew its 429 and Retry-After: the
		// origin counts it as early though it may have left before any
		// answer (at HEAD f96fcfc: 1 such request; 0 with an in-flight cap
		// of 1). Its split (told or crossed) is logged, not asserted: the
		// pacer's side of issue 35 owns it.
		inFlightRace bool
	}{
		{"worker floor 100ms", strategy.HostPacer, 100 * time.Millisecond, 30, false},
		// Floor 0 outruns the bucket: throttled at once, so fewer files
		// keep the run short at the pacer's real-time constants.
		{"worker floor 0", strategy.HostPacer, 0, 12, true},
		{"curl --retry", strategy.CurlRetry, 0, 30, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
			defer cancel()
			rep, err := loadtest.Run(ctx, loadtest.Options{
				Jobs: tt.jobs, Authorities: 1, Workers: 1, Profile: nginxProfile(10, tt.floor), InProcess: true,
				Strategies: []string{tt.strategy},
				TimeLimit:  150 * time.Second, Dir: t.TempDir(),
				Logger: zerolog.New(zerolog.NewTestWriter(t)).Level(zerolog.WarnLevel),
			})
			if err != nil {
				t.Fatal(err)
			}
			r := rep.Results[0]
			if r.Error != "" || !r.Drained || r.JobsStored != tt.jobs || r.DeadLettered != 0 {
				t.Fatalf("error=%q drained=%v stored=%d dead=%d; want all %d stored", r.Error, r.Drained, r.JobsStored, r.DeadLettered, tt.jobs)
			}
			// Every strategy here logs its departures, so the origin's
			// early count is split, and whole (refusals.go).
			if !r.DeparturesLogged || r.EarlyTold+r.EarlyCrossed != r.Early || int64(len(r.EarlyRequests)) != r.Early {
				t.Errorf("early %d split into %d told and %d crossed (%d listed, departures logged %v)", r.Early, r.EarlyTold, r.EarlyCrossed, len(r.EarlyRequests), r.DeparturesLogged)
			}
			switch {
			case r.Early != 0 && tt.inFlightRace:
				t.Logf("%d requests arrived early: %d told to wait, %d crossed a refusal: %+v", r.Early, r.EarlyTold, r.EarlyCrossed, r.EarlyRequests)
			case r.Early != 0:
				t.Errorf("%d requests while told to wait", r.Early)
			}
			// The floor is asserted on the departures, the pacer's
			// decisions; arrivals are logged: on a busy 2-core machine a
			// request delayed on its way lands closer to the next one than
			// it left (TestLoadtestPods says the same).
			if tt.strategy == strategy.HostPacer && tt.floor > 0 && r.SentGapsBelowFloor != 0 {
				t.Errorf("%d requests sent closer than the %v floor (closest %.3f s)", r.SentGapsBelowFloor, tt.floor, r.MinSentGapSeconds)
			}
			if tt.strategy == strategy.CurlRetry && r.Status429 == 0 {
				t.Errorf("the reference drew no 429 from a 10 r/s bucket it does not pace for")
			}
			t.Logf("%s: drain %.1f s, %d requests, %d 429s, %d early, %d arrivals and %d departures closer than the floor", tt.name, r.DrainSeconds, r.Requests, r.Status429, r.Early, r.GapsBelowFloor, r.SentGapsBelowFloor)
		})
	}
}
