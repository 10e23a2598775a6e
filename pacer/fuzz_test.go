package pacer_test

import (
	"net/http"
	"testing"
	"time"

	"github.com/mirrorworker/mirrorworker/pacer"
)

// The fuzz targets check that no header value makes the parsers panic or
// produce a negative or absurd delay, and that the pacer never lets such a
// value through as a pause over 600 s. Seed corpora: testdata/fuzz/<Name>/.

var fuzzNow = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)

const maxParsed = (1 << 32) * time.Second

func checkPacer(t *testing.T, status int, h http.Header) {
	t.Helper()
	p := pacer.New(&pacer.Options{Rand: func() float64 { return 0.5 }})
	pm, err := p.Acquire(fuzzNow, "fuzz.example:443", 0)
	if err != nil {
		t.Fatal(err)
	}
	v := p.Done(fuzzNow, pm, pacer.Response{Status: status, Header: h})
	if !v.Until.IsZero() && (v.Until.Sub(fuzzNow) > 600*time.Second || !v.Until.After(fuzzNow)) {
		t.Fatalf("pause %s", v.Until.Sub(fuzzNow))
	}
	for _, q := range pacer.ParseQuotas(h, fuzzNow, nil) {
		if q.Remaining < 0 || q.Reset < 0 || q.Limit < 0 || q.Window < 0 || q.Interval() < 0 {
			t.Fatalf("quota %+v", q)
		}
	}
	// Whatever a budget reading said, an authority with nothing out is
	// never stalled by it for longer than the cap of any pause.
	later := fuzzNow.Add(601 * time.Second)
	pm, err = p.Acquire(later, "fuzz.example:443", 0)
	if err != nil {
		t.Fatalf("after %v: %v", later.Sub(fuzzNow), err)
	}
	p.Done(later, pm, pacer.Response{Cancelled: true})
}

func FuzzParseRetryAfter(f *testing.F) {
	f.Fuzz(func(t *testing.T, value, date string) {
		d, ok := pacer.ParseRetryAfter(value, date, fuzzNow)
		if d < 0 || !ok && d != 0 {
			t.Fatalf("ParseRetryAfter(%q, %q) = %s, %v", value, date, d, ok)
		}
		checkPacer(t, 429, http.Header{"Retry-After": {value}, "Date": {date}})
		checkPacer(t, 503, http.Header{"Retry-After": {value}, "Date": {date}})
	})
}

func fuzzFamily(f *testing.F, remaining, reset string) {
	f.Fuzz(func(t *testing.T, rem, rst string) {
		h := http.Header{remaining: {rem}, reset: {rst}}
		fb := pacer.ParseFeedback(200, h, fuzzNow)
		if fb.Reset < 0 || (fb.Reset > 0) != (fb.Family != "") {
			t.Fatalf("%q %q: %+v", rem, rst, fb)
		}
		checkPacer(t, 200, h)
		checkPacer(t, 403, h)
	})
}

func FuzzIETFRateLimit(f *testing.F) {
	f.Fuzz(func(t *testing.T, field, policy string) {
		h := http.Header{"Ratelimit": {field}, "Ratelimit-Policy": {policy}}
		fb := pacer.ParseFeedback(200, h, fuzzNow)
		if fb.Reset < 0 || fb.Reset > maxParsed || fb.Reset%time.Second != 0 {
			t.Fatalf("%q: %+v", field, fb)
		}
		checkPacer(t, 429, h)
	})
}

func FuzzRateLimitReset(f *testing.F) {
	fuzzFamily(f, "Ratelimit-Remaining", "Ratelimit-Reset")
}

func FuzzXRateLimitReset(f *testing.F) {
	fuzzFamily(f, "X-Ratelimit-Remaining", "X-Ratelimit-Reset")
}

func FuzzXRateDashLimitReset(f *testing.F) {
	fuzzFamily(f, "X-Rate-Limit-Remaining", "X-Rate-Limit-Reset")
}

func FuzzXRateLimitResetAfter(f *testing.F) {
	fuzzFamily(f, "X-Ratelimit-Remaining", "X-Ratelimit-Reset-After")
}

func FuzzParsePolicy(f *testing.F) {
	f.Fuzz(func(t *testing.T, data []byte) {
		p, err := pacer.ParsePolicy(data)
		if err != nil {
			return
		}
		if p.Default.Floor < 0 || p.Default.MaxInFlight < 1 {
			t.Fatalf("accepted %+v", p.Default)
		}
		for k, l := range p.Authorities {
			if l.Floor < 0 || l.MaxInFlight < 1 || k == "" {
				t.Fatalf("accepted %q %+v", k, l)
			}
		}
	})
}
