package pacer_test

import (
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/mirrorworker/mirrorworker/pacer"
)

// The worker's loop around one request: ask, wait for Start, fetch, report.
// Time is a parameter, so this example runs on fixed instants.
func Example() {
	p := pacer.New(nil) // floor 1 s, 2 in flight, quiet window 30 min
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	auth := "files.example.org:443" // authority.Authority.String()

	pm, err := p.Acquire(now, auth, 0)
	fmt.Println("first:", err == nil, pm.Start.Equal(now))

	// A second request within the floor: refused, or reserved if the caller
	// can wait that long. Starts are spaced by the floor plus a 2 ms start
	// guard against scheduling jitter on the way to the socket.
	_, err = p.Acquire(now.Add(200*time.Millisecond), auth, 0)
	fmt.Println("second:", err)
	pm2, _ := p.Acquire(now.Add(200*time.Millisecond), auth, time.Second)
	fmt.Println("reserved for:", pm2.Start.Sub(now))

	// The origin throttles the first request.
	v := p.Done(now.Add(500*time.Millisecond), pm, pacer.Response{
		Status: http.StatusTooManyRequests,
		Header: http.Header{"Retry-After": {"30"}},
	})
	fmt.Println("verdict:", v.Throttled, v.Reason, v.Until.Sub(now))
	p.Done(now.Add(1500*time.Millisecond), pm2, pacer.Response{Status: http.StatusOK})

	// Until the deadline every caller is deferred with the remaining time.
	_, err = p.Acquire(now.Add(10*time.Second), auth, time.Minute)
	var re *pacer.RefusedError
	if errors.As(err, &re) {
		fmt.Println("deferred:", re.Reason, re.Wait, "interval", re.Interval)
	}

	// After it, one probe; its success restores ordinary traffic.
	probe, _ := p.Acquire(now.Add(31*time.Second), auth, 0)
	_, err = p.Acquire(now.Add(31*time.Second), auth, 0)
	fmt.Println("probe:", probe.Probe, "other:", err)
	p.Done(now.Add(32*time.Second), probe, pacer.Response{Status: http.StatusOK})
	fmt.Println(p.Counts(now.Add(33 * time.Second))["escalated"], "escalated authority")

	// Output:
	// first: true true
	// second: pacer: files.example.org:443 spacing, retry in 802ms
	// reserved for: 1.002s
	// verdict: true 429 30.5s
	// deferred: cooling 20.5s interval 2s
	// probe: true other: pacer: files.example.org:443 probing, retry in 1s
	// 1 escalated authority
}

// Confirm before every request start: a slot that wakes late moves the next
// reservation, which waits for its new Start and confirms again.
func ExamplePacer_Confirm() {
	p := pacer.New(&pacer.Options{
		Policy:     &pacer.Policy{Default: pacer.Limits{Floor: 100 * time.Millisecond, MaxInFlight: 4}},
		StartGuard: -1, // none, to keep the numbers round
	})
	t0 := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	auth := "files.example.org:443"

	first, _ := p.Acquire(t0, auth, 0)
	a, _ := p.Acquire(t0, auth, time.Second)
	b, _ := p.Acquire(t0, auth, time.Second)
	fmt.Println("reserved:", a.Start.Sub(t0), b.Start.Sub(t0))

	first, _ = p.Confirm(t0, first)                   // starts now
	a, _ = p.Confirm(t0.Add(125*time.Millisecond), a) // woke 25 ms late: starts now anyway
	now := b.Start                                    // b wakes on time...
	b, _ = p.Confirm(now, b)
	fmt.Println("b moved to:", b.Start.Sub(t0)) // ...but must keep 100 ms after a
	now = b.Start
	b, _ = p.Confirm(now, b)
	fmt.Println("b starts at:", now.Sub(t0), b.Start.Equal(now))

	for _, pm := range []pacer.Permit{first, a, b} {
		p.Done(now, pm, pacer.Response{Status: http.StatusOK})
	}
	// Output:
	// reserved: 100ms 200ms
	// b moved to: 225ms
	// b starts at: 225ms true
}
