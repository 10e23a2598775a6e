package stuborigin_test

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/mirrorworker/mirrorworker/stuborigin"
)

// TestProxyLimitAnswers checks what a client of the nginx- and
// HAProxy-like profiles sees: the configured status, a fixed Retry-After or
// none, never a rate-limit header, and "told to wait" counted only when a
// Retry-After was sent.
func TestProxyLimitAnswers(t *testing.T) {
	tests := []struct {
		name       string
		p          stuborigin.Profile
		admitted   int // at one instant before the first refusal
		status     int
		retryAfter string
		reason     string
	}{
		{
			name:     "nginx 429 with Retry-After 2",
			p:        stuborigin.Profile{Name: "nginx", LimitReq: &stuborigin.LimitReq{Rate: 2, Burst: 5, NoDelay: true, Status: 429, RetryAfter: dur(2 * time.Second)}},
			admitted: 6, status: 429, retryAfter: "2", reason: stuborigin.ReasonLimitReq,
		},
		{
			name:     "nginx default: 503 without Retry-After",
			p:        stuborigin.Profile{Name: "nginx-503", LimitReq: &stuborigin.LimitReq{Rate: 10, Burst: 5, NoDelay: true}},
			admitted: 6, status: 503, reason: stuborigin.ReasonLimitReq,
		},
		{
			name:     "haproxy 429 with Retry-After 10",
			p:        stuborigin.Profile{Name: "haproxy", StickTable: &stuborigin.StickTable{Period: dur(10 * time.Second), Limit: 20, RetryAfter: dur(10 * time.Second)}},
			admitted: 20, status: 429, retryAfter: "10", reason: stuborigin.ReasonStickTable,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			og, fc, urls := startOrigin(t, &tt.p, 1)
			c := clientFrom(t, "127.0.0.1")
			r, n := untilRefused(t, c, urls[0]+"/f")
			if n != tt.admitted || r.status != tt.status {
				t.Fatalf("admitted %d then %d, want %d then %d", n, r.status, tt.admitted, tt.status)
			}
			if got := r.header.Get("Retry-After"); got != tt.retryAfter {
				t.Errorf("Retry-After %q, want %q", got, tt.retryAfter)
			}
			if r.reason() != tt.reason {
				t.Errorf("reason %q, want %q", r.reason(), tt.reason)
			}
			for h := range r.header {
				if h == "Ratelimit" || h == "Ratelimit-Policy" || h == "X-Ratelimit-Remaining" {
					t.Errorf("sent %s: the proxies send no rate-limit header", h)
				}
			}
			get(t, c, urls[0]+"/f") // early only when a Retry-After was sent
			want := int64(0)
			if tt.retryAfter != "" {
				want = 1
			}
			if e := og.Stats().Sum().Early; e != want {
				t.Errorf("early %d, want %d", e, want)
			}
			if tt.retryAfter != "" {
				// Past the Retry-After and, for the sliding window, past
				// the period after it (at 10 s the previous period's 22
				// still weigh in full, as in HAProxy).
				fc.Advance(20 * time.Second)
				if r := get(t, c, urls[0]+"/f"); r.status != http.StatusOK {
					t.Errorf("after the Retry-After: %d, want 200", r.status)
				}
			}
		})
	}
}

func TestProxyLimitProfileValidation(t *testing.T) {
	tests := []struct {
		name, json, want string
	}{
		{"both", `{"name":"x","limit_req":{"rate":1},"stick_table":{"period":"1s","limit":1}}`, "exclude each other"},
		{"headers", `{"name":"x","limit_req":{"rate":1},"rate_limit_headers":"ietf"}`, "rate_limit_headers"},
		{"status", `{"name":"x","limit_req":{"rate":1,"status":403}}`, "limit_req.status"},
		{"fractional retry-after", `{"name":"x","limit_req":{"rate":1,"retry_after":"1500ms"}}`, "limit_req.retry_after"},
		{"nodelay and delay", `{"name":"x","limit_req":{"rate":1,"burst":3,"delay":2,"nodelay":true}}`, "limit_req.delay"},
		{"no limit", `{"name":"x","stick_table":{"period":"10s"}}`, "stick_table.limit"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := stuborigin.ParseProfile([]byte(tt.json))
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("error %v, want one naming %q", err, tt.want)
			}
		})
	}
	if _, err := stuborigin.ParseProfile([]byte(`{"name":"ok","limit_req":{"rate":2,"burst":5,"nodelay":true}}`)); err != nil {
		t.Errorf("a limit_req profile without quotas: %v", err)
	}
}
