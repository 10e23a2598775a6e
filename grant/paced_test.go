package grant_test

import (
	"context"
	"errors"
	"net/http"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mirrorworker/mirrorworker/broker/brokertest"
	"github.com/mirrorworker/mirrorworker/clock"
	"github.com/mirrorworker/mirrorworker/grant"
	"github.com/mirrorworker/mirrorworker/pacer"
)

// confirmed runs pacer.Wait, as the worker does, on a permit of p.
func confirmed(t *testing.T, p *grant.Paced) pacer.Permit {
	t.Helper()
	pm, err := p.Acquire(time.Now(), auth, time.Minute)
	if err != nil {
		t.Fatalf("acquire: %v", err)
	}
	pm, err = pacer.Wait(brokertest.Context(t), clock.Real{}, p, pm)
	if err != nil {
		t.Fatalf("confirm: %v", err)
	}
	return pm
}

// TestPacedStartsAreTheOwners: a Paced with no floor of its own starts its
// requests at the owner's floor, each granted by the owner, and its
// reports free the owner's in-flight place.
func TestPacedStartsAreTheOwners(t *testing.T) {
	const floor = 150 * time.Millisecond
	// The owner awaits its askers' writes, as a pod's pacer does
	// (pipeline: AwaitSends), and the asker reports each (Sent) as the
	// replay does: the starts are judged as the asker makes them, so that
	// the NATS hop between the owner's grant and the asker is inside them.
	owner := pacer.New(&pacer.Options{Policy: &pacer.Policy{Default: pacer.Limits{Floor: floor, MaxInFlight: 1}}, AwaitSends: true})
	s, nc := serve(t, owner, nil)
	p := grant.NewPaced(brokertest.Context(t), grant.PacedLocal(grant.DefaultAsksInFlight), grant.NewClient(nc, "test", 0, nil), nil)
	base := s.Outstanding() // serve's own probe
	var starts []time.Time
	for range 3 {
		pm := confirmed(t, p)
		at := time.Now()
		starts = append(starts, at)
		p.Sent(at, pm)
		if n := s.Outstanding() - base; n != 1 {
			t.Fatalf("the owner holds %d grants after a confirm, want 1", n)
		}
		if v := p.Done(time.Now(), pm, pacer.Response{Status: 304}); v.Throttled {
			t.Fatalf("verdict %+v", v)
		}
		if n := s.Outstanding() - base; n != 0 {
			t.Fatalf("the owner holds %d grants after the report, want 0", n)
		}
	}
	for i := 1; i < len(starts); i++ {
		if gap := starts[i].Sub(starts[i-1]); gap < floor {
			t.Errorf("starts %d and %d %v apart, the owner's floor is %v", i-1, i, gap, floor)
		}
	}
}

// TestPacedWaitsOutTheOwnersCooldown: a 429 reported through a Paced cools
// the owner's pacer, and the Paced refuses the authority (asking nothing)
// until the cooldown is over, as its own pacer would.
func TestPacedWaitsOutTheOwnersCooldown(t *testing.T) {
	owner := testPacer(0, 4)
	_, nc := serve(t, owner, nil)
	p := grant.NewPaced(brokertest.Context(t), grant.PacedLocal(4), grant.NewClient(nc, "test", 0, nil), nil)
	pm := confirmed(t, p)
	v := p.Done(time.Now(), pm, pacer.Response{Status: 429, Header: http.Header{"Retry-After": {"30"}}})
	if !v.Throttled || v.Until.Before(time.Now().Add(20*time.Second)) {
		t.Fatalf("verdict %+v, want throttled for about 30 s", v)
	}
	cooling := false
	for _, st := range owner.Snapshot(time.Now()) {
		cooling = cooling || st.Authority == auth && st.State == "cooling"
	}
	if !cooling {
		t.Fatalf("the owner's pacer does not cool %s", auth)
	}
	_, err := p.Acquire(time.Now(), auth, time.Minute)
	var re *pacer.RefusedError
	if !asRefused(err, &re) || re.Reason != pacer.ReasonCooling || re.Wait < 20*time.Second {
		t.Fatalf("acquire during the owner's cooldown: %v, want a cooling refusal of about 30 s", err)
	}
	if w, _, _ := p.ReadyIn(time.Now(), auth); w < 20*time.Second {
		t.Fatalf("ReadyIn %v during the owner's cooldown", w)
	}
}

// TestPacedRefusesALongWait: an owner whose authority cools (learned from
// its own request) answers a wait longer than Hold: the permit is refused
// and the authority is not asked again before it ends.
func TestPacedRefusesALongWait(t *testing.T) {
	owner := testPacer(0, 4)
	now := time.Now()
	owner.Apply(now, pacer.Event{Type: pacer.EventCooldown, Authority: auth, At: now, Until: now.Add(time.Minute)})
	_, nc := serve(t, owner, nil)
	var waits []grant.Answer
	p := grant.NewPaced(brokertest.Context(t), grant.PacedLocal(4), grant.NewClient(nc, "test", 0, nil),
		&grant.PacedOptions{OnWait: func(_ string, a grant.Answer) { waits = append(waits, a) }})
	pm, err := p.Acquire(time.Now(), auth, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	_, err = pacer.Wait(brokertest.Context(t), clock.Real{}, p, pm)
	var re *pacer.RefusedError
	if !asRefused(err, &re) || re.Wait < 30*time.Second {
		t.Fatalf("confirm during the owner's cooldown: %v, want a refusal of about a minute", err)
	}
	if _, err := p.Acquire(time.Now(), auth, time.Minute); !asRefused(err, &re) {
		t.Fatalf("acquire after the refusal: %v, want refused without asking", err)
	}
	if len(waits) != 1 || waits[0].Reason != string(pacer.ReasonCooling) {
		t.Fatalf("waits told: %+v, want one cooling", waits)
	}
}

func asRefused(err error, re **pacer.RefusedError) bool { return errors.As(err, re) }

// TestPacedAsksTheNewOwner: while no server owns the authority (a
// partition between pods) an ask goes unanswered and the start waits; once
// a server owns it, the same permit is asked again and granted by it.
func TestPacedAsksTheNewOwner(t *testing.T) {
	var owns atomic.Bool
	s, nc := serve(t, testPacer(0, 4), &grant.Options{Owns: func(a string) bool { return a != auth || owns.Load() }})
	base := s.Outstanding() // serve's own probe
	var waits atomic.Int32
	p := grant.NewPaced(brokertest.Context(t), grant.PacedLocal(4), grant.NewClient(nc, "test", 100*time.Millisecond, nil),
		&grant.PacedOptions{OnWait: func(_ string, a grant.Answer) {
			if a.Reason == "no_owner" && waits.Add(1) == 1 {
				owns.Store(true) // the partition's new owner takes it
			}
		}})
	pm := confirmed(t, p)
	if waits.Load() == 0 {
		t.Fatal("granted without an owner")
	}
	if n := s.Outstanding() - base; n != 1 {
		t.Fatalf("the new owner holds %d grants, want 1", n)
	}
	p.Done(time.Now(), pm, pacer.Response{Status: 200})
	if n := s.Outstanding() - base; n != 0 {
		t.Fatalf("the new owner holds %d grants after the report, want 0", n)
	}
}

// TestASentSpacesTheOwnersNextStart: the owner spaces its next start from
// a grant's Sent (the request written, received later than the answer),
// not only from its answer, so that the answer's way to the client does
// not bring the next request closer than the floor at the origin.
func TestASentSpacesTheOwnersNextStart(t *testing.T) {
	const floor = 200 * time.Millisecond
	t0 := time.Now()
	clk := clock.NewFake(t0)
	owner := testPacer(floor, 4)
	_, nc := serve(t, owner, &grant.Options{Clock: clk})
	c := grant.NewClient(nc, "test", 0, nil)
	ctx := brokertest.Context(t)
	g, err := c.Ask(ctx, auth)
	if err != nil || !g.Granted() {
		t.Fatalf("ask: %+v, %v", g, err)
	}
	next := func() time.Time {
		for _, st := range owner.Snapshot(clk.Now()) {
			if st.Authority == auth {
				return st.NextSlot
			}
		}
		return time.Time{}
	}
	if got := next(); got.Before(t0.Add(floor)) || !got.Before(t0.Add(floor+50*time.Millisecond)) {
		t.Fatalf("next slot %v after the grant, want a floor after its answer", got.Sub(t0))
	}
	clk.Advance(50 * time.Millisecond) // the answer's way, the client's write
	if err := c.Sent(auth, g); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for next().Before(t0.Add(50*time.Millisecond + floor)) {
		if time.Now().After(deadline) {
			t.Fatalf("next slot %v after the Sent 50 ms after the answer, want at least %v", next().Sub(t0), 50*time.Millisecond+floor)
		}
		runtime.Gosched()
	}
}

// TestPacedLastAnswerIsAnOwnersAnswer: an ask no server answers leaves
// LastAnswer where it was (a replay beside pods that have all gone paces
// alone again once its asks go unanswered, docs/adr/0031); a grant and a
// report's verdict move it.
func TestPacedLastAnswerIsAnOwnersAnswer(t *testing.T) {
	var owns atomic.Bool
	_, nc := serve(t, testPacer(0, 4), &grant.Options{Owns: func(a string) bool { return a != auth || owns.Load() }})
	p := grant.NewPaced(brokertest.Context(t), grant.PacedLocal(4), grant.NewClient(nc, "test", 100*time.Millisecond, nil), nil)
	pm, err := p.Acquire(time.Now(), auth, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if cpm, err := p.Confirm(time.Now(), pm); err != nil || !cpm.Start.After(time.Now()) {
		t.Fatalf("confirm with no owner: %+v, %v; want a later start", cpm, err)
	}
	if at := p.LastAnswer(); !at.IsZero() {
		t.Fatalf("LastAnswer %v after an ask nobody answered, want zero", at)
	}
	owns.Store(true)
	before := time.Now()
	pm = confirmed(t, p)
	granted := p.LastAnswer()
	if granted.Before(before) {
		t.Fatalf("LastAnswer %v after a grant asked from %v", granted, before)
	}
	p.Done(time.Now(), pm, pacer.Response{Status: 304})
	if at := p.LastAnswer(); at.Before(granted) {
		t.Fatalf("LastAnswer %v after the report, before the grant's %v", at, granted)
	}
}

// TestPacedTellsWhatItLearnedAlone: an answer whose owner has gone before
// its report (a pod killed mid-request) is learned by the local pacer, and
// its verdict told to OnLearned, so that a replay that paces alone next
// waits out a cooldown no owner heard of.
func TestPacedTellsWhatItLearnedAlone(t *testing.T) {
	_, nc := brokertest.Streams(t)
	s := grant.NewServer(nc, testPacer(0, 4), nil)
	sctx, stop := context.WithCancel(context.Background())
	stopped := make(chan error, 1)
	go func() { stopped <- s.Run(sctx) }()
	t.Cleanup(stop)
	var learned []pacer.Verdict
	var unreported int
	p := grant.NewPaced(brokertest.Context(t), grant.PacedLocal(4), grant.NewClient(nc, "test", 200*time.Millisecond, nil), &grant.PacedOptions{
		OnUnreported: func(string, error) { unreported++ },
		OnLearned:    func(_ time.Time, a string, v pacer.Verdict) { learned = append(learned, v) },
	})
	var pm pacer.Permit
	deadline := time.Now().Add(10 * time.Second)
	for {
		// The server has subscribed once an ask is granted.
		var err error
		if pm, err = p.Acquire(time.Now(), auth, time.Minute); err != nil {
			t.Fatal(err)
		}
		if pm, err = p.Confirm(time.Now(), pm); err == nil && !pm.Start.After(time.Now()) {
			break
		}
		p.Done(time.Now(), pm, pacer.Response{Cancelled: true})
		if time.Now().After(deadline) {
			t.Fatal("no grant from the server")
		}
	}
	stop() // the owner goes before the report
	<-stopped
	v := p.Done(time.Now(), pm, pacer.Response{Status: 429, Header: http.Header{"Retry-After": {"30"}}})
	if !v.Throttled || unreported != 1 || len(learned) != 1 || !learned[0].Throttled || learned[0].Until.Before(time.Now().Add(20*time.Second)) {
		t.Fatalf("verdict %+v, %d unreported, learned %+v: want one throttled verdict of about 30 s told", v, unreported, learned)
	}
}

// TestAnAskerThatReportsWritesIsAwaited: the owner's pacer keeps the floor
// between requests as the origin receives them (AwaitSends, as a pod's
// does). A grant's answer counts as its write for an asker that does not
// report writes, so the next start may come a floor after the answer; for
// one that does (Paced), the next start waits for its Sent, however late
// the asker writes (a loaded machine), and is a floor after it.
func TestAnAskerThatReportsWritesIsAwaited(t *testing.T) {
	const floor = 200 * time.Millisecond
	for _, writes := range []bool{false, true} {
		t0 := time.Now()
		clk := clock.NewFake(t0)
		owner := pacer.New(&pacer.Options{Policy: &pacer.Policy{Default: pacer.Limits{Floor: floor, MaxInFlight: 4}}, AwaitSends: true})
		_, nc := serve(t, owner, &grant.Options{Clock: clk})
		c := grant.NewClient(nc, "test", 0, nil)
		if writes {
			c = c.ReportingWrites()
		}
		ctx := brokertest.Context(t)
		g, err := c.Ask(ctx, auth)
		if err != nil || !g.Granted() {
			t.Fatalf("writes %v: ask: %+v, %v", writes, g, err)
		}
		clk.Advance(floor + 50*time.Millisecond) // the asker has not written yet
		_, err = owner.Acquire(clk.Now(), auth, 0)
		if started := err == nil; started == writes {
			t.Errorf("writes %v: a start %v after the grant, its request not yet written: %v", writes, floor+50*time.Millisecond, err)
		}
		if !writes {
			continue
		}
		if err := c.Sent(auth, g); err != nil {
			t.Fatal(err)
		}
		wrote := clk.Now()
		// The clock goes on until the owner starts again: no sooner than a
		// floor after the write (the owner takes it when the Sent arrives,
		// at the latest).
		deadline := time.Now().Add(10 * time.Second)
		for {
			if _, err := owner.Acquire(clk.Now(), auth, 0); err == nil {
				if at := clk.Now().Sub(wrote); at < floor {
					t.Errorf("the next start %v after the write, floor %v", at, floor)
				}
				break
			}
			if time.Now().After(deadline) {
				t.Fatal("no start after the reported write")
			}
			clk.Advance(10 * time.Millisecond)
			runtime.Gosched()
		}
	}
}
