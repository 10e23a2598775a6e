package pacer_test

import (
	"net/http"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/mirrorworker/mirrorworker/pacer"
)

func TestParseRetryAfter(t *testing.T) {
	now := time.Date(1994, 11, 6, 8, 49, 7, 0, time.UTC) // the RFC's example day
	tests := []struct {
		value, date string
		want        time.Duration
		ok          bool
	}{
		{"120", "", 120 * time.Second, true},
		{" 120 ", "", 120 * time.Second, true},
		{"0", "", 0, true},
		{"1.2", "", 2 * time.Second, true},
		{"1.0", "", time.Second, true},
		{"0.001", "", time.Second, true},
		{"0.0000000001", "", time.Second, true},
		{".5", "", time.Second, true},
		{"5.", "", 5 * time.Second, true},
		{"99999999999999999999999", "", (1 << 32) * time.Second, true}, // saturates; the pacer caps it
		{"", "", 0, false},
		{"-1", "", 0, false},
		{"+1", "", 0, false},
		{"1e3", "", 0, false},
		{"1.2.3", "", 0, false},
		{"soon", "", 0, false},
		{".", "", 0, false},
		// the three RFC 9110 forms, measured against now
		{"Sun, 06 Nov 1994 08:49:37 GMT", "", 30 * time.Second, true},
		{"Sunday, 06-Nov-94 08:49:37 GMT", "", 30 * time.Second, true},
		{"Sun Nov  6 08:49:37 1994", "", 30 * time.Second, true},
		// measured against the response Date when present and valid
		{"Sun, 06 Nov 1994 08:49:37 GMT", "Sun, 06 Nov 1994 08:48:37 GMT", 60 * time.Second, true},
		{"Sun, 06 Nov 1994 08:49:37 GMT", "Sunday, 06-Nov-94 08:49:27 GMT", 10 * time.Second, true},
		{"Sun, 06 Nov 1994 08:49:37 GMT", "garbage", 30 * time.Second, true},
		// expired is valid but zero
		{"Sun, 06 Nov 1994 08:00:00 GMT", "", 0, true},
		{"Sun, 06 Nov 1994 08:49:37", "", 0, false},
		{"06 Nov 1994 08:49:37 GMT", "", 0, false},
	}
	for _, tt := range tests {
		got, ok := pacer.ParseRetryAfter(tt.value, tt.date, now)
		if got != tt.want || ok != tt.ok {
			t.Errorf("ParseRetryAfter(%q, %q) = %s, %v; want %s, %v", tt.value, tt.date, got, ok, tt.want, tt.ok)
		}
	}
}

func TestParseReset(t *testing.T) {
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	sec := strconv.FormatInt(now.Unix(), 10)
	ms := strconv.FormatInt(now.UnixMilli(), 10)
	tests := []struct {
		value string
		want  time.Duration
		ok    bool
	}{
		{"30", 30 * time.Second, true},
		{"2.5", 3 * time.Second, true},
		{"0", 0, true},
		{strconv.FormatInt(now.Unix()+42, 10), 42 * time.Second, true},
		{sec + ".5", 500 * time.Millisecond, true},
		{strconv.FormatInt(now.UnixMilli()+1500, 10), 1500 * time.Millisecond, true},
		{strconv.FormatInt(now.Unix()-42, 10), 0, true},
		{ms, 0, true},
		{"1m30s", 90 * time.Second, true},
		{"1.5s", 1500 * time.Millisecond, true},
		{"250ms", 250 * time.Millisecond, true},
		{"-1m", 0, false},
		{"-5", 0, false},
		{"", 0, false},
		{"tomorrow", 0, false},
		{"99999999999999999999999999", (1 << 32) * time.Second, true},
	}
	for _, tt := range tests {
		got, ok := pacer.ParseReset(tt.value, now)
		if got != tt.want || ok != tt.ok {
			t.Errorf("ParseReset(%q) = %s, %v; want %s, %v", tt.value, got, ok, tt.want, tt.ok)
		}
	}
}

func TestParseFeedbackFamilies(t *testing.T) {
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	epoch := func(d time.Duration) string { return strconv.FormatInt(now.Add(d).Unix(), 10) }
	tests := []struct {
		name   string
		h      http.Header
		reset  time.Duration
		family string
	}{
		{"none", nil, 0, ""},
		{"IETF exhausted", hdr("RateLimit", `"default";r=0;t=30`), 30 * time.Second, pacer.FamilyIETF},
		{"IETF with policy field", hdr("RateLimit-Policy", `"default";q=100;w=60`, "RateLimit", `"default";r=0;t=45`), 45 * time.Second, pacer.FamilyIETF},
		{"IETF token name", hdr("RateLimit", `default;r=0;t=5`), 5 * time.Second, pacer.FamilyIETF},
		{"IETF longest exhausted item", hdr("RateLimit", `"a";r=0;t=5, "b";r=0;t=50, "c";r=3;t=500`), 50 * time.Second, pacer.FamilyIETF},
		{"IETF list over two lines", hdr("RateLimit", `"a";r=5;t=5`, "RateLimit", `"b";r=0;t=8`), 8 * time.Second, pacer.FamilyIETF},
		{"IETF remaining left", hdr("RateLimit", `"default";r=1;t=30`), 0, ""},
		{"IETF zero reset", hdr("RateLimit", `"default";r=0;t=0`), 0, ""},
		{"IETF no t", hdr("RateLimit", `"default";r=0`), 0, ""},
		{"IETF decimal r ignored", hdr("RateLimit", `"default";r=0.0;t=30`), 0, ""},
		{"IETF string t ignored", hdr("RateLimit", `"default";r=0;t="30"`), 0, ""},
		{"IETF malformed field ignored", hdr("RateLimit", `"default";r=0;t=30,`), 0, ""},
		{"IETF uppercase key is malformed", hdr("RateLimit", `"default";R=0;T=30`), 0, ""},
		{"IETF old dictionary draft is not this family", hdr("RateLimit", `limit=100, remaining=0, reset=30`), 0, ""},
		{"IETF inner list and other params", hdr("RateLimit", `(1 2);x, "q";pk=:YWJj:;r=0;t=9;ok=?1`), 9 * time.Second, pacer.FamilyIETF},
		{"RateLimit-Remaining/Reset", hdr("RateLimit-Remaining", "0", "RateLimit-Reset", "12"), 12 * time.Second, pacer.FamilyRateLimit},
		{"RateLimit-Reset alone", hdr("RateLimit-Reset", "12"), 0, ""},
		{"X-RateLimit relative", hdr("X-RateLimit-Remaining", "0", "X-RateLimit-Reset", "20"), 20 * time.Second, pacer.FamilyXRateLimit},
		{"X-RateLimit epoch seconds", hdr("X-RateLimit-Remaining", "0", "X-RateLimit-Reset", epoch(75*time.Second)), 75 * time.Second, pacer.FamilyXRateLimit},
		{"X-RateLimit epoch against Date", hdr("X-RateLimit-Remaining", "0", "X-RateLimit-Reset", epoch(75*time.Second), "Date", now.Add(-25*time.Second).Format(http.TimeFormat)), 100 * time.Second, pacer.FamilyXRateLimit},
		{"X-RateLimit epoch ms", hdr("X-RateLimit-Remaining", "0", "X-RateLimit-Reset", strconv.FormatInt(now.Add(2*time.Second).UnixMilli(), 10)), 2 * time.Second, pacer.FamilyXRateLimit},
		{"X-RateLimit Go duration", hdr("X-RateLimit-Remaining", "0", "X-RateLimit-Reset", "1m30s"), 90 * time.Second, pacer.FamilyXRateLimit},
		{"X-RateLimit remaining 2", hdr("X-RateLimit-Remaining", "2", "X-RateLimit-Reset", "20"), 0, ""},
		{"X-RateLimit remaining malformed", hdr("X-RateLimit-Remaining", "none", "X-RateLimit-Reset", "20"), 0, ""},
		{"X-RateLimit past epoch", hdr("X-RateLimit-Remaining", "0", "X-RateLimit-Reset", epoch(-time.Minute)), 0, ""},
		{"X-Rate-Limit", hdr("X-Rate-Limit-Remaining", "0", "X-Rate-Limit-Reset", "33"), 33 * time.Second, pacer.FamilyXRateDash},
		{"X-RateLimit-Reset-After decimal", hdr("X-RateLimit-Remaining", "0", "X-RateLimit-Reset-After", "2.25"), 3 * time.Second, pacer.FamilyXResetAfter},
		{"X-RateLimit-Reset-After is relative only", hdr("X-RateLimit-Remaining", "0", "X-RateLimit-Reset-After", "1m"), 0, ""},
		{"families pair their own fields", hdr("X-Rate-Limit-Remaining", "0", "X-RateLimit-Reset", "50", "RateLimit-Remaining", "0", "X-Rate-Limit-Reset", "5"), 5 * time.Second, pacer.FamilyXRateDash},
		{"longest exhausted family wins", hdr("RateLimit", `"d";r=0;t=40`, "X-RateLimit-Remaining", "0", "X-RateLimit-Reset", "10"), 40 * time.Second, pacer.FamilyIETF},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := pacer.ParseFeedback(200, tt.h, now)
			if f.Reset != tt.reset || f.Family != tt.family || f.Exhausted() != (tt.reset > 0) {
				t.Fatalf("reset %s family %q, want %s %q", f.Reset, f.Family, tt.reset, tt.family)
			}
		})
	}
}

func TestFeedbackVerdict(t *testing.T) {
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	ex := []string{"X-RateLimit-Remaining", "0", "X-RateLimit-Reset", "20"}
	tests := []struct {
		status    int
		h         http.Header
		throttled bool
		reason    string
		hint      time.Duration
	}{
		{429, nil, true, "429", 0},
		{429, hdr("Retry-After", "5"), true, "429", 5 * time.Second},
		{503, nil, false, "", 0},
		{503, hdr("Retry-After", "0"), false, "", 0},
		{503, hdr("Retry-After", "5"), true, "503", 5 * time.Second},
		{403, nil, false, "", 0},
		{403, hdr(ex...), true, "403", 20 * time.Second},
		{200, hdr(ex...), false, "ratelimit", 20 * time.Second},
		{200, hdr(append(ex, "Retry-After", "3")...), false, "ratelimit", 3 * time.Second},
		{200, hdr("Retry-After", "3"), false, "", 3 * time.Second},
		{500, hdr("Retry-After", "3"), false, "", 3 * time.Second},
	}
	for _, tt := range tests {
		f := pacer.ParseFeedback(tt.status, tt.h, now)
		if f.Throttled() != tt.throttled || f.Reason() != tt.reason || f.Hint() != tt.hint {
			t.Errorf("%d %v: throttled %v reason %q hint %s; want %v %q %s", tt.status, tt.h, f.Throttled(), f.Reason(), f.Hint(), tt.throttled, tt.reason, tt.hint)
		}
	}
}

func TestParseFeedbackNoAllocs(t *testing.T) {
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	h := hdr("Content-Type", "text/plain", "X-RateLimit-Remaining", "7", "X-RateLimit-Reset", "20", "RateLimit", `"d";r=5;t=3`)
	if n := testing.AllocsPerRun(100, func() { pacer.ParseFeedback(200, h, now) }); n != 0 {
		t.Fatalf("%v allocs per ParseFeedback, want 0", n)
	}
}

func TestParseFeedbackQuotas(t *testing.T) {
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	epoch := strconv.FormatInt(now.Unix()+30, 10)
	type q = pacer.Quota
	tests := []struct {
		name string
		h    http.Header
		want []pacer.Quota
	}{
		{"none", hdr("Content-Type", "text/plain"), nil},
		{"ietf with its named policy",
			hdr("RateLimit", `"sustained";r=3;t=7`, "RateLimit-Policy", `"burst";q=5;w=2, "sustained";q=20;w=10`),
			[]q{{Family: pacer.FamilyIETF, Policy: "sustained", Remaining: 3, Reset: 7 * time.Second, Limit: 20, Window: 10 * time.Second}}},
		{"ietf, two items, one policy each",
			hdr("RateLimit", `"a";r=0;t=1, "b";r=9;t=60`, "RateLimit-Policy", `"b";q=100;w=60, "a";q=2;w=1`),
			[]q{{Family: pacer.FamilyIETF, Policy: "a", Remaining: 0, Reset: time.Second, Limit: 2, Window: time.Second},
				{Family: pacer.FamilyIETF, Policy: "b", Remaining: 9, Reset: time.Minute, Limit: 100, Window: time.Minute}}},
		{"ietf, policy not named: the slowest announced",
			hdr("RateLimit", `"x";r=4;t=5`, "RateLimit-Policy", `10;w=1, 100;w=60`),
			[]q{{Family: pacer.FamilyIETF, Policy: "x", Remaining: 4, Reset: 5 * time.Second, Limit: 100, Window: time.Minute}}},
		{"ietf without a policy", hdr("RateLimit", `"x";r=4;t=5`),
			[]q{{Family: pacer.FamilyIETF, Policy: "x", Remaining: 4, Reset: 5 * time.Second}}},
		{"ietf, malformed policy field: the count stays",
			hdr("RateLimit", `"x";r=4;t=5`, "RateLimit-Policy", `"x";q=5;w=`),
			[]q{{Family: pacer.FamilyIETF, Policy: "x", Remaining: 4, Reset: 5 * time.Second}}},
		{"ietf, malformed RateLimit: ignored as a whole", hdr("RateLimit", `"x";r=4;t=5,`), nil},
		{"ietf item without r", hdr("RateLimit", `"x";t=5`), nil},
		{"x-ratelimit with an epoch reset and a windowed limit",
			hdr("X-RateLimit-Remaining", "12", "X-RateLimit-Reset", epoch, "X-RateLimit-Limit", "60, 60;w=60"),
			[]q{{Family: pacer.FamilyXRateLimit, Remaining: 12, Reset: 30 * time.Second, Limit: 60, Window: time.Minute}}},
		{"x-ratelimit with reset-after", hdr("X-RateLimit-Remaining", "2", "X-RateLimit-Reset-After", "1.5"),
			[]q{{Family: pacer.FamilyXRateLimit, Remaining: 2, Reset: 2 * time.Second}}},
		{"ratelimit-* of the earlier drafts",
			hdr("RateLimit-Remaining", "5", "RateLimit-Reset", "9", "RateLimit-Limit", "10, 10;w=20"),
			[]q{{Family: pacer.FamilyRateLimit, Remaining: 5, Reset: 9 * time.Second, Limit: 10, Window: 20 * time.Second}}},
		{"x-rate-limit-*", hdr("X-Rate-Limit-Remaining", "0", "X-Rate-Limit-Reset", "3"),
			[]q{{Family: pacer.FamilyXRateDash, Remaining: 0, Reset: 3 * time.Second}}},
		{"a remaining that is not a count", hdr("X-RateLimit-Remaining", "lots", "X-RateLimit-Reset", "3"), nil},
		{"a fractional remaining", hdr("X-RateLimit-Remaining", "1.5"), nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := pacer.ParseQuotas(tt.h, now, nil)
			// Announces says a remaining field is present, valid or not:
			// every row but the first has one.
			if f := pacer.ParseFeedback(200, tt.h, now); f.Announces != (tt.name != "none") {
				t.Errorf("Announces %v", f.Announces)
			}
			if len(got) != len(tt.want) {
				t.Fatalf("quotas %+v, want %+v", got, tt.want)
			}
			for i := range got {
				if got[i] != tt.want[i] {
					t.Errorf("quota %d: %+v, want %+v", i, got[i], tt.want[i])
				}
			}
		})
	}
}

func TestParseQuotasNoAllocs(t *testing.T) {
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	h := hdr("X-RateLimit-Remaining", "7", "X-RateLimit-Reset", "20", "X-RateLimit-Limit", "60, 60;w=60",
		"RateLimit", `"d";r=5;t=3`, "RateLimit-Policy", `"d";q=10;w=1`)
	buf := make([]pacer.Quota, 0, pacer.MaxQuotas)
	if n := testing.AllocsPerRun(100, func() { pacer.ParseQuotas(h, now, buf[:0]) }); n != 0 {
		t.Fatalf("%v allocs per ParseQuotas, want 0", n)
	}
}

func TestQuotaInterval(t *testing.T) {
	tests := []struct {
		q    pacer.Quota
		want time.Duration
	}{
		{pacer.Quota{Limit: 20, Window: 10 * time.Second}, 500 * time.Millisecond},
		{pacer.Quota{Limit: 3, Window: time.Second}, 333333334 * time.Nanosecond}, // rounded up: never faster
		{pacer.Quota{Limit: 0, Window: time.Second}, 0},
		{pacer.Quota{Limit: 5}, 0},
	}
	for _, tt := range tests {
		if got := tt.q.Interval(); got != tt.want {
			t.Errorf("%+v: %v, want %v", tt.q, got, tt.want)
		}
	}
}

// TestThrottleHeaders: the list names, in canonical form, fields the
// parsers read, and a caller's change does not leak into the next call.
func TestThrottleHeaders(t *testing.T) {
	got := pacer.ThrottleHeaders()
	want := []string{"Retry-After", "Ratelimit", "Ratelimit-Policy", "Ratelimit-Remaining", "Ratelimit-Reset",
		"X-Ratelimit-Remaining", "X-Ratelimit-Reset", "X-Ratelimit-Reset-After", "X-Rate-Limit-Remaining", "X-Rate-Limit-Reset"}
	if !slices.Equal(got, want) {
		t.Fatalf("ThrottleHeaders() = %q, want %q", got, want)
	}
	got[0] = "changed"
	if pacer.ThrottleHeaders()[0] != "Retry-After" {
		t.Fatal("a caller's change leaked into the package's list")
	}
}
