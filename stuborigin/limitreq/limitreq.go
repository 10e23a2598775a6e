// Package limitreq is nginx's limit_req arithmetic (ngx_http_limit_req_module),
// the one model of it that the stub origin and the tests of the pacer and of
// the worker's processes share: a leaky bucket per key, counted as nginx
// counts it, in milli-requests and whole milliseconds.
//
// It provides the admission rule only: no keys, no zones, no HTTP, no
// delaying of requests (a caller that wants nginx's delay= computes it from
// the excess Admit returns). It depends on nothing but the standard library,
// so that the pacer's black-box tests can import it without a cycle.
//
// The rule, as nginx documents and implements it: a key's node keeps an
// excess (requests admitted beyond the rate and not yet leaked) and the
// instant of its last accounted request. A request computes
//
//	excess' = max(excess - rate x elapsed + 1, 0)
//
// and is refused when excess' > burst, leaving the node as it was (a refusal
// costs nothing). An admitted request stores excess'. A new node starts at
// excess 0 with its first request admitted. Because the +1 comes before the
// clamp to 0, an admission into a bucket that has drained empty (idle for
// more than 1/rate) leaves it at 0, not 1: after every pause the bucket
// admits burst + 1 requests in a row, not burst.
package limitreq

import (
	"math"
	"time"
)

// Limit is one limit_req: the rate its zone leaks (limit_req_zone rate=) and
// the burst its location allows (limit_req burst=).
type Limit struct {
	// Rate is requests per second (0.5 is nginx's 30r/m). nginx stores it
	// in whole milli-requests per second; so does Admit.
	Rate float64
	// Burst is nginx's burst= (0: nothing beyond the rate).
	Burst int64
}

// RateMilli is nginx's ctx->rate: the rate in whole milli-requests per
// second.
func (l Limit) RateMilli() int64 { return int64(math.Round(l.Rate * 1000)) }

// Allowance is how many requests l admits a key in d from an empty bucket,
// at most: burst + 1 at once, then the rate.
func (l Limit) Allowance(d time.Duration) float64 {
	return float64(l.Burst+1) + l.Rate*d.Seconds()
}

// Bucket is one key's node. The zero value is a key not yet seen. A Bucket
// is not safe for concurrent use.
type Bucket struct {
	excess int64 // milli-requests
	last   int64 // Unix milliseconds of the last accounted request
	seen   bool
}

// Admit decides a request of the key at now under l: whether it is admitted
// and the excess it leaves (or, refused, would have left), in
// milli-requests. A refusal changes nothing.
func (b *Bucket) Admit(l Limit, now time.Time) (ok bool, excess int64) {
	ms := now.UnixMilli()
	if !b.seen {
		*b = Bucket{last: ms, seen: true}
		return true, 0
	}
	elapsed := ms - b.last
	switch {
	case elapsed < -60000:
		// A clock stepped far back: nginx counts one millisecond.
		elapsed = 1
	case elapsed < 0:
		elapsed = 0
	}
	excess = max(b.excess-l.RateMilli()*elapsed/1000+1000, 0)
	if excess > l.Burst*1000 {
		return false, excess
	}
	b.excess = excess
	if elapsed != 0 {
		// nginx keeps last when the clock went back (elapsed clamped
		// to 0), so that the leak up to it is not counted again.
		b.last = ms
	}
	return true, excess
}

// Limiter is one key under one limit: the shape a test origin needs. The
// zero value admits one request and refuses the rest; set Limit. It is not
// safe for concurrent use.
type Limiter struct {
	Limit  Limit
	bucket Bucket
}

// Admit reports whether a request at now is admitted.
func (l *Limiter) Admit(now time.Time) bool {
	ok, _ := l.bucket.Admit(l.Limit, now)
	return ok
}
