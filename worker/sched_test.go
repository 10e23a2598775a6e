package worker

import (
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/mirrorworker/mirrorworker/authority"
	"github.com/mirrorworker/mirrorworker/jobs"
	"github.com/mirrorworker/mirrorworker/pacer"
)

var t0 = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)

func TestCalendarSlots(t *testing.T) {
	type call struct {
		at         time.Duration // now, from t0
		wait, step time.Duration
		want       time.Duration // slot, from t0
	}
	tests := []struct {
		name   string
		spread time.Duration
		calls  []call
	}{
		{
			name:   "k-th job one step later",
			spread: time.Minute,
			calls: []call{
				{0, 5 * time.Second, 2 * time.Second, 5 * time.Second},
				{0, 5 * time.Second, 2 * time.Second, 7 * time.Second},
				{time.Second, 4 * time.Second, 2 * time.Second, 9 * time.Second},
			},
		},
		{
			name:   "sequence restarts once its slots have passed",
			spread: time.Minute,
			calls: []call{
				{0, 5 * time.Second, time.Second, 5 * time.Second},
				{0, 5 * time.Second, time.Second, 6 * time.Second},
				{10 * time.Second, 5 * time.Second, time.Second, 15 * time.Second},
				{10 * time.Second, 5 * time.Second, time.Second, 16 * time.Second},
			},
		},
		{
			name:   "a later cooldown restarts at its deadline",
			spread: time.Minute,
			calls: []call{
				{0, 5 * time.Second, time.Second, 5 * time.Second},
				{0, 5 * time.Second, time.Second, 6 * time.Second},
				{0, 30 * time.Second, time.Second, 30 * time.Second},
			},
		},
		{
			name:   "offsets wrap at the spread",
			spread: 3 * time.Second,
			calls: []call{
				{0, 10 * time.Second, 2 * time.Second, 10 * time.Second},
				{0, 10 * time.Second, 2 * time.Second, 12 * time.Second},
				{0, 10 * time.Second, 2 * time.Second, 11 * time.Second}, // 4 s mod 3 s
				{0, 10 * time.Second, 2 * time.Second, 10 * time.Second}, // 6 s mod 3 s
			},
		},
		{
			name:   "zero step: every job at the deadline",
			spread: time.Minute,
			calls: []call{
				{0, 5 * time.Second, 0, 5 * time.Second},
				{0, 5 * time.Second, 0, 5 * time.Second},
			},
		},
		{
			name:   "never before the earliest instant",
			spread: time.Minute,
			calls: []call{
				{0, 10 * time.Second, 10 * time.Second, 10 * time.Second},
				{0, 10 * time.Second, 10 * time.Second, 20 * time.Second},
				{15 * time.Second, 2 * time.Second, 10 * time.Second, 30 * time.Second},
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var c calendar
			for i, cl := range tt.calls {
				got := c.slot(t0.Add(cl.at), cl.wait, cl.step, tt.spread).Sub(t0)
				if got != cl.want {
					t.Errorf("call %d: slot at %v, want %v", i, got, cl.want)
				}
			}
		})
	}
}

// testJob makes a held job for url's authority and tenant.
func testJob(t *testing.T, seq uint64, rawURL, tenant string) *heldJob {
	t.Helper()
	a, err := authority.Parse(rawURL)
	if err != nil {
		t.Fatal(err)
	}
	return &heldJob{seq: seq, auth: a.String(), job: jobs.Job{ID: rawURL, URL: rawURL, Tenant: tenant, Authority: a}}
}

func newTestSched(p Pacer, mod func(*schedOptions)) *scheduler {
	o := schedOptions{slots: 8, holdMax: 2 * time.Second, maxHeld: 1000, maxPerAuth: 100, spread: time.Hour,
		rand: func() float64 { return 0 }}
	if mod != nil {
		mod(&o)
	}
	return newScheduler(p, o)
}

func policy(floor time.Duration, inflight int) *pacer.Policy {
	return &pacer.Policy{Default: pacer.Limits{Floor: floor, MaxInFlight: inflight}}
}

func TestSchedulerCoolingAuthorityDoesNotBlockOthers(t *testing.T) {
	p := pacer.New(&pacer.Options{Policy: policy(0, 4)})
	// Put a.test into a 30 s cooldown with a 429.
	pm, err := p.Acquire(t0, "a.test:80", 0)
	if err != nil {
		t.Fatal(err)
	}
	p.Done(t0, pm, pacer.Response{Status: 429, Header: http.Header{"Retry-After": {"30"}}})

	// The scheduler asks the pacer at admission: a.test's jobs are deferred
	// at once, b.test's queue.
	s := newTestSched(p, nil)
	var seq uint64
	var defers []deferral
	for i := range 5 {
		for _, host := range []string{"a.test", "b.test"} {
			seq++
			d, deferred := s.admit(t0, testJob(t, seq, "http://"+host+"/"+string(rune('a'+i)), "default"))
			if deferred != (host == "a.test") {
				t.Fatalf("job %d of %s: deferred=%v at admission", seq, host, deferred)
			}
			if deferred {
				defers = append(defers, d)
			}
		}
	}
	grants, _, _ := s.next(t0)
	if len(grants) != 4 {
		t.Fatalf("grants = %d, want 4 (b.test's cap)", len(grants))
	}
	for _, g := range grants {
		if g.job.auth != "b.test:80" {
			t.Errorf("granted %s, want only b.test", g.job.auth)
		}
	}
	// Escalated interval after one 429: max(2×0, 2 s, 0) = 2 s.
	for k, d := range defers {
		want := 30*time.Second + time.Duration(k)*2*time.Second
		if d.delay != want {
			t.Errorf("deferral %d: delay %v, want %v", k, d.delay, want)
		}
		if d.reason != reasonCooling {
			t.Errorf("deferral %d: reason %q", k, d.reason)
		}
	}
	// A job for the cooling authority arriving later is deferred on
	// admission, continuing the calendar.
	d, deferred := s.admit(t0.Add(time.Second), testJob(t, 100, "http://a.test/late", "default"))
	if !deferred || d.delay != 29*time.Second+5*2*time.Second {
		t.Errorf("late job: deferred=%v delay=%v, want 39s", deferred, d.delay)
	}
	if got := s.held(); got != 5 {
		t.Errorf("held = %d, want 5 (4 granted + 1 queued for b.test)", got)
	}
}

func TestSchedulerTenantRoundRobin(t *testing.T) {
	p := pacer.New(&pacer.Options{Policy: policy(0, 1)})
	s := newTestSched(p, nil)
	var seq uint64
	add := func(tenant string, n int) {
		for range n {
			seq++
			s.admit(t0, testJob(t, seq, "http://a.test/"+tenant+string(rune('0'+seq)), tenant))
		}
	}
	add("big", 4)
	add("small", 2)
	var order []string
	now := t0
	for range 6 {
		grants, _, _ := s.next(now)
		if len(grants) != 1 {
			t.Fatalf("grants = %d, want 1 (cap 1)", len(grants))
		}
		g := grants[0]
		order = append(order, g.job.job.Tenant)
		p.Done(now, g.permit, pacer.Response{Status: 200})
		s.finished(now, g.job, time.Millisecond, false)
		now = now.Add(time.Millisecond)
	}
	want := []string{"big", "small", "big", "small", "big", "big"}
	for i := range want {
		if order[i] != want[i] {
			t.Fatalf("order = %v, want %v", order, want)
		}
	}
}

func TestSchedulerHoldsShortWaitsInMemory(t *testing.T) {
	p := pacer.New(&pacer.Options{Policy: policy(time.Second, 4), StartGuard: -1})
	s := newTestSched(p, func(o *schedOptions) { o.reserve = 0 })
	s.admit(t0, testJob(t, 1, "http://a.test/1", "default"))
	s.admit(t0, testJob(t, 2, "http://a.test/2", "default"))
	grants, defers, wake := s.next(t0)
	if len(grants) != 1 || len(defers) != 0 {
		t.Fatalf("grants %d defers %d, want 1 and 0", len(grants), len(defers))
	}
	if !wake.Equal(t0.Add(time.Second)) {
		t.Fatalf("wake = %v, want t0+1s (the next slot)", wake.Sub(t0))
	}
	// Nothing before the slot, even when poked.
	if g, _, _ := s.next(t0.Add(500 * time.Millisecond)); len(g) != 0 {
		t.Fatalf("granted before the slot")
	}
	g2, _, _ := s.next(t0.Add(time.Second))
	if len(g2) != 1 || g2[0].permit.Start.Before(t0.Add(time.Second)) {
		t.Fatalf("second grant %+v, want one at t0+1s", g2)
	}
}

func TestSchedulerInFlightCapWaitsForACompletion(t *testing.T) {
	p := pacer.New(&pacer.Options{Policy: policy(0, 1)})
	s := newTestSched(p, nil)
	s.admit(t0, testJob(t, 1, "http://a.test/1", "default"))
	s.admit(t0, testJob(t, 2, "http://a.test/2", "default"))
	grants, _, _ := s.next(t0)
	if len(grants) != 1 {
		t.Fatalf("grants %d, want 1", len(grants))
	}
	if g, d, _ := s.next(t0); len(g)+len(d) != 0 {
		t.Fatalf("second job granted or deferred while the cap is reached")
	}
	now := t0.Add(10 * time.Millisecond)
	p.Done(now, grants[0].permit, pacer.Response{Status: 200})
	s.finished(now, grants[0].job, 10*time.Millisecond, false)
	g2, _, _ := s.next(now)
	if len(g2) != 1 || g2[0].job.seq != 2 {
		t.Fatalf("after the completion: %d grants, want job 2 at once", len(g2))
	}
}

func TestSchedulerOverflowIsDeferred(t *testing.T) {
	// A 1 s floor: the three jobs queued ahead take longer than HoldMax.
	p := pacer.New(&pacer.Options{Policy: policy(time.Second, 1)})
	s := newTestSched(p, func(o *schedOptions) { o.maxPerAuth = 3 })
	seq := uint64(0)
	admit := func(host string) (deferral, bool) {
		seq++
		return s.admit(t0, testJob(t, seq, "http://"+host+"/"+string(rune('a'+seq)), "default"))
	}
	for i := range 3 {
		if _, d := admit("hot.test"); d {
			t.Fatalf("job %d deferred below the per-authority bound", i)
		}
	}
	// One is granted: the scheduler now knows the 100 ms interval.
	if g, _, _ := s.next(t0); len(g) != 1 {
		t.Fatalf("grants %d, want 1", len(g))
	}
	if _, d := admit("hot.test"); d {
		t.Fatal("job deferred with room in the queue")
	}
	for k := range 3 {
		d, deferred := admit("hot.test")
		// The head waits one spacing (1 s and the start guard), three
		// queued ahead one spacing each, then one spacing per
		// overflowing job (the calendar).
		const sp = time.Second + 2*time.Millisecond
		want := 4*sp + time.Duration(k)*sp
		if !deferred || d.reason != "overflow" || d.delay != want {
			t.Fatalf("overflow %d: deferred=%v reason=%q delay=%v, want overflow after %v", k, deferred, d.reason, d.delay, want)
		}
	}
	if s.saturated(t0, 0) {
		t.Error("a slow authority's overflow saturates the partition; its jobs are deferred instead")
	}
	// Another authority is unaffected.
	if _, d := admit("cold.test"); d {
		t.Fatal("other authority's job deferred")
	}
}

func TestSchedulerFastOverflowIsHeldAndPausesIntake(t *testing.T) {
	// Floor 0: the authority serves its queue within HoldMax, so jobs past
	// the per-authority bound wait in memory (one delivery each) and the
	// partition is saturated until the queue is back under the bound.
	p := pacer.New(&pacer.Options{Policy: policy(0, 1)})
	s := newTestSched(p, func(o *schedOptions) { o.maxPerAuth = 3 })
	var seq uint64
	admit := func(host string) (deferral, bool) {
		seq++
		return s.admit(t0, testJob(t, seq, "http://"+host+"/"+string(rune('a'+seq)), "default"))
	}
	for i := range 5 {
		if d, deferred := admit("fast.test"); deferred {
			t.Fatalf("job %d deferred (%s after %v); want it held", i, d.reason, d.delay)
		}
	}
	if !s.saturated(t0, 0) {
		t.Fatal("5 jobs queued past a bound of 3: want the partition saturated")
	}
	now := t0
	for range 3 {
		g, _, _ := s.next(now)
		if len(g) != 1 {
			t.Fatalf("grants %d, want 1", len(g))
		}
		now = now.Add(time.Millisecond)
		p.Done(now, g[0].permit, pacer.Response{Status: 200})
		s.finished(now, g[0].job, time.Millisecond, false)
	}
	if s.saturated(now, 0) {
		t.Fatal("queue back under the bound: want the partition no longer saturated")
	}
}

func TestSchedulerStalledAuthorityReleasesItsPartition(t *testing.T) {
	// A fast authority past its bound saturates the partition; when its
	// requests stop completing for HoldMax, the partition is pulled again
	// and the authority's next job goes back to the stream.
	p := pacer.New(&pacer.Options{Policy: policy(0, 1)})
	s := newTestSched(p, func(o *schedOptions) { o.maxPerAuth = 3 })
	var seq uint64
	admit := func(now time.Time) (deferral, bool) {
		seq++
		return s.admit(now, testJob(t, seq, "http://hang.test/"+string(rune('a'+seq)), "default"))
	}
	for range 4 {
		if _, deferred := admit(t0); deferred {
			t.Fatal("deferred with a fast authority")
		}
	}
	if g, _, _ := s.next(t0); len(g) != 1 { // its request hangs from here
		t.Fatalf("grants %d, want 1", len(g))
	}
	if _, deferred := admit(t0); deferred {
		t.Fatal("deferred with a fast authority")
	}
	if !s.saturated(t0.Add(time.Second), 0) {
		t.Fatal("want the partition saturated within HoldMax")
	}
	late := t0.Add(3 * time.Second) // past HoldMax (2 s) with nothing done
	if s.saturated(late, 0) {
		t.Fatal("a stalled authority still holds its partition")
	}
	if d, deferred := admit(late); !deferred || d.reason != "overflow" {
		t.Fatalf("a stalled authority's job past the bound: deferred=%v reason=%q, want overflow", deferred, d.reason)
	}
	if s.saturated(late, 0) {
		t.Fatal("the deferred job saturated the partition again")
	}
}

func TestSchedulerHeldOverflowIsBoundedInTime(t *testing.T) {
	// A fast authority with a long backlog keeps going over its bound, one
	// short episode after another. After HoldMax (the horizon here) of that,
	// its overflow is deferred for a horizon, so that its partition's other
	// authorities are pulled; then it may hold again.
	p := pacer.New(&pacer.Options{Policy: policy(0, 1)})
	s := newTestSched(p, func(o *schedOptions) { o.maxPerAuth = 3 })
	var seq uint64
	admit := func(now time.Time) (deferral, bool) {
		seq++
		return s.admit(now, testJob(t, seq, fmt.Sprint("http://hot.test/", seq), "default"))
	}
	now := t0
	serve := func() {
		g, _, _ := s.next(now)
		if len(g) != 1 {
			t.Fatalf("at %v: grants %d, want 1", now.Sub(t0), len(g))
		}
		now = now.Add(100 * time.Millisecond)
		p.Done(now, g[0].permit, pacer.Response{Status: 200})
		s.finished(now, g[0].job, 100*time.Millisecond, false)
	}
	for range 4 {
		if _, deferred := admit(now); deferred {
			t.Fatal("deferred with a fast authority")
		}
	}
	// Serve one, admit one: the queue stays over its bound, episode after
	// episode, for 2 s (the horizon).
	for now.Sub(t0)+100*time.Millisecond <= 2*time.Second {
		serve()
		if d, deferred := admit(now); deferred {
			t.Fatalf("at %v, within the horizon: deferred (%s)", now.Sub(t0), d.reason)
		}
	}
	serve()
	if s.saturated(now, 0) {
		t.Fatalf("at %v the authority still holds its partition, after the horizon", now.Sub(t0))
	}
	if d, deferred := admit(now); !deferred || d.reason != "overflow" {
		t.Fatalf("past the horizon: deferred=%v reason=%q, want overflow", deferred, d.reason)
	}
	// A horizon later it may hold again.
	now = now.Add(2100 * time.Millisecond)
	for s.held() > 2 {
		serve()
	}
	for range 2 {
		if _, deferred := admit(now); deferred {
			t.Fatal("deferred under the bound")
		}
	}
	if _, deferred := admit(now); deferred {
		t.Fatalf("a horizon after the block: deferred, want held")
	}
}

func TestSchedulerSlotsAreSharedRoundRobin(t *testing.T) {
	p := pacer.New(&pacer.Options{Policy: policy(0, 8)})
	s := newTestSched(p, func(o *schedOptions) { o.slots = 3 })
	var seq uint64
	for _, h := range []string{"a.test", "b.test", "c.test"} {
		for i := range 5 {
			seq++
			s.admit(t0, testJob(t, seq, "http://"+h+"/"+string(rune('a'+i)), "default"))
		}
	}
	grants, _, _ := s.next(t0)
	seen := map[string]bool{}
	for _, g := range grants {
		seen[g.job.auth] = true
	}
	if len(grants) != 3 || len(seen) != 3 {
		t.Fatalf("grants %d over %d authorities, want 3 over 3", len(grants), len(seen))
	}
}

func TestSchedulerDrainAndForget(t *testing.T) {
	p := pacer.New(&pacer.Options{Policy: policy(time.Hour, 2)})
	s := newTestSched(p, nil)
	for i := range 4 {
		s.admit(t0, testJob(t, uint64(i+1), "http://a.test/"+string(rune('a'+i)), "default"))
	}
	grants, defers, _ := s.next(t0)
	if len(grants) != 1 || len(defers) != 3 {
		t.Fatalf("grants %d defers %d, want 1 and 3 (an hour's floor)", len(grants), len(defers))
	}
	s.admit(t0, testJob(t, 9, "http://b.test/x", "default"))
	if got := len(s.drain()); got != 1 {
		t.Fatalf("drained %d, want 1", got)
	}
	p.Done(t0, grants[0].permit, pacer.Response{Status: 200})
	s.finished(t0, grants[0].job, time.Millisecond, false)
	if s.held() != 0 {
		t.Fatalf("held %d after drain and finish", s.held())
	}
	// Calendars in the future are kept; once passed, the authority is forgotten.
	s.touchDue(t0.Add(4*time.Hour), t0)
	if n := s.authorities(); n != 0 {
		t.Fatalf("%d authorities tracked after everything passed", n)
	}
}

// ackLog is a Msg that records its acknowledgements.
type ackLog struct {
	Msg
	ops []string
}

func (m *ackLog) NakWithDelay(time.Duration) error { m.ops = append(m.ops, "nak"); return nil }
func (m *ackLog) InProgress() error                { m.ops = append(m.ops, "wpi"); return nil }

func TestNoInProgressAfterADeferral(t *testing.T) {
	// The heartbeat picks a job, then the dispatcher defers it before the
	// in-progress ack goes out: that ack must not follow the NAK, or the
	// server would push the redelivery out to a full AckWait.
	w := &Worker{sched: newScheduler(nil, schedOptions{}), m: mustMetrics(t)}
	w.settler = &settler{sched: w.sched, m: w.m, o: &w.o}
	m := &ackLog{}
	j := &heldJob{msg: m, seq: 1, auth: "a:80"}
	w.inProgress(j)
	w.settler.deferJob(deferral{job: j, delay: time.Second, reason: "cooling"})
	w.inProgress(j)
	if got := strings.Join(m.ops, ","); got != "wpi,nak" {
		t.Fatalf("acks %s, want wpi,nak", got)
	}
}

func mustMetrics(t *testing.T) *Metrics {
	t.Helper()
	m, err := NewMetrics(nil, 10)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func TestSchedulerOverflowHeldWithinTheHorizon(t *testing.T) {
	// A 1 s floor and three jobs ahead: 3 s of queue, longer than HoldMax
	// but within the horizon (the worker's ParkAfter): held, not deferred.
	p := pacer.New(&pacer.Options{Policy: policy(time.Second, 1)})
	s := newTestSched(p, func(o *schedOptions) { o.maxPerAuth = 3; o.overHorizon = 10 * time.Second })
	var seq uint64
	for i := range 5 {
		seq++
		if d, deferred := s.admit(t0, testJob(t, seq, "http://floored.test/"+string(rune('a'+seq)), "default")); deferred {
			t.Fatalf("job %d deferred (%s after %v); want it held", i, d.reason, d.delay)
		}
		if i == 0 {
			s.next(t0) // one granted: the scheduler learns the 1 s interval
		}
	}
	if !s.saturated(t0, 0) {
		t.Fatal("want the partition saturated")
	}
	for i := range 20 {
		seq++
		if _, deferred := s.admit(t0, testJob(t, seq, "http://floored.test/z"+strconv.Itoa(i), "default")); deferred {
			return // the queue grew past the horizon: deferred from here
		}
	}
	t.Fatal("20 more jobs at 1 s each all held: want those past the 10 s horizon deferred")
}
