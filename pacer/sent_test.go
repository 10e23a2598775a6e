package pacer_test

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/mirrorworker/mirrorworker/pacer"
)

// newSendsPacer is a Pacer whose caller reports writes (Options.AwaitSends),
// floor 100 ms, a start guard of 25 ms (large enough to tell apart from the
// floor in these tests), in-flight cap c.
func newSendsPacer(c int) *pacer.Pacer {
	return pacer.New(&pacer.Options{
		Policy:     &pacer.Policy{Default: pacer.Limits{Floor: 100 * time.Millisecond, MaxInFlight: c}},
		Rand:       fixedRand(0),
		StartGuard: 25 * time.Millisecond,
		AwaitSends: true,
	})
}

// A first request slow to be written (its connection dials, shakes hands,
// waits on a proxy's CONNECT) delays the second: while A is started but
// not written, B's confirm moves it one spacing on, and once A is written
// B is spaced from that write, not from A's start. Spaced from A's start
// alone (as without AwaitSends) B would leave at 125 ms, before A reached
// the origin at 200 ms.
func TestSlowWriteDelaysTheNextStart(t *testing.T) {
	const sp = 125 * time.Millisecond // floor 100 ms + guard 25 ms
	ms := time.Millisecond
	p := newSendsPacer(2)
	a := mustGrant(t, p, t0, 0)
	if got := mustConfirm(t, p, t0, a); got != a {
		t.Fatalf("A confirmed at its grant = %+v, want unchanged", got)
	}
	// A confirmed again (its own wait) is never held by its own write.
	if got := mustConfirm(t, p, t0, a); got != a {
		t.Fatalf("A confirmed twice = %+v, want unchanged", got)
	}
	b := mustGrant(t, p, t0, time.Second)
	if !b.Start.Equal(at(sp)) {
		t.Fatalf("B reserved at %s, want %s", b.Start.Sub(t0), sp)
	}
	b = mustConfirm(t, p, at(sp), b)
	if want := at(2 * sp); !b.Start.Equal(want) {
		t.Fatalf("B confirmed at %s while A is unwritten: start %s, want %s", sp, b.Start.Sub(t0), 2*sp)
	}
	p.Sent(at(200*ms), a)
	b = mustConfirm(t, p, at(2*sp), b)
	if want := at(200*ms + sp); !b.Start.Equal(want) {
		t.Fatalf("B after A's write at 200ms: start %s, want %s", b.Start.Sub(t0), 200*ms+sp)
	}
	if got := mustConfirm(t, p, at(200*ms+sp), b); got != b {
		t.Fatalf("B at its new start = %+v, want %+v", got, b)
	}
	// Now B is out unwritten: a new caller is refused at the cap, then,
	// once A is done, for one spacing while B is unwritten, then spaced
	// from B's write.
	if re := mustRefuse(t, p, at(200*ms+sp), 0); re.Reason != pacer.ReasonInFlight {
		t.Fatalf("third request at the cap of 2: %+v, want inflight", re)
	}
	p.Done(at(330*ms), a, resp(200))
	if re := mustRefuse(t, p, at(330*ms), 0); re.Reason != pacer.ReasonSpacing || re.Wait != sp {
		t.Fatalf("refusal while B is unwritten: %+v, want spacing %s", re, sp)
	}
	p.Sent(at(335*ms), b)
	if re := mustRefuse(t, p, at(340*ms), 0); re.Reason != pacer.ReasonSpacing || re.Wait != 120*ms {
		t.Fatalf("refusal after B's write at 335ms: %+v, want spacing 120ms", re)
	}
	c := mustGrant(t, p, at(340*ms), time.Second)
	if !c.Start.Equal(at(335*ms + sp)) {
		t.Fatalf("C reserved at %s, want %s", c.Start.Sub(t0), 335*ms+sp)
	}
	p.Done(at(400*ms), b, resp(200))
	if got := mustConfirm(t, p, c.Start, c); got != c {
		t.Fatalf("C at its slot after B's write = %+v, want unchanged", got)
	}
	p.Done(c.Start, c, resp(200))
	if st := state(t, p, c.Start); st.InFlight != 0 {
		t.Fatalf("in flight after every Done: %d", st.InFlight)
	}
}

// A request that fails before it is written reached no origin: its Done
// releases the wait, and the next start is spaced from its start alone.
// One the origin answered without a reported write was written by its
// Done: the next start is spaced from there. (Floor 0 with a 50 ms start
// guard, so that a failure backs nothing off: the backoff is another rule.)
func TestDoneWithoutWriteReleasesTheWait(t *testing.T) {
	ms := time.Millisecond
	for _, tt := range []struct {
		name   string
		done   bool // A is done at 70 ms with r
		r      pacer.Response
		bStart time.Duration // B confirmed at 100 ms may start at
	}{
		{"still unwritten", false, pacer.Response{}, 150 * ms},
		{"failed before writing", true, pacer.Response{Err: errors.New("proxy CONNECT: connection refused")}, 100 * ms},
		{"given back", true, pacer.Response{Cancelled: true}, 100 * ms},
		{"answered, write not reported", true, resp(200), 120 * ms},
	} {
		t.Run(tt.name, func(t *testing.T) {
			p := pacer.New(&pacer.Options{
				Policy:            &pacer.Policy{Default: pacer.Limits{Floor: 0, MaxInFlight: 2}},
				StartGuard:        50 * ms,
				FailureBackoffMin: -1,
				AwaitSends:        true,
			})
			a := mustGrant(t, p, t0, 0)
			mustConfirm(t, p, t0, a)
			b := mustGrant(t, p, t0, time.Second)
			if b = mustConfirm(t, p, at(50*ms), b); !b.Start.Equal(at(100 * ms)) {
				t.Fatalf("B confirmed at 50ms while A is unwritten: start %s, want 100ms", b.Start.Sub(t0))
			}
			if tt.done {
				p.Done(at(70*ms), a, tt.r)
			}
			got := mustConfirm(t, p, at(100*ms), b)
			if !got.Start.Equal(at(tt.bStart)) {
				t.Fatalf("B confirmed at 100ms: start %s, want %s", got.Start.Sub(t0), tt.bStart)
			}
			if tt.bStart == 100*ms && got != b {
				t.Fatalf("B released = %+v, want unchanged %+v", got, b)
			}
		})
	}
}

// Without AwaitSends nothing waits for a write, but a reported write still
// spaces the next starts; at floor 0 a write awaited holds nothing.
func TestSentWithoutAwait(t *testing.T) {
	const sp = 125 * time.Millisecond
	ms := time.Millisecond
	p := newPacerCap(t, 100*ms, 2, 25*ms)
	a := mustGrant(t, p, t0, 0)
	mustConfirm(t, p, t0, a)
	b := mustGrant(t, p, t0, time.Second)
	if got := mustConfirm(t, p, at(sp), b); got != b {
		t.Fatalf("B at its slot without AwaitSends = %+v, want unchanged", got)
	}
	p.Sent(at(200*ms), a) // A written after B left: later starts are spaced from it
	p.Done(at(210*ms), a, resp(200))
	re := mustRefuse(t, p, at(210*ms), 0)
	if re.Reason != pacer.ReasonSpacing || re.Wait != 115*ms {
		t.Fatalf("refusal after A's late write: %+v, want spacing 115ms (200ms + %s)", re, sp)
	}
	// Sent for an authority not tracked, or a Permit not made by Acquire, is ignored.
	p.Sent(t0, pacer.Permit{Authority: "other.example:443"})
	if n := len(p.Snapshot(t0)); n != 1 {
		t.Fatalf("%d authorities after a stray Sent, want 1", n)
	}

	z := pacer.New(&pacer.Options{Policy: &pacer.Policy{Default: pacer.Limits{Floor: 0, MaxInFlight: 4}}, AwaitSends: true})
	x := mustGrant(t, z, t0, 0)
	mustConfirm(t, z, t0, x)
	y := mustGrant(t, z, t0, 0)
	if got := mustConfirm(t, z, t0, y); got != y {
		t.Fatalf("floor 0: second start held by an unwritten first: %+v", got)
	}
}

// ReadyIn, which brings parked jobs back, counts an unwritten request as
// being written no sooner than now.
func TestReadyInWaitsForTheWrite(t *testing.T) {
	const sp = 125 * time.Millisecond
	ms := time.Millisecond
	p := newSendsPacer(2)
	a := mustGrant(t, p, t0, 0)
	mustConfirm(t, p, t0, a)
	if w, _, why := p.ReadyIn(at(500*ms), host); w != sp || why != pacer.ReasonSpacing {
		t.Fatalf("ReadyIn at 500ms while A is unwritten = %s %q, want %s spacing", w, why, sp)
	}
	p.Sent(at(550*ms), a)
	if w, _, why := p.ReadyIn(at(600*ms), host); w != 75*ms || why != pacer.ReasonSpacing {
		t.Fatalf("ReadyIn at 600ms after A's write at 550ms = %s %q, want 75ms spacing", w, why)
	}
	if w, _, _ := p.ReadyIn(at(550*ms+sp), host); w != 0 {
		t.Fatalf("ReadyIn one spacing after the write = %s, want 0", w)
	}
}

// TestPropertyWritesKeepTheFloor drives one authority with seeded random
// grants, starts, writes at random delays after the start, and ends (an
// answer, a failure before the write, a request given back), with
// AwaitSends, and checks what the origin would see: no two writes closer
// than the floor plus the start guard, counting as a write every Sent and
// every answer whose write was never reported (written by its Done). It
// also checks that no start is let go while another request is started and
// neither written nor done.
func TestPropertyWritesKeepTheFloor(t *testing.T) {
	type request struct {
		pm               pacer.Permit
		started, written bool
	}
	floors := []time.Duration{250 * time.Millisecond, time.Second, 90 * time.Second}
	for seed := uint64(1); seed <= 12; seed++ {
		floor := floors[seed%uint64(len(floors))]
		sp := floor + pacer.StartGuardFor(floor)
		t.Run(fmt.Sprintf("seed%d_floor%s", seed, floor), func(t *testing.T) {
			rnd := rand.New(rand.NewPCG(seed, 7))
			p := pacer.New(&pacer.Options{
				Policy:     &pacer.Policy{Default: pacer.Limits{Floor: floor, MaxInFlight: 1 + int(seed%3)}},
				Rand:       rnd.Float64,
				AwaitSends: true,
			})
			now := t0
			var writes []time.Time
			var out []*request
			unwritten := func(except *request) bool {
				return slices.ContainsFunc(out, func(r *request) bool { return r != except && r.started && !r.written })
			}
			for op := 0; op < 3000; op++ {
				switch k := rnd.IntN(10); {
				case k < 2: // time passes
					step := []time.Duration{2 * sp, 10 * time.Second}[rnd.IntN(2)] // past backoffs and cooldowns too
					now = now.Add(time.Duration(rnd.Int64N(int64(step))))
				case k < 4: // a caller asks
					pm, err := p.Acquire(now, host, []time.Duration{0, sp, time.Hour}[rnd.IntN(3)])
					if err == nil {
						out = append(out, &request{pm: pm})
					}
				case k < 6: // a granted request wakes at its Start and is confirmed
					i := slices.IndexFunc(out, func(r *request) bool { return !r.started })
					if i < 0 {
						continue
					}
					r := out[i]
					if r.pm.Start.After(now) {
						now = r.pm.Start
					}
					pm, err := p.Confirm(now, r.pm)
					if err != nil {
						p.Done(now, pm, pacer.Response{Cancelled: true})
						out = slices.Delete(out, i, i+1)
						continue
					}
					r.pm = pm
					if pm.Start.After(now) {
						continue // it waits, and is confirmed again later
					}
					if unwritten(r) {
						t.Fatalf("op %d: a start at %s while another request is unwritten", op, now.Sub(t0))
					}
					r.started = true
				case k < 8: // a started request is written, maybe after a slow setup
					i := slices.IndexFunc(out, func(r *request) bool { return r.started && !r.written })
					if i < 0 {
						continue
					}
					now = now.Add(time.Duration(rnd.Int64N(int64(3 * sp))))
					p.Sent(now, out[i].pm)
					out[i].written = true
					writes = append(writes, now)
				default: // a request ends
					if len(out) == 0 {
						continue
					}
					i := rnd.IntN(len(out))
					r := out[i]
					out = slices.Delete(out, i, i+1)
					switch {
					case !r.started:
						p.Done(now, r.pm, pacer.Response{Cancelled: true})
					case !r.written && rnd.IntN(2) == 0: // failed before its write
						p.Done(now, r.pm, []pacer.Response{{Err: errors.New("dial")}, {Cancelled: true}}[rnd.IntN(2)])
					default:
						if !r.written {
							writes = append(writes, now) // answered: written by now
						}
						p.Done(now, r.pm, []pacer.Response{resp(200), resp(200), resp(404), resp(503), resp(429, "Retry-After", "1")}[rnd.IntN(5)])
					}
				}
			}
			slices.SortFunc(writes, time.Time.Compare)
			for i := 1; i < len(writes); i++ {
				if d := writes[i].Sub(writes[i-1]); d < sp {
					t.Fatalf("writes %d and %d only %s apart, floor %s + guard", i-1, i, d, floor)
				}
			}
			if len(writes) < 50 {
				t.Fatalf("only %d writes: the sequence tests little", len(writes))
			}
			t.Logf("%d writes", len(writes))
		})
	}
}
