package stuborigin

import (
	"testing"
	"time"

	"github.com/mirrorworker/mirrorworker/stuborigin/limitreq"
)

// step is one request of a limiter script: at offset from the start, the
// answer expected.
type step struct {
	at    time.Duration
	ok    bool
	delay time.Duration // limit_req only: how long nginx would hold it
}

// TestLeakyBucketIsNginxLimitReq runs nginx's limit_req semantics on
// virtual instants: burst B admits B+1 at once (the first request makes a
// node with excess 0), the excess leaks at the rate in milli-requests, a
// refused request leaves the state as it was, and without nodelay an
// admitted request beyond delay= is held (excess - delay) / rate.
func TestLeakyBucketIsNginxLimitReq(t *testing.T) {
	ms := time.Millisecond
	tests := []struct {
		name  string
		l     LimitReq
		steps []step
	}{
		{
			name: "burst 5 nodelay: six at once, then one per 500 ms",
			l:    LimitReq{Rate: 2, Burst: 5, NoDelay: true},
			steps: []step{
				{0, true, 0}, {0, true, 0}, {0, true, 0}, {0, true, 0}, {0, true, 0}, {0, true, 0},
				{0, false, 0},
				{499 * ms, false, 0}, // excess 5000 - 998 + 1000 > 5000
				{500 * ms, true, 0},  // 5000 - 1000 + 1000 = 5000: admitted
				{500 * ms, false, 0},
				{1000 * ms, true, 0},
			},
		},
		{
			name: "refusals cost nothing: retrying early does not push the bucket further",
			l:    LimitReq{Rate: 2, Burst: 0, NoDelay: true},
			steps: []step{
				{0, true, 0},
				{100 * ms, false, 0}, {200 * ms, false, 0}, {300 * ms, false, 0}, {400 * ms, false, 0},
				{500 * ms, true, 0},
				{999 * ms, false, 0},
				{1000 * ms, true, 0},
			},
		},
		{
			name: "burst without nodelay: admitted requests are held excess/rate",
			l:    LimitReq{Rate: 2, Burst: 3},
			steps: []step{
				{0, true, 0}, {0, true, 500 * ms}, {0, true, 1000 * ms}, {0, true, 1500 * ms},
				{0, false, 0},
				{250 * ms, false, 0}, // 3000 - 500 + 1000 = 3500 > 3000
				{500 * ms, true, 1500 * ms},
			},
		},
		{
			name: "delay=2: two beyond the first served at once, the rest held",
			l:    LimitReq{Rate: 10, Burst: 4, Delay: 2},
			steps: []step{
				{0, true, 0}, {0, true, 0}, {0, true, 0}, {0, true, 100 * ms}, {0, true, 200 * ms},
				{0, false, 0},
			},
		},
		{
			name: "30r/m: the excess leaks 0.5 per second",
			l:    LimitReq{Rate: 0.5, NoDelay: true},
			steps: []step{
				{0, true, 0}, {1999 * ms, false, 0}, {2000 * ms, true, 0},
			},
		},
		{
			name: "idle for long: the excess never goes below zero",
			l:    LimitReq{Rate: 1, Burst: 1, NoDelay: true},
			steps: []step{
				{0, true, 0}, {time.Hour, true, 0}, {time.Hour, true, 0}, {time.Hour, false, 0},
			},
		},
	}
	start := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if err := tt.l.validate(); err != nil {
				t.Fatal(err)
			}
			var ls limitreq.Bucket
			for i, s := range tt.steps {
				ok, delay := admitLimitReq(&ls, &tt.l, start.Add(s.at))
				if ok != s.ok || delay != s.delay {
					t.Fatalf("request %d at %v: admitted %v held %v, want %v held %v (state %+v)", i, s.at, ok, delay, s.ok, s.delay, ls)
				}
			}
		})
	}
}

// TestStickTableIsHAProxyRequestRate runs HAProxy's http_req_rate on
// virtual instants: every request is counted, refused ones too, and the
// previous period counts for the share of the current one still to run.
func TestStickTableIsHAProxyRequestRate(t *testing.T) {
	s := StickTable{Period: Duration{10 * time.Second}, Limit: 3}
	if err := s.validate(); err != nil {
		t.Fatal(err)
	}
	sec := time.Second
	steps := []step{
		{0, true, 0}, {sec, true, 0}, {2 * sec, true, 0},
		{3 * sec, false, 0}, // rate 4 > 3
		{9 * sec, false, 0}, // rate 5: refused requests count
		// A new period: prev 5 weighted by 9/10 = 4 (truncated), + 1.
		{11 * sec, false, 0},
		// 19 s: prev 5 x 1/10 = 0, curr 2 (the refused one at 11 s counted).
		{19 * sec, true, 0},
		// Two periods idle: prev forgotten.
		{40 * sec, true, 0}, {40 * sec, true, 0}, {40 * sec, true, 0}, {40 * sec, false, 0},
	}
	start := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	var rs rateState
	for i, st := range steps {
		ok := rs.track(s.Period.Duration, start.Add(st.at)) <= s.Limit
		if ok != st.ok {
			t.Fatalf("request %d at %v: admitted %v, want %v (state %+v)", i, st.at, ok, st.ok, rs)
		}
	}
}
