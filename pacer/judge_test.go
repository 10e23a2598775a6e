package pacer_test

import (
	"errors"
	"fmt"
	"net/http"
	"syscall"
	"testing"
	"time"

	"github.com/mirrorworker/mirrorworker/pacer"
	"github.com/mirrorworker/mirrorworker/stuborigin/limitreq"
)

// judged is one request in a judge test: its URL, what came back, and how
// long after its start.
type judged struct {
	url    string
	status int   // 0: err
	err    error // no answer
	took   time.Duration
}

// judgeRun sends the answers one after the other, each as soon as the pacer
// allows (its wait taken on virtual time), and returns the verdicts, the
// events and the pacer.
func judgeRun(t *testing.T, floor time.Duration, as []judged) ([]pacer.Verdict, []pacer.Event, *pacer.Pacer, time.Time) {
	t.Helper()
	const a = "origin.example:443"
	var evs []pacer.Event
	p := pacer.New(&pacer.Options{
		Policy:     &pacer.Policy{Default: pacer.Limits{Floor: floor, MaxInFlight: 2}},
		StartGuard: -1,
		Rand:       func() float64 { return 0 },
		OnEvent:    func(ev pacer.Event) { evs = append(evs, ev) },
	})
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	var vs []pacer.Verdict
	for i, an := range as {
		wait, _, _ := p.ReadyIn(now, a)
		now = now.Add(wait)
		pm, err := p.Acquire(now, a, 0)
		if err != nil {
			t.Fatalf("judged %d: %v", i, err)
		}
		if pm, err = p.Confirm(now, pm); err != nil {
			t.Fatalf("judged %d: confirm: %v", i, err)
		}
		now = now.Add(an.took)
		vs = append(vs, p.Done(now, pm, pacer.Response{Status: an.status, Err: an.err, URL: an.url}))
	}
	return vs, evs, p, now
}

func countEvents(evs []pacer.Event, typ pacer.EventType) int {
	n := 0
	for _, ev := range evs {
		if ev.Type == typ {
			n++
		}
	}
	return n
}

// TestOneURLFailingIsNotItsOrigin: a 5xx of one URL while other URLs of the
// origin succeed is that URL's failure and no step of the origin's
// backoff, however often it comes; failures spanning two URLs with no
// success of another between them, failures without an judged and
// failures of an unknown URL are the origin's.
func TestOneURLFailingIsNotItsOrigin(t *testing.T) {
	const (
		u = "https://origin.example/broken"
		b = "https://origin.example/b"
		c = "https://origin.example/c"
	)
	ms := 10 * time.Millisecond
	ok := func(url string) judged { return judged{url: url, status: 200, took: ms} }
	fail := func(url string) judged { return judged{url: url, status: 500, took: ms} }
	reset := judged{url: u, err: syscall.ECONNRESET, took: ms}
	var interleaved []judged
	for range 20 {
		interleaved = append(interleaved, fail(u), ok(b), ok(c))
	}
	for _, tc := range []struct {
		name     string
		as       []judged
		backoffs int // EventBackoff facts
	}{
		{"one URL fails between others' successes", append([]judged{ok(b)}, interleaved...), 0},
		{"one URL fails on its own after one success", []judged{ok(b), fail(u), fail(u), fail(u), fail(u)}, 0},
		{"one URL fails before any success", []judged{fail(u), fail(u)}, 0},
		{"two URLs fail before any success", []judged{fail(u), fail(b)}, 1},
		{"two URLs fail with no success between", []judged{ok(c), fail(u), fail(b)}, 1},
		{"two URLs fail with a success between", []judged{ok(c), fail(u), ok(c), fail(b), ok(c), fail(u)}, 0},
		{"no judged is the origin's", []judged{ok(b), reset}, 1},
		{"a 5xx after the origin failed", []judged{ok(b), reset, fail(u)}, 2},
		{"an unknown URL", []judged{ok(b), fail("")}, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			vs, evs, p, now := judgeRun(t, time.Second, tc.as)
			if n := countEvents(evs, pacer.EventBackoff); n != tc.backoffs {
				t.Errorf("%d backoff facts, want %d", n, tc.backoffs)
			}
			for i, v := range vs {
				if v.Throttled {
					t.Errorf("judged %d throttled: %+v", i, v)
				}
			}
			if tc.backoffs == 0 {
				st := p.Snapshot(now)[0]
				if st.State == pacer.StateBackoff || st.Failures != 0 || st.Interval != time.Second {
					t.Errorf("state %+v, want no backoff, the floor's interval", st)
				}
			}
		})
	}
}

// TestLimiter503: a 503 without a valid Retry-After that comes back within
// LimiterAnswerWithin while other requests succeed is a limiter's refusal:
// throttling (the interval escalates as for a 429) without a cooldown, no
// failure, no backoff. A slow 503, a 503 before any success, and a second
// 503 with no success since the first (an origin that went down) are
// failures, as before: of the origin when they span two URLs.
func TestLimiter503(t *testing.T) {
	const u, b, c = "https://origin.example/a", "https://origin.example/b", "https://origin.example/c"
	quick := 5 * time.Millisecond
	slow := func(url string) judged {
		return judged{url: url, status: 503, took: pacer.LimiterAnswerWithin + time.Millisecond}
	}
	ok := judged{url: b, status: 200, took: quick}
	no := judged{url: u, status: 503, took: quick}
	var alternating []judged
	for range 40 {
		alternating = append(alternating, no, ok)
	}
	for _, tc := range []struct {
		name      string
		as        []judged
		throttled []int // which answers are read as a limiter's
		backoffs  int
		interval  time.Duration // after the last judged; 0: not checked
	}{
		{"a quick 503 while others succeed", []judged{ok, no}, []int{1}, 0, 2 * time.Second},
		// The interval it settles at is the escalation's and decay's
		// business (pacer.go), not this rule's.
		{"a limiter saying no every other request", append([]judged{ok}, alternating...), evens(1, 81), 0, 0},
		// A slow 503 is a failure: of its URL alone while others succeed
		// (TestOneURLFailingIsNotItsOrigin), of the origin across URLs.
		{"a slow 503", []judged{ok, slow(u)}, nil, 0, 100 * time.Millisecond},
		{"slow 503s of two URLs", []judged{ok, slow(u), slow(c)}, nil, 1, 100 * time.Millisecond},
		{"a 503 before any success", []judged{no}, nil, 0, 100 * time.Millisecond},
		{"503s of two URLs before any success", []judged{no, {url: c, status: 503, took: quick}}, nil, 1, 100 * time.Millisecond},
		{"an origin that went down answering 503", []judged{ok, no, {url: c, status: 503, took: quick}, no}, []int{1}, 2, 2 * time.Second},
		{"a 503 after the origin failed", []judged{ok, {url: u, err: syscall.ECONNREFUSED, took: quick}, no}, nil, 2, 100 * time.Millisecond},
	} {
		t.Run(tc.name, func(t *testing.T) {
			vs, evs, p, now := judgeRun(t, 100*time.Millisecond, tc.as)
			want := map[int]bool{}
			for _, i := range tc.throttled {
				want[i] = true
			}
			for i, v := range vs {
				if v.Throttled != want[i] || (v.Throttled && (v.Reason != "limiter" || !v.Until.IsZero())) {
					t.Errorf("judged %d (%d): verdict %+v, want throttled %v without a cooldown", i, tc.as[i].status, v, want[i])
				}
			}
			if n := countEvents(evs, pacer.EventBackoff); n != tc.backoffs {
				t.Errorf("%d backoff facts, want %d", n, tc.backoffs)
			}
			if n := countEvents(evs, pacer.EventCooldown); n != 0 {
				t.Errorf("%d cooldown facts, want none (no 503 without Retry-After starts one)", n)
			}
			if n := countEvents(evs, pacer.EventThrottle); n != len(tc.throttled) {
				t.Errorf("%d throttle facts, want %d", n, len(tc.throttled))
			}
			if st := p.Snapshot(now)[0]; (tc.interval != 0 && st.Interval != tc.interval) || !st.CooldownUntil.IsZero() || st.State == pacer.StateBackoff && tc.backoffs == 0 {
				t.Errorf("state %+v, want interval %s and no cooldown", st, tc.interval)
			}
		})
	}
}

// evens returns from, from+2, ... below to.
func evens(from, to int) []int {
	var out []int
	for i := from; i < to; i += 2 {
		out = append(out, i)
	}
	return out
}

// TestLimiter503InFlightTogether: two requests in flight together both
// refused by a limiter are both its refusals (the second was sent before
// the first refusal came back); the next request, sent after, that is
// refused again with no success between is the origin failing.
func TestLimiter503InFlightTogether(t *testing.T) {
	const a = "origin.example:443"
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	p := pacer.New(&pacer.Options{Policy: &pacer.Policy{Default: pacer.Limits{Floor: 0, MaxInFlight: 2}},
		StartGuard: -1, Rand: func() float64 { return 0 }})
	start := func(at time.Time) pacer.Permit { t.Helper(); return startAt(t, p, a, at) }
	p.Done(t0, start(t0), pacer.Response{Status: 200, URL: "/ok"})
	x, y := start(t0.Add(time.Millisecond)), start(t0.Add(2*time.Millisecond))
	for i, pm := range []pacer.Permit{x, y} {
		if v := p.Done(t0.Add(time.Duration(10+i)*time.Millisecond), pm, pacer.Response{Status: 503, URL: "/x"}); !v.Throttled {
			t.Fatalf("in-flight request %d: %+v, want a limiter's refusal", i, v)
		}
	}
	at := t0.Add(time.Second)
	if wait, _, _ := p.ReadyIn(at, a); wait > 0 {
		at = at.Add(wait)
	}
	if v := p.Done(at.Add(time.Millisecond), start(at), pacer.Response{Status: 503, URL: "/x"}); v.Throttled {
		t.Fatalf("a 503 after the limiter's, none between: %+v, want a failure", v)
	}
	if st := p.Snapshot(at)[0]; st.State != pacer.StateBackoff {
		t.Fatalf("state %+v, want backoff", st)
	}
}

// TestLimiter503KeepsRetryAfterRule: a 503 with a valid Retry-After is the
// throttling it always was (a cooldown), whatever came before.
func TestLimiter503KeepsRetryAfterRule(t *testing.T) {
	const a = "origin.example:443"
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	p := pacer.New(&pacer.Options{Policy: &pacer.Policy{Default: pacer.Limits{Floor: 0, MaxInFlight: 2}}, StartGuard: -1})
	pm, _ := p.Acquire(t0, a, 0)
	p.Done(t0, pm, pacer.Response{Status: 200, URL: "/ok"})
	pm, _ = p.Acquire(t0, a, 0)
	v := p.Done(t0, pm, pacer.Response{Status: 503, URL: "/x", Header: http.Header{"Retry-After": {"7"}}})
	if !v.Throttled || !v.Until.Equal(t0.Add(7*time.Second)) {
		t.Fatalf("503 with Retry-After: %+v, want a 7 s cooldown", v)
	}
	var re *pacer.RefusedError
	if _, err := p.Acquire(t0.Add(time.Second), a, 0); !errors.As(err, &re) || re.Reason != pacer.ReasonCooling {
		t.Fatalf("during the cooldown: %v", err)
	}
}

// TestLimiter503SettlesLikeA429: 300 files through nginx's limit_req (2 r/s,
// burst 5, nodelay) on virtual time, floor 0, one request at a time, the
// limiter refusing with 503 and no Retry-After, or with 429 and
// Retry-After: 2 (issue 35's first row). The 503 run fails nothing, starts
// no cooldown and backs nothing off, and drains no slower than the 429 run.
func TestLimiter503SettlesLikeA429(t *testing.T) {
	const (
		a     = "origin.example:443"
		files = 300
	)
	run := func(refuse pacer.Response) (drain time.Duration, refusals, backoffs, cooldowns int) {
		var evs []pacer.Event
		p := pacer.New(&pacer.Options{Policy: &pacer.Policy{Default: pacer.Limits{Floor: 0, MaxInFlight: 1}},
			StartGuard: -1, Rand: func() float64 { return 0 }, OnEvent: func(ev pacer.Event) { evs = append(evs, ev) }})
		b := &limitreq.Limiter{Limit: limitreq.Limit{Rate: 2, Burst: 5}}
		t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
		now := t0
		for i := 0; i < files; {
			if wait, _, _ := p.ReadyIn(now, a); wait > 0 {
				now = now.Add(wait)
			}
			pm, err := p.Acquire(now, a, 0)
			if err == nil {
				pm, err = p.Confirm(now, pm)
			}
			if err != nil {
				t.Fatalf("file %d at +%s: %v", i, now.Sub(t0), err)
			}
			r := pacer.Response{Status: 200, URL: fmt.Sprintf("/f/%d", i)}
			if !b.Admit(now) {
				r = refuse
				r.URL = fmt.Sprintf("/f/%d", i)
				refusals++
			} else {
				i++
			}
			now = now.Add(5 * time.Millisecond)
			if v := p.Done(now, pm, r); r.Status != 200 && !v.Throttled {
				t.Fatalf("refusal %d (%d) not read as throttling: %+v", refusals, r.Status, v)
			}
		}
		return now.Sub(t0), refusals, countEvents(evs, pacer.EventBackoff), countEvents(evs, pacer.EventCooldown)
	}
	d503, r503, b503, c503 := run(pacer.Response{Status: 503})
	d429, r429, _, _ := run(pacer.Response{Status: 429, Header: http.Header{"Retry-After": {"2"}}})
	t.Logf("503 without Retry-After: drained in %s, %d refusals; 429 + Retry-After: 2: %s, %d refusals", d503, r503, d429, r429)
	if b503 != 0 || c503 != 0 {
		t.Errorf("503 run: %d backoff and %d cooldown facts, want none", b503, c503)
	}
	if d503 > d429+d429/10 {
		t.Errorf("503 run drained in %s, the 429 run in %s: want within 1.1x", d503, d429)
	}
}

// TestLimiter503ColdBlast: the cold blast's refusals may come back before
// the successes sent with them (a 503 is quicker than a body). The first is
// a limiter's while another request is on its way, the rest of the blast
// crossed it, a request sent at the very instant a refusal came back (granted
// before the pacer read it) crossed it too; an origin that answers 503 to
// everything is read as failing from the first request sent after the blast.
func TestLimiter503ColdBlast(t *testing.T) {
	const a = "origin.example:443"
	ms := time.Millisecond
	newPacer := func() (*pacer.Pacer, *[]pacer.Event) {
		var evs []pacer.Event
		return pacer.New(&pacer.Options{Policy: &pacer.Policy{Default: pacer.Limits{Floor: 0, MaxInFlight: 2}},
			StartGuard: -1, Rand: func() float64 { return 0 }, OnEvent: func(ev pacer.Event) { evs = append(evs, ev) }}), &evs
	}
	start := func(p *pacer.Pacer, at time.Time) pacer.Permit { t.Helper(); return startAt(t, p, a, at) }
	no := func(u string) pacer.Response { return pacer.Response{Status: 503, URL: u} }
	ok := func(u string) pacer.Response { return pacer.Response{Status: 200, URL: u} }

	t.Run("a refusal before the success sent with it", func(t *testing.T) {
		p, evs := newPacer()
		x, y := start(p, t0), start(p, t0)
		if v := p.Done(t0.Add(5*ms), y, no("/y")); !v.Throttled || v.Reason != "limiter" || !v.Until.IsZero() {
			t.Fatalf("the blast's refusal: %+v, want a limiter's, no cooldown", v)
		}
		p.Done(t0.Add(20*ms), x, ok("/x"))
		if n := countEvents(*evs, pacer.EventBackoff); n != 0 {
			t.Errorf("%d backoff facts, want none", n)
		}
	})
	t.Run("a request sent as the refusal came back", func(t *testing.T) {
		p, _ := newPacer()
		p.Done(t0, start(p, t0), ok("/ok"))
		x := start(p, t0.Add(ms))
		at := t0.Add(20 * ms)
		y := start(p, at) // granted at the instant x's refusal comes back, before the pacer reads it
		if v := p.Done(at, x, no("/x")); !v.Throttled {
			t.Fatalf("the refusal: %+v, want a limiter's", v)
		}
		if v := p.Done(at.Add(20*ms), y, no("/y")); !v.Throttled {
			t.Fatalf("a request sent as the refusal came back: %+v, want a limiter's (it crossed the refusal)", v)
		}
	})
	t.Run("an origin answering 503 to everything from the start", func(t *testing.T) {
		p, evs := newPacer()
		x, y := start(p, t0), start(p, t0)
		for i, pm := range []pacer.Permit{x, y} {
			if v := p.Done(t0.Add(time.Duration(5+i)*ms), pm, no(fmt.Sprintf("/%d", i))); !v.Throttled {
				t.Fatalf("blast request %d: %+v, want a limiter's (the blast is read as one)", i, v)
			}
		}
		at := t0.Add(10 * ms)
		if wait, _, _ := p.ReadyIn(at, a); wait > 0 {
			at = at.Add(wait)
		}
		if v := p.Done(at.Add(5*ms), start(p, at), no("/2")); v.Throttled {
			t.Fatalf("the first 503 after the blast: %+v, want a failure", v)
		}
		if st := p.Snapshot(at)[0]; st.State != pacer.StateBackoff || countEvents(*evs, pacer.EventBackoff) != 1 {
			t.Fatalf("state %+v, %d backoff facts: want backoff, one fact", st, countEvents(*evs, pacer.EventBackoff))
		}
	})
	t.Run("a lone request refused before any success", func(t *testing.T) {
		p, _ := newPacer()
		if v := p.Done(t0.Add(5*ms), start(p, t0), no("/x")); v.Throttled {
			t.Fatalf("%+v, want a failure: nothing else was on its way", v)
		}
	})
}

// startAt starts a request to auth at at, granted and confirmed there (the
// tests' pacers have no floor, so nothing makes it wait).
func startAt(t *testing.T, p *pacer.Pacer, auth string, at time.Time) pacer.Permit {
	t.Helper()
	pm, err := p.Acquire(at, auth, 0)
	if err == nil {
		pm, err = p.Confirm(at, pm)
	}
	if err != nil {
		t.Fatal(err)
	}
	return pm
}

// TestLimiter503AfterTheBlastsShortStep: the cold blast's refusal by a
// limiter's 503 (a blast of six admitted, the seventh refused) steps the
// first step over the depth (333 ms), and the one request sent after that
// step, refused at once with nothing failed since, is still the limiter's:
// a limiter slower than 3 r/s has not leaked a place by then. The refusal
// after it is ADR 0030's again: an origin that admitted the blast and then
// answers everything 503 is read as failing from there, one request and
// 333 ms later than with the 2 s step. A failure since the blast's refusal,
// or a slow 503, ends the exception; an origin down at first contact reads
// no depth, takes the 2 s step, and is failing from the first request after
// the blast as before (TestLimiter503ColdBlast).
func TestLimiter503AfterTheBlastsShortStep(t *testing.T) {
	const a = "origin.example:443"
	ms := time.Millisecond
	no := pacer.Response{Status: 503, URL: "/no"}
	// blast sends six admitted requests and a seventh refused, with x in
	// flight beside it answered by sibling (zero: not answered), and
	// returns the pacer, its events and the instant after the blast.
	blast := func(t *testing.T, sibling pacer.Response) (*pacer.Pacer, *[]pacer.Event, time.Time) {
		t.Helper()
		var evs []pacer.Event
		p := pacer.New(&pacer.Options{Policy: &pacer.Policy{Default: pacer.Limits{Floor: 0, MaxInFlight: 2}},
			StartGuard: -1, Rand: func() float64 { return 0 }, OnEvent: func(ev pacer.Event) { evs = append(evs, ev) }})
		at := t0
		for i := range 6 {
			p.Done(at.Add(2*ms), startAt(t, p, a, at), pacer.Response{Status: 200, URL: fmt.Sprintf("/%d", i)})
			at = at.Add(2 * ms)
		}
		x, y := startAt(t, p, a, at), startAt(t, p, a, at)
		if v := p.Done(at.Add(ms), y, no); !v.Throttled || v.Reason != "limiter" || !v.Until.IsZero() {
			t.Fatalf("the blast's refusal: %+v, want a limiter's, no cooldown", v)
		}
		if st := p.Snapshot(at)[0]; st.Interval != pacer.FirstStep/6 {
			t.Fatalf("after the blast's refusal: interval %s, want the first step over the depth of 6, %s", st.Interval, pacer.FirstStep/6)
		}
		at = at.Add(2 * ms)
		if sibling.Status != 0 || sibling.Err != nil {
			p.Done(at, x, sibling)
		}
		return p, &evs, at
	}
	// next starts the next request when the pacer allows it and answers it
	// with r after took.
	next := func(t *testing.T, p *pacer.Pacer, at time.Time, r pacer.Response, took time.Duration) (pacer.Verdict, time.Time) {
		t.Helper()
		if wait, _, _ := p.ReadyIn(at, a); wait > 0 {
			at = at.Add(wait)
		}
		return p.Done(at.Add(took), startAt(t, p, a, at), r), at.Add(took)
	}

	t.Run("refused after the step: the limiter's, then failing", func(t *testing.T) {
		p, evs, at := blast(t, pacer.Response{Status: 200, URL: "/x"})
		// The sibling's success came before: ADR 0030's reading already
		// takes the next refusal for the limiter's, and does here too.
		v, at := next(t, p, at, no, 5*ms)
		if !v.Throttled || v.Reason != "limiter" {
			t.Fatalf("the request after the step, a success since the refusal: %+v, want a limiter's", v)
		}
		v, _ = next(t, p, at, no, 5*ms)
		if v.Throttled {
			t.Fatalf("the next refusal, none between: %+v, want a failure", v)
		}
		if n := countEvents(*evs, pacer.EventBackoff); n != 1 {
			t.Errorf("%d backoff facts, want 1", n)
		}
	})
	t.Run("no success since the blast's refusal", func(t *testing.T) {
		p, evs, at := blast(t, pacer.Response{})
		v, after := next(t, p, at, no, 5*ms)
		if gap := after.Add(-5 * ms).Sub(at); gap > pacer.FirstStep/6 {
			t.Errorf("the request after the blast left %s after it, want at most the short step %s", gap, pacer.FirstStep/6)
		}
		if !v.Throttled || v.Reason != "limiter" || !v.Until.IsZero() {
			t.Fatalf("the request after the short step refused: %+v, want a limiter's refusal, no cooldown", v)
		}
		st := p.Snapshot(after)[0]
		if st.Interval != pacer.FirstStep || st.State == pacer.StateBackoff || st.Failures != 0 {
			t.Fatalf("after it: %+v, want the interval at the first step %s, no failure, no backoff", st, pacer.FirstStep)
		}
		var again int
		for _, ev := range *evs {
			if ev.Type == pacer.EventThrottle && ev.AfterBlastStep {
				again++
			}
		}
		if n := countEvents(*evs, pacer.EventBackoff); n != 0 || again != 1 || countEvents(*evs, pacer.EventCooldown) != 0 {
			t.Fatalf("%d backoff facts, %d throttle facts read after the blast's step, %d cooldowns: want 0, 1, 0",
				n, again, countEvents(*evs, pacer.EventCooldown))
		}
		// Once: the origin that goes on refusing is failing.
		v, after = next(t, p, after, no, 5*ms)
		if v.Throttled {
			t.Fatalf("the refusal after that one: %+v, want a failure", v)
		}
		if st := p.Snapshot(after)[0]; st.State != pacer.StateBackoff || countEvents(*evs, pacer.EventBackoff) != 1 {
			t.Fatalf("state %+v, %d backoff facts: want backoff, one fact", st, countEvents(*evs, pacer.EventBackoff))
		}
	})
	t.Run("a failure since the blast's refusal", func(t *testing.T) {
		p, _, at := blast(t, pacer.Response{Err: syscall.ECONNRESET, URL: "/x"})
		if v, _ := next(t, p, at, no, 5*ms); v.Throttled {
			t.Fatalf("the request after the step, the origin failed since: %+v, want a failure", v)
		}
	})
	t.Run("a slow 503 after the step", func(t *testing.T) {
		p, _, at := blast(t, pacer.Response{})
		if v, _ := next(t, p, at, no, pacer.LimiterAnswerWithin+ms); v.Throttled {
			t.Fatalf("a slow 503: %+v, want a failure", v)
		}
	})
}
