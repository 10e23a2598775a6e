package pacer_test

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"sort"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mirrorworker/mirrorworker/pacer"
)

// TestPropertyRandomSequences drives one authority with seeded random
// requests and responses and checks, against a model that knows only what
// the verdicts said, that no grant ever
//   - starts closer than the floor to another start,
//   - starts before a cooldown deadline known when it was granted,
//   - is granted while a probe is in flight, or is not the probe when a
//     cooldown awaits confirmation,
//   - exceeds the in-flight cap,
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
	floors := []time.Duration{0, 250 * time.Millisecond, time.Second, 90 * time.Second}
	for seed := uint64(1); seed <= 24; seed++ {
		floor := floors[seed%uint64(len(floors))]
		t.Run(fmt.Sprintf("seed%d_floor%s", seed, floor), func(t *testing.T) {
			rnd := rand.New(rand.NewPCG(seed, 42))
			p := newPacer(t, floor, &pacer.Options{Rand: rnd.Float64, QuietWindow: 10 * time.Minute})
			maxIv := max(60*time.Second, floor)
			now := t0
			var starts []time.Time
			var outstanding []pacer.Permit
			var known time.Time // latest cooldown deadline the verdicts told us
			needProbe, probeOut := false, false
			for op := 0; op < 3000; op++ {
				switch k := rnd.IntN(10); {
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
					if probeOut {
						t.Fatalf("op %d: grant while a probe is in flight", op)
					}
					if needProbe != pm.Probe {
						t.Fatalf("op %d: probe %v, want %v", op, pm.Probe, needProbe)
					}
					if pm.Interval > maxIv || pm.Interval < floor {
						t.Fatalf("op %d: interval %s outside [%s, %s]", op, pm.Interval, floor, maxIv)
					}
					probeOut = pm.Probe
					starts = append(starts, pm.Start)
					outstanding = append(outstanding, pm)
					if len(outstanding) > 2 {
						t.Fatalf("op %d: %d in flight, cap 2", op, len(outstanding))
					}
				default: // a request finishes
					if len(outstanding) == 0 {
						continue
					}
					i := rnd.IntN(len(outstanding))
					pm := outstanding[i]
					if pm.Start.After(now) {
						now = pm.Start
					}
					outstanding = append(outstanding[:i], outstanding[i+1:]...)
					r := responses[rnd.IntN(len(responses))](now, rnd)
					v := p.Done(now, pm, r)
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
					if pm.Probe {
						probeOut = false
						learned := !r.Cancelled && r.Err == nil
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
			sort.Slice(starts, func(i, j int) bool { return starts[i].Before(starts[j]) })
			for i := 1; i < len(starts); i++ {
				if d := starts[i].Sub(starts[i-1]); d < floor {
					t.Fatalf("starts %d and %d only %s apart, floor %s", i-1, i, d, floor)
				}
			}
			if len(starts) < 50 {
				t.Fatalf("only %d grants: the sequence exercised too little", len(starts))
			}
		})
	}
}

// TestConcurrentOneAuthority hammers one authority from many goroutines on a
// shared virtual clock (run it with -race) and checks that no two granted
// starts are closer than the floor and the cap is never exceeded.
func TestConcurrentOneAuthority(t *testing.T) {
	const (
		floor      = 10 * time.Millisecond
		goroutines = 32
		perG       = 2000
	)
	p := newPacer(t, floor, &pacer.Options{Policy: pacer.DefaultPolicy().WithDefaultFloor(floor)})
	var clock atomic.Int64 // nanoseconds since t0
	var inFlight, maxSeen atomic.Int64
	var mu sync.Mutex
	var starts []time.Time
	var wg sync.WaitGroup
	for g := 0; g < goroutines; g++ {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			rnd := rand.New(rand.NewPCG(uint64(g), 7))
			var mine []time.Time
			for i := 0; i < perG; i++ {
				now := t0.Add(time.Duration(clock.Add(int64(rnd.IntN(1000)) * int64(time.Microsecond))))
				pm, err := p.Acquire(now, host, time.Duration(rnd.IntN(3))*floor)
				if err != nil {
					continue
				}
				n := inFlight.Add(1)
				for m := maxSeen.Load(); n > m && !maxSeen.CompareAndSwap(m, n); m = maxSeen.Load() {
				}
				mine = append(mine, pm.Start)
				inFlight.Add(-1)
				p.Done(pm.Start, pm, resp(200))
			}
			mu.Lock()
			starts = append(starts, mine...)
			mu.Unlock()
		}(g)
	}
	wg.Wait()
	sort.Slice(starts, func(i, j int) bool { return starts[i].Before(starts[j]) })
	for i := 1; i < len(starts); i++ {
		if d := starts[i].Sub(starts[i-1]); d < floor {
			t.Fatalf("starts %d and %d only %s apart, floor %s", i-1, i, d, floor)
		}
	}
	if len(starts) < 100 {
		t.Fatalf("only %d grants", len(starts))
	}
	if maxSeen.Load() > 2 {
		t.Fatalf("%d in flight at once, cap 2", maxSeen.Load())
	}
	if st := p.Snapshot(t0.Add(time.Duration(clock.Load()))); len(st) != 1 || st[0].InFlight != 0 {
		t.Fatalf("state after all Done: %+v", st)
	}
}
