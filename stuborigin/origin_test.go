package stuborigin_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/mirrorworker/mirrorworker/clock"
	"github.com/mirrorworker/mirrorworker/stuborigin"
)

var t0 = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

func dur(d time.Duration) stuborigin.Duration { return stuborigin.Duration{Duration: d} }

// quota builds a Quota: burst capacity and refill/s, sustained capacity per window.
func quota(bc int64, br float64, sc int64, sw time.Duration) stuborigin.Quota {
	return stuborigin.Quota{
		Burst:     stuborigin.Burst{Capacity: bc, RefillPerSecond: br},
		Sustained: stuborigin.Sustained{Capacity: sc, Window: dur(sw)},
	}
}

func generous() stuborigin.Quota { return quota(1000, 1000, 100000, time.Hour) }

// startOrigin runs p on loopback with a fake clock at t0.
func startOrigin(t testing.TB, p *stuborigin.Profile, authorities int) (*stuborigin.Origin, *clock.Fake, []string) {
	t.Helper()
	fc := clock.NewFake(t0)
	og, err := stuborigin.New(p, &stuborigin.Options{Authorities: authorities, Clock: fc})
	if err != nil {
		t.Fatal(err)
	}
	urls, err := og.Start(context.Background(), "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := og.Close(); err != nil {
			t.Errorf("close: %v", err)
		}
	})
	return og, fc, urls
}

// clientFrom returns a client whose connections come from source address src
// (any 127.0.0.0/8 address is on the loopback interface).
func clientFrom(t testing.TB, src string) *http.Client {
	d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}}
	tr := &http.Transport{DialContext: d.DialContext, MaxIdleConnsPerHost: 100}
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr, Timeout: 20 * time.Second}
}

type reply struct {
	status int
	header http.Header
	body   []byte
}

func (r reply) code() string {
	var p struct{ Code, Reason string }
	json.Unmarshal(r.body, &p)
	return p.Code
}

func (r reply) reason() string {
	var p struct{ Code, Reason string }
	json.Unmarshal(r.body, &p)
	return p.Reason
}

func do(t testing.TB, c *http.Client, method, url string, hdr ...string) reply {
	t.Helper()
	r, err := try(c, method, url, hdr...)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// try is do for goroutines other than the test's: it returns the error.
func try(c *http.Client, method, url string, hdr ...string) (reply, error) {
	req, err := http.NewRequest(method, url, nil)
	if err != nil {
		return reply{}, err
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := c.Do(req)
	if err != nil {
		return reply{}, fmt.Errorf("%s %s: %w", method, url, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return reply{}, fmt.Errorf("%s %s: read body: %w", method, url, err)
	}
	return reply{resp.StatusCode, resp.Header, b}, nil
}

func get(t testing.TB, c *http.Client, url string, hdr ...string) reply {
	t.Helper()
	return do(t, c, http.MethodGet, url, hdr...)
}

// untilRefused sends requests at the current fake instant until one is
// refused, and returns it with the number admitted before it.
func untilRefused(t *testing.T, c *http.Client, url string, hdr ...string) (reply, int) {
	t.Helper()
	for n := 0; n < 10000; n++ {
		r := get(t, c, url, hdr...)
		if r.status != http.StatusOK {
			return r, n
		}
	}
	t.Fatal("never refused")
	return reply{}, 0
}

func TestRetryAfterIsExactForThisCaller(t *testing.T) {
	tests := []struct {
		name       string
		quota      stuborigin.Quota
		headers    []string
		wantAdmit  int
		wantReason string
		wantRA     int64
	}{
		{
			name:  "burst exhausted",
			quota: quota(3, 1, 100, 100*time.Second), wantAdmit: 3, wantReason: "burst", wantRA: 1,
		},
		{
			name:  "sustained exhausted while burst has tokens",
			quota: quota(10, 10, 4, 8*time.Second), wantAdmit: 4, wantReason: "sustained", wantRA: 2,
		},
		{
			// The store's clock decides refill: a client Date an hour
			// ahead must not refill anything.
			name:  "client Date header ignored",
			quota: quota(2, 0.25, 100, 100*time.Second), headers: []string{"Date", t0.Add(time.Hour).Format(http.TimeFormat)},
			wantAdmit: 2, wantReason: "burst", wantRA: 4,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := &stuborigin.Profile{Name: "t", Quotas: map[string]stuborigin.Quota{"anonymous": tt.quota}}
			_, fc, urls := startOrigin(t, p, 1)
			c := clientFrom(t, "127.0.0.1")
			url := urls[0] + "/obj?size=10"

			r, admitted := untilRefused(t, c, url, tt.headers...)
			if admitted != tt.wantAdmit || r.status != http.StatusTooManyRequests || r.code() != "rate_limited" || r.reason() != tt.wantReason {
				t.Fatalf("after %d admitted: %d %s/%s, want %d admitted then 429 rate_limited/%s", admitted, r.status, r.code(), r.reason(), tt.wantAdmit, tt.wantReason)
			}
			ra, err := strconv.ParseInt(r.header.Get("Retry-After"), 10, 64)
			if err != nil || ra != tt.wantRA {
				t.Fatalf("Retry-After %q, want %d", r.header.Get("Retry-After"), tt.wantRA)
			}
			// One tick before the deadline: still refused.
			fc.Advance(time.Duration(ra)*time.Second - time.Nanosecond)
			if r := get(t, c, url, tt.headers...); r.status != http.StatusTooManyRequests {
				t.Fatalf("1ns before Retry-After: status %d, want 429", r.status)
			}
			// Exactly Retry-After later: admitted.
			fc.Advance(time.Nanosecond)
			if r := get(t, c, url, tt.headers...); r.status != http.StatusOK {
				t.Fatalf("at Retry-After: status %d %s, want 200", r.status, r.body)
			}
		})
	}
}

// A fractional refill rounds Retry-After up: the caller is admitted at the
// announced second and would have been refused a whole second earlier.
func TestRetryAfterRoundsUp(t *testing.T) {
	p := &stuborigin.Profile{Name: "t", Quotas: map[string]stuborigin.Quota{"anonymous": quota(1, 0.4, 100, 100*time.Second)}}
	_, fc, urls := startOrigin(t, p, 1)
	c := clientFrom(t, "127.0.0.1")
	get(t, c, urls[0]+"/a")
	fc.Advance(700 * time.Millisecond) // the next token is 1.8 s away
	r := get(t, c, urls[0]+"/a")
	if r.status != 429 || r.header.Get("Retry-After") != "2" {
		t.Fatalf("got %d Retry-After %q, want 429 with 2", r.status, r.header.Get("Retry-After"))
	}
	fc.Advance(time.Second)
	if r := get(t, c, urls[0]+"/a"); r.status != 429 {
		t.Fatalf("1 s before Retry-After: %d, want 429", r.status)
	}
	fc.Advance(time.Second)
	if r := get(t, c, urls[0]+"/a"); r.status != 200 {
		t.Fatalf("at Retry-After: %d, want 200", r.status)
	}
}

func TestFairShareOnOneShard(t *testing.T) {
	p := &stuborigin.Profile{
		Name:   "fair",
		Quotas: map[string]stuborigin.Quota{"anonymous": generous(), "default": generous()},
		Tokens: map[string]stuborigin.Token{
			"tok-alice": {Principal: "alice", Tenant: "acme"},
			"tok-bob":   {Principal: "bob", Tenant: "globex"},
			"tok-carol": {Principal: "carol", Tenant: "initech"},
		},
		Shard:            stuborigin.Shard{Capacity: 20, Window: dur(10 * time.Second), TenantShare: 0.5},
		RateLimitHeaders: stuborigin.HeadersIETF,
	}
	og, fc, urls := startOrigin(t, p, 1)
	c := clientFrom(t, "127.0.0.1")
	url := urls[0] + "/shared"

	// acme floods with 60 concurrent requests while globex sends 10.
	var mu sync.Mutex
	var replies = map[string][]reply{}
	var wg sync.WaitGroup
	send := func(who string, n int) {
		for range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				r, err := try(c, "GET", url, "Authorization", "Bearer tok-"+who)
				if err != nil {
					t.Error(err)
				}
				mu.Lock()
				replies[who] = append(replies[who], r)
				mu.Unlock()
			}()
		}
	}
	send("alice", 60)
	send("bob", 10)
	wg.Wait()
	count := func(who string, status int) (n int) {
		for _, r := range replies[who] {
			if r.status == status {
				n++
			}
		}
		return n
	}
	if got := count("bob", 200); got != 10 {
		t.Errorf("globex admitted %d of 10 while acme flooded; its fair share is 10", got)
	}
	if got := count("alice", 200); got != 10 {
		t.Errorf("acme admitted %d, want its share of 10", got)
	}
	if got := count("alice", 429); got != 50 {
		t.Errorf("acme got %d 429s, want 50", got)
	}
	// globex's next request is over its own share: a 429 for it too.
	r := get(t, c, url, "Authorization", "Bearer tok-bob")
	replies["bob"] = append(replies["bob"], r)
	if r.status != 429 || r.reason() != "tenant_share" || r.header.Get("Retry-After") != "10" {
		t.Errorf("globex over its share: %d %s Retry-After %q, want 429 tenant_share 10", r.status, r.reason(), r.header.Get("Retry-After"))
	}

	// Nothing either tenant saw names the other.
	leaks := map[string][]string{
		"alice": {"bob", "globex", "tok-bob", "carol", "initech"},
		"bob":   {"alice", "acme", "tok-alice", "carol", "initech"},
	}
	for who, words := range leaks {
		for _, r := range replies[who] {
			var all bytes.Buffer
			r.header.Write(&all)
			all.Write(r.body)
			for _, w := range words {
				if strings.Contains(strings.ToLower(all.String()), w) {
					t.Fatalf("a %d answer to %s mentions %q:\n%s", r.status, who, w, all.String())
				}
			}
		}
	}

	// A third tenant finds the shard full: 503, with the window's end as
	// its Retry-After, and admitted when the window turns.
	r = get(t, c, url, "Authorization", "Bearer tok-carol")
	if r.status != 503 || r.code() != "capacity_exhausted" || r.header.Get("Retry-After") != "10" {
		t.Fatalf("third tenant on a full shard: %d %s Retry-After %q, want 503 capacity_exhausted 10", r.status, r.code(), r.header.Get("Retry-After"))
	}
	fc.Advance(10 * time.Second)
	if r := get(t, c, url, "Authorization", "Bearer tok-carol"); r.status != 200 {
		t.Fatalf("next window: %d, want 200", r.status)
	}

	st := og.Stats().Authorities[0]
	if st.Requests != 73 || st.Admitted != 21 || st.RateLimited != 51 || st.CapacityExhausted != 1 {
		t.Errorf("stats %+v, want 73 requests, 21 admitted, 51 429s, 1 503", st.Counts)
	}
	if st.IdentityCount != 3 {
		t.Errorf("identities %d, want 3", st.IdentityCount)
	}
}

func TestStoreDownFailsClosedForEveryone(t *testing.T) {
	p := &stuborigin.Profile{
		Name:             "t",
		Quotas:           map[string]stuborigin.Quota{"anonymous": generous(), "default": generous()},
		Tokens:           map[string]stuborigin.Token{"tok-a": {Principal: "a", Tenant: "ta"}},
		RateLimitHeaders: stuborigin.HeadersXRateLimit,
	}
	og, _, urls := startOrigin(t, p, 2)
	c := clientFrom(t, "127.0.0.1")
	if err := og.SetFaults(stuborigin.Faults{StoreDown: true}); err != nil {
		t.Fatal(err)
	}
	for _, u := range urls {
		for _, auth := range []string{"", "Bearer tok-a", "Bearer unknown"} {
			r := get(t, c, u+"/x", "Authorization", auth)
			if r.status != 503 || r.code() != "capacity_exhausted" {
				t.Errorf("%s with %q: %d %s, want 503 capacity_exhausted", u, auth, r.status, r.code())
			}
			// Nothing to compute a delay from: no Retry-After, no quota headers.
			for _, h := range []string{"Retry-After", "X-RateLimit-Remaining", "X-RateLimit-Limit"} {
				if v := r.header.Get(h); v != "" {
					t.Errorf("%s: %s: %q on a store-down answer", u, h, v)
				}
			}
		}
	}
	if err := og.SetFaults(stuborigin.Faults{}); err != nil {
		t.Fatal(err)
	}
	if r := get(t, c, urls[0]+"/x"); r.status != 200 {
		t.Fatalf("store back: %d, want 200", r.status)
	}
}

func TestAnonymousIdentityIsTheNetworkRange(t *testing.T) {
	p := &stuborigin.Profile{Name: "t", Quotas: map[string]stuborigin.Quota{"anonymous": quota(2, 0.001, 100, time.Hour)}}
	og, _, urls := startOrigin(t, p, 1)
	u := urls[0] + "/pub"
	a1, a2, b := clientFrom(t, "127.0.0.1"), clientFrom(t, "127.0.0.2"), clientFrom(t, "127.0.1.1")

	// 127.0.0.1 and 127.0.0.2 are one /24: they share one bucket of 2.
	for i, c := range []*http.Client{a1, a2} {
		if r := get(t, c, u); r.status != 200 {
			t.Fatalf("request %d from 127.0.0.0/24: %d", i, r.status)
		}
	}
	if r := get(t, a2, u); r.status != 429 {
		t.Fatalf("third request from 127.0.0.0/24: %d, want 429 (shared bucket)", r.status)
	}
	if r := get(t, a1, u); r.status != 429 {
		t.Fatalf("fourth request from 127.0.0.0/24: %d, want 429 (shared bucket)", r.status)
	}
	// 127.0.1.1 is another /24: its own full bucket.
	for i := range 2 {
		if r := get(t, b, u); r.status != 200 {
			t.Fatalf("request %d from 127.0.1.0/24: %d, want 200", i, r.status)
		}
	}
	// A bad token does not escape the caller's range: admitted as anonymous, then 401.
	if r := get(t, b, u, "Authorization", "Bearer nope"); r.status != 429 {
		t.Fatalf("bad token from an exhausted range: %d, want 429", r.status)
	}
	st := og.Stats().Authorities[0]
	if st.IdentityCount != 2 {
		t.Fatalf("identities %d, want 2", st.IdentityCount)
	}
	for _, id := range st.Identities {
		if id.Kind != "anonymous" || id.Tenant != "" || !strings.HasPrefix(id.Identity, "anon:") || strings.Contains(id.Identity, "127.") {
			t.Errorf("anonymous identity %+v: want an opaque anon: hash with no tenant", id)
		}
	}
}

func TestConcurrentRequestsNeverGetExtraTokens(t *testing.T) {
	p := &stuborigin.Profile{Name: "t", Quotas: map[string]stuborigin.Quota{"anonymous": quota(25, 1, 1000, time.Hour)}}
	og, _, urls := startOrigin(t, p, 1)
	c := clientFrom(t, "127.0.0.1")
	var wg sync.WaitGroup
	var mu sync.Mutex
	ok := 0
	for range 120 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r, err := try(c, "GET", urls[0]+"/c")
			if err != nil {
				t.Error(err)
			}
			if r.status == 200 {
				mu.Lock()
				ok++
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if ok != 25 {
		t.Fatalf("admitted %d concurrent requests at one instant, want exactly the burst of 25", ok)
	}
	if st := og.Stats().Authorities[0]; st.Admitted != 25 || st.RateLimited != 95 {
		t.Fatalf("stats %+v", st.Counts)
	}
}

func TestObjects(t *testing.T) {
	p := &stuborigin.Profile{Name: "t", Quotas: map[string]stuborigin.Quota{"anonymous": generous()}}
	_, _, urls := startOrigin(t, p, 1)
	c := clientFrom(t, "127.0.0.1")

	r := get(t, c, urls[0]+"/dir/file.bin?size=100000")
	want := stuborigin.ObjectBytes("/dir/file.bin", 100000)
	if r.status != 200 || !bytes.Equal(r.body, want) || r.header.Get("Content-Length") != "100000" {
		t.Fatalf("GET: %d, %d bytes, Content-Length %q", r.status, len(r.body), r.header.Get("Content-Length"))
	}
	etag := r.header.Get("ETag")
	if etag != stuborigin.ETag("/dir/file.bin", 100000) || strings.HasPrefix(etag, "W/") || !strings.HasPrefix(etag, `"`) {
		t.Fatalf("ETag %q", etag)
	}
	if other := get(t, c, urls[0]+"/dir/other.bin?size=100000"); bytes.Equal(other.body, r.body) || other.header.Get("ETag") == etag {
		t.Fatal("two paths served the same bytes or ETag")
	}
	if r2 := get(t, c, urls[0]+"/dir/file.bin?size=99999"); r2.header.Get("ETag") == etag {
		t.Fatal("two sizes share an ETag")
	}

	tests := []struct {
		name   string
		method string
		url    string
		hdr    []string
		status int
		length int
	}{
		{"If-None-Match matches", "GET", "/dir/file.bin?size=100000", []string{"If-None-Match", `"x", ` + etag}, 304, 0},
		{"If-None-Match weak form", "GET", "/dir/file.bin?size=100000", []string{"If-None-Match", "W/" + etag}, 304, 0},
		{"If-None-Match other", "GET", "/dir/file.bin?size=100000", []string{"If-None-Match", `"nope"`}, 200, 100000},
		{"If-Modified-Since later", "GET", "/dir/file.bin?size=5", []string{"If-Modified-Since", "Sat, 01 Aug 2026 00:00:00 GMT"}, 304, 0},
		{"default size", "GET", "/d", nil, 200, 1024},
		{"HEAD", "HEAD", "/dir/file.bin?size=100000", nil, 200, 0},
		{"bad size", "GET", "/x?size=-1", nil, 400, -1},
		{"POST", "POST", "/x", nil, 405, -1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := do(t, c, tt.method, urls[0]+tt.url, tt.hdr...)
			if r.status != tt.status || (tt.length >= 0 && len(r.body) != tt.length) {
				t.Fatalf("%d with %d bytes, want %d with %d", r.status, len(r.body), tt.status, tt.length)
			}
		})
	}
}

func TestRateLimitHeadersAreTheCallersOwn(t *testing.T) {
	tests := []struct {
		family string
		after1 map[string]string
		after3 map[string]string
	}{
		{stuborigin.HeadersIETF,
			map[string]string{"RateLimit": `"burst";r=2;t=1`, "RateLimit-Policy": `"burst";q=3;w=3, "sustained";q=100;w=100`},
			map[string]string{"RateLimit": `"burst";r=0;t=1`}},
		{stuborigin.HeadersXRateLimit,
			map[string]string{"X-RateLimit-Limit": "3", "X-RateLimit-Remaining": "2", "X-RateLimit-Reset": "1"},
			map[string]string{"X-RateLimit-Remaining": "0", "X-RateLimit-Reset": "1"}},
	}
	for _, tt := range tests {
		t.Run(tt.family, func(t *testing.T) {
			p := &stuborigin.Profile{Name: "t", RateLimitHeaders: tt.family,
				Quotas: map[string]stuborigin.Quota{"anonymous": quota(3, 1, 100, 100*time.Second)}}
			og, _, urls := startOrigin(t, p, 1)
			c, other := clientFrom(t, "127.0.0.1"), clientFrom(t, "127.0.9.1")
			check := func(r reply, want map[string]string) {
				t.Helper()
				for k, v := range want {
					if got := r.header.Get(k); got != v {
						t.Errorf("%s: %q, want %q", k, got, v)
					}
				}
			}
			check(get(t, c, urls[0]+"/h"), tt.after1)
			get(t, c, urls[0]+"/h")
			check(get(t, c, urls[0]+"/h"), tt.after3)
			// Another identity's headers show its own full bucket, not ours.
			check(get(t, other, urls[0]+"/h"), tt.after1)
			// Told "0 left, reset in 1 s": a request now is early.
			if r := get(t, c, urls[0]+"/h"); r.status != 429 {
				t.Fatalf("status %d", r.status)
			}
			if st := og.Stats().Authorities[0]; st.Early != 1 {
				t.Errorf("early %d, want 1", st.Early)
			}
		})
	}
}

// The tenant's share of the shard window refuses a caller with a 429 of its
// own quota, so the headers announce it: a client that spends only what is
// announced is never refused for it.
func TestRateLimitHeadersAnnounceTheTenantShare(t *testing.T) {
	tests := []struct {
		family string
		after1 map[string]string
		after2 map[string]string
	}{
		{stuborigin.HeadersIETF,
			map[string]string{"RateLimit": `"tenant_share";r=1;t=10`,
				"RateLimit-Policy": `"burst";q=100;w=1, "sustained";q=100;w=100, "tenant_share";q=2;w=10`},
			map[string]string{"RateLimit": `"tenant_share";r=0;t=10`}},
		{stuborigin.HeadersXRateLimit,
			map[string]string{"X-RateLimit-Limit": "2", "X-RateLimit-Remaining": "1", "X-RateLimit-Reset": "10"},
			map[string]string{"X-RateLimit-Remaining": "0", "X-RateLimit-Reset": "10"}},
	}
	for _, tt := range tests {
		t.Run(tt.family, func(t *testing.T) {
			p := &stuborigin.Profile{Name: "t", RateLimitHeaders: tt.family,
				Quotas: map[string]stuborigin.Quota{"anonymous": quota(100, 100, 100, 100*time.Second)},
				Shard:  stuborigin.Shard{Capacity: 4, Window: dur(10 * time.Second), TenantShare: 0.5}}
			// The store clock at the start of a shard window (windows are
			// aligned on the epoch).
			fc := clock.NewFake(time.Unix(1_800_000_000, 0))
			og, err := stuborigin.New(p, &stuborigin.Options{Clock: fc})
			if err != nil {
				t.Fatal(err)
			}
			urls, err := og.Start(context.Background(), "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { og.Close() })
			c := clientFrom(t, "127.0.0.1")
			check := func(r reply, want map[string]string) {
				t.Helper()
				for k, v := range want {
					if got := r.header.Get(k); got != v {
						t.Errorf("%s: %q, want %q", k, got, v)
					}
				}
			}
			check(get(t, c, urls[0]+"/h"), tt.after1)
			check(get(t, c, urls[0]+"/h"), tt.after2)
			if r := get(t, c, urls[0]+"/h"); r.status != 429 || r.reason() != "tenant_share" {
				t.Fatalf("third request: %d %s, want 429 tenant_share", r.status, r.reason())
			}
			if st := og.Stats().Authorities[0]; st.Early != 1 {
				t.Errorf("early %d, want 1: the third came before the announced reset", st.Early)
			}
			fc.Advance(10 * time.Second)
			if r := get(t, c, urls[0]+"/h"); r.status != 200 {
				t.Errorf("after the announced reset: %d, want 200", r.status)
			}
		})
	}
}

func TestStatsEarlyGapsAndTimeline(t *testing.T) {
	p := &stuborigin.Profile{Name: "t", Quotas: map[string]stuborigin.Quota{"anonymous": quota(1, 0.5, 100, 100*time.Second)}}
	fc := clock.NewFake(t0)
	og, err := stuborigin.New(p, &stuborigin.Options{Clock: fc, GapFloor: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	urls, err := og.Listen("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	adminURL, err := og.ListenAdmin("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- og.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	}()
	c := clientFrom(t, "127.0.0.1")
	u := urls[0] + "/s"

	get(t, c, u) // t=0 admitted
	fc.Advance(500 * time.Millisecond)
	r := get(t, c, u) // t=0.5 429, told 2 s (token at 2.0)
	if r.header.Get("Retry-After") != "2" {
		t.Fatalf("Retry-After %q, want 2", r.header.Get("Retry-After"))
	}
	fc.Advance(time.Second)
	get(t, c, u) // t=1.5: early (told to wait until 2.5), and refused
	fc.Advance(time.Second)
	if r := get(t, c, u); r.status != 200 { // t=2.5: on time
		t.Fatalf("at the deadline: %d", r.status)
	}

	resp, err := c.Get(adminURL + "/stats")
	if err != nil {
		t.Fatal(err)
	}
	var st stuborigin.Stats
	err = json.NewDecoder(resp.Body).Decode(&st)
	resp.Body.Close()
	if err != nil {
		t.Fatal(err)
	}
	a := st.Authorities[0]
	if a.Requests != 4 || a.Admitted != 2 || a.RateLimited != 2 || a.Early != 1 {
		t.Errorf("authority %+v early %d", a.Counts, a.Early)
	}
	if a.MinGap != 500*time.Millisecond || a.GapCount != 3 || a.BelowFloor != 1 {
		t.Errorf("gaps %+v, want min 500ms, 3 gaps, 1 below the 1 s floor", a.Gaps)
	}
	if len(a.Identities) != 1 || a.Identities[0].Early != 1 || a.Identities[0].Requests != 4 {
		t.Errorf("identities %+v", a.Identities)
	}
	want := []stuborigin.Second{
		{T: 0, Counts: stuborigin.Counts{Requests: 2, Admitted: 1, RateLimited: 1}},
		{T: 1, Counts: stuborigin.Counts{Requests: 1, RateLimited: 1}},
		{T: 2, Counts: stuborigin.Counts{Requests: 1, Admitted: 1}},
	}
	if len(a.Timeline) != len(want) {
		t.Fatalf("timeline %+v, want %+v", a.Timeline, want)
	}
	for i := range want {
		if a.Timeline[i] != want[i] {
			t.Errorf("timeline[%d] = %+v, want %+v", i, a.Timeline[i], want[i])
		}
	}

	resp, err = c.Get(adminURL + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	m, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, line := range []string{
		`mirrorworker_stub_admissions_total{authority="` + a.Authority + `",caller="anonymous"} 2`,
		`mirrorworker_stub_rejections_total{authority="` + a.Authority + `",caller="anonymous",code="rate_limited",reason="burst"} 2`,
		`mirrorworker_stub_capacity_error_budget 0.01`,
	} {
		if !strings.Contains(string(m), line+"\n") {
			t.Errorf("metrics lack %q:\n%s", line, m)
		}
	}
}

func TestFaultsFromAdmin(t *testing.T) {
	p := &stuborigin.Profile{Name: "t", Quotas: map[string]stuborigin.Quota{"anonymous": quota(1, 0.1, 100, 100*time.Second)}}
	fc := clock.NewFake(t0)
	og, err := stuborigin.New(p, &stuborigin.Options{Clock: fc, Authorities: 2})
	if err != nil {
		t.Fatal(err)
	}
	adminURL, err := og.ListenAdmin("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	urls, err := og.Start(context.Background(), "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer og.Close()
	c := clientFrom(t, "127.0.0.1")
	setFaults := func(js string) int {
		resp, err := c.Post(adminURL+"/faults", "application/json", strings.NewReader(js))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if s := setFaults(`{"retry_after": "sometimes"}`); s != 400 {
		t.Fatalf("invalid faults: %d, want 400", s)
	}

	raTests := []struct {
		format string
		check  func(r reply) bool
	}{
		{"http-date", func(r reply) bool {
			at, err1 := http.ParseTime(r.header.Get("Retry-After"))
			date, err2 := http.ParseTime(r.header.Get("Date"))
			return err1 == nil && err2 == nil && at.Sub(date) == 10*time.Second
		}},
		{"malformed", func(r reply) bool {
			_, err := strconv.Atoi(r.header.Get("Retry-After"))
			_, err2 := http.ParseTime(r.header.Get("Retry-After"))
			return r.header.Get("Retry-After") != "" && err != nil && err2 != nil
		}},
		{"absent", func(r reply) bool { _, ok := r.header["Retry-After"]; return !ok }},
		{"seconds", func(r reply) bool { return r.header.Get("Retry-After") == "10" }},
	}
	for i, tt := range raTests {
		t.Run("retry-after "+tt.format, func(t *testing.T) {
			if s := setFaults(`{"retry_after": "` + tt.format + `"}`); s != 200 {
				t.Fatalf("POST /faults: %d", s)
			}
			u := urls[0] + "/ra" + strconv.Itoa(i)
			get(t, clientFrom(t, "127.0."+strconv.Itoa(10+i)+".1"), u)
			r := get(t, clientFrom(t, "127.0."+strconv.Itoa(10+i)+".1"), u)
			if r.status != 429 || !tt.check(r) {
				t.Fatalf("%d Retry-After %q Date %q", r.status, r.header.Get("Retry-After"), r.header.Get("Date"))
			}
		})
	}

	t.Run("reset", func(t *testing.T) {
		setFaults(`{"reset_ratio": 1, "authorities": [1]}`)
		cl := clientFrom(t, "127.0.20.1")
		if _, err := cl.Get(urls[1] + "/r"); err == nil {
			t.Fatal("reset fault: request succeeded")
		}
		if r := get(t, cl, urls[0]+"/r"); r.status != 200 {
			t.Fatalf("authority 0 is not faulted: %d", r.status)
		}
	})
	t.Run("truncate", func(t *testing.T) {
		setFaults(`{"truncate_ratio": 1}`)
		resp, err := clientFrom(t, "127.0.21.1").Get(urls[0] + "/t?size=100000")
		if err != nil {
			t.Fatal(err)
		}
		b, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err == nil || len(b) >= 100000 || resp.ContentLength != 100000 {
			t.Fatalf("truncate: read %d of %d bytes, err %v; want a short read with an error", len(b), resp.ContentLength, err)
		}
	})
	t.Run("slow body waits on the origin's clock", func(t *testing.T) {
		setFaults(`{"slow_ratio": 1, "slow_bytes_per_second": 10}`)
		got := make(chan reply, 1)
		slowClient := clientFrom(t, "127.0.22.1")
		go func() {
			r, err := try(slowClient, "GET", urls[0]+"/slow?size=5")
			if err != nil {
				t.Error(err)
			}
			got <- r
		}()
		for i := 0; i < 10000; i++ {
			select {
			case r := <-got:
				if !bytes.Equal(r.body, stuborigin.ObjectBytes("/slow", 5)) {
					t.Fatalf("slow body: %q", r.body)
				}
				if i < 4 {
					t.Fatalf("body of 5 bytes at 1 byte per 100 ms done after %d clock steps", i)
				}
				return
			default:
			}
			if fc.Timers() > 0 {
				fc.Advance(100 * time.Millisecond)
			} else {
				time.Sleep(time.Millisecond) // yield until the handler arms its timer
			}
		}
		t.Fatal("slow body never finished")
	})
}

func TestProfileValidation(t *testing.T) {
	tests := []struct {
		name, json, want string
	}{
		{"no quotas", `{"name":"x"}`, "quotas: required"},
		{"no anonymous", `{"quotas":{"default":{"burst":{"capacity":1,"refill_per_second":1},"sustained":{"capacity":1,"window":"1s"}}}}`, "quotas.anonymous: required"},
		{"bad burst", `{"quotas":{"anonymous":{"burst":{"capacity":0,"refill_per_second":1},"sustained":{"capacity":1,"window":"1s"}}}}`, "quotas.anonymous.burst.capacity"},
		{"bad window", `{"quotas":{"anonymous":{"burst":{"capacity":1,"refill_per_second":1},"sustained":{"capacity":1,"window":"soon"}}}}`, "decode"},
		{"unknown field", `{"quota":{}}`, "unknown field"},
		{"token without quota", `{"quotas":{"anonymous":{"burst":{"capacity":1,"refill_per_second":1},"sustained":{"capacity":1,"window":"1s"}}},"tokens":{"secret":{"principal":"p","tenant":"t"}}}`, `names quota "default"`},
		{"share", `{"quotas":{"anonymous":{"burst":{"capacity":1,"refill_per_second":1},"sustained":{"capacity":1,"window":"1s"}}},"shard":{"capacity":5,"window":"1s","tenant_share":1.5}}`, "shard.tenant_share"},
		{"headers", `{"quotas":{"anonymous":{"burst":{"capacity":1,"refill_per_second":1},"sustained":{"capacity":1,"window":"1s"}}},"rate_limit_headers":"github"}`, "rate_limit_headers"},
		{"faults", `{"quotas":{"anonymous":{"burst":{"capacity":1,"refill_per_second":1},"sustained":{"capacity":1,"window":"1s"}}},"faults":{"reset_ratio":0.7,"truncate_ratio":0.7}}`, "at most 1"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := stuborigin.ParseProfile([]byte(tt.json))
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("error %v, want it to mention %q", err, tt.want)
			}
			if err != nil && strings.Contains(err.Error(), "secret") {
				t.Fatalf("error %v reveals a token", err)
			}
		})
	}
}

func TestExampleProfilesLoad(t *testing.T) {
	for _, name := range []string{"throttling", "generous", "tenants", "faulty"} {
		t.Run(name, func(t *testing.T) {
			p, err := stuborigin.LoadProfile("../testdata/profiles/" + name + ".json")
			if err != nil {
				t.Fatal(err)
			}
			if _, err := stuborigin.New(p, &stuborigin.Options{Authorities: 50}); err != nil {
				t.Fatal(err)
			}
			if p.SustainedRate("anonymous") <= 0 {
				t.Fatal("no sustained rate for anonymous callers")
			}
		})
	}
}

func TestStatsSum(t *testing.T) {
	p := &stuborigin.Profile{Name: "t", Quotas: map[string]stuborigin.Quota{"anonymous": quota(1, 1, 100, 100*time.Second)}}
	og, fc, urls := startOrigin(t, p, 3)
	c := clientFrom(t, "127.0.0.1")
	for _, u := range urls {
		get(t, c, u+"/x") // admitted
		get(t, c, u+"/x") // 429
	}
	fc.Advance(2 * time.Second)
	get(t, c, urls[1]+"/x")
	sum := og.Stats().Sum()
	if sum.Requests != 7 || sum.Admitted != 4 || sum.RateLimited != 3 || sum.IdentityCount != 3 || sum.Reasons["burst"] != 3 {
		t.Fatalf("sum %+v", sum)
	}
	if len(sum.Timeline) != 3 || sum.Timeline[0].Requests != 6 || sum.Timeline[2].Admitted != 1 {
		t.Fatalf("timeline %+v", sum.Timeline)
	}
}
