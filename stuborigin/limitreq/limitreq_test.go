package limitreq_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/mirrorworker/mirrorworker/stuborigin/limitreq"
)

// TestAdmitIsNginxArithmetic runs scripts of requests on virtual instants
// against nginx's limit_req rule. The case that the project's earlier
// copies got wrong is the pause: nginx adds the request before clamping the
// excess at 0, so an empty bucket admits burst + 1 in a row every time, not
// only on a key's first request.
func TestAdmitIsNginxArithmetic(t *testing.T) {
	ms := time.Millisecond
	type req struct {
		at     time.Duration
		ok     bool
		excess int64 // milli-requests after (or, refused, that would be)
	}
	tests := []struct {
		name  string
		limit limitreq.Limit
		reqs  []req
	}{
		{
			name:  "a new key: burst + 1 at once",
			limit: limitreq.Limit{Rate: 10, Burst: 2},
			reqs:  []req{{0, true, 0}, {0, true, 1000}, {0, true, 2000}, {0, false, 3000}},
		},
		{
			name:  "after a pause: burst + 1 again, not burst",
			limit: limitreq.Limit{Rate: 10, Burst: 2},
			reqs: []req{
				{0, true, 0}, {0, true, 1000}, {0, true, 2000}, {0, false, 3000},
				// 2000 leaks in 200 ms; 300 ms later the bucket sat empty 100 ms.
				{300 * ms, true, 0}, {300 * ms, true, 1000}, {300 * ms, true, 2000}, {300 * ms, false, 3000},
			},
		},
		{
			name:  "at the rate: one per 1/rate, each leaving the excess where it was",
			limit: limitreq.Limit{Rate: 10, Burst: 0},
			reqs:  []req{{0, true, 0}, {99 * ms, false, 10}, {100 * ms, true, 0}, {200 * ms, true, 0}, {250 * ms, false, 500}},
		},
		{
			name:  "a refusal costs nothing",
			limit: limitreq.Limit{Rate: 2, Burst: 1},
			reqs: []req{
				{0, true, 0}, {0, true, 1000}, {100 * ms, false, 1800}, {200 * ms, false, 1600},
				{500 * ms, true, 1000}, // 1000 - 1000 + 1000: the refusals added nothing
			},
		},
		{
			name:  "within one millisecond: no leak",
			limit: limitreq.Limit{Rate: 1000, Burst: 1},
			reqs: []req{
				{0, true, 0}, {0, true, 1000}, {999 * time.Microsecond, false, 2000},
				{1 * ms, true, 1000},
			},
		},
		{
			name:  "a clock stepped back: no leak, and last stays the later instant",
			limit: limitreq.Limit{Rate: 10, Burst: 1},
			reqs:  []req{{time.Second, true, 0}, {500 * ms, true, 1000}, {400 * ms, false, 2000}, {1100 * ms, true, 1000}},
		},
	}
	t0 := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var b limitreq.Bucket
			for i, r := range tt.reqs {
				ok, excess := b.Admit(tt.limit, t0.Add(r.at))
				if ok != r.ok || excess != r.excess {
					t.Fatalf("request %d at %v: admitted %v excess %d, want %v %d", i, r.at, ok, excess, r.ok, r.excess)
				}
			}
		})
	}
}

// TestAllowanceIsWhatABlastGets checks Allowance against Admit: a key that
// sends as fast as it can for d from an empty bucket gets Allowance(d)
// requests, give or take the one in flight at d.
func TestAllowanceIsWhatABlastGets(t *testing.T) {
	l := limitreq.Limit{Rate: 10, Burst: 5}
	lim := limitreq.Limiter{Limit: l}
	t0 := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	const d = 3 * time.Second
	admitted := 0
	for at := time.Duration(0); at <= d; at += time.Millisecond {
		for lim.Admit(t0.Add(at)) {
			admitted++
		}
	}
	if want := l.Allowance(d); float64(admitted) < want-1 || float64(admitted) > want {
		t.Errorf("a blast for %s got %d admissions, Allowance says %.1f", d, admitted, want)
	}
}

func ExampleLimiter() {
	lim := limitreq.Limiter{Limit: limitreq.Limit{Rate: 2, Burst: 1}}
	t0 := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	for _, at := range []time.Duration{0, 0, 0, 500 * time.Millisecond, 10 * time.Second, 10 * time.Second, 10 * time.Second} {
		fmt.Println(at, lim.Admit(t0.Add(at)))
	}
	// Output:
	// 0s true
	// 0s true
	// 0s false
	// 500ms true
	// 10s true
	// 10s true
	// 10s false
}
