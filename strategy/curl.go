package strategy

import (
	"net/http"
	"time"

	"github.com/mirrorworker/mirrorworker/pacer"
)

// CurlRetry names the reference client the load test runs beside the
// strategies: what `curl --retry N` does, one file at a time per authority,
// each request on its own with no pace shared between files (curl keeps
// none across invocations or URLs). It is not a pacer (New refuses it):
// package loadtest runs its loop, and CurlRetryWait is its rule.
const CurlRetry = "curl-retry"

// References returns the reference clients Parse accepts beside Names.
func References() []string { return []string{CurlRetry} }

// Curl's retry constants (its --retry documentation): the first retry
// waits one second, each later one twice the last, at most ten minutes.
const (
	CurlFirstRetryWait = time.Second
	CurlMaxRetryWait   = 10 * time.Minute
	// DefaultCurlRetries is the --retry N the reference runs with (issue 35
	// measured curl --retry 10).
	DefaultCurlRetries = 10
)

// CurlRetryWait is curl's decision after an answer with this status and
// header, given how many retries of this transfer came before (0 for the
// first): whether it retries and how long it sleeps first. A transient
// answer (408, 429, 500, 502, 503, 504) is retried while retries are left;
// the sleep is the Retry-After when the answer has a valid one (curl
// 7.66.0 and later comply with it), else 1 s doubled per earlier retry, at
// most 10 min. now is for an HTTP-date Retry-After.
func CurlRetryWait(status int, h http.Header, retriesBefore, maxRetries int, now time.Time) (retry bool, wait time.Duration) {
	switch status {
	case http.StatusRequestTimeout, http.StatusTooManyRequests, http.StatusInternalServerError,
		http.StatusBadGateway, http.StatusServiceUnavailable, http.StatusGatewayTimeout:
	default:
		return false, 0
	}
	if retriesBefore >= maxRetries {
		return false, 0
	}
	if h != nil {
		if v := h.Get("Retry-After"); v != "" {
			if d, ok := pacer.ParseRetryAfter(v, h.Get("Date"), now); ok {
				return true, max(d, 0)
			}
		}
	}
	wait = CurlFirstRetryWait
	for i := 0; i < retriesBefore && wait < CurlMaxRetryWait; i++ {
		wait *= 2
	}
	return true, min(wait, CurlMaxRetryWait)
}
