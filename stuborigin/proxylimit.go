package stuborigin

import (
	"errors"
	"fmt"
	"math"
	"net/http"
	"time"

	"github.com/mirrorworker/mirrorworker/stuborigin/limitreq"
)

// LimitReq is a limiter that behaves like nginx's ngx_http_limit_req_module
// (`limit_req_zone $binary_remote_addr rate=Rr/s; limit_req zone=z burst=B
// [nodelay | delay=D]; limit_req_status S;` plus, optionally, `add_header
// Retry-After N always`), keyed by the caller identity as the zone is keyed
// by the client address. It replaces the token-bucket quotas: a profile
// with a LimitReq needs no quotas, and sends no rate-limit headers (nginx
// sends none).
//
// The admission is nginx's leaky bucket as package limitreq models it (the
// one model the project's tests share): each caller keeps an excess, a
// request is refused when excess - rate x elapsed + 1 (never below 0)
// exceeds the burst, a refusal costs nothing (a client retrying early is
// refused only while the bucket is full), and after a pause the bucket
// admits burst + 1 in a row. With NoDelay an admitted request
// is served at once; without, a request whose excess is above Delay x 1000
// is held (excess - Delay x 1000) / rate before it is served, as nginx
// delays it; Delay 0 without NoDelay is nginx's plain `burst=B`.
type LimitReq struct {
	// Rate is the requests per second the bucket leaks (nginx rate=; 0.5
	// is 30r/m). Stored, as in nginx, in whole milli-requests per second.
	Rate float64 `json:"rate"`
	// Burst is nginx's burst= (default 0: nothing beyond the rate).
	Burst int64 `json:"burst"`
	// NoDelay serves every admitted request at once (nginx nodelay).
	NoDelay bool `json:"nodelay,omitempty"`
	// Delay is nginx's delay=: the excess served at once without NoDelay.
	Delay int64 `json:"delay,omitempty"`
	// Status is limit_req_status: 503 (nginx's default) or 429.
	Status int `json:"status,omitempty"`
	// RetryAfter, when set, is sent on every refusal as a fixed
	// Retry-After (nginx: add_header Retry-After N always); whole seconds.
	// Zero sends none, as nginx does by default.
	RetryAfter Duration `json:"retry_after,omitempty"`
}

// StickTable is a limiter that behaves like HAProxy's request-rate limit
// (`stick-table type ip store http_req_rate(Period)`, `http-request
// track-sc0 src`, `http-request deny deny_status S if { sc_http_req_rate(0)
// gt Limit }`), keyed by the caller identity. Every request is tracked
// before the deny rule runs, refused ones included, so a caller that keeps
// sending while refused stays refused. The rate is HAProxy's freq_ctr over
// a period: the current period's count plus the previous period's weighted
// by the share of the period still to run (a sliding window). Like
// LimitReq it replaces the quotas and sends no rate-limit headers.
type StickTable struct {
	// Period is the http_req_rate period.
	Period Duration `json:"period"`
	// Limit refuses a request when the rate, this one counted, is above it.
	Limit int64 `json:"limit"`
	// Status is deny_status: 429 (the default here) or 503 or 403.
	Status int `json:"status,omitempty"`
	// RetryAfter, when set, is a fixed Retry-After on every refusal (as
	// `http-request return status 429 hdr Retry-After N` or http-response
	// set-header would add); whole seconds. Zero sends none.
	RetryAfter Duration `json:"retry_after,omitempty"`
}

// Reasons of a proxy limiter's refusals, in /stats.
const (
	ReasonLimitReq   = "limit_req"
	ReasonStickTable = "stick_table"
)

// DefaultLimitReqStatus is nginx's limit_req_status default.
const DefaultLimitReqStatus = http.StatusServiceUnavailable

// DefaultStickTableStatus is the deny_status the stick-table limiter
// answers with when none is set (HAProxy's own default, 403, is rarely
// what a rate limit is configured with).
const DefaultStickTableStatus = http.StatusTooManyRequests

func (l *LimitReq) status() int {
	if l.Status == 0 {
		return DefaultLimitReqStatus
	}
	return l.Status
}

func (s *StickTable) status() int {
	if s.Status == 0 {
		return DefaultStickTableStatus
	}
	return s.Status
}

// limit is l's rate and burst in limitreq's terms.
func (l *LimitReq) limit() limitreq.Limit { return limitreq.Limit{Rate: l.Rate, Burst: l.Burst} }

// rateMilli is nginx's ctx->rate: milli-requests per second, whole.
func (l *LimitReq) rateMilli() int64 { return l.limit().RateMilli() }

func validRetryAfter(d time.Duration) bool {
	return d >= 0 && d%time.Second == 0 && d <= 24*time.Hour
}

func validDenyStatus(s int, allowed ...int) bool {
	if s == 0 {
		return true
	}
	for _, a := range allowed {
		if s == a {
			return true
		}
	}
	return false
}

func (l *LimitReq) validate() error {
	if l == nil {
		return nil
	}
	var errs []error
	bad := func(field, format string, a ...any) {
		errs = append(errs, fmt.Errorf("limit_req.%s: %s", field, fmt.Sprintf(format, a...)))
	}
	if !(l.Rate > 0) || math.IsInf(l.Rate, 0) || l.Rate > 1e6 || l.rateMilli() < 1 {
		bad("rate", "must be at least 0.001 and at most 1e6 requests per second, got %v", l.Rate)
	}
	if l.Burst < 0 || l.Burst > 1e9 {
		bad("burst", "must be between 0 and 1e9, got %d", l.Burst)
	}
	if l.Delay < 0 || l.Delay > l.Burst {
		bad("delay", "must be between 0 and burst, got %d", l.Delay)
	}
	if l.NoDelay && l.Delay > 0 {
		bad("delay", "nodelay and delay exclude each other (as in nginx)")
	}
	if !validDenyStatus(l.Status, http.StatusServiceUnavailable, http.StatusTooManyRequests) {
		bad("status", "want 503 or 429, got %d", l.Status)
	}
	if !validRetryAfter(l.RetryAfter.Duration) {
		bad("retry_after", "must be whole seconds between 0 (none) and 24h, got %v", l.RetryAfter.Duration)
	}
	return errors.Join(errs...)
}

func (s *StickTable) validate() error {
	if s == nil {
		return nil
	}
	var errs []error
	bad := func(field, format string, a ...any) {
		errs = append(errs, fmt.Errorf("stick_table.%s: %s", field, fmt.Sprintf(format, a...)))
	}
	if s.Period.Duration < time.Millisecond || s.Period.Duration > 24*time.Hour {
		bad("period", "must be between 1ms and 24h, got %v", s.Period.Duration)
	}
	if s.Limit < 1 || s.Limit > 1e9 {
		bad("limit", "must be between 1 and 1e9, got %d", s.Limit)
	}
	if !validDenyStatus(s.Status, http.StatusTooManyRequests, http.StatusServiceUnavailable, http.StatusForbidden) {
		bad("status", "want 429, 503 or 403, got %d", s.Status)
	}
	if !validRetryAfter(s.RetryAfter.Duration) {
		bad("retry_after", "must be whole seconds between 0 (none) and 24h, got %v", s.RetryAfter.Duration)
	}
	return errors.Join(errs...)
}

// admitLimitReq is ngx_http_limit_req_lookup and _account for one limit at
// now, on one caller's bucket (the arithmetic is limitreq's, shared with the
// tests that model nginx): whether the request is admitted and, if so, how
// long nginx would delay it before serving it.
func admitLimitReq(b *limitreq.Bucket, l *LimitReq, now time.Time) (ok bool, delay time.Duration) {
	ok, excess := b.Admit(l.limit(), now)
	if !ok || l.NoDelay || excess <= l.Delay*1000 {
		return ok, 0
	}
	return true, time.Duration((excess-l.Delay*1000)*1000/l.rateMilli()) * time.Millisecond
}

// rateState is one caller's HAProxy freq_ctr: the current period's start
// and count, and the previous period's count.
type rateState struct {
	currStart  time.Time
	curr, prev int64
}

// track counts a request at now and returns the rate HAProxy's
// sc_http_req_rate reads after it: curr + prev x (time left in the current
// period) / period. Periods are aligned on the first request, and a gap of
// more than one period forgets the previous count, as freq_ctr does.
func (rs *rateState) track(period time.Duration, now time.Time) int64 {
	switch {
	case rs.currStart.IsZero():
		rs.currStart = now
	case !now.Before(rs.currStart.Add(period)):
		n := now.Sub(rs.currStart) / period
		if n == 1 {
			rs.prev = rs.curr
		} else {
			rs.prev = 0
		}
		rs.curr = 0
		rs.currStart = rs.currStart.Add(n * period)
	}
	rs.curr++
	left := rs.currStart.Add(period).Sub(now)
	return rs.curr + int64(float64(rs.prev)*float64(left)/float64(period))
}

// admitProxyLocked is the admission of a profile with a proxy limiter. A
// refusal carries the fixed Retry-After, if any, as the wait; no limit view
// (no rate-limit headers). s.mu must be held.
func (s *shard) admitProxyLocked(id *identity, now time.Time) decision {
	var (
		ok     bool
		delay  time.Duration
		status int
		reason string
		ra     time.Duration
	)
	switch {
	case s.limitReq != nil:
		ok, delay = admitLimitReq(&id.leaky, s.limitReq, now)
		status, reason, ra = s.limitReq.status(), ReasonLimitReq, s.limitReq.RetryAfter.Duration
	default:
		ok = id.rate.track(s.stick.Period.Duration, now) <= s.stick.Limit
		status, reason, ra = s.stick.status(), ReasonStickTable, s.stick.RetryAfter.Duration
	}
	if ok {
		return decision{outcome: Admitted, hold: delay}
	}
	d := decision{outcome: RateLimited, reason: reason, wait: ra, hasWait: ra > 0}
	switch status {
	case http.StatusServiceUnavailable:
		d.outcome = CapacityExhausted
	case http.StatusForbidden:
		d.outcome = Forbidden
	}
	return d
}

// ProxyAllowance is how many requests a proxy limiter admits one caller in
// d from a fresh start, at most (LimitReq: burst + 1 at once, then the
// rate; StickTable: the limit in the first period, then about the limit
// per period, its sliding window a little generous at period edges); 0
// when p has no proxy limiter. The load test's bound reads it.
func (p *Profile) ProxyAllowance(d time.Duration) float64 {
	switch {
	case p.LimitReq != nil:
		return p.LimitReq.limit().Allowance(d)
	case p.StickTable != nil:
		per := p.StickTable.Period.Seconds()
		return float64(p.StickTable.Limit) * (1 + d.Seconds()/per)
	}
	return 0
}

// ProxyLimited reports whether p admits with a reverse proxy's limiter
// (limit_req or stick_table) instead of its quotas.
func (p *Profile) ProxyLimited() bool { return p.LimitReq != nil || p.StickTable != nil }
