package pacer

import (
	"net/http"
	"strings"
	"time"
)

// Rate-limit family names, as Feedback.Family reports them. Each names the
// field that carries the family's reset.
const (
	FamilyIETF         = "RateLimit"               // RateLimit (structured, r and t), draft-ietf-httpapi-ratelimit-headers
	FamilyRateLimit    = "RateLimit-Reset"         // RateLimit-Remaining + RateLimit-Reset
	FamilyXRateLimit   = "X-RateLimit-Reset"       // X-RateLimit-Remaining + X-RateLimit-Reset
	FamilyXRateDash    = "X-Rate-Limit-Reset"      // X-Rate-Limit-Remaining + X-Rate-Limit-Reset
	FamilyXResetAfter  = "X-RateLimit-Reset-After" // X-RateLimit-Remaining + X-RateLimit-Reset-After
	maxHeaderSeconds   = 1 << 32                   // saturation for parsed seconds: far beyond any cap, far below Duration overflow
	epochSecondsAbove  = 1_000_000_000             // a bare reset at or above this is a Unix time in seconds (2001-09-09)
	epochMillisAbove   = 1_000_000_000_000         // ... and at or above this, in milliseconds
	canonicalRA        = "Retry-After"
	canonicalDate      = "Date"
	canonicalIETF      = "Ratelimit"
	canonicalRLRem     = "Ratelimit-Remaining"
	canonicalRLReset   = "Ratelimit-Reset"
	canonicalXRLRem    = "X-Ratelimit-Remaining"
	canonicalXRLReset  = "X-Ratelimit-Reset"
	canonicalXRDRem    = "X-Rate-Limit-Remaining"
	canonicalXRDReset  = "X-Rate-Limit-Reset"
	canonicalXRLResetA = "X-Ratelimit-Reset-After"
	canonicalIETFPol   = "Ratelimit-Policy"
	canonicalRLLimit   = "Ratelimit-Limit"
	canonicalXRLLimit  = "X-Ratelimit-Limit"
	canonicalXRDLimit  = "X-Rate-Limit-Limit"
)

// throttleHeaders are the response fields that explain a throttling
// answer, in the order ThrottleHeaders gives them.
var throttleHeaders = [...]string{canonicalRA, canonicalIETF, canonicalIETFPol, canonicalRLRem, canonicalRLReset,
	canonicalXRLRem, canonicalXRLReset, canonicalXRLResetA, canonicalXRDRem, canonicalXRDReset}

// ThrottleHeaders returns the canonical names of the response fields that
// explain a throttling answer (Retry-After and the rate-limit families'
// remaining, reset and policy fields this package reads), for a log line or
// a dead-letter detail. The caller may keep and change the slice.
func ThrottleHeaders() []string { return append([]string(nil), throttleHeaders[:]...) }

// Quota is one quota a response announces with what remains of it: an item
// of the IETF RateLimit field with r, or the Remaining header of a pair
// family. Where the origin also announces the quota's policy (RateLimit-Policy
// q and w, or a Limit header with a window such as "100;w=60"), Limit and
// Window give its sustained rate.
type Quota struct {
	Family string // the family, one of the Family constants
	Policy string // the IETF policy name; empty for the pair families
	// Remaining is how many requests the quota allowed when the response
	// was made, after this request.
	Remaining int64
	// Reset is how long until the quota resets (RateLimit t, or the
	// family's reset); zero when absent or not valid.
	Reset time.Duration
	// Limit requests per Window: the announced policy, zero when none.
	Limit  int64
	Window time.Duration
}

// Interval is the sustained spacing the quota's policy allows (Window /
// Limit, rounded up), or zero when no policy was announced.
func (q Quota) Interval() time.Duration {
	if q.Limit <= 0 || q.Window <= 0 {
		return 0
	}
	return (q.Window + time.Duration(q.Limit) - 1) / time.Duration(q.Limit)
}

// Feedback is what one response says about the origin's limits. The zero
// value says nothing.
type Feedback struct {
	Status int
	// RetryAfter is the Retry-After delay when RetryAfterValid; an expired
	// date or "0" gives a valid zero.
	RetryAfter      time.Duration
	RetryAfterValid bool
	// Reset is the longest reset among the exhausted rate-limit families
	// (remaining 0 and a positive reset), uncapped; zero when none is exhausted.
	Reset time.Duration
	// Family names the family that gave Reset (one of the Family constants).
	Family string
	// Announces reports that the response carries a remaining count (the
	// IETF RateLimit field, or a Remaining header of a pair family), which
	// ParseQuotas reads.
	Announces bool
	// Limiter is set by the pacer, never by ParseFeedback: it read this
	// 503 without a valid Retry-After as a rate limiter's refusal (it came
	// back at once while other requests succeed, or in the cold blast,
	// docs/adr/0030). It is
	// throttling without a cooldown: the interval escalates as for a 429,
	// no pause starts, no failure is counted.
	Limiter bool
	// limiterAgain: Limiter was read only because this was the request
	// sent after the cold blast's short step (limiterAgainLocked), for the
	// throttle fact's log line.
	limiterAgain bool
}

// MaxQuotas is how many announced quotas the pacer keeps per authority.
const MaxQuotas = 4

// Exhausted reports whether some rate-limit family is exhausted.
func (f Feedback) Exhausted() bool { return f.Reset > 0 }

// Throttled reports whether the response is the origin refusing for rate
// reasons: a 429, a 503 with a valid positive Retry-After or read as a
// limiter's refusal (Limiter), or a 403 with an exhausted rate-limit family.
func (f Feedback) Throttled() bool {
	switch f.Status {
	case http.StatusTooManyRequests:
		return true
	case http.StatusServiceUnavailable:
		return f.RetryAfterValid && f.RetryAfter > 0 || f.Limiter
	case http.StatusForbidden:
		return f.Exhausted()
	}
	return false
}

// Reason is the stable code of the signal: "429", "503", "limiter" (a 503
// read as a limiter's refusal, Limiter), "403", "ratelimit" (an exhausted
// family on another status), or "" when there is none.
func (f Feedback) Reason() string {
	if f.Throttled() {
		switch f.Status {
		case http.StatusTooManyRequests:
			return "429"
		case http.StatusServiceUnavailable:
			if !(f.RetryAfterValid && f.RetryAfter > 0) {
				return "limiter"
			}
			return "503"
		default:
			return "403"
		}
	}
	if f.Exhausted() {
		return "ratelimit"
	}
	return ""
}

// Hint is the pause the headers ask for, uncapped: a positive Retry-After
// takes precedence, otherwise the longest exhausted reset; zero if neither.
// It is only meaningful when the response is throttled or exhausted.
func (f Feedback) Hint() time.Duration {
	if f.RetryAfterValid && f.RetryAfter > 0 {
		return f.RetryAfter
	}
	return f.Reset
}

// ParseFeedback reads Retry-After and every rate-limit family of a response.
// HTTP-dates and epoch resets are measured against the response's Date header
// when it is present and valid, else against now. It does not allocate for a
// response without such headers; h must be canonical (as net/http makes it).
func ParseFeedback(status int, h http.Header, now time.Time) Feedback {
	f := Feedback{Status: status}
	if len(h) == 0 {
		return f
	}
	ref := now
	if d := h[canonicalDate]; len(d) > 0 {
		if t, err := http.ParseTime(trimOWS(d[0])); err == nil {
			ref = t
		}
	}
	if v := h[canonicalRA]; len(v) > 0 {
		f.RetryAfter, f.RetryAfterValid = retryAfterAt(v[0], ref)
	}
	f.Announces = len(h[canonicalIETF]) > 0 || len(h[canonicalRLRem]) > 0 || len(h[canonicalXRLRem]) > 0 || len(h[canonicalXRDRem]) > 0
	if v := h[canonicalIETF]; len(v) > 0 {
		s := v[0]
		if len(v) > 1 {
			s = strings.Join(v, ",") // one structured list split over lines
		}
		f.consider(ietfReset(s), FamilyIETF)
	}
	f.consider(pairReset(h, canonicalRLRem, canonicalRLReset, ref, false), FamilyRateLimit)
	f.consider(pairReset(h, canonicalXRLRem, canonicalXRLReset, ref, false), FamilyXRateLimit)
	f.consider(pairReset(h, canonicalXRDRem, canonicalXRDReset, ref, false), FamilyXRateDash)
	f.consider(pairReset(h, canonicalXRLRem, canonicalXRLResetA, ref, true), FamilyXResetAfter)
	return f
}

// ParseQuotas appends to dst every quota the response announces with a
// remaining count, in header order (IETF items first), each with its reset
// and, where announced, its policy. Resets are measured as ParseFeedback
// measures them. It does not allocate when dst has room; h must be canonical.
func ParseQuotas(h http.Header, now time.Time, dst []Quota) []Quota {
	ref := now
	if d := h[canonicalDate]; len(d) > 0 {
		if t, err := http.ParseTime(trimOWS(d[0])); err == nil {
			ref = t
		}
	}
	if v := h[canonicalIETF]; len(v) > 0 {
		var buf, pbuf [8]sfItem
		items, ok := sfList(strings.Join(v, ","), buf[:0])
		var pols []sfItem
		if pv := h[canonicalIETFPol]; ok && len(pv) > 0 {
			if pols, ok = sfList(strings.Join(pv, ","), pbuf[:0]); !ok {
				pols, ok = nil, true // a malformed policy field hides no remaining count
			}
		}
		for _, it := range items {
			if !ok || !it.hasR {
				continue
			}
			q := Quota{Family: FamilyIETF, Policy: it.name, Remaining: it.r}
			if it.hasT {
				q.Reset = time.Duration(min(it.t, maxHeaderSeconds)) * time.Second
			}
			q.Limit, q.Window = policyOf(pols, it.name)
			dst = append(dst, q)
		}
	}
	dst = pairQuota(dst, h, FamilyRateLimit, canonicalRLRem, canonicalRLReset, "", canonicalRLLimit, ref)
	dst = pairQuota(dst, h, FamilyXRateLimit, canonicalXRLRem, canonicalXRLReset, canonicalXRLResetA, canonicalXRLLimit, ref)
	dst = pairQuota(dst, h, FamilyXRateDash, canonicalXRDRem, canonicalXRDReset, "", canonicalXRDLimit, ref)
	return dst
}

// policyOf returns the policy named name among pols ("q" and "w", or the
// earlier drafts' Integer with "w"); failing a match, the only policy, or
// else the slowest one, which is the safe reading of a quota whose policy
// is not named.
func policyOf(pols []sfItem, name string) (limit int64, window time.Duration) {
	var best time.Duration
	for _, p := range pols {
		l, w, ok := policyItem(p)
		if !ok {
			continue
		}
		if name != "" && p.name == name {
			return l, w
		}
		if iv := w / time.Duration(l); iv > best || limit == 0 {
			best, limit, window = iv, l, w
		}
	}
	return limit, window
}

func policyItem(p sfItem) (int64, time.Duration, bool) {
	l := p.q
	if !p.hasQ {
		l = p.num
		if !p.hasNum {
			return 0, 0, false
		}
	}
	if !p.hasW || p.w <= 0 || l <= 0 {
		return 0, 0, false
	}
	return l, time.Duration(min(p.w, maxHeaderSeconds)) * time.Second, true
}

// pairQuota appends the quota of a pair family when its Remaining header is
// a valid count: its reset from resetName (or, failing that, the relative
// resetAfter) and its policy from the Limit header's windowed items.
func pairQuota(dst []Quota, h http.Header, family, remName, resetName, resetAfter, limitName string, ref time.Time) []Quota {
	rem := h[remName]
	if len(rem) == 0 {
		return dst
	}
	whole, frac, ok := parseDecimal(trimOWS(rem[0]))
	if !ok || frac != 0 || whole > 1<<53 {
		return dst
	}
	q := Quota{Family: family, Remaining: int64(whole)}
	if v := h[resetName]; len(v) > 0 {
		if d, ok := ParseReset(v[0], ref); ok {
			q.Reset = d
		}
	} else if v := h[resetAfter]; resetAfter != "" && len(v) > 0 {
		if d, ok := parseSeconds(trimOWS(v[0])); ok {
			q.Reset = d
		}
	}
	if v := h[limitName]; len(v) > 0 {
		var buf [8]sfItem
		if items, ok := sfList(strings.Join(v, ","), buf[:0]); ok {
			q.Limit, q.Window = policyOf(items, "")
		}
	}
	return append(dst, q)
}

func (f *Feedback) consider(reset time.Duration, family string) {
	if reset > f.Reset {
		f.Reset, f.Family = reset, family
	}
}

// pairReset returns the family's reset if its remaining is zero and its reset
// is valid and positive, else 0.
func pairReset(h http.Header, remName, resetName string, ref time.Time, relativeOnly bool) time.Duration {
	rem, reset := h[remName], h[resetName]
	if len(rem) == 0 || len(reset) == 0 || !isZeroCount(trimOWS(rem[0])) {
		return 0
	}
	var d time.Duration
	var ok bool
	if relativeOnly {
		d, ok = parseSeconds(trimOWS(reset[0]))
	} else {
		d, ok = ParseReset(reset[0], ref)
	}
	if !ok || d <= 0 {
		return 0
	}
	return d
}

// ParseRetryAfter parses a Retry-After value: delay-seconds (leniently, a
// non-negative decimal, rounded up to whole seconds) or an HTTP-date in
// IMF-fixdate, RFC 850 or asctime form, measured against date (the response's
// Date header) when that is a valid HTTP-date, else against now. ok is false
// for a missing or malformed value; an expired date gives (0, true).
func ParseRetryAfter(value, date string, now time.Time) (time.Duration, bool) {
	ref := now
	if date != "" {
		if t, err := http.ParseTime(trimOWS(date)); err == nil {
			ref = t
		}
	}
	return retryAfterAt(value, ref)
}

func retryAfterAt(value string, ref time.Time) (time.Duration, bool) {
	v := trimOWS(value)
	if v == "" {
		return 0, false
	}
	if c := v[0]; c >= '0' && c <= '9' || c == '.' {
		return parseSeconds(v)
	}
	t, err := http.ParseTime(v)
	if err != nil {
		return 0, false
	}
	d := t.Sub(ref)
	if d < 0 {
		d = 0
	}
	return d, true
}

// ParseReset parses a rate-limit reset as providers send it: Unix epoch
// seconds, epoch milliseconds, relative seconds (decimals rounded up), or a Go
// duration such as "1m30s". Epoch values are measured against ref (the
// response's Date, or now). A bare number at or above 1e12 is epoch
// milliseconds, at or above 1e9 epoch seconds, below that relative seconds.
// An epoch in the past gives (0, true).
func ParseReset(value string, ref time.Time) (time.Duration, bool) {
	v := trimOWS(value)
	if v == "" {
		return 0, false
	}
	if c := v[0]; c >= '0' && c <= '9' || c == '.' {
		whole, frac, ok := parseDecimal(v)
		if !ok {
			return parseGoDuration(v)
		}
		var at time.Time
		switch {
		case whole >= epochMillisAbove:
			if whole > 1<<53 { // beyond any plausible clock: treat as far future
				return maxHeaderSeconds * time.Second, true
			}
			at = time.UnixMilli(int64(whole))
		case whole >= epochSecondsAbove:
			at = time.Unix(int64(whole), int64(frac))
		default:
			return ceilSeconds(whole, frac), true
		}
		d := at.Sub(ref)
		if d < 0 {
			d = 0
		}
		return d, true
	}
	return parseGoDuration(v)
}

// parseGoDuration accepts a non-negative Go duration ("1m30s", "1.5s").
func parseGoDuration(v string) (time.Duration, bool) {
	d, err := time.ParseDuration(v)
	if err != nil || d < 0 {
		return 0, false
	}
	return d, true
}

// parseSeconds parses a non-negative decimal number of seconds, rounded up.
func parseSeconds(v string) (time.Duration, bool) {
	whole, frac, ok := parseDecimal(v)
	if !ok {
		return 0, false
	}
	return ceilSeconds(whole, frac), true
}

func ceilSeconds(whole uint64, frac uint32) time.Duration {
	if frac > 0 {
		whole++
	}
	if whole > maxHeaderSeconds {
		whole = maxHeaderSeconds
	}
	return time.Duration(whole) * time.Second
}

// parseDecimal parses digits [ "." digits ] (at least one digit in all),
// saturating the whole part. frac is the fraction in nanoseconds (truncated
// past nine digits, but never truncated to zero when a digit is non-zero).
func parseDecimal(v string) (whole uint64, frac uint32, ok bool) {
	i, digits := 0, 0
	for ; i < len(v) && v[i] >= '0' && v[i] <= '9'; i++ {
		if whole < 1<<60 {
			whole = whole*10 + uint64(v[i]-'0')
		}
		digits++
	}
	if i < len(v) {
		if v[i] != '.' {
			return 0, 0, false
		}
		i++
		scale := uint32(100_000_000)
		nonzero := false
		for ; i < len(v) && v[i] >= '0' && v[i] <= '9'; i++ {
			d := uint32(v[i] - '0')
			frac += d * scale
			scale /= 10
			nonzero = nonzero || d != 0
			digits++
		}
		if nonzero && frac == 0 {
			frac = 1
		}
		if i != len(v) {
			return 0, 0, false
		}
	}
	return whole, frac, digits > 0
}

// isZeroCount reports whether v is a valid count equal to zero ("0", "0.0").
func isZeroCount(v string) bool {
	whole, frac, ok := parseDecimal(v)
	return ok && whole == 0 && frac == 0
}

func trimOWS(s string) string {
	for len(s) > 0 && (s[0] == ' ' || s[0] == '\t') {
		s = s[1:]
	}
	for len(s) > 0 && (s[len(s)-1] == ' ' || s[len(s)-1] == '\t') {
		s = s[:len(s)-1]
	}
	return s
}
