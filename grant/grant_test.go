package grant_test

import (
	"context"
	"errors"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/mirrorworker/mirrorworker/broker/brokertest"
	"github.com/mirrorworker/mirrorworker/clock"
	"github.com/mirrorworker/mirrorworker/grant"
	"github.com/mirrorworker/mirrorworker/pacer"
)

const auth = "127.0.0.1:18766"

// serve runs a grant server from p on a fresh embedded NATS and returns a
// connection for clients.
func serve(t testing.TB, p *pacer.Pacer, o *grant.Options) (*grant.Server, *nats.Conn) {
	t.Helper()
	_, nc := brokertest.Streams(t)
	s := grant.NewServer(nc, p, o)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	// Run has subscribed once an ask is answered.
	c := grant.NewClient(nc, "probe", 200*time.Millisecond, nil)
	deadline := time.Now().Add(10 * time.Second)
	for {
		if _, err := c.Ask(context.Background(), "probe.invalid:1"); !errors.Is(err, grant.ErrNoOwner) || time.Now().After(deadline) {
			break
		}
	}
	return s, nc
}

// testPacer is a pacer at floor with an in-flight cap; the server gives it
// the time.
func testPacer(floor time.Duration, cap int) *pacer.Pacer {
	return pacer.New(&pacer.Options{Policy: &pacer.Policy{Default: pacer.Limits{Floor: floor, MaxInFlight: cap}}})
}

// TestGrantsKeepTheFloor: two starts asked for back to back are granted a
// floor apart: the server holds the second ask until its slot.
func TestGrantsKeepTheFloor(t *testing.T) {
	const floor = 200 * time.Millisecond
	_, nc := serve(t, testPacer(floor, 4), nil)
	c := grant.NewClient(nc, "test", 0, nil)
	ctx := brokertest.Context(t)
	var starts []time.Time
	for range 3 {
		g, err := c.Wait(ctx, auth, nil)
		if err != nil {
			t.Fatal(err)
		}
		starts = append(starts, time.Now())
		if v, err := c.Report(ctx, auth, g, pacer.Response{Status: 200}); err != nil || v.Unknown {
			t.Fatalf("report: %+v, %v", v, err)
		}
	}
	for i := 1; i < len(starts); i++ {
		if gap := starts[i].Sub(starts[i-1]); gap < floor {
			t.Errorf("grants %d and %d received %v apart, floor %v", i-1, i, gap, floor)
		}
	}
}

// TestAReportedThrottleIsWaitedOut: a 429 with Retry-After reported under
// a grant cools the authority in the server's pacer; the next ask is told
// to wait for the cooldown, and Client.Wait asks no more until it is over.
func TestAReportedThrottleIsWaitedOut(t *testing.T) {
	p := testPacer(0, 4)
	_, nc := serve(t, p, nil)
	c := grant.NewClient(nc, "test", 0, nil)
	ctx := brokertest.Context(t)
	g, err := c.Wait(ctx, auth, nil)
	if err != nil {
		t.Fatal(err)
	}
	v, err := c.Report(ctx, auth, g, pacer.Response{Status: 429, Header: http.Header{"Retry-After": {"2"}, "X-Other": {"x"}}})
	if err != nil || !v.Throttled || v.Until.IsZero() {
		t.Fatalf("verdict %+v, %v: want throttled until a time", v, err)
	}
	a, err := c.Ask(ctx, auth)
	if err != nil || a.Granted() || a.Reason != string(pacer.ReasonCooling) || a.Wait < time.Second || a.Until.IsZero() {
		t.Fatalf("ask during the cooldown: %+v, %v; want a wait for the cooldown", a, err)
	}
	var waits int
	g, err = c.Wait(ctx, auth, func(grant.Answer) { waits++ })
	if err != nil {
		t.Fatal(err)
	}
	if now := time.Now(); now.Before(v.Until) {
		t.Errorf("granted at %s, before the cooldown's end %s", now, v.Until)
	}
	if waits == 0 || waits > 3 {
		t.Errorf("Wait was told to wait %d times: want it to wait the cooldown out in one or two asks", waits)
	}
	if !g.Probe {
		t.Errorf("the first grant after the cooldown is not the probe: %+v", g)
	}
	if _, err := c.Report(ctx, auth, g, pacer.Response{Status: 200}); err != nil {
		t.Fatal(err)
	}
}

// TestAGrantLapses: a grant never reported holds the authority's in-flight
// place until it lapses, then frees it.
func TestAGrantLapses(t *testing.T) {
	clk := clock.NewFake(time.Date(2026, 12, 3, 14, 0, 0, 0, time.UTC))
	s, nc := serve(t, testPacer(0, 1), &grant.Options{Clock: clk, Lapse: 5 * time.Second})
	c := grant.NewClient(nc, "test", 0, clk)
	ctx := brokertest.Context(t)
	if a, err := c.Ask(ctx, auth); err != nil || !a.Granted() {
		t.Fatalf("first ask: %+v, %v", a, err)
	}
	if a, err := c.Ask(ctx, auth); err != nil || a.Granted() || a.Reason != string(pacer.ReasonInFlight) {
		t.Fatalf("ask with the only place granted: %+v, %v; want a wait (inflight)", a, err)
	}
	for i := 0; s.Outstanding() > 0; i++ {
		if i > 10000 {
			t.Fatal("the grant never lapsed")
		}
		if clk.Timers() > 0 {
			clk.Advance(time.Second)
		}
		time.Sleep(time.Millisecond) // lets the server's timer goroutine run
	}
	if a, err := c.Ask(ctx, auth); err != nil || !a.Granted() {
		t.Fatalf("ask after the lapse: %+v, %v", a, err)
	}
	if v, err := c.Report(ctx, auth, grant.Answer{Grant: "grant-1"}, pacer.Response{Status: 200}); err != nil || !v.Unknown {
		t.Errorf("a report of the lapsed grant: %+v, %v; want unknown", v, err)
	}
}

// TestOnlyTheOwnerAnswers: a server that does not own the authority stays
// silent, so an ask finds no owner.
func TestOnlyTheOwnerAnswers(t *testing.T) {
	_, nc := serve(t, testPacer(0, 1), &grant.Options{Owns: func(a string) bool { return a != auth }})
	c := grant.NewClient(nc, "test", 300*time.Millisecond, nil)
	if _, err := c.Ask(brokertest.Context(t), auth); !errors.Is(err, grant.ErrNoOwner) {
		t.Fatalf("ask: %v, want ErrNoOwner", err)
	}
}

// TestARevokedGrantStillCountsAsAStart: a pod giving up the authority
// revokes its grant; the grant's start still spaces the next one by the
// floor (it is the pacer's last start, which the take-over fence carries),
// its in-flight place is freed, and its report is answered Unknown.
func TestARevokedGrantStillCountsAsAStart(t *testing.T) {
	const floor = 300 * time.Millisecond
	p := testPacer(floor, 1)
	s, nc := serve(t, p, nil)
	c := grant.NewClient(nc, "test", 0, nil)
	ctx := brokertest.Context(t)
	g, err := c.Ask(ctx, auth)
	if err != nil || !g.Granted() {
		t.Fatalf("ask: %+v, %v", g, err)
	}
	if n := s.Revoke(func(a string) bool { return a == auth }); n != 1 {
		t.Fatalf("Revoke revoked %d grants, want 1", n)
	}
	now := time.Now()
	wait, _, reason := p.ReadyIn(now, auth)
	if wait <= 0 || now.Add(wait).Before(g.Start.Add(floor)) {
		t.Errorf("after the revoke the next start may come in %v (%s): want no sooner than a floor after the grant's start", wait, reason)
	}
	pm, err := p.Acquire(now, auth, time.Minute)
	if err != nil {
		t.Fatalf("acquire after the revoke: %v (the grant's in-flight place is still held)", err)
	}
	p.Done(now, pm, pacer.Response{Cancelled: true})
	if v, err := c.Report(ctx, auth, g, pacer.Response{Status: 200}); err != nil || !v.Unknown {
		t.Errorf("report of the revoked grant: %+v, %v; want unknown", v, err)
	}
}

// TestNoGrantOnceOwnershipEnds: an ask held for its slot while the
// authority changes owner is answered with a wait (moved), not a grant.
func TestNoGrantOnceOwnershipEnds(t *testing.T) {
	const floor = 300 * time.Millisecond
	var owned atomic.Bool
	owned.Store(true)
	p := testPacer(floor, 4)
	_, nc := serve(t, p, &grant.Options{Owns: func(string) bool { return owned.Load() }})
	c := grant.NewClient(nc, "test", 0, nil)
	ctx := brokertest.Context(t)
	if g, err := c.Ask(ctx, auth); err != nil || !g.Granted() {
		t.Fatalf("first ask: %+v, %v", g, err)
	}
	// The second ask is held until a floor after the first grant; the
	// authority moves meanwhile.
	type res struct {
		a   grant.Answer
		err error
	}
	done := make(chan res, 1)
	go func() { a, err := c.Ask(ctx, auth); done <- res{a, err} }()
	for p.Snapshot(time.Now())[0].InFlight < 2 {
		time.Sleep(time.Millisecond) // until the held ask has its permit
	}
	owned.Store(false)
	r := <-done
	if r.err != nil || r.a.Granted() || r.a.Reason != grant.ReasonMoved {
		t.Fatalf("held ask: %+v, %v; want a wait (moved)", r.a, r.err)
	}
}

// BenchmarkGrantRoundTrip is one ask and its report, one after the other,
// over an embedded NATS server on loopback (floor 0): ns/op is a grant's
// round trip, asked and reported.
func BenchmarkGrantRoundTrip(b *testing.B) {
	_, nc := serve(b, testPacer(0, 1<<20), nil)
	c := grant.NewClient(nc, "bench", 0, nil)
	ctx := context.Background()
	b.ResetTimer()
	for range b.N {
		g, err := c.Ask(ctx, auth)
		if err != nil || !g.Granted() {
			b.Fatalf("%+v, %v", g, err)
		}
		if _, err := c.Report(ctx, auth, g, pacer.Response{Status: 200}); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkGrantsServed is asks and reports from many goroutines at once,
// over 8 authorities: the grants one server serves per second is
// 1e9/(ns/op).
func BenchmarkGrantsServed(b *testing.B) {
	_, nc := serve(b, testPacer(0, 1<<20), nil)
	c := grant.NewClient(nc, "bench", 0, nil)
	ctx := context.Background()
	b.SetParallelism(16)
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		i := 0
		for pb.Next() {
			i++
			a := "127.0.0." + string(rune('0'+i%8)) + ":" + string(rune('1'+i%8))
			g, err := c.Ask(ctx, a)
			if err != nil || !g.Granted() {
				b.Errorf("%+v, %v", g, err)
				return
			}
			if _, err := c.Report(ctx, a, g, pacer.Response{Status: 200}); err != nil {
				b.Error(err)
				return
			}
		}
	})
}

// TestAGrantTheAskerGaveUpOnIsGivenBack: an ask the owner holds for its
// slot, whose caller gives up (Ctrl-C) before the slot comes, is still
// answered; the grant made then is reported cancelled at once, so it does
// not hold the authority's place until it lapses (30 s by default, here
// never: the fake clock stops at the slot).
func TestAGrantTheAskerGaveUpOnIsGivenBack(t *testing.T) {
	const floor = time.Second
	clk := clock.NewFake(time.Date(2026, 12, 3, 14, 0, 0, 0, time.UTC))
	s, nc := serve(t, testPacer(floor, 2), &grant.Options{Clock: clk})
	c := grant.NewClient(nc, "test", 0, clk)
	ctx := brokertest.Context(t)
	before := s.Outstanding() // serve's probe of another authority
	first, err := c.Ask(ctx, auth)
	if err != nil || !first.Granted() {
		t.Fatalf("first ask: %+v, %v", first, err)
	}
	// The second is held for its slot, a floor after the first's start:
	// the server sleeps on the clock for it (one timer more).
	base := clk.Timers()
	gave, giveUp := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		_, err := c.Ask(gave, auth)
		done <- err
	}()
	for i := 0; clk.Timers() <= base; i++ {
		if i > 10000 {
			t.Fatal("the second ask was never held")
		}
		time.Sleep(time.Millisecond) // lets the server take the ask
	}
	giveUp()
	// The slot comes (the pacer may move a start on by its start guard:
	// the clock goes on while the server sleeps on it), whether or not
	// the ask has returned.
	var askErr error
	returned := false
	for i := 0; !returned || clk.Timers() > base; i++ {
		if i > 10000 {
			t.Fatal("the ask given up on never returned, or its slot never came")
		}
		select {
		case askErr = <-done:
			returned = true
		default:
		}
		if clk.Timers() > base {
			clk.Advance(10 * time.Millisecond)
		}
		time.Sleep(time.Millisecond) // lets the server's goroutine run
	}
	if !errors.Is(askErr, context.Canceled) {
		t.Fatalf("the ask given up on: %v, want context.Canceled", askErr)
	}
	if _, err := c.Report(ctx, auth, first, pacer.Response{Status: 200}); err != nil {
		t.Fatal(err)
	}
	// No watch needed: the server holds a grant before it answers, and Ask
	// returned only once the answer had come (and, given up on, once its
	// cancelled report was answered). A grant made for nobody is therefore
	// outstanding now, and stays so until it lapses (never, on this clock).
	if n := s.Outstanding(); n != before {
		t.Fatalf("%d grants outstanding after the first was reported, %d before: the one made for the ask given up on holds a place until it lapses", n, before)
	}
}
