package stuborigin_test

import (
	"context"
	"fmt"
	"net/http"
	"time"

	"github.com/mirrorworker/mirrorworker/clock"
	"github.com/mirrorworker/mirrorworker/stuborigin"
)

// A load test starts the origin in-process, sends traffic, and reads what
// the origin saw.
func Example() {
	p, err := stuborigin.ParseProfile([]byte(`{
		"name": "example",
		"quotas": {"anonymous": {
			"burst": {"capacity": 2, "refill_per_second": 1},
			"sustained": {"capacity": 10, "window": "10s"}}}}`))
	if err != nil {
		panic(err)
	}
	fc := clock.NewFake(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	og, err := stuborigin.New(p, &stuborigin.Options{Authorities: 2, Clock: fc})
	if err != nil {
		panic(err)
	}
	urls, err := og.Start(context.Background(), "127.0.0.1:0")
	if err != nil {
		panic(err)
	}
	defer og.Close()

	c := &http.Client{Transport: &http.Transport{}}
	for range 3 {
		resp, err := c.Get(urls[0] + "/file.bin?size=1000")
		if err != nil {
			panic(err)
		}
		resp.Body.Close()
		fmt.Printf("%d Retry-After=%q\n", resp.StatusCode, resp.Header.Get("Retry-After"))
	}
	a := og.Stats().Authorities[0]
	fmt.Printf("requests %d admitted %d 429s %d early %d\n", a.Requests, a.Admitted, a.RateLimited, a.Early)
	fmt.Printf("allowed %.1f/s per identity and authority\n", p.SustainedRate("anonymous"))
	// Output:
	// 200 Retry-After=""
	// 200 Retry-After=""
	// 429 Retry-After="1"
	// requests 3 admitted 2 429s 1 early 0
	// allowed 1.0/s per identity and authority
}
