package strategy_test

import (
	"errors"
	"net/http"
	"sort"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mirrorworker/mirrorworker/pacer"
	"github.com/mirrorworker/mirrorworker/strategy"
)

var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

const auth = "origin.example:443"

// step is one call on a fixed virtual instant. Exactly one of the three
// shapes is used: a grant, a refusal, or a Done on the oldest outstanding
// permit with a response.
type step struct {
	at      time.Duration // offset from t0
	maxWait time.Duration

	// Acquire granted: the request may start at t0+start, with this interval.
	grant    bool
	start    time.Duration
	probe    bool
	interval time.Duration

	// Acquire refused.
	refuse pacer.Reason
	wait   time.Duration

	// Done with a response; want is the verdict, until an offset from t0
	// (zero: no deadline).
	status    int
	header    http.Header
	cancelled bool
	throttled bool
	reason    string
	until     time.Duration
}

func ra(secs int) http.Header { return http.Header{"Retry-After": {strconv.Itoa(secs)}} }

func ms(n int) time.Duration { return time.Duration(n) * time.Millisecond }

func run(t *testing.T, p *pacer.Pacer, steps []step) {
	t.Helper()
	var outstanding []pacer.Permit
	for i, s := range steps {
		now := t0.Add(s.at)
		switch {
		case s.status != 0 || s.cancelled:
			if len(outstanding) == 0 {
				t.Fatalf("step %d: Done without an outstanding permit", i)
			}
			pm := outstanding[0]
			outstanding = outstanding[1:]
			v := p.Done(now, pm, pacer.Response{Status: s.status, Header: s.header, Cancelled: s.cancelled})
			var until time.Time
			if s.until != 0 {
				until = t0.Add(s.until)
			}
			want := pacer.Verdict{Throttled: s.throttled, Reason: s.reason, Until: until}
			if v.Throttled != want.Throttled || v.Reason != want.Reason || !v.Until.Equal(want.Until) {
				t.Fatalf("step %d at %v: Done(%d) = %+v, want %+v", i, s.at, s.status, v, want)
			}
		case s.grant:
			pm, err := p.Acquire(now, auth, s.maxWait)
			if err != nil {
				t.Fatalf("step %d at %v: Acquire refused (%v), want a grant at %v", i, s.at, err, s.start)
			}
			if !pm.Start.Equal(t0.Add(s.start)) || pm.Probe != s.probe || pm.Interval != s.interval || pm.Authority != auth {
				t.Fatalf("step %d at %v: grant start=%v probe=%v interval=%v, want start=%v probe=%v interval=%v",
					i, s.at, pm.Start.Sub(t0), pm.Probe, pm.Interval, s.start, s.probe, s.interval)
			}
			outstanding = append(outstanding, pm)
		default:
			_, err := p.Acquire(now, auth, s.maxWait)
			var re *pacer.RefusedError
			if !errors.As(err, &re) {
				t.Fatalf("step %d at %v: Acquire = %v, want a %s refusal", i, s.at, err, s.refuse)
			}
			if re.Reason != s.refuse || re.Wait != s.wait {
				t.Fatalf("step %d at %v: refused %s wait %v, want %s wait %v", i, s.at, re.Reason, re.Wait, s.refuse, s.wait)
			}
		}
	}
}

func newStrategy(t *testing.T, name string, o strategy.Options) *pacer.Pacer {
	t.Helper()
	if o.StartGuard == 0 && name != strategy.HostPacer {
		o.StartGuard = -1 // the tables speak of the interval alone
	}
	p, err := strategy.New(name, o)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// Rules every non-HostPacer strategy shares: floor spacing with short-wait
// reservation and the in-flight cap.
func TestCommonSpacingAndInFlight(t *testing.T) {
	for _, name := range []string{strategy.Fixed, strategy.Escalate, strategy.EscalateRA, strategy.Cooldown, strategy.Feedback} {
		t.Run(name, func(t *testing.T) {
			run(t, newStrategy(t, name, strategy.Options{Floor: time.Second, MaxInFlight: 2}), []step{
				{at: 0, grant: true, start: 0, interval: time.Second},
				{at: 0, refuse: pacer.ReasonSpacing, wait: time.Second},
				{at: 0, maxWait: time.Second, grant: true, start: time.Second, interval: time.Second},
				{at: 0, maxWait: time.Hour, refuse: pacer.ReasonInFlight, wait: 2 * time.Second},
				{at: ms(300), status: 200},
				{at: ms(400), refuse: pacer.ReasonSpacing, wait: ms(1600)},
				{at: ms(1200), status: 304},
				{at: 2 * time.Second, grant: true, start: 2 * time.Second, interval: time.Second},
			})
		})
	}
}

func TestFixed(t *testing.T) {
	run(t, newStrategy(t, strategy.Fixed, strategy.Options{Floor: time.Second}), []step{
		{at: 0, grant: true, interval: time.Second},
		{at: ms(100), status: 429, header: ra(30), throttled: true, reason: "429"},
		// Nothing learned: the next slot is still one floor after the first.
		{at: ms(100), refuse: pacer.ReasonSpacing, wait: ms(900)},
		{at: time.Second, grant: true, start: time.Second, interval: time.Second},
		{at: ms(1100), status: 503, header: ra(5), throttled: true, reason: "503"},
		{at: 2 * time.Second, grant: true, start: 2 * time.Second, interval: time.Second},
		{at: ms(2100), status: 503}, // no Retry-After: an ordinary server error
		{at: 3 * time.Second, grant: true, start: 3 * time.Second, interval: time.Second},
	})
}

func TestEscalate(t *testing.T) {
	run(t, newStrategy(t, strategy.Escalate, strategy.Options{Floor: time.Second}), []step{
		{at: 0, grant: true, interval: time.Second},
		{at: ms(500), status: 429, throttled: true, reason: "429"},
		// 2 s first step; the next slot is the last start plus the new interval.
		{at: ms(500), refuse: pacer.ReasonSpacing, wait: ms(1500)},
		{at: 2 * time.Second, grant: true, start: 2 * time.Second, interval: 2 * time.Second},
		// Retry-After is ignored: x2, not 100 s.
		{at: ms(2100), status: 429, header: ra(100), throttled: true, reason: "429"},
		{at: 6 * time.Second, grant: true, start: 6 * time.Second, interval: 4 * time.Second},
		// A 503 is a server error to this strategy, even with Retry-After.
		{at: ms(6100), status: 503, header: ra(100)},
		{at: 10 * time.Second, grant: true, start: 10 * time.Second, interval: 4 * time.Second},
		{at: 10 * time.Second, status: 429, throttled: true, reason: "429"}, // 8 s
		{at: 18 * time.Second, grant: true, start: 18 * time.Second, interval: 8 * time.Second},
		{at: 18 * time.Second, status: 429, throttled: true, reason: "429"}, // 16 s
		{at: 34 * time.Second, grant: true, start: 34 * time.Second, interval: 16 * time.Second},
		{at: 34 * time.Second, status: 429, throttled: true, reason: "429"}, // 32 s
		{at: 66 * time.Second, grant: true, start: 66 * time.Second, interval: 32 * time.Second},
		{at: 66 * time.Second, status: 429, throttled: true, reason: "429"}, // capped at 60 s
		{at: 126 * time.Second, grant: true, start: 126 * time.Second, interval: 60 * time.Second},
		{at: 126 * time.Second, status: 429, throttled: true, reason: "429"}, // stays 60 s
		{at: 186 * time.Second, grant: true, start: 186 * time.Second, interval: 60 * time.Second},
		{at: 186 * time.Second, status: 200},
		// Quiet window: 30 min after the last 429 the interval halves, once
		// per window, toward the floor.
		{at: 126*time.Second + 30*time.Minute - 1, grant: true, start: 126*time.Second + 30*time.Minute - 1, interval: 60 * time.Second},
		{at: 126*time.Second + 30*time.Minute, status: 200},
		{at: 126*time.Second + 61*time.Minute, grant: true, start: 126*time.Second + 61*time.Minute, interval: 15 * time.Second},
		{at: 126*time.Second + 61*time.Minute, status: 200},
		{at: 126*time.Second + 6*time.Hour, grant: true, start: 126*time.Second + 6*time.Hour, interval: time.Second},
	})
}

func TestEscalateScaled(t *testing.T) {
	// Scale 0.01: 2 s -> 20 ms, 60 s -> 600 ms, 30 min -> 18 s; the floor
	// is policy and is not scaled.
	run(t, newStrategy(t, strategy.Escalate, strategy.Options{Floor: ms(10), Scale: 0.01}), []step{
		{at: 0, grant: true, interval: ms(10)},
		{at: 0, status: 429, throttled: true, reason: "429"},
		{at: ms(20), grant: true, start: ms(20), interval: ms(20)},
		{at: ms(20), status: 429, throttled: true, reason: "429"},
		{at: ms(60), grant: true, start: ms(60), interval: ms(40)},
		{at: ms(60), status: 429, throttled: true, reason: "429"},
		{at: ms(60) + 18*time.Second, grant: true, start: ms(60) + 18*time.Second, interval: ms(40)},
		{at: ms(60) + 18*time.Second, status: 200},
	})
}

func TestEscalateRA(t *testing.T) {
	run(t, newStrategy(t, strategy.EscalateRA, strategy.Options{Floor: time.Second}), []step{
		{at: 0, grant: true, interval: time.Second},
		{at: 0, status: 429, throttled: true, reason: "429"}, // max(2 x 1, 2) = 2 s
		{at: 2 * time.Second, grant: true, start: 2 * time.Second, interval: 2 * time.Second},
		{at: 2 * time.Second, status: 429, header: ra(10), throttled: true, reason: "429"}, // max(4, 2, 10) = 10 s
		{at: 12 * time.Second, grant: true, start: 12 * time.Second, interval: 10 * time.Second},
		{at: 12 * time.Second, status: 503, throttled: true, reason: "503"}, // every 503 counts: 20 s
		{at: 32 * time.Second, grant: true, start: 32 * time.Second, interval: 20 * time.Second},
		{at: 32 * time.Second, status: 429, header: ra(600), throttled: true, reason: "429"}, // capped at floor + 60 s
		{at: 92 * time.Second, refuse: pacer.ReasonSpacing, wait: time.Second},
		{at: 93 * time.Second, grant: true, start: 93 * time.Second, interval: 61 * time.Second},
		{at: 93 * time.Second, status: 200},
		// Straight back to the floor 30 min after the last refusal.
		{at: 32*time.Second + 30*time.Minute - 1, grant: true, start: 32*time.Second + 30*time.Minute - 1, interval: 61 * time.Second},
		{at: 32*time.Second + 30*time.Minute, status: 200},
		{at: 32*time.Second + 32*time.Minute, grant: true, start: 32*time.Second + 32*time.Minute, interval: time.Second},
	})
}

func TestCooldown(t *testing.T) {
	half := func() float64 { return 0.5 }
	run(t, newStrategy(t, strategy.Cooldown, strategy.Options{Floor: time.Second, Rand: half}), []step{
		{at: 0, grant: true, interval: time.Second},
		{at: ms(100), status: 429, header: ra(5), throttled: true, reason: "429", until: ms(5100)},
		{at: time.Second, maxWait: time.Hour, refuse: pacer.ReasonCooling, wait: ms(4100)},
		// After the deadline, one probe; the others are told 1 s.
		{at: ms(5100), grant: true, start: ms(5100), probe: true, interval: time.Second},
		{at: ms(6200), refuse: pacer.ReasonProbing, wait: time.Second},
		// A failed probe without a hint: the ceiling doubles to 120 s and the
		// jitter draws 60 + 0.5 x 60 = 90 s. The spacing does not change.
		{at: ms(6200), status: 429, throttled: true, reason: "429", until: ms(96200)},
		{at: ms(96200), grant: true, start: ms(96200), probe: true, interval: time.Second},
		// A probe cancelled releases the slot for the next caller.
		{at: ms(96300), cancelled: true},
		{at: ms(97200), grant: true, start: ms(97200), probe: true, interval: time.Second},
		// A probe answered without throttling restores ordinary traffic
		// and the 60 s ceiling.
		{at: ms(97300), status: 200},
		{at: ms(98200), grant: true, start: ms(98200), interval: time.Second},
		{at: ms(98300), status: 429, throttled: true, reason: "429", until: ms(98300 + 60000)},
		{at: ms(98300 + 60000), grant: true, start: ms(98300 + 60000), probe: true, interval: time.Second},
		{at: ms(98300 + 60000), status: 404},
		// Retry-After is capped at 600 s, and a shorter pause never
		// shortens a longer one.
		{at: 200 * time.Second, grant: true, start: 200 * time.Second, interval: time.Second},
		{at: 200 * time.Second, grant: true, maxWait: time.Second, start: 201 * time.Second, interval: time.Second},
		{at: 201 * time.Second, status: 429, header: ra(3600), throttled: true, reason: "429", until: 801 * time.Second},
		{at: 202 * time.Second, status: 503, header: ra(5), throttled: true, reason: "503", until: 801 * time.Second},
		{at: 800 * time.Second, refuse: pacer.ReasonCooling, wait: time.Second},
		{at: 801 * time.Second, grant: true, start: 801 * time.Second, probe: true, interval: time.Second},
		// A 503 without Retry-After is not a throttle.
		{at: 801 * time.Second, status: 503},
		{at: 802 * time.Second, grant: true, start: 802 * time.Second, interval: time.Second},
		{at: 802 * time.Second, status: 503},
		{at: 803 * time.Second, grant: true, start: 803 * time.Second, interval: time.Second},
	})
}

func TestCooldownScaledCeiling(t *testing.T) {
	top := func() float64 { return 0.999999 }
	// Scale 0.01: fallback 600 ms, ceiling doubles to 1.2 s, 2.4 s, 4.8 s,
	// then stays at 6 s.
	run(t, newStrategy(t, strategy.Cooldown, strategy.Options{Floor: ms(10), Scale: 0.01, Rand: top}), []step{
		{at: 0, grant: true, interval: ms(10)},
		{at: 0, status: 429, throttled: true, reason: "429", until: ms(600)},
		{at: ms(600), grant: true, start: ms(600), probe: true, interval: ms(10)},
		{at: ms(600), status: 429, throttled: true, reason: "429", until: ms(600) + 1199999400},
		{at: 2 * time.Second, grant: true, start: 2 * time.Second, probe: true, interval: ms(10)},
		{at: 2 * time.Second, status: 429, throttled: true, reason: "429", until: 2*time.Second + 2399998200},
		{at: 5 * time.Second, grant: true, start: 5 * time.Second, probe: true, interval: ms(10)},
		{at: 5 * time.Second, status: 429, throttled: true, reason: "429", until: 5*time.Second + 4799995800},
		{at: 10 * time.Second, grant: true, start: 10 * time.Second, probe: true, interval: ms(10)},
		{at: 10 * time.Second, status: 429, throttled: true, reason: "429", until: 10*time.Second + 5999994600},
	})
}

func TestFeedback(t *testing.T) {
	xrl := func(rem, reset string) http.Header {
		return http.Header{"X-Ratelimit-Remaining": {rem}, "X-Ratelimit-Reset": {reset}}
	}
	run(t, newStrategy(t, strategy.Feedback, strategy.Options{Floor: time.Second}), []step{
		{at: 0, grant: true, interval: time.Second},
		// Headerless 429s: 1 s, 2 s, 4 s...
		{at: 0, status: 429, throttled: true, reason: "429", until: time.Second},
		{at: ms(500), maxWait: time.Hour, refuse: pacer.ReasonCooling, wait: ms(500)},
		{at: time.Second, grant: true, start: time.Second, interval: time.Second},
		{at: time.Second, status: 429, throttled: true, reason: "429", until: 3 * time.Second},
		{at: 3 * time.Second, grant: true, start: 3 * time.Second, interval: time.Second},
		// A 429 with a positive Retry-After uses it and still counts.
		{at: 3 * time.Second, status: 429, header: ra(7), throttled: true, reason: "429", until: 10 * time.Second},
		// No probe: when the pause ends, callers go at floor spacing.
		{at: 10 * time.Second, grant: true, start: 10 * time.Second, interval: time.Second},
		{at: 10 * time.Second, maxWait: time.Second, grant: true, start: 11 * time.Second, interval: time.Second},
		{at: 10 * time.Second, status: 429, throttled: true, reason: "429", until: 18 * time.Second}, // fourth: 8 s
		// Any other status resets the count.
		{at: 11 * time.Second, status: 200},
		{at: 18 * time.Second, grant: true, start: 18 * time.Second, interval: time.Second},
		{at: 18 * time.Second, status: 429, throttled: true, reason: "429", until: 19 * time.Second},
		// An exhausted family pauses even on a 200, which is not a throttle.
		{at: 19 * time.Second, grant: true, start: 19 * time.Second, interval: time.Second},
		{at: 19 * time.Second, status: 200, header: xrl("0", "5"), reason: "ratelimit", until: 24 * time.Second},
		{at: 20 * time.Second, refuse: pacer.ReasonCooling, wait: 4 * time.Second},
		// A 503 with a valid Retry-After pauses; the cap is 15 min.
		{at: 24 * time.Second, grant: true, start: 24 * time.Second, interval: time.Second},
		{at: 24 * time.Second, status: 503, header: ra(3600), throttled: true, reason: "503", until: 24*time.Second + 15*time.Minute},
		{at: 24*time.Second + 15*time.Minute, grant: true, start: 24*time.Second + 15*time.Minute, interval: time.Second},
		{at: 24*time.Second + 15*time.Minute, status: 503},
	})
}

func TestFeedbackBackoffCap(t *testing.T) {
	steps := []step{}
	at := time.Duration(0)
	for _, pause := range []time.Duration{1, 2, 4, 8, 16, 30, 30} {
		pause *= time.Second
		steps = append(steps,
			step{at: at, grant: true, start: at, interval: time.Second},
			step{at: at, status: 429, throttled: true, reason: "429", until: at + pause})
		at += pause
	}
	run(t, newStrategy(t, strategy.Feedback, strategy.Options{Floor: time.Second}), steps)
}

func TestNewAndParse(t *testing.T) {
	for _, tc := range []struct {
		list    string
		want    []string
		wantErr bool
	}{
		{list: "all", want: append(strategy.Names(), strategy.References()...)},
		{list: "fixed,hostpacer", want: []string{"fixed", "hostpacer"}},
		{list: "escalate-ra", want: []string{"escalate-ra"}},
		{list: "hostpacer,curl-retry", want: []string{"hostpacer", "curl-retry"}},
		{list: "fixed,,cooldown", wantErr: true},
		{list: "fixed,fixed", wantErr: true},
		{list: "tokenbucket", wantErr: true},
		{list: "", wantErr: true},
	} {
		t.Run(tc.list, func(t *testing.T) {
			got, err := strategy.Parse(tc.list)
			if (err != nil) != tc.wantErr {
				t.Fatalf("Parse(%q) error = %v, want error %v", tc.list, err, tc.wantErr)
			}
			if len(got) != len(tc.want) {
				t.Fatalf("Parse(%q) = %v, want %v", tc.list, got, tc.want)
			}
			for i := range got {
				if got[i] != tc.want[i] {
					t.Fatalf("Parse(%q) = %v, want %v", tc.list, got, tc.want)
				}
			}
		})
	}
	if _, err := strategy.New("nope", strategy.Options{}); err == nil {
		t.Fatal("New(nope) succeeded")
	}
	if _, err := strategy.New(strategy.Fixed, strategy.Options{Scale: -1}); err == nil {
		t.Fatal("a negative scale was accepted")
	}
}

func TestDoneWithForeignPermitIsIgnored(t *testing.T) {
	p := newStrategy(t, strategy.Cooldown, strategy.Options{})
	v := p.Done(t0, pacer.Permit{Authority: "never.example:80"}, pacer.Response{Status: 429})
	if v != (pacer.Verdict{}) {
		t.Fatalf("Done on an unknown authority = %+v", v)
	}
}

// The HostPacer under the same harness: same floor, cap and refusal waits
// as the engine the other strategies share, so only learning differs.
func TestHostPacerShareTheDecision(t *testing.T) {
	// Floor 100 ms at Scale 0.01: a start guard of 25 ms (given, to tell it
	// from the floor), the first escalation step 2 s x 0.01 = 20 ms, the
	// interval cap max(60 s x 0.01, floor) = 600 ms, the quiet window 30 min
	// x 0.01 = 18 s.
	run(t, newStrategy(t, strategy.HostPacer, strategy.Options{Floor: ms(100), MaxInFlight: 2, Scale: 0.01, StartGuard: ms(25)}), []step{
		{at: 0, grant: true, start: 0, interval: ms(100)},
		{at: 0, refuse: pacer.ReasonSpacing, wait: ms(125)},
		{at: 0, maxWait: time.Second, grant: true, start: ms(125), interval: ms(100)},
		{at: 0, maxWait: time.Hour, refuse: pacer.ReasonInFlight, wait: ms(250)}, // the gap to the slot after the reserved one
		{at: ms(300), status: 200},
		// 429 Retry-After 5: cooldown, and the interval escalates to 200 ms.
		{at: ms(1200), status: 429, header: ra(5), throttled: true, reason: "429", until: ms(6200)},
		{at: ms(6200), grant: true, start: ms(6200), probe: true, interval: ms(200)},
		{at: ms(6300), status: 200},
		// 18 s of quiet after the 429 halve the interval back to the floor.
		{at: ms(1200) + 18*time.Second, grant: true, start: ms(1200) + 18*time.Second, interval: ms(100)},
	})
}

// Many goroutines on one authority: no two grants closer than the floor,
// for every strategy, under -race.
func TestConcurrentGrantsKeepTheFloor(t *testing.T) {
	for _, name := range strategy.Names() {
		t.Run(name, func(t *testing.T) {
			const floor = 10 * time.Millisecond
			p := newStrategy(t, name, strategy.Options{Floor: floor, MaxInFlight: 4, Scale: 0.001})
			var (
				mu     sync.Mutex
				starts []time.Time
				tick   atomic.Int64
				wg     sync.WaitGroup
			)
			for g := 0; g < 8; g++ {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for i := 0; i < 300; i++ {
						now := t0.Add(time.Duration(tick.Add(1)) * time.Millisecond)
						pm, err := p.Acquire(now, auth, 5*time.Millisecond)
						if err != nil {
							continue
						}
						mu.Lock()
						starts = append(starts, pm.Start)
						mu.Unlock()
						r := pacer.Response{Status: 200}
						if i%50 == 49 {
							r = pacer.Response{Status: 429, Header: ra(1)}
						}
						p.Done(now, pm, r)
					}
				}()
			}
			wg.Wait()
			sort.Slice(starts, func(i, j int) bool { return starts[i].Before(starts[j]) })
			if len(starts) < 2 {
				t.Fatalf("only %d grants", len(starts))
			}
			for i := 1; i < len(starts); i++ {
				if gap := starts[i].Sub(starts[i-1]); gap < floor {
					t.Fatalf("grants %v apart, below the %v floor", gap, floor)
				}
			}
		})
	}
}

// TestConfirmSpacesFromActualStarts: a request whose timer fired late, and
// the next one on time, would leave closer than the floor; Confirm moves the
// second to the floor (plus the start guard) after the first's actual start,
// for every strategy, as the HostPacer does.
func TestConfirmSpacesFromActualStarts(t *testing.T) {
	const floor = 100 * time.Millisecond
	guard := pacer.StartGuardFor(floor) // the default
	for _, name := range strategy.Names() {
		t.Run(name, func(t *testing.T) {
			p, err := strategy.New(name, strategy.Options{Floor: floor, MaxInFlight: 2})
			if err != nil {
				t.Fatal(err)
			}
			a, err := p.Acquire(t0, auth, time.Second)
			if err != nil {
				t.Fatal(err)
			}
			b, err := p.Acquire(t0, auth, time.Second)
			if err != nil {
				t.Fatal(err)
			}
			if want := t0.Add(floor + guard); !b.Start.Equal(want) {
				t.Fatalf("second grant starts at %s, want %s", b.Start.Sub(t0), want.Sub(t0))
			}
			late := t0.Add(90 * time.Millisecond) // a's timer fired 90 ms late
			if a2, err := p.Confirm(late, a); err != nil || !a2.Start.Equal(a.Start) {
				t.Fatalf("Confirm(a) = %+v, %v; want a unchanged", a2, err)
			}
			b2, err := p.Confirm(b.Start, b)
			if err != nil {
				t.Fatal(err)
			}
			if want := late.Add(floor + guard); !b2.Start.Equal(want) {
				t.Fatalf("Confirm(b) at its Start moves it to %s, want %s (a floor and guard after a's actual start)", b2.Start.Sub(t0), want.Sub(t0))
			}
			if b3, err := p.Confirm(b2.Start, b2); err != nil || !b3.Start.Equal(b2.Start) {
				t.Fatalf("Confirm(b) at its new Start = %+v, %v; want it to go", b3, err)
			}
		})
	}
}
