package strategy_test

import (
	"fmt"
	"net/http"
	"time"

	"github.com/mirrorworker/mirrorworker/pacer"
	"github.com/mirrorworker/mirrorworker/strategy"
)

// A crawler's domain backoff doubles its spacing on a 429 and ignores the
// origin's Retry-After; at scale 0.01 its 2 s first step is 20 ms. Like the
// HostPacer, it adds a start guard of a quarter of the floor (2.5 ms).
func ExampleNew() {
	p, err := strategy.New(strategy.Escalate, strategy.Options{Floor: 10 * time.Millisecond, Scale: 0.01})
	if err != nil {
		panic(err)
	}
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	pm, _ := p.Acquire(now, "origin.example:443", 0)
	v := p.Done(now, pm, pacer.Response{Status: 429, Header: http.Header{"Retry-After": {"30"}}})
	fmt.Println("throttled:", v.Throttled)
	_, err = p.Acquire(now.Add(5*time.Millisecond), "origin.example:443", 0)
	fmt.Println(err)
	pm, _ = p.Acquire(now.Add(22500*time.Microsecond), "origin.example:443", 0)
	fmt.Println("interval:", pm.Interval)
	// Output:
	// throttled: true
	// pacer: origin.example:443 spacing, retry in 15.2ms
	// interval: 20ms
}
