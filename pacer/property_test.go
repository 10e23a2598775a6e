package pacer_test

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mirrorworker/mirrorworker/pacer"
)

// TestPropertyRandomSequences drives one authority with seeded random
// requests and responses and checks, against a model that knows only what
// the verdicts said, that
//   - no grant starts before a cooldown deadline known when it was granted,
//     nor is granted while a probe is in flight, nor fails to be the probe
//     when a cooldown awaits confirmation, nor exceeds the in-flight cap;
//   - every request actually starts (Confirm, after a random lateness past
//     its Start, looping while Confirm moves the Start) outside any known
//     cooldown, while no other probe runs, and as the probe when a cooldown
//     awaits confirmation;
//   - no two actual starts are closer than the floor plus the default start
//     guard;
//
// and that no interval exceeds max(60 s, floor) nor any pause 600 s.
func TestPropertyRandomSequences(t *testing.T) {
	responses := []func(now time.Time, rnd *rand.Rand) pacer.Response{
		func(time.Time, *rand.Rand) pacer.Response { return resp(200) },
		func(time.Time, *rand.Rand) pacer.Response { return resp(200) },
		func(time.Time, *rand.Rand) pacer.Response { return resp(404) },
		func(time.Time, *rand.Rand) pacer.Response { return resp(429) },
		func(_ time.Time, r *rand.Rand) pacer.Response {
			return resp(429, "Retry-After", strconv.Itoa(r.IntN(2000)))
		},
		func(now time.Time, r *rand.Rand) pacer.Response {
			return resp(429, "Retry-After", now.Add(time.Duration(r.IntN(3000)-500)*time.Second).Format(http.TimeFormat))
		},
		func(_ time.Time, r *rand.Rand) pacer.Response {
			return resp(503, "Retry-After", strconv.Itoa(r.IntN(900)))
		},
		func(time.Time, *rand.Rand) pacer.Response { return resp(503) },
		func(time.Time, *rand.Rand) pacer.Response { return resp(502) },
		func(_ time.Time, r *rand.Rand) pacer.Response {
			return resp(200, "X-RateLimit-Remaining", strconv.Itoa(r.IntN(2)), "X-RateLimit-Reset", strconv.Itoa(r.IntN(1000)))
		},
		func(_ time.Time, r *rand.Rand) pacer.Response {
			return resp(403, "RateLimit", fmt.Sprintf(`"q";r=%d;t=%d`, r.IntN(2), r.IntN(100000)))
		},
		func(time.Time, *rand.Rand) pacer.Response { return pacer.Response{Err: errors.New("reset")} },
		func(time.Time, *rand.Rand) pacer.Response { return pacer.Response{Cancelled: true} },
	}
	// How late a request wakes after its Start: often on time, sometimes
	// by scheduling noise, sometimes by far more than an interval.
	lateness := []time.Duration{0, 0, 0, time.Millisecond, 25 * time.Millisecond, 300 * time.Millisecond, 3 * time.Second}
	floors := []time.Duration{0, 250 * time.Millisecond, time.Second, 90 * time.Second}
	type request struct {
		pm      pacer.Permit
		started bool
	}
	for seed := uint64(1); seed <= 24; seed++ {
		floor := floors[seed%uint64(len(floors))]
		guard := pacer.StartGuardFor(floor)
		t.Run(fmt.Sprintf("seed%d_floor%s", seed, floor), func(t *testing.T) {
			rnd := rand.New(rand.NewPCG(seed, 42))
			p := pacer.New(&pacer.Options{
				Policy:      pacer.DefaultPolicy().WithDefaultFloor(floor),
				Rand:        rnd.Float64,
				QuietWindow: 10 * time.Minute,
			})
			maxIv := max(60*time.Second, floor)
			now := t0
			late := func() time.Duration {
				l := lateness[rnd.IntN(len(lateness))]
				if l == 0 {
					return 0
				}
				return time.Duration(rnd.Int64N(int64(l)))
			}
			var starts, grants []time.Time
			var outstanding []*request
			var known time.Time // latest cooldown deadline the verdicts told us
			needProbe := false
			var probe *request // the probe in flight, granted or promoted
			for op := 0; op < 4000; op++ {
				switch k := rnd.IntN(12); {
				case k < 3: // time passes
					steps := []time.Duration{time.Millisecond, 100 * time.Millisecond, time.Second, 10 * time.Second, 5 * time.Minute}
					now = now.Add(time.Duration(rnd.Int64N(int64(steps[rnd.IntN(len(steps))]))))
				case k < 7: // a caller asks
					waits := []time.Duration{0, 0, 500 * time.Millisecond, 5 * time.Second, time.Hour}
					pm, err := p.Acquire(now, host, waits[rnd.IntN(len(waits))])
					if err != nil {
						var re *pacer.RefusedError
						if !errors.As(err, &re) || re.Wait <= 0 {
							t.Fatalf("op %d: bad refusal %v", op, err)
						}
						continue
					}
					if pm.Start.Before(now) {
						t.Fatalf("op %d: start %s before now", op, pm.Start.Sub(now))
					}
					if pm.Start.Before(known) {
						t.Fatalf("op %d: grant at %s during a cooldown until %s", op, pm.Start.Sub(t0), known.Sub(t0))
					}
					if probe != nil {
						t.Fatalf("op %d: grant while a probe is in flight", op)
					}
					if needProbe != pm.Probe {
						t.Fatalf("op %d: probe %v, want %v", op, pm.Probe, needProbe)
					}
					if pm.Interval > maxIv || pm.Interval < floor {
						t.Fatalf("op %d: interval %s outside [%s, %s]", op, pm.Interval, floor, maxIv)
					}
					r := &request{pm: pm}
					if pm.Probe {
						probe = r
					}
					grants = append(grants, pm.Start)
					outstanding = append(outstanding, r)
					if len(outstanding) > 2 {
						t.Fatalf("op %d: %d in flight, cap 2", op, len(outstanding))
					}
				case k < 10: // a granted request wakes, late or not, and starts
					i := slices.IndexFunc(outstanding, func(r *request) bool { return !r.started })
					if i < 0 {
						continue
					}
					r := outstanding[i]
					for loops := 0; ; loops++ {
						if loops > 100 {
							t.Fatalf("op %d: Confirm moved the start %d times", op, loops)
						}
						if r.pm.Start.After(now) {
							now = r.pm.Start
						}
						now = now.Add(late())
						pm, err := p.Confirm(now, r.pm)
						if err != nil {
							var re *pacer.RefusedError
							if !errors.As(err, &re) || re.Wait <= 0 || (re.Reason != pacer.ReasonCooling && re.Reason != pacer.ReasonProbing && re.Reason != pacer.ReasonBackoff) {
								t.Fatalf("op %d: bad revocation %v", op, err)
							}
							p.Done(now, pm, pacer.Response{Cancelled: true})
							if probe == r {
								probe = nil
							}
							outstanding = slices.Delete(outstanding, i, i+1)
							break
						}
						if pm.Probe && !r.pm.Probe {
							if probe != nil {
								t.Fatalf("op %d: promoted to the probe while another runs", op)
							}
							probe = r
						}
						if pm.Start.Before(r.pm.Start) {
							t.Fatalf("op %d: Confirm moved the start earlier", op)
						}
						r.pm = pm
						if pm.Start.After(now) {
							continue // wait for the new Start and confirm again
						}
						if now.Before(known) {
							t.Fatalf("op %d: started at %s during a cooldown until %s", op, now.Sub(t0), known.Sub(t0))
						}
						if probe != nil && probe != r {
							t.Fatalf("op %d: started while a probe is in flight", op)
						}
						if needProbe && !pm.Probe {
							t.Fatalf("op %d: started a non-probe while a cooldown awaits its probe", op)
						}
						r.started = true
						starts = append(starts, now)
						break
					}
				default: // a request finishes, or a caller abandons its grant
					if len(outstanding) == 0 {
						continue
					}
					i := rnd.IntN(len(outstanding))
					r := outstanding[i]
					outstanding = slices.Delete(outstanding, i, i+1)
					if probe == r {
						probe = nil
					}
					if !r.started {
						p.Done(now, r.pm, pacer.Response{Cancelled: true})
						continue
					}
					resp := responses[rnd.IntN(len(responses))](now, rnd)
					v := p.Done(now, r.pm, resp)
					if !v.Until.IsZero() {
						if v.Until.Sub(now) > 600*time.Second {
							t.Fatalf("op %d: pause %s over 600 s", op, v.Until.Sub(now))
						}
						if v.Until.Before(known) && known.After(now) {
							t.Fatalf("op %d: pause shortened from %s to %s", op, known.Sub(t0), v.Until.Sub(t0))
						}
						known = v.Until
						needProbe = true
					}
					if r.pm.Probe {
						learned := !resp.Cancelled && resp.Err == nil
						if learned && !v.Throttled && v.Until.IsZero() {
							needProbe = false
						}
					}
				}
				for _, s := range p.Snapshot(now) {
					if s.Interval > maxIv || s.Interval < floor {
						t.Fatalf("op %d: interval %s outside [%s, %s]", op, s.Interval, floor, maxIv)
					}
					if !s.CooldownUntil.IsZero() && s.CooldownUntil.Sub(now) > 600*time.Second {
						t.Fatalf("op %d: cooldown %s ahead", op, s.CooldownUntil.Sub(now))
					}
					if s.Ceiling < 60*time.Second || s.Ceiling > 600*time.Second {
						t.Fatalf("op %d: ceiling %s", op, s.Ceiling)
					}
				}
			}
			slices.SortFunc(grants, time.Time.Compare)
			for i := 1; i < len(grants); i++ {
				if d := grants[i].Sub(grants[i-1]); d < floor {
					t.Fatalf("grants %d and %d only %s apart, floor %s", i-1, i, d, floor)
				}
			}
			// Starts are confirmed in time order here, so sorting is a no-op;
			// sort anyway so the check does not depend on it.
			slices.SortFunc(starts, time.Time.Compare)
			for i := 1; i < len(starts); i++ {
				if d := starts[i].Sub(starts[i-1]); d < floor+guard {
					t.Fatalf("actual starts %d and %d only %s apart, floor %s + guard %s", i-1, i, d, floor, guard)
				}
			}
			if len(starts) < 50 {
				t.Fatalf("only %d actual starts: the sequence exercised too little", len(starts))
			}
		})
	}
}

// TestConcurrentOneAuthority hammers one authority from many goroutines on a
// shared virtual clock (run it with -race). Each granted request wakes a
// random lateness after its Start and confirms, waiting and confirming again
// while Confirm moves its Start. Goroutines read the clock at different
// moments, so Confirm sees instants out of order. It checks that no two
// actual starts are closer than the floor plus the default start guard, no
// two grants closer than the floor, and the cap is never exceeded.
func TestConcurrentOneAuthority(t *testing.T) {
	const (
		floor      = 10 * time.Millisecond
		goroutines = 32
		perG       = 2000
	)
	guard := pacer.StartGuardFor(floor) // the default
	p := pacer.New(&pacer.Options{Policy: pacer.DefaultPolicy().WithDefaultFloor(floor)})
	var clock atomic.Int64 // nanoseconds since t0
	var inFlight, maxSeen atomic.Int64
	var mu sync.Mutex
	var starts, grants []time.Time
	var moved atomic.Int64
	var wg sync.WaitGroup
	for g := 0; g < goroutines; g++ {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			rnd := rand.New(rand.NewPCG(uint64(g), 7))
			late := func() time.Duration {
				if rnd.IntN(4) == 0 {
					return time.Duration(rnd.Int64N(int64(3 * floor)))
				}
				return 0
			}
			var mine, granted []time.Time
			// start confirms pm from a random lateness after its Start,
			// waiting for every new Start, and returns the actual start.
			start := func(pm pacer.Permit) (pacer.Permit, time.Time, bool) {
				at := pm.Start.Add(late())
				for loops := 0; ; loops++ {
					if loops > 10000 {
						t.Errorf("Confirm moved a start %d times", loops)
						return pm, at, false
					}
					c, err := p.Confirm(at, pm)
					if err != nil {
						t.Errorf("Confirm: %v", err)
						return pm, at, false
					}
					if !c.Start.After(at) {
						return c, at, true
					}
					moved.Add(1)
					pm, at = c, c.Start.Add(late())
				}
			}
			for i := 0; i < perG; i++ {
				// Up to two grants at once, then their starts in order, so
				// that a late first start moves the second even when the
				// goroutines happen not to interleave.
				var pms []pacer.Permit
				for range 2 {
					now := t0.Add(time.Duration(clock.Add(int64(rnd.IntN(1000)) * int64(time.Microsecond))))
					pm, err := p.Acquire(now, host, time.Duration(rnd.IntN(4))*floor)
					if err != nil {
						continue
					}
					n := inFlight.Add(1)
					for m := maxSeen.Load(); n > m && !maxSeen.CompareAndSwap(m, n); m = maxSeen.Load() {
					}
					granted = append(granted, pm.Start)
					pms = append(pms, pm)
				}
				for _, pm := range pms {
					pm, at, ok := start(pm)
					if !ok {
						return
					}
					mine = append(mine, at)
					// The caller waited until at: the shared clock is there too.
					for c := clock.Load(); int64(at.Sub(t0)) > c && !clock.CompareAndSwap(c, int64(at.Sub(t0))); c = clock.Load() {
					}
					inFlight.Add(-1)
					p.Done(at, pm, resp(200))
				}
			}
			mu.Lock()
			starts = append(starts, mine...)
			grants = append(grants, granted...)
			mu.Unlock()
		}(g)
	}
	wg.Wait()
	for _, c := range []struct {
		what string
		ts   []time.Time
		min  time.Duration
	}{{"grants", grants, floor}, {"actual starts", starts, floor + guard}} {
		slices.SortFunc(c.ts, time.Time.Compare)
		for i := 1; i < len(c.ts); i++ {
			if d := c.ts[i].Sub(c.ts[i-1]); d < c.min {
				t.Fatalf("%s %d and %d only %s apart, want at least %s", c.what, i-1, i, d, c.min)
			}
		}
	}
	t.Logf("%d grants, %d actual starts, %d moved by Confirm", len(grants), len(starts), moved.Load())
	if len(starts) < 100 || moved.Load() == 0 {
		t.Fatalf("only %d starts, %d moved by Confirm: the test exercised too little", len(starts), moved.Load())
	}
	if maxSeen.Load() > 2 {
		t.Fatalf("%d in flight at once, cap 2", maxSeen.Load())
	}
	if st := p.Snapshot(t0.Add(time.Duration(clock.Load()))); len(st) != 1 || st[0].InFlight != 0 {
		t.Fatalf("state after all Done: %+v", st)
	}
}
