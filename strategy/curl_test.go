package strategy_test

import (
	"net/http"
	"testing"
	"time"

	"github.com/mirrorworker/mirrorworker/strategy"
)

// TestCurlRetryWait is curl --retry's rule: transient statuses only, the
// Retry-After when valid, else 1 s doubled per earlier retry up to 10 min,
// and no retry once N were made.
func TestCurlRetryWait(t *testing.T) {
	now := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	ra := func(v string) http.Header { return http.Header{"Retry-After": {v}} }
	tests := []struct {
		name      string
		status    int
		h         http.Header
		before    int
		wantRetry bool
		wantWait  time.Duration
	}{
		{"429 with Retry-After 2", 429, ra("2"), 0, true, 2 * time.Second},
		{"Retry-After replaces the backoff, whatever came before", 429, ra("2"), 5, true, 2 * time.Second},
		{"HTTP-date Retry-After", 503, ra(now.Add(7 * time.Second).Format(http.TimeFormat)), 0, true, 7 * time.Second},
		{"503 without Retry-After: 1 s first", 503, nil, 0, true, time.Second},
		{"then 2 s", 503, nil, 1, true, 2 * time.Second},
		{"then 4 s", 429, nil, 2, true, 4 * time.Second},
		{"malformed Retry-After: the backoff", 429, ra("soon"), 3, true, 8 * time.Second},
		{"the tenth retry: 512 s", 504, nil, 9, true, 512 * time.Second},
		{"408 is transient", 408, nil, 0, true, time.Second},
		{"no retries left", 429, ra("2"), 10, false, 0},
		{"404 is not transient", 404, nil, 0, false, 0},
		{"403 is not transient", 403, ra("5"), 0, false, 0},
		{"200", 200, nil, 0, false, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			retry, wait := strategy.CurlRetryWait(tt.status, tt.h, tt.before, strategy.DefaultCurlRetries, now)
			if retry != tt.wantRetry || wait != tt.wantWait {
				t.Fatalf("CurlRetryWait = %v, %v; want %v, %v", retry, wait, tt.wantRetry, tt.wantWait)
			}
		})
	}
	if retry, wait := strategy.CurlRetryWait(503, nil, 12, 20, now); !retry || wait != 10*time.Minute {
		t.Errorf("the 13th retry of 20: %v, %v; want a retry after 10m (the cap)", retry, wait)
	}
	if _, err := strategy.New(strategy.CurlRetry, strategy.Options{}); err == nil {
		t.Error("New(curl-retry) made a pacer of the reference client")
	}
}
