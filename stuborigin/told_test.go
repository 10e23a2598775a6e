package stuborigin_test

import (
	"context"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/mirrorworker/mirrorworker/clock"
	"github.com/mirrorworker/mirrorworker/stuborigin"
)

// TestToldIsEveryAnswerThatTellsAWait: each answer that tells its caller a
// deadline is reported once (Options.OnTold), to the identity the arrivals
// name, with the deadline it told and an instant of writing no sooner than
// the decision; a request before that deadline arrives early. A refusal
// without Retry-After tells nothing.
func TestToldIsEveryAnswerThatTellsAWait(t *testing.T) {
	tests := []struct {
		name  string
		lr    stuborigin.LimitReq
		until time.Duration // 0: the refusal tells no deadline
	}{
		{name: "429 with Retry-After 2", lr: stuborigin.LimitReq{Rate: 1, NoDelay: true, Status: 429, RetryAfter: dur(2 * time.Second)}, until: 2 * time.Second},
		{name: "nginx's default 503 without Retry-After", lr: stuborigin.LimitReq{Rate: 1, NoDelay: true}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var (
				mu       sync.Mutex
				arrivals []stuborigin.Arrival
				told     []stuborigin.Told
			)
			fc := clock.NewFake(t0)
			og, err := stuborigin.New(&stuborigin.Profile{Name: "nginx", LimitReq: &tt.lr}, &stuborigin.Options{
				Clock:     fc,
				OnArrival: func(a stuborigin.Arrival) { mu.Lock(); arrivals = append(arrivals, a); mu.Unlock() },
				OnTold:    func(tl stuborigin.Told) { mu.Lock(); told = append(told, tl); mu.Unlock() },
			})
			if err != nil {
				t.Fatal(err)
			}
			urls, err := og.Start(context.Background(), "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			defer og.Close()
			c := clientFrom(t, "127.0.0.1")
			if r := get(t, c, urls[0]+"/f"); r.status != http.StatusOK {
				t.Fatalf("first: %d", r.status)
			}
			refused := get(t, c, urls[0]+"/f")
			fc.Advance(500 * time.Millisecond)
			again := get(t, c, urls[0]+"/f")
			if refused.status == http.StatusOK || again.status == http.StatusOK {
				t.Fatalf("statuses %d, %d: want two refusals", refused.status, again.status)
			}
			mu.Lock()
			defer mu.Unlock()
			if len(arrivals) != 3 {
				t.Fatalf("%d arrivals, want 3", len(arrivals))
			}
			if tt.until == 0 {
				if len(told) != 0 || arrivals[2].Early {
					t.Errorf("told %+v, third early %v: want nothing told, nothing early", told, arrivals[2].Early)
				}
				return
			}
			if len(told) != 2 {
				t.Fatalf("told %d times, want 2 (each refusal): %+v", len(told), told)
			}
			first := told[0]
			if first.Identity != arrivals[1].Identity || !first.Decided.Equal(arrivals[1].Handled) ||
				!first.Until.Equal(first.Decided.Add(tt.until)) || first.Written.Before(first.Decided) {
				t.Errorf("told %+v for arrival %+v: want its identity, decided when handled, until %v later, written no sooner", first, arrivals[1], tt.until)
			}
			if arrivals[1].Early || !arrivals[2].Early {
				t.Errorf("early: refusal %v, next %v; want false, true", arrivals[1].Early, arrivals[2].Early)
			}
		})
	}
}
