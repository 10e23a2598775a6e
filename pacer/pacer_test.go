package pacer_test

import (
	"encoding/json"
	"errors"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/mirrorworker/mirrorworker/pacer"
)

// t0 is the virtual clock's origin; every instant in these tests is t0 plus
// an offset, and nothing sleeps.
var t0 = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)

func at(d time.Duration) time.Time { return t0.Add(d) }

const host = "files.example.org:443"

func hdr(kv ...string) http.Header {
	h := http.Header{}
	for i := 0; i+1 < len(kv); i += 2 {
		h.Add(kv[i], kv[i+1])
	}
	return h
}

func resp(status int, kv ...string) pacer.Response {
	return pacer.Response{Status: status, Header: hdr(kv...)}
}

// fixedRand returns a Rand that always yields r.
func fixedRand(r float64) func() float64 { return func() float64 { return r } }

// newPacer builds a Pacer with the given default floor and Rand 0. Unless o
// sets StartGuard, it has none: the contract's tables speak of the interval alone,
// and the guard has its own tests.
func newPacer(t testing.TB, floor time.Duration, o *pacer.Options) *pacer.Pacer {
	t.Helper()
	if o == nil {
		o = &pacer.Options{}
	}
	if o.StartGuard == 0 {
		o.StartGuard = -1
	}
	if o.Policy == nil {
		o.Policy = pacer.DefaultPolicy().WithDefaultFloor(floor)
	}
	if o.Rand == nil {
		o.Rand = fixedRand(0)
	}
	return pacer.New(o)
}

func mustGrant(t *testing.T, p *pacer.Pacer, now time.Time, maxWait time.Duration) pacer.Permit {
	t.Helper()
	pm, err := p.Acquire(now, host, maxWait)
	if err != nil {
		t.Fatalf("Acquire at %s: %v", now.Sub(t0), err)
	}
	return pm
}

// acquireWaits asks for a request to host at now and checks the answer: a
// grant when wait is 0, else a refusal by the in-flight cap (the crossing
// rule, the cold hold) for exactly wait.
func acquireWaits(t *testing.T, p *pacer.Pacer, now time.Time, wait time.Duration) {
	t.Helper()
	_, err := p.Acquire(now, host, 0)
	var re *pacer.RefusedError
	switch {
	case wait == 0 && err != nil:
		t.Fatalf("refused: %v", err)
	case wait != 0 && !errors.As(err, &re):
		t.Fatalf("granted, want a refusal for %s", wait)
	case wait != 0 && (re.Reason != pacer.ReasonInFlight || re.Wait != wait):
		t.Fatalf("refused %s for %s, want %s for %s", re.Reason, re.Wait, pacer.ReasonInFlight, wait)
	}
}

func mustRefuse(t *testing.T, p *pacer.Pacer, now time.Time, maxWait time.Duration) *pacer.RefusedError {
	t.Helper()
	pm, err := p.Acquire(now, host, maxWait)
	var re *pacer.RefusedError
	if !errors.As(err, &re) {
		t.Fatalf("Acquire at %s: granted %+v, want a refusal", now.Sub(t0), pm)
	}
	return re
}

func state(t *testing.T, p *pacer.Pacer, now time.Time) pacer.State {
	t.Helper()
	for _, s := range p.Snapshot(now) {
		if s.Authority == host {
			return s
		}
	}
	t.Fatalf("no state for %s", host)
	return pacer.State{}
}

// throttle makes one request at now answered by r and returns the verdict.
func throttle(t *testing.T, p *pacer.Pacer, now time.Time, r pacer.Response) pacer.Verdict {
	t.Helper()
	pm := mustGrant(t, p, now, time.Hour)
	return p.Done(pm.Start, pm, r)
}

// escalate answers n successive requests (the first at or after from) with
// 429 and Retry-After 1, and returns the instant of the last one.
func escalate(t *testing.T, p *pacer.Pacer, from time.Time, n int) time.Time {
	t.Helper()
	now, last := from, from
	for i := 0; i < n; i++ {
		pm := mustGrant(t, p, now, time.Hour)
		v := p.Done(pm.Start, pm, resp(429, "Retry-After", "1"))
		last, now = pm.Start, v.Until
	}
	return last
}

// recoverAt answers the probe with a 200 and returns its start.
func recoverAt(t *testing.T, p *pacer.Pacer, now time.Time) time.Time {
	t.Helper()
	pm := mustGrant(t, p, now, time.Hour)
	if !pm.Probe {
		t.Fatalf("recoverAt: permit %+v is not a probe", pm)
	}
	p.Done(pm.Start, pm, resp(200))
	return pm.Start
}

func TestAcquireDecisions(t *testing.T) {
	type step struct {
		at      time.Duration
		maxWait time.Duration
		done    *pacer.Response // give the permit back right away with this response
		// want: a grant starting at start (and probe), or a refusal
		start  time.Duration
		probe  bool
		reason pacer.Reason
		wait   time.Duration
		until  time.Duration // for ReasonCooling
	}
	ok := &pacer.Response{Status: 200}
	tooMany := &pacer.Response{Status: 429}
	cancelled := &pacer.Response{Cancelled: true}
	netErr := &pacer.Response{Err: errors.New("connection reset")}
	tests := []struct {
		name  string
		floor time.Duration
		steps []step
	}{
		{"first request starts now", time.Second, []step{
			{at: 0, start: 0, done: ok},
		}},
		{"inside the floor without maxWait is refused with the gap", time.Second, []step{
			{at: 0, start: 0, done: ok},
			{at: 300 * time.Millisecond, reason: pacer.ReasonSpacing, wait: 700 * time.Millisecond},
			{at: time.Second, start: time.Second, done: ok},
		}},
		{"a short wait reserves the slot and moves the next one", time.Second, []step{
			{at: 0, start: 0, done: ok},
			{at: 100 * time.Millisecond, maxWait: time.Second, start: time.Second, done: ok},
			{at: 200 * time.Millisecond, maxWait: time.Second, reason: pacer.ReasonSpacing, wait: 1800 * time.Millisecond},
			{at: 200 * time.Millisecond, maxWait: 1800 * time.Millisecond, start: 2 * time.Second, done: ok},
		}},
		{"in-flight cap comes before spacing", time.Second, []step{
			{at: 0, start: 0},
			{at: 0, maxWait: time.Minute, start: time.Second},
			{at: 0, maxWait: time.Minute, reason: pacer.ReasonInFlight, wait: 2 * time.Second},
		}},
		{"in-flight refusal waits at least a second", 0, []step{
			{at: 0, start: 0},
			{at: 0, start: 0},
			{at: 0, reason: pacer.ReasonInFlight, wait: time.Second},
		}},
		{"floor 0 grants back to back", 0, []step{
			{at: 0, start: 0, done: ok},
			{at: 0, start: 0, done: ok},
			{at: 0, start: 0, done: ok},
		}},
		{"cooling refuses with the rest of the cooldown", time.Second, []step{
			{at: 0, start: 0, done: tooMany}, // fallback 60 s, interval 2 s
			{at: 10 * time.Second, maxWait: time.Hour, reason: pacer.ReasonCooling, wait: 50 * time.Second, until: 60 * time.Second},
			{at: 59*time.Second + 999*time.Millisecond, maxWait: time.Hour, reason: pacer.ReasonCooling, wait: time.Millisecond, until: 60 * time.Second},
		}},
		{"after the deadline one probe, others told 1 s", time.Second, []step{
			{at: 0, start: 0, done: tooMany},
			{at: 60 * time.Second, start: 60 * time.Second, probe: true},
			{at: 61 * time.Second, reason: pacer.ReasonProbing, wait: time.Second},
			{at: 300 * time.Second, maxWait: time.Hour, reason: pacer.ReasonProbing, wait: time.Second},
		}},
		{"probe success restores ordinary traffic at the escalated interval", time.Second, []step{
			{at: 0, start: 0, done: tooMany},
			{at: 60 * time.Second, start: 60 * time.Second, probe: true, done: ok},
			{at: 61 * time.Second, reason: pacer.ReasonSpacing, wait: time.Second},
			{at: 62 * time.Second, start: 62 * time.Second, done: ok},
		}},
		{"cancelled probe releases the slot", time.Second, []step{
			{at: 0, start: 0, done: tooMany},
			{at: 60 * time.Second, start: 60 * time.Second, probe: true, done: cancelled},
			{at: 61 * time.Second, maxWait: 2 * time.Second, start: 62 * time.Second, probe: true, done: ok},
			{at: 64 * time.Second, start: 64 * time.Second},
		}},
		{"failed connection releases the probe slot", time.Second, []step{
			{at: 0, start: 0, done: tooMany},
			{at: 70 * time.Second, start: 70 * time.Second, probe: true, done: netErr},
			{at: 72 * time.Second, start: 72 * time.Second, probe: true},
		}},
		{"a probe answered with a 5xx still confirms recovery", time.Second, []step{
			{at: 0, start: 0, done: tooMany},
			{at: 60 * time.Second, start: 60 * time.Second, probe: true, done: &pacer.Response{Status: 502}},
			{at: 62 * time.Second, start: 62 * time.Second},
		}},
		{"a probe answered 503 with Retry-After fails", time.Second, []step{
			{at: 0, start: 0, done: tooMany},
			{at: 60 * time.Second, start: 60 * time.Second, probe: true, done: &pacer.Response{Status: 503, Header: hdr("Retry-After", "5")}},
			{at: 64 * time.Second, reason: pacer.ReasonCooling, wait: time.Second, until: 65 * time.Second},
			{at: 65 * time.Second, start: 65 * time.Second, probe: true}, // the 4 s slot after 60 s has passed
		}},
		{"a probe waits for its spacing slot too", time.Second, []step{
			{at: 0, start: 0, done: &pacer.Response{Status: 429, Header: hdr("Retry-After", "1")}}, // interval 2 s, until 1 s
			{at: time.Second, reason: pacer.ReasonSpacing, wait: time.Second},
			{at: time.Second, maxWait: time.Second, start: 2 * time.Second, probe: true},
		}},
		{"a throttled probe starts a new cooldown", time.Second, []step{
			{at: 0, start: 0, done: tooMany},
			{at: 60 * time.Second, start: 60 * time.Second, probe: true, done: tooMany}, // ceiling 120 s, Rand 0 → 60 s
			{at: 61 * time.Second, reason: pacer.ReasonCooling, wait: 59 * time.Second, until: 120 * time.Second},
			{at: 120 * time.Second, start: 120 * time.Second, probe: true},
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := newPacer(t, tt.floor, nil)
			for i, s := range tt.steps {
				now := at(s.at)
				pm, err := p.Acquire(now, host, s.maxWait)
				if s.reason != "" {
					var re *pacer.RefusedError
					if !errors.As(err, &re) {
						t.Fatalf("step %d: granted %+v, want %s", i, pm, s.reason)
					}
					if re.Reason != s.reason || re.Wait != s.wait || re.Authority != host {
						t.Fatalf("step %d: refused %s wait %s, want %s wait %s", i, re.Reason, re.Wait, s.reason, s.wait)
					}
					if s.reason == pacer.ReasonCooling && !re.Until.Equal(at(s.until)) {
						t.Fatalf("step %d: until %s, want %s", i, re.Until.Sub(t0), s.until)
					}
					continue
				}
				if err != nil {
					t.Fatalf("step %d: %v, want a grant at %s", i, err, s.start)
				}
				if !pm.Start.Equal(at(s.start)) || pm.Probe != s.probe || pm.Authority != host {
					t.Fatalf("step %d: start %s probe %v, want %s probe %v", i, pm.Start.Sub(t0), pm.Probe, s.start, s.probe)
				}
				if s.done != nil {
					p.Done(pm.Start, pm, *s.done)
				}
			}
		})
	}
}

func TestResponseRules(t *testing.T) {
	dateNow := t0.Format(http.TimeFormat)
	tests := []struct {
		name      string
		floor     time.Duration
		interval  time.Duration // reached first by escalation if above the floor
		r         pacer.Response
		throttled bool
		reason    string
		interval2 time.Duration // after
		pause     time.Duration // cooldown from the response's instant; 0 = none
	}{
		{name: "429 without Retry-After: x2 from 2 s and the 60 s fallback", floor: time.Second, r: resp(429),
			throttled: true, reason: "429", interval2: 2 * time.Second, pause: 60 * time.Second},
		{name: "429 with Retry-After seconds", floor: time.Second, r: resp(429, "Retry-After", "120"),
			throttled: true, reason: "429", interval2: 2 * time.Second, pause: 120 * time.Second},
		{name: "429 with decimal Retry-After rounds up", floor: time.Second, r: resp(429, "Retry-After", "1.2"),
			throttled: true, reason: "429", interval2: 2 * time.Second, pause: 2 * time.Second},
		{name: "429 with zero Retry-After uses the fallback", floor: time.Second, r: resp(429, "Retry-After", "0"),
			throttled: true, reason: "429", interval2: 2 * time.Second, pause: 60 * time.Second},
		{name: "429 with malformed Retry-After uses the fallback", floor: time.Second, r: resp(429, "Retry-After", "soon"),
			throttled: true, reason: "429", interval2: 2 * time.Second, pause: 60 * time.Second},
		{name: "429 with expired date uses the fallback", floor: time.Second, r: resp(429, "Retry-After", at(-time.Hour).Format(http.TimeFormat)),
			throttled: true, reason: "429", interval2: 2 * time.Second, pause: 60 * time.Second},
		{name: "429 with an HTTP-date measured against Date", floor: time.Second,
			r:         resp(429, "Retry-After", at(-10*time.Second+90*time.Second).Format(http.TimeFormat), "Date", at(-10*time.Second).Format(http.TimeFormat)),
			throttled: true, reason: "429", interval2: 2 * time.Second, pause: 90 * time.Second},
		{name: "429 with Retry-After over 600 s is capped", floor: time.Second, r: resp(429, "Retry-After", "86400"),
			throttled: true, reason: "429", interval2: 2 * time.Second, pause: 600 * time.Second},
		{name: "429 doubles the interval", floor: time.Second, interval: 8 * time.Second, r: resp(429, "Retry-After", "5"),
			throttled: true, reason: "429", interval2: 16 * time.Second, pause: 5 * time.Second},
		{name: "429 escalation stops at 60 s", floor: time.Second, interval: 32 * time.Second, r: resp(429, "Retry-After", "5"),
			throttled: true, reason: "429", interval2: 60 * time.Second, pause: 5 * time.Second},
		{name: "floor 0 first step is 2 s", floor: 0, r: resp(429, "Retry-After", "5"),
			throttled: true, reason: "429", interval2: 2 * time.Second, pause: 5 * time.Second},
		{name: "floor 250ms first step is 2 s", floor: 250 * time.Millisecond, r: resp(429, "Retry-After", "5"),
			throttled: true, reason: "429", interval2: 2 * time.Second, pause: 5 * time.Second},
		{name: "floor 45 s escalates to 60 s", floor: 45 * time.Second, r: resp(429, "Retry-After", "5"),
			throttled: true, reason: "429", interval2: 60 * time.Second, pause: 5 * time.Second},
		{name: "floor 90 s stays at the floor", floor: 90 * time.Second, r: resp(429, "Retry-After", "5"),
			throttled: true, reason: "429", interval2: 90 * time.Second, pause: 5 * time.Second},
		{name: "503 with Retry-After is a throttle", floor: time.Second, r: resp(503, "Retry-After", "30"),
			throttled: true, reason: "503", interval2: 2 * time.Second, pause: 30 * time.Second},
		{name: "503 with Retry-After date", floor: time.Second, r: resp(503, "Retry-After", at(45*time.Second).Format(http.TimeFormat), "Date", dateNow),
			throttled: true, reason: "503", interval2: 2 * time.Second, pause: 45 * time.Second},
		{name: "503 without Retry-After is an error", floor: time.Second, r: resp(503), interval2: time.Second},
		{name: "503 with zero Retry-After is an error", floor: time.Second, r: resp(503, "Retry-After", "0"), interval2: time.Second},
		{name: "503 with malformed Retry-After is an error", floor: time.Second, r: resp(503, "Retry-After", "-5"), interval2: time.Second},
		{name: "500 teaches nothing", floor: time.Second, r: resp(500, "Retry-After", "30"), interval2: time.Second},
		{name: "network error teaches nothing", floor: time.Second, r: pacer.Response{Err: errors.New("eof")}, interval2: time.Second},
		{name: "200 with an exhausted family pauses, interval unchanged", floor: time.Second, interval: 4 * time.Second,
			r: resp(200, "X-RateLimit-Remaining", "0", "X-RateLimit-Reset", "30"), reason: "ratelimit", interval2: 4 * time.Second, pause: 30 * time.Second},
		{name: "200 with remaining quota teaches nothing", floor: time.Second,
			r: resp(200, "X-RateLimit-Remaining", "3", "X-RateLimit-Reset", "30"), interval2: time.Second},
		{name: "404 with an exhausted IETF family pauses", floor: time.Second,
			r: resp(404, "RateLimit", `"default";r=0;t=12`), reason: "ratelimit", interval2: time.Second, pause: 12 * time.Second},
		{name: "500 with an exhausted family pauses", floor: time.Second,
			r: resp(500, "RateLimit-Remaining", "0", "RateLimit-Reset", "7"), reason: "ratelimit", interval2: time.Second, pause: 7 * time.Second},
		{name: "403 with an exhausted family is a throttle until the reset", floor: time.Second,
			r: resp(403, "X-Rate-Limit-Remaining", "0", "X-Rate-Limit-Reset", "1m30s"), throttled: true, reason: "403", interval2: 2 * time.Second, pause: 90 * time.Second},
		{name: "403 without a family is not a throttle", floor: time.Second, r: resp(403), interval2: time.Second},
		{name: "exhausted reset over 600 s is capped", floor: time.Second,
			r: resp(200, "X-RateLimit-Remaining", "0", "X-RateLimit-Reset-After", "3600"), reason: "ratelimit", interval2: time.Second, pause: 600 * time.Second},
		{name: "positive Retry-After wins over a longer reset", floor: time.Second,
			r: resp(429, "Retry-After", "10", "X-RateLimit-Remaining", "0", "X-RateLimit-Reset", "100"), throttled: true, reason: "429", interval2: 2 * time.Second, pause: 10 * time.Second},
		{name: "429 without Retry-After waits the longer of fallback and reset", floor: time.Second,
			r: resp(429, "X-RateLimit-Remaining", "0", "X-RateLimit-Reset", "300"), throttled: true, reason: "429", interval2: 2 * time.Second, pause: 300 * time.Second},
		{name: "longest exhausted family wins", floor: time.Second,
			r:      resp(200, "RateLimit", `"a";r=0;t=5`, "X-RateLimit-Remaining", "0", "X-RateLimit-Reset", "40", "RateLimit-Remaining", "0", "RateLimit-Reset", "20"),
			reason: "ratelimit", interval2: time.Second, pause: 40 * time.Second},
		{name: "an unexhausted family does not hide an exhausted one", floor: time.Second,
			r:      resp(200, "X-RateLimit-Remaining", "0", "X-RateLimit-Reset-After", "9", "X-RateLimit-Reset", strconv.FormatInt(t0.Unix()-100, 10), "RateLimit-Remaining", "5", "RateLimit-Reset", "50"),
			reason: "ratelimit", interval2: time.Second, pause: 9 * time.Second},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := newPacer(t, tt.floor, &pacer.Options{QuietWindow: -1})
			now := t0
			if tt.interval > 0 {
				for i := 0; i < 10; i++ {
					now = escalate(t, p, now, 1).Add(time.Minute)
					if state(t, p, now).Interval >= tt.interval {
						break
					}
				}
				now = recoverAt(t, p, now).Add(time.Minute)
				if got := state(t, p, now).Interval; got != tt.interval {
					t.Fatalf("setup: interval %s, want %s", got, tt.interval)
				}
			}
			pm := mustGrant(t, p, now, 0)
			v := p.Done(now, pm, tt.r)
			if v.Throttled != tt.throttled || v.Reason != tt.reason {
				t.Fatalf("verdict %+v, want throttled %v reason %q", v, tt.throttled, tt.reason)
			}
			wantUntil := time.Time{}
			if tt.pause > 0 {
				wantUntil = now.Add(tt.pause)
			}
			if !v.Until.Equal(wantUntil) {
				t.Fatalf("until %s, want %s", v.Until.Sub(now), tt.pause)
			}
			st := state(t, p, now)
			if st.Interval != tt.interval2 {
				t.Fatalf("interval %s, want %s", st.Interval, tt.interval2)
			}
			if !st.CooldownUntil.Equal(wantUntil) {
				t.Fatalf("state cooldown %v, want %v", st.CooldownUntil, wantUntil)
			}
		})
	}
}

func TestEscalationSequence(t *testing.T) {
	p := newPacer(t, time.Second, &pacer.Options{QuietWindow: -1})
	now := t0
	want := []time.Duration{2, 4, 8, 16, 32, 60, 60}
	for i, w := range want {
		pm := mustGrant(t, p, now, time.Hour)
		if i > 0 && pm.Interval != want[i-1]*time.Second {
			t.Fatalf("step %d: permit interval %s, want %s", i, pm.Interval, want[i-1]*time.Second)
		}
		v := p.Done(pm.Start, pm, resp(429, "Retry-After", "1"))
		if got := state(t, p, pm.Start).Interval; got != w*time.Second {
			t.Fatalf("step %d: interval %s, want %s", i, got, w*time.Second)
		}
		now = v.Until
	}
}

func TestFallbackCeiling(t *testing.T) {
	// Rand just below 1 draws the ceiling itself; each failed probe doubles
	// it up to 600 s; a successful probe resets it to 60 s.
	p := newPacer(t, time.Second, &pacer.Options{Rand: fixedRand(1), QuietWindow: -1})
	now := t0
	v := throttle(t, p, now, resp(429))
	if got := v.Until.Sub(now); got != 60*time.Second {
		t.Fatalf("first fallback %s, want 60s", got)
	}
	for i, want := range []time.Duration{120, 240, 480, 600, 600} {
		now = v.Until
		pm := mustGrant(t, p, now, time.Hour)
		if !pm.Probe {
			t.Fatalf("probe %d: not a probe", i)
		}
		v = p.Done(pm.Start, pm, resp(429))
		if got := v.Until.Sub(pm.Start); got != want*time.Second {
			t.Fatalf("failed probe %d: pause %s, want %s", i, got, want*time.Second)
		}
		if st := state(t, p, pm.Start); st.Ceiling != want*time.Second {
			t.Fatalf("failed probe %d: ceiling %s, want %s", i, st.Ceiling, want*time.Second)
		}
	}
	now = v.Until
	pm := mustGrant(t, p, now, time.Hour)
	if v := p.Done(pm.Start, pm, resp(200)); v.Throttled || !v.Until.IsZero() {
		t.Fatalf("probe success verdict %+v", v)
	}
	st := state(t, p, pm.Start)
	if st.Ceiling != 60*time.Second || !st.CooldownUntil.IsZero() || st.State == pacer.StateCooling {
		t.Fatalf("after recovery %+v", st)
	}
	now = pm.Start.Add(time.Minute)
	v = throttle(t, p, now, resp(429))
	if got := v.Until.Sub(now); got != 60*time.Second {
		t.Fatalf("fallback after recovery %s, want 60s", got)
	}
}

func TestFallbackJitter(t *testing.T) {
	for _, tt := range []struct {
		r    float64
		want time.Duration
	}{{0, 60 * time.Second}, {0.5, 90 * time.Second}, {0.25, 75 * time.Second}} {
		p := newPacer(t, time.Second, &pacer.Options{Rand: fixedRand(tt.r)})
		v := throttle(t, p, t0, resp(429))
		pm := mustGrant(t, p, v.Until, 0)
		v = p.Done(v.Until, pm, resp(429)) // ceiling now 120 s
		if got := v.Until.Sub(pm.Start); got != tt.want {
			t.Errorf("rand %v: pause %s, want %s", tt.r, got, tt.want)
		}
	}
}

func TestNeverShortensAPause(t *testing.T) {
	p := newPacer(t, 0, &pacer.Options{})
	p1 := mustGrant(t, p, t0, 0)
	p2 := mustGrant(t, p, t0, 0)
	v := p.Done(t0, p1, resp(429, "Retry-After", "300"))
	if !v.Until.Equal(at(300 * time.Second)) {
		t.Fatalf("until %s", v.Until.Sub(t0))
	}
	v = p.Done(at(time.Second), p2, resp(429, "Retry-After", "10"))
	if !v.Until.Equal(at(300 * time.Second)) {
		t.Fatalf("shorter pause replaced the longer one: until %s", v.Until.Sub(t0))
	}
	// p2 was in flight with p1, granted before p1's 429 was read: one
	// escalation per signal (ADR 0006 §4), although both came at t0.
	if got := state(t, p, at(time.Second)).Interval; got != 2*time.Second {
		t.Fatalf("interval %s, want 2s (one escalation for the two 429s in flight)", got)
	}
}

func TestExhaustedProbeRecoversThenPauses(t *testing.T) {
	p := newPacer(t, time.Second, nil)
	v := throttle(t, p, t0, resp(429, "Retry-After", "10"))
	pm := mustGrant(t, p, v.Until, 0)
	v = p.Done(pm.Start, pm, resp(200, "X-RateLimit-Remaining", "0", "X-RateLimit-Reset", "20"))
	if v.Throttled || !v.Until.Equal(pm.Start.Add(20*time.Second)) {
		t.Fatalf("verdict %+v", v)
	}
	if re := mustRefuse(t, p, pm.Start.Add(time.Second), time.Hour); re.Reason != pacer.ReasonCooling {
		t.Fatalf("reason %s", re.Reason)
	}
}

func TestNonProbeSuccessDoesNotClearCooldown(t *testing.T) {
	p := newPacer(t, 0, nil)
	p1 := mustGrant(t, p, t0, 0)
	p2 := mustGrant(t, p, t0, 0)
	p.Done(t0, p1, resp(429, "Retry-After", "30"))
	if v := p.Done(at(time.Second), p2, resp(200)); !v.Until.Equal(at(30 * time.Second)) {
		t.Fatalf("a request admitted before the cooldown cleared it: %+v", v)
	}
	mustRefuse(t, p, at(2*time.Second), time.Hour)
}

func TestDecay(t *testing.T) {
	tests := []struct {
		name    string
		floor   time.Duration
		quiet   time.Duration
		after   time.Duration
		want    time.Duration
		signals []time.Duration // more throttles at these offsets
	}{
		{name: "not before the quiet window", floor: time.Second, after: 30*time.Minute - time.Nanosecond, want: 16 * time.Second},
		{name: "halves after one window", floor: time.Second, after: 30 * time.Minute, want: 8 * time.Second},
		{name: "halves per elapsed window", floor: time.Second, after: 90 * time.Minute, want: 2 * time.Second},
		{name: "never below the floor", floor: 3 * time.Second, after: 10 * time.Hour, want: 3 * time.Second},
		{name: "halving clamps to the floor", floor: 700 * time.Millisecond, after: 5 * 30 * time.Minute, want: 700 * time.Millisecond},
		{name: "halving above the floor", floor: 700 * time.Millisecond, after: 4 * 30 * time.Minute, want: time.Second},
		{name: "custom window", floor: time.Second, quiet: time.Minute, after: 2 * time.Minute, want: 4 * time.Second},
		{name: "a throttle restarts the window", floor: time.Second, after: 40 * time.Minute, want: 32 * time.Second, signals: []time.Duration{20 * time.Minute}},
		{name: "an exhausted family restarts the window", floor: time.Second, after: 40 * time.Minute, want: 16 * time.Second, signals: []time.Duration{-20 * time.Minute}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := newPacer(t, tt.floor, &pacer.Options{QuietWindow: tt.quiet})
			l := escalate(t, p, t0, 4) // 2, 4, 8, 16 s (from a 1 s floor)
			for _, s := range tt.signals {
				r := resp(429, "Retry-After", "1")
				if s < 0 { // negative: an exhausted 200 at -s
					s = -s
					r = resp(200, "X-RateLimit-Remaining", "0", "X-RateLimit-Reset", "1")
				}
				pm := mustGrant(t, p, l.Add(s), 0)
				p.Done(pm.Start, pm, r)
			}
			now := l.Add(tt.after)
			if got := state(t, p, now).Interval; got != tt.want {
				t.Fatalf("snapshot interval %s, want %s", got, tt.want)
			}
			// Acquire applies the decay and reports it in the permit.
			pm, err := p.Acquire(now, host, time.Hour)
			if err != nil {
				t.Fatal(err)
			}
			if pm.Interval != tt.want {
				t.Fatalf("permit interval %s, want %s", pm.Interval, tt.want)
			}
		})
	}
}

func TestEvents(t *testing.T) {
	var evs []pacer.Event
	p := newPacer(t, time.Second, &pacer.Options{OnEvent: func(e pacer.Event) { evs = append(evs, e) }})
	v := throttle(t, p, t0, resp(429, "Retry-After", "30"))
	pm := mustGrant(t, p, v.Until, 0)
	p.Done(pm.Start, pm, resp(200))
	p.Acquire(at(31*time.Second+30*time.Minute), host, 0) // decay 2 s → 1 s
	want := []pacer.Event{
		{Type: pacer.EventInterval, Authority: host, At: t0, Status: 429, Reason: "429", Interval: 2 * time.Second},
		{Type: pacer.EventThrottle, Authority: host, At: t0, Status: 429, Reason: "429", Interval: 2 * time.Second, Until: at(30 * time.Second), Ceiling: time.Minute},
		{Type: pacer.EventCooldown, Authority: host, At: t0, Status: 429, Reason: "429", Interval: 2 * time.Second, Until: at(30 * time.Second), Ceiling: time.Minute},
		{Type: pacer.EventRecovered, Authority: host, At: at(30 * time.Second), Status: 200, Interval: 2 * time.Second, Ceiling: time.Minute},
		{Type: pacer.EventInterval, Authority: host, At: at(30 * time.Minute), Reason: "decay", Interval: time.Second},
	}
	if len(evs) != len(want) {
		t.Fatalf("got %d events %+v, want %d", len(evs), evs, len(want))
	}
	for i := range want {
		g, w := evs[i], want[i]
		if g.Type != w.Type || g.Authority != w.Authority || !g.At.Equal(w.At) || g.Status != w.Status ||
			g.Reason != w.Reason || g.Interval != w.Interval || !g.Until.Equal(w.Until) || g.Ceiling != w.Ceiling {
			t.Errorf("event %d:\n got %+v\nwant %+v", i, g, w)
		}
	}
}

func TestDecayOnDone(t *testing.T) {
	var evs []pacer.Event
	p := newPacer(t, time.Second, &pacer.Options{OnEvent: func(e pacer.Event) { evs = append(evs, e) }})
	l := escalate(t, p, t0, 2) // 4 s
	recoverAt(t, p, l.Add(time.Minute))
	pm := mustGrant(t, p, l.Add(29*time.Minute), 0)
	evs = nil
	p.Done(l.Add(31*time.Minute), pm, resp(200))
	// The quiet window halves the interval (4 s to 2 s) at its end; the
	// answer then halves it again, to the floor (ADR 0029).
	if len(evs) != 2 || evs[0].Type != pacer.EventInterval || evs[0].Interval != 2*time.Second || !evs[0].At.Equal(l.Add(30*time.Minute)) ||
		evs[1].Type != pacer.EventInterval || evs[1].Interval != time.Second || !evs[1].At.Equal(l.Add(31*time.Minute)) {
		t.Fatalf("events %+v", evs)
	}
	if st := state(t, p, l.Add(31*time.Minute)); st.Interval != time.Second || st.InFlight != 0 {
		t.Fatalf("state %+v", st)
	}
}

func TestApplyRebuildsState(t *testing.T) {
	// Record a live history, replay it into a fresh pacer, compare.
	var evs []pacer.Event
	live := newPacer(t, time.Second, &pacer.Options{Rand: fixedRand(0.5), OnEvent: func(e pacer.Event) { evs = append(evs, e) }})
	v := throttle(t, live, t0, resp(429))  // interval 2 s, until 60 s
	pm := mustGrant(t, live, v.Until, 0)   // probe
	v = live.Done(pm.Start, pm, resp(429)) // ceiling 120, pause 90 s, interval 4 s
	recoverAt(t, live, at(5*time.Minute))  // ceiling back to 60 s
	v3 := throttle(t, live, at(6*time.Minute), resp(429, "Retry-After", "100"))
	now := at(6*time.Minute + 10*time.Second)

	cold := newPacer(t, time.Second, nil)
	for _, e := range evs {
		cold.Apply(now, e)
	}
	got, want := state(t, cold, now), state(t, live, now)
	if got.Interval != want.Interval || !got.CooldownUntil.Equal(want.CooldownUntil) || got.Ceiling != want.Ceiling || got.State != want.State {
		t.Fatalf("replayed %+v\n    live %+v", got, want)
	}
	if !got.CooldownUntil.Equal(v3.Until) {
		t.Fatalf("cooldown %v, want %v", got.CooldownUntil, v3.Until)
	}
	re := mustRefuse(t, cold, now, time.Hour)
	if re.Reason != pacer.ReasonCooling || !re.Until.Equal(v3.Until) {
		t.Fatalf("cold pacer %+v", re)
	}
}

func TestApplyNeverRuder(t *testing.T) {
	p := newPacer(t, time.Second, nil)
	now := at(time.Hour)
	// an expired cooldown with no recovery still wants a probe
	p.Apply(now, pacer.Event{Type: pacer.EventCooldown, Authority: host, At: at(0), Until: at(time.Minute), Interval: 4 * time.Second, Ceiling: 2 * time.Minute})
	// a recovery from before a later cooldown's deadline does not clear it
	p.Apply(now, pacer.Event{Type: pacer.EventRecovered, Authority: host, At: at(30 * time.Second)})
	pm := mustGrant(t, p, now, 0)
	if !pm.Probe {
		t.Fatalf("replayed unconfirmed cooldown: permit %+v, want a probe", pm)
	}
	mustRefuse(t, p, now, time.Hour)
	if st := state(t, p, now); st.Ceiling != 2*time.Minute {
		t.Fatalf("ceiling %s", st.Ceiling)
	}
	// a later cooldown is not shortened by an earlier, shorter one
	q := newPacer(t, time.Second, nil)
	q.Apply(t0, pacer.Event{Type: pacer.EventCooldown, Authority: host, At: t0, Until: at(5 * time.Minute)})
	q.Apply(t0, pacer.Event{Type: pacer.EventCooldown, Authority: host, At: t0, Until: at(time.Minute)})
	if re := mustRefuse(t, q, at(2*time.Minute), time.Hour); !re.Until.Equal(at(5 * time.Minute)) {
		t.Fatalf("until %v", re.Until)
	}
}

// TestCappedPauseEvents: the pacer logs nothing; what the log line of a
// capped pause needs travels on the events (the facts.Sink writes it).
func TestCappedPauseEvents(t *testing.T) {
	var evs []pacer.Event
	p := newPacer(t, time.Second, &pacer.Options{OnEvent: func(ev pacer.Event) { evs = append(evs, ev) }})
	first := mustGrant(t, p, t0, 0)
	second := mustGrant(t, p, t0, time.Hour)
	v := p.Done(t0, first, resp(429, "Retry-After", "7200"))
	if !v.Until.Equal(at(600 * time.Second)) {
		t.Fatalf("until %s", v.Until.Sub(t0))
	}
	// A second capped answer that leaves the cooldown as it was changes
	// nothing but is reported (EventCapped).
	p.Done(t0, second, resp(429, "Retry-After", "7200"))
	if last := evs[len(evs)-1]; last.Type != pacer.EventCapped || last.Asked != 7200*time.Second || last.Pause != 600*time.Second {
		t.Errorf("last event %+v, want EventCapped asking 7200 s, capped to 600 s", last)
	}
	pm := mustGrant(t, p, v.Until, 0)
	p.Done(pm.Start, pm, resp(200))
	var cooldown, recovered *pacer.Event
	for i := range evs {
		switch evs[i].Type {
		case pacer.EventCooldown:
			cooldown = &evs[i]
		case pacer.EventRecovered:
			recovered = &evs[i]
		}
	}
	if cooldown == nil || cooldown.Asked != 7200*time.Second || cooldown.Pause != 600*time.Second || cooldown.Extended || cooldown.Fallback {
		t.Errorf("cooldown event %+v, want asked 7200 s capped to a 600 s pause, entered, not the fallback", cooldown)
	}
	if recovered == nil || recovered.Status != 200 {
		t.Errorf("recovered event %+v", recovered)
	}
	b, err := json.Marshal(cooldown)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(b), "asked") || strings.Contains(string(b), "7200") {
		t.Errorf("published form carries the log-only fields: %s", b)
	}
}

func TestStatesAndCounts(t *testing.T) {
	p := newPacer(t, time.Second, &pacer.Options{})
	a, b, c, d := "a.example:443", "b.example:443", "c.example:80", "[2001:db8::1]:8443"
	pa, _ := p.Acquire(t0, a, 0)
	p.Done(t0, pa, resp(200)) // idle after its slot
	p.Acquire(t0, b, 0)       // active: in flight
	pc, _ := p.Acquire(t0, c, 0)
	p.Done(t0, pc, resp(429, "Retry-After", "30")) // cooling
	pd, _ := p.Acquire(t0, d, 0)
	p.Done(t0, pd, resp(429, "Retry-After", "1")) // probing at 10 s
	now := at(10 * time.Second)
	pe, err := p.Acquire(now, d, 0)
	if err != nil || !pe.Probe {
		t.Fatalf("probe %v %v", pe, err)
	}
	got := p.Counts(now)
	want := map[string]int{"idle": 1, "active": 1, "escalated": 0, "cooling": 1, "probing": 1}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("counts[%s] = %d, want %d (%v)", k, got[k], v, got)
		}
	}
	snap := p.Snapshot(now)
	if len(snap) != 4 || snap[0].Authority != d || snap[1].Authority != a {
		t.Fatalf("snapshot not sorted: %+v", snap)
	}
	if s := snap[0]; !s.Probing || s.InFlight != 1 || s.State != "probing" || s.MaxInFlight != 2 || s.Floor != time.Second || s.Interval != 2*time.Second {
		t.Errorf("probing state %+v", s)
	}
	if s := snap[3]; s.Authority != c || !s.CooldownUntil.Equal(at(30*time.Second)) || !s.LastThrottle.Equal(t0) {
		t.Errorf("cooling state %+v", s)
	}
	// after the probe succeeds and the quiet window passes, d is idle again,
	// then escalated in between
	p.Done(now, pe, resp(200))
	if got := p.Counts(at(time.Minute))["escalated"]; got != 1 {
		t.Errorf("escalated = %d, want 1", got)
	}
}

func TestEviction(t *testing.T) {
	p := newPacer(t, time.Second, &pacer.Options{MaxEntries: 3})
	hot := "hot.example:443"
	ph, _ := p.Acquire(t0, hot, 0)
	p.Done(t0, ph, resp(429, "Retry-After", "600")) // cooling: never evicted
	busy := "busy.example:443"
	p.Acquire(t0, busy, 0) // in flight: never evicted
	idle := "idle.example:443"
	pi, _ := p.Acquire(t0, idle, 0)
	p.Done(t0, pi, resp(200))
	// Within idle's floor it must not be forgotten: forgetting would allow
	// a start closer than the floor.
	px, _ := p.Acquire(at(500*time.Millisecond), "x1.example:443", 0)
	p.Done(at(600*time.Millisecond), px, resp(200))
	if _, err := p.Acquire(at(500*time.Millisecond), idle, 0); err == nil {
		t.Fatal("idle entry forgotten inside its floor")
	}
	names := func(now time.Time) map[string]bool {
		m := map[string]bool{}
		for _, s := range p.Snapshot(now) {
			m[s.Authority] = true
		}
		return m
	}
	// x1 is now the 4th entry (soft limit exceeded: nothing was evictable).
	if n := len(p.Snapshot(at(time.Second))); n != 4 {
		t.Fatalf("%d entries, want 4", n)
	}
	// Much later, idle and x1 are idle at their floor and get evicted when a
	// new authority needs room; hot (cooling) and busy (in flight) stay.
	p.Acquire(at(time.Minute), "x2.example:443", 0)
	m := names(at(time.Minute))
	if !m[hot] || !m[busy] || !m["x2.example:443"] || m[idle] || m["x1.example:443"] {
		t.Fatalf("after eviction: %v", m)
	}
	// An escalated entry is kept even after its cooldown has been confirmed.
	pp, err := p.Acquire(at(11*time.Minute), hot, 0)
	if err != nil || !pp.Probe {
		t.Fatalf("probe %v %v", pp, err)
	}
	p.Done(at(11*time.Minute), pp, resp(200))
	for i := 0; i < 5; i++ {
		p.Acquire(at(12*time.Minute+time.Duration(i)*time.Minute), "y"+string(rune('a'+i))+".example:443", 0)
	}
	if m := names(at(20 * time.Minute)); !m[hot] || !m[busy] {
		t.Fatalf("escalated or busy entry evicted: %v", m)
	}
}

func TestPolicyPerAuthority(t *testing.T) {
	pol, err := pacer.ParsePolicy([]byte(`{"default":{"floor":"2s"},"authorities":{"Files.Example.ORG:443":{"floor":"250ms","max_in_flight":1}}}`))
	if err != nil {
		t.Fatal(err)
	}
	p := pacer.New(&pacer.Options{Policy: pol, StartGuard: -1})
	pm := mustGrant(t, p, t0, 0)
	if re := mustRefuse(t, p, at(300*time.Millisecond), 0); re.Reason != pacer.ReasonInFlight {
		t.Fatalf("cap 1: %+v", re)
	}
	p.Done(t0, pm, resp(200))
	mustGrant(t, p, at(250*time.Millisecond), 0)
	p.Acquire(t0, "other.example:443", 0)
	var re *pacer.RefusedError
	if _, err := p.Acquire(at(1999*time.Millisecond), "other.example:443", 0); !errors.As(err, &re) || re.Reason != pacer.ReasonSpacing || re.Wait != time.Millisecond {
		t.Fatalf("default floor 2s not applied: %v", err)
	}
}

func TestDoneWithoutAcquire(t *testing.T) {
	p := newPacer(t, time.Second, nil)
	if v := p.Done(t0, pacer.Permit{Authority: host}, resp(200)); v != (pacer.Verdict{}) {
		t.Fatalf("verdict %+v", v)
	}
	if len(p.Snapshot(t0)) != 0 {
		t.Fatal("a no-op Done created state")
	}
	// A throttle is still learned: it is the origin speaking.
	v := p.Done(t0, pacer.Permit{Authority: host}, resp(429, "Retry-After", "30"))
	if !v.Throttled || !v.Until.Equal(at(30*time.Second)) {
		t.Fatalf("verdict %+v", v)
	}
}

func TestNilOptionsDefaults(t *testing.T) {
	// Floor 1 s, start guard 2 ms (spacing 1.002 s, reported interval 1 s).
	p := pacer.New(nil)
	mustGrant(t, p, t0, 0)
	if re := mustRefuse(t, p, at(999*time.Millisecond), 0); re.Wait != 3*time.Millisecond || re.Interval != time.Second {
		t.Fatalf("%+v", re)
	}
	if pm := mustGrant(t, p, at(1002*time.Millisecond), 0); pm.Interval != time.Second {
		t.Fatalf("%+v", pm)
	}
	if re := mustRefuse(t, p, at(2*time.Second), 0); re.Reason != pacer.ReasonInFlight {
		t.Fatalf("%+v", re)
	}
}

func TestConfirmRevokesAReservationOvertakenByACooldown(t *testing.T) {
	// Floor 1 s, cap 2: the second request reserves the slot at t0+1s. A 429
	// answered at t0+500ms starts a 30 s cooldown; the reservation must not go.
	p := newPacer(t, time.Second, nil)
	p1 := mustGrant(t, p, t0, 0)
	p2 := mustGrant(t, p, t0, 2*time.Second)
	if !p2.Start.Equal(at(time.Second)) {
		t.Fatalf("reserved start = %s, want 1s", p2.Start.Sub(t0))
	}
	if got, err := p.Confirm(at(time.Second), p2); err != nil || got.Probe {
		t.Fatalf("Confirm before any cooldown = %+v, %v; want the permit unchanged", got, err)
	}
	p.Done(at(500*time.Millisecond), p1, resp(429, "Retry-After", "30"))
	_, err := p.Confirm(at(time.Second), p2)
	var re *pacer.RefusedError
	if !errors.As(err, &re) || re.Reason != pacer.ReasonCooling || re.Wait != 29500*time.Millisecond {
		t.Fatalf("Confirm during the cooldown = %v, want cooling with 29.5s left", err)
	}
	p.Done(at(time.Second), p2, pacer.Response{Cancelled: true})
	if s := state(t, p, at(time.Second)); s.InFlight != 0 {
		t.Fatalf("in flight after the revoked permit was given back = %d, want 0", s.InFlight)
	}
}

func TestConfirmAfterTheDeadlineMakesTheReservationTheProbe(t *testing.T) {
	p := newPacer(t, 0, nil)
	p1 := mustGrant(t, p, t0, 0)
	p2 := mustGrant(t, p, t0, 0)
	p.Done(t0, p1, resp(429, "Retry-After", "5"))
	// p2 was granted before the cooldown; it is confirmed after the deadline
	// with no probe out, so it becomes the probe.
	pr, err := p.Confirm(at(6*time.Second), p2)
	if err != nil || !pr.Probe {
		t.Fatalf("Confirm after the deadline = %+v, %v; want the probe", pr, err)
	}
	if re := mustRefuse(t, p, at(6*time.Second), 0); re.Reason != pacer.ReasonProbing {
		t.Fatalf("second caller while the confirmed probe runs: %s, want probing", re.Reason)
	}
	if v := p.Done(at(7*time.Second), pr, resp(200)); !v.Until.IsZero() {
		t.Fatalf("probe success left a cooldown: %+v", v)
	}
	// The probe actually started at 6 s: the next start keeps the escalated
	// 2 s interval from there, not from its reservation at 0.
	if re := mustRefuse(t, p, at(7*time.Second), 0); re.Reason != pacer.ReasonSpacing || re.Wait != time.Second {
		t.Fatalf("Acquire 1 s after the probe started: %+v, want spacing 1s", re)
	}
	mustGrant(t, p, at(8*time.Second), 0)

	// A stale reservation confirmed while another request is the probe is refused.
	p = newPacer(t, 0, nil)
	q1 := mustGrant(t, p, t0, 0)
	q2 := mustGrant(t, p, t0, 0)
	p.Done(t0, q1, resp(429, "Retry-After", "1"))
	probe := mustGrant(t, p, at(2*time.Second), 0)
	if !probe.Probe {
		t.Fatal("first grant after the deadline is not the probe")
	}
	var re *pacer.RefusedError
	if _, err := p.Confirm(at(2*time.Second), q2); !errors.As(err, &re) || re.Reason != pacer.ReasonProbing {
		t.Fatalf("Confirm of a stale reservation while a probe runs = %v, want probing", err)
	}
}

// TestFenceFromAFutureInstant: a take-over that holds its first request
// (an expired lease, docs/adr/0007) fences from the end of the hold: no
// start before it plus the interval, and a fence in the past spaces from
// there as before.
func TestFenceFromAFutureInstant(t *testing.T) {
	tests := []struct {
		name  string
		fence time.Duration // from t0, the instant passed to Fence at t0
		first time.Duration // the first instant a request is granted
	}{
		{name: "past", fence: -400 * time.Millisecond, first: 600 * time.Millisecond},
		{name: "now", fence: 0, first: time.Second},
		{name: "future", fence: 2 * time.Second, first: 3 * time.Second},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := newPacer(t, time.Second, nil)
			p.Fence(t0, host, at(tt.fence))
			re := mustRefuse(t, p, t0, 0)
			if re.Wait != tt.first {
				t.Fatalf("refused at t0 with wait %s, want %s", re.Wait, tt.first)
			}
			mustRefuse(t, p, at(tt.first-time.Millisecond), 0)
			pm := mustGrant(t, p, at(tt.first), 0)
			p.Done(at(tt.first), pm, resp(200))
		})
	}
}

// TestOperatorPauseKeepsItsReason: State names the reason of the pause in
// force (the longest), until a resume ends it (issue 36 item 7: status
// showed a pause without its reason).
func TestOperatorPauseKeepsItsReason(t *testing.T) {
	p := newPacer(t, 0, &pacer.Options{})
	mustGrant(t, p, t0, 0) // the authority is tracked
	steps := []struct {
		name       string
		ev         *pacer.Event
		now        time.Time
		wantReason string
	}{
		{"a pause", &pacer.Event{Type: pacer.EventPaused, Until: at(10 * time.Minute), Reason: "origin maintenance"}, at(time.Second), "origin maintenance"},
		{"a shorter pause does not replace it", &pacer.Event{Type: pacer.EventPaused, Until: at(time.Minute), Reason: "short"}, at(2 * time.Second), "origin maintenance"},
		{"a longer one does", &pacer.Event{Type: pacer.EventPaused, Until: at(time.Hour), Reason: "abuse report"}, at(3 * time.Second), "abuse report"},
		{"a resume ends it", &pacer.Event{Type: pacer.EventResumed}, at(4 * time.Second), ""},
	}
	for _, s := range steps {
		s.ev.Authority, s.ev.At = host, s.now
		p.Apply(s.now, *s.ev)
		if got := state(t, p, s.now).PauseReason; got != s.wantReason {
			t.Errorf("%s: reason %q, want %q", s.name, got, s.wantReason)
		}
	}
}
