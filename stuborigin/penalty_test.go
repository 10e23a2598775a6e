package stuborigin_test

import (
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/mirrorworker/mirrorworker/stuborigin"
)

// penaltyProfile admits one request per identity every 10 s (a burst of
// one), so a second request at the same instant is told to wait 10 s and
// every further one is early; pen is the penalty under test.
func penaltyProfile(pen stuborigin.Penalty) *stuborigin.Profile {
	return &stuborigin.Profile{
		Name:    "penalty",
		Quotas:  map[string]stuborigin.Quota{"anonymous": quota(1, 0.1, 1000, time.Hour)},
		Penalty: &pen,
	}
}

func retryAfter(t *testing.T, r reply) int {
	t.Helper()
	ra := r.header.Get("Retry-After")
	n, err := strconv.Atoi(ra)
	if err != nil {
		t.Fatalf("Retry-After %q: %v (status %d, %s)", ra, err, r.status, r.body)
	}
	return n
}

// rude sends n requests at the current fake instant and returns the last.
func rude(t *testing.T, c *http.Client, u string, n int) reply {
	t.Helper()
	var r reply
	for range n {
		r = get(t, c, u)
	}
	return r
}

func identityOf(t *testing.T, og *stuborigin.Origin, early bool) stuborigin.IdentityStats {
	t.Helper()
	ids := og.Stats().Authorities[0].Identities
	for _, id := range ids {
		if (id.Early > 0) == early {
			return id
		}
	}
	t.Fatalf("no identity with early>0 = %v in %+v", early, ids)
	return stuborigin.IdentityStats{}
}

// K early requests start a ban of D: every request in it gets the ban's
// answer (429 banned, Retry-After the time left), buckets full or not; it
// ends at D; a polite caller of another identity on the same authority is
// never banned.
func TestBanAfterKEarlyRequestsLastsD(t *testing.T) {
	const k, d = 5, 60 * time.Second
	og, fc, urls := startOrigin(t, penaltyProfile(stuborigin.Penalty{
		After: k, Within: dur(10 * time.Second), For: dur(d),
		Ban: &stuborigin.Ban{Status: 429, Disclosed: true},
	}), 1)
	u := urls[0] + "/obj"
	bad, polite := clientFrom(t, "127.0.0.1"), clientFrom(t, "127.0.1.1")

	if r := get(t, bad, u); r.status != 200 {
		t.Fatalf("first request: %d", r.status)
	}
	if r := get(t, bad, u); r.status != 429 || r.reason() != "burst" || retryAfter(t, r) != 10 {
		t.Fatalf("second request: %d %s RA %s, want 429 burst RA 10", r.status, r.reason(), r.header.Get("Retry-After"))
	}
	// k-1 early requests are ordinary 429s; the k-th starts the ban.
	for i := range k - 1 {
		if r := get(t, bad, u); r.reason() != "burst" {
			t.Fatalf("early request %d: %d %s, want an ordinary 429 before the %d-th", i+1, r.status, r.reason(), k)
		}
	}
	r := get(t, bad, u)
	if r.status != 429 || r.code() != "rate_limited" || r.reason() != "banned" || retryAfter(t, r) != 60 {
		t.Fatalf("%d-th early request: %d %s/%s RA %q, want 429 rate_limited/banned RA 60", k, r.status, r.code(), r.reason(), r.header.Get("Retry-After"))
	}

	// The polite caller waits what it is told, all through the ban.
	var politeDeadline time.Time
	step := func(adv time.Duration) {
		fc.Advance(adv)
		if fc.Now().Before(politeDeadline) {
			return
		}
		pr := get(t, polite, u)
		switch pr.status {
		case 200:
		case 429:
			if pr.reason() == "banned" {
				t.Fatalf("polite caller banned at %v", fc.Now().Sub(t0))
			}
			politeDeadline = fc.Now().Add(time.Duration(retryAfter(t, pr)) * time.Second)
		default:
			t.Fatalf("polite caller: %d", pr.status)
		}
	}

	// Halfway, with the rude caller's buckets long full: still banned,
	// told the time left.
	step(30 * time.Second)
	if r := get(t, bad, u); r.status != 429 || r.reason() != "banned" || retryAfter(t, r) != 30 {
		t.Fatalf("at 30 s: %d %s RA %q, want banned RA 30", r.status, r.reason(), r.header.Get("Retry-After"))
	}
	step(30*time.Second - time.Millisecond)
	if r := get(t, bad, u); r.reason() != "banned" {
		t.Fatalf("1 ms before the end: %d %s, want banned", r.status, r.reason())
	}
	step(time.Millisecond)
	if r := get(t, bad, u); r.status != 200 {
		t.Fatalf("at D: %d %s, want 200 (the ban ended)", r.status, r.reason())
	}
	for range 20 {
		step(2 * time.Second)
	}

	st := og.Stats().Authorities[0]
	if st.Penalty.Bans != 1 || st.Penalty.DuringBans != 3 || st.Penalty.BannedSeconds != d.Seconds() {
		t.Errorf("authority penalty %+v, want 1 ban, 3 requests during it, 60 s banned", st.Penalty)
	}
	if len(st.BanPeriods) != 1 || st.BanPeriods[0].Start != 0 || st.BanPeriods[0].End != 60 || st.BanPeriods[0].Ongoing {
		t.Errorf("ban periods %+v, want one from 0 to 60 s", st.BanPeriods)
	}
	if st.Reasons["banned"] != 3 {
		t.Errorf("reasons %v, want 3 banned", st.Reasons)
	}
	p := identityOf(t, og, false)
	if p.Penalty.Bans != 0 || p.Penalty.Penalties != 0 || p.Admitted == 0 {
		t.Errorf("polite identity %+v: want admitted, never penalized", p)
	}
}

// The ban can be a 403 that says nothing of a ban or of when it ends, or a
// 429 that looks like ordinary throttling: the caller cannot read it.
func TestUndisclosedBans(t *testing.T) {
	for _, tc := range []struct {
		status         int
		code, reason   string
		wantRetryAfter bool
	}{
		{status: 403, code: "forbidden", reason: ""},
		{status: 429, code: "rate_limited", reason: "sustained", wantRetryAfter: true}, // both buckets full: the default reason
	} {
		t.Run(strconv.Itoa(tc.status), func(t *testing.T) {
			og, fc, urls := startOrigin(t, penaltyProfile(stuborigin.Penalty{
				After: 3, Within: dur(10 * time.Second), For: dur(time.Minute),
				Ban: &stuborigin.Ban{Status: tc.status},
			}), 1)
			u := urls[0] + "/obj"
			c := clientFrom(t, "127.0.0.1")
			rude(t, c, u, 2+3) // 200, 429 (told 10 s), 3 early: banned
			fc.Advance(20 * time.Second)
			r := get(t, c, u) // buckets full again: only the ban refuses it
			if r.status != tc.status || r.code() != tc.code || r.reason() != tc.reason {
				t.Fatalf("during the ban: %d %s/%s, want %d %s/%s", r.status, r.code(), r.reason(), tc.status, tc.code, tc.reason)
			}
			if got := r.header.Get("Retry-After") != ""; got != tc.wantRetryAfter {
				t.Fatalf("Retry-After %q, want present %v", r.header.Get("Retry-After"), tc.wantRetryAfter)
			}
			if strings.Contains(string(r.body), "ban") {
				t.Fatalf("body %s names the ban", r.body)
			}
			fc.Advance(40 * time.Second)
			if r := get(t, c, u); r.status != 200 {
				t.Fatalf("after the ban: %d", r.status)
			}
			pen := og.Stats().Authorities[0].Penalty
			if pen.Bans != 1 || pen.DuringBans < 2 {
				t.Errorf("penalty %+v: want 1 ban with the requests during it counted", pen)
			}
		})
	}
}

// A tarpit holds each answer for T on the origin's clock while the caller
// is penalized, its connection open, and answers it then.
func TestTarpitDelaysByT(t *testing.T) {
	const tarpit = 5 * time.Second
	og, fc, urls := startOrigin(t, penaltyProfile(stuborigin.Penalty{
		After: 3, Within: dur(10 * time.Second), For: dur(time.Minute), Tarpit: dur(tarpit),
	}), 1)
	u := urls[0] + "/obj"
	c := clientFrom(t, "127.0.0.1")
	rude(t, c, u, 2+2) // 200, 429, 2 early: not yet penalized, answered at once

	got := make(chan reply, 1)
	go func() {
		r, err := try(c, http.MethodGet, u)
		if err != nil {
			t.Error(err)
		}
		got <- r
	}()
	deadline := time.Now().Add(20 * time.Second)
	for fc.Timers() == 0 {
		if time.Now().After(deadline) {
			t.Fatal("the 3rd early request was never held")
		}
		time.Sleep(time.Millisecond) // polling a condition, not timing the origin
	}
	fc.Advance(tarpit - time.Millisecond)
	select {
	case r := <-got:
		t.Fatalf("answered %d before T", r.status)
	default:
	}
	if fc.Timers() != 1 {
		t.Fatalf("%d timers armed 1 ms before T, want the tarpit's", fc.Timers())
	}
	fc.Advance(time.Millisecond)
	var r reply
	select {
	case r = <-got:
	case <-time.After(20 * time.Second):
		t.Fatal("no answer after T")
	}
	if r.status != 429 || r.reason() != "burst" {
		t.Fatalf("held answer: %d %s, want the ordinary 429 (a tarpit alone refuses nothing)", r.status, r.reason())
	}
	pen := og.Stats().Authorities[0].Penalty
	if pen.Tarpitted != 1 || pen.TarpitSeconds != tarpit.Seconds() || pen.Bans != 0 || pen.Penalties != 1 {
		t.Errorf("penalty %+v, want 1 penalty, 1 answer held 5 s, no ban", pen)
	}
}

// With a growing Retry-After, each early request during the penalty is told
// step more than the deadline it had, and that wait is enforced.
func TestRetryAfterGrowsWithEachEarlyRequest(t *testing.T) {
	og, fc, urls := startOrigin(t, penaltyProfile(stuborigin.Penalty{
		After: 2, Within: dur(10 * time.Second), For: dur(10 * time.Minute),
		RetryAfterStep: dur(30 * time.Second), RetryAfterMax: dur(2 * time.Minute),
	}), 1)
	u := urls[0] + "/obj"
	c := clientFrom(t, "127.0.0.1")
	rude(t, c, u, 2) // 200, 429 told 10 s
	get(t, c, u)     // early 1
	var ras []int
	for range 5 { // early 2 starts the penalty: 10+30, 70, 100, 120 (max), 120
		r := get(t, c, u)
		if r.status != 429 || r.reason() != "penalty" {
			t.Fatalf("early request in the penalty: %d %s", r.status, r.reason())
		}
		ras = append(ras, retryAfter(t, r))
	}
	want := []int{40, 70, 100, 120, 120}
	for i := range want {
		if ras[i] != want[i] {
			t.Fatalf("Retry-After %v, want %v", ras, want)
		}
	}
	// The buckets are full long before: the grown wait is what refuses.
	fc.Advance(119 * time.Second)
	if r := get(t, c, u); r.status != 429 || r.reason() != "penalty" {
		t.Fatalf("before the grown deadline: %d %s", r.status, r.reason())
	}
	// That request was early too, and grew the wait to the max again.
	fc.Advance(120 * time.Second)
	if r := get(t, c, u); r.status != 200 {
		t.Fatalf("at the grown deadline: %d %s", r.status, r.reason())
	}
	if pen := og.Stats().Authorities[0].Penalty; pen.Extended != 6 || pen.Bans != 0 {
		t.Errorf("penalty %+v, want 6 extended, no ban", pen)
	}
}

// Counting 429s penalizes a caller that never reads the answers, early or
// not (without a Retry-After nothing is early).
func TestBanAfterK429s(t *testing.T) {
	p := penaltyProfile(stuborigin.Penalty{
		Count: "429", After: 3, Within: dur(10 * time.Second), For: dur(time.Minute),
		Ban: &stuborigin.Ban{Disclosed: true},
	})
	p.Faults.RetryAfter = stuborigin.RetryAfterAbsent
	og, _, urls := startOrigin(t, p, 1)
	u := urls[0] + "/obj"
	c := clientFrom(t, "127.0.0.1")
	rude(t, c, u, 1+3) // 200, three 429s: the third starts the ban
	if r := get(t, c, u); r.reason() != "banned" {
		t.Fatalf("after 3 429s: %d %s, want banned", r.status, r.reason())
	}
	st := og.Stats().Authorities[0]
	if st.Early != 0 || st.Penalty.Bans != 1 {
		t.Errorf("early %d, penalty %+v: want 0 early and 1 ban", st.Early, st.Penalty)
	}
}

func TestPenaltyMetricsAndValidation(t *testing.T) {
	og, _, urls := startOrigin(t, penaltyProfile(stuborigin.Penalty{
		After: 2, Within: dur(10 * time.Second), For: dur(time.Minute), Ban: &stuborigin.Ban{Disclosed: true},
	}), 1)
	u := urls[0] + "/obj"
	rude(t, clientFrom(t, "127.0.0.1"), u, 2+2+1)
	m := scrape(t, og.AdminHandler())
	for _, want := range []string{
		`mirrorworker_stub_bans_total{authority="` + strings.TrimPrefix(urls[0], "http://") + `",caller="anonymous"} 1`,
		`mirrorworker_stub_banned_seconds_total{`,
		`mirrorworker_stub_requests_during_bans_total{authority=`,
		`mirrorworker_stub_tarpitted_total{`,
		`mirrorworker_stub_retry_after_extended_total{`,
		`mirrorworker_stub_rejections_total{authority="` + strings.TrimPrefix(urls[0], "http://") + `",caller="anonymous",code="rate_limited",reason="banned"} 2`,
	} {
		if !strings.Contains(m, want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
	for _, tc := range []struct{ json, want string }{
		{`{"after": 3, "within": "10s", "for": "1m"}`, "penalty.ban: a penalty needs"},
		{`{"after": 3, "for": "1m", "tarpit": "1s"}`, "penalty.within"},
		{`{"after": 3, "within": "1s", "for": "1m", "ban": {"status": 418}}`, "penalty.ban.status"},
		{`{"count": "often", "after": 3, "within": "1s", "for": "1m", "tarpit": "1s"}`, "penalty.count"},
	} {
		_, err := stuborigin.ParseProfile([]byte(`{"name": "x", "quotas": {"anonymous": {"burst": {"capacity": 1, "refill_per_second": 1}, "sustained": {"capacity": 1, "window": "1s"}}}, "penalty": ` + tc.json + `}`))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: err %v, want %q", tc.json, err, tc.want)
		}
	}
}

// The example profiles turn on the default penalty, and Describe says it in
// one line (the stub logs it; the load-test report shows it).
func TestExampleProfilesPenalty(t *testing.T) {
	p, err := stuborigin.LoadProfile("../testdata/profiles/throttling.json")
	if err != nil {
		t.Fatal(err)
	}
	if got, want := p.Penalty.Describe(), "after 10 early requests within 10s: banned 30s (429, disclosed)"; got != want {
		t.Errorf("Describe() = %q, want %q", got, want)
	}
	var none *stuborigin.Penalty
	if got := none.Describe(); got != "off" {
		t.Errorf("nil Describe() = %q, want off", got)
	}
	all := stuborigin.Penalty{Count: "429", After: 5, Within: dur(time.Minute), For: dur(time.Hour),
		Ban: &stuborigin.Ban{Status: 403}, Tarpit: dur(2 * time.Second), RetryAfterStep: dur(time.Minute)}
	if got, want := all.Describe(), "after 5 429 answers within 1m0s: banned 1h0m0s (403, undisclosed); answers held 2s for 1h0m0s; each early request waits 1m0s more (up to 1h0m0s)"; got != want {
		t.Errorf("Describe() = %q, want %q", got, want)
	}
}
