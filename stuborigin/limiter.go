package stuborigin

import (
	"time"

	"github.com/mirrorworker/mirrorworker/stuborigin/limitreq"
)

// bucketSpec is a token bucket: capacity tokens, one more every interval.
type bucketSpec struct {
	capacity int64
	interval time.Duration
}

// tolerance is how far the theoretical arrival time may run ahead of now
// while a token is still available.
func (s bucketSpec) tolerance() time.Duration { return time.Duration(s.capacity-1) * s.interval }

// bucket is a token bucket in GCRA form: tat is the instant at which the
// bucket would be full again. Integer nanoseconds, rather than fractional
// tokens, make "wait exactly Retry-After and be admitted" exact. The zero
// value is a full bucket.
type bucket struct{ tat time.Time }

// wait is how long from now until the bucket holds a token (0: it does).
func (b *bucket) wait(s bucketSpec, now time.Time) time.Duration {
	at := b.tat.Add(-s.tolerance())
	if !now.Before(at) {
		return 0
	}
	return at.Sub(now)
}

// take spends one token; the caller has checked wait is 0.
func (b *bucket) take(s bucketSpec, now time.Time) {
	t := b.tat
	if t.Before(now) {
		t = now
	}
	b.tat = t.Add(s.interval)
}

// remaining is the whole tokens available now.
func (b *bucket) remaining(s bucketSpec, now time.Time) int64 {
	d := b.tat.Sub(now)
	if d <= 0 {
		return s.capacity
	}
	used := int64((d + s.interval - 1) / s.interval)
	return max(s.capacity-used, 0)
}

// reset is, for rate-limit headers, how long until the bucket is full (when
// it holds a token) or until its next token (when empty).
func (b *bucket) reset(s bucketSpec, now time.Time) time.Duration {
	if w := b.wait(s, now); w > 0 {
		return w
	}
	return max(b.tat.Sub(now), 0)
}

// quotaSpec is a Quota compiled to bucket specs.
type quotaSpec struct {
	name      string
	burst     bucketSpec
	sustained bucketSpec
	window    time.Duration // of the sustained bucket, for RateLimit-Policy
}

func compileQuota(name string, q Quota) *quotaSpec {
	return &quotaSpec{
		name:      name,
		burst:     bucketSpec{capacity: q.Burst.Capacity, interval: time.Duration(float64(time.Second) / q.Burst.RefillPerSecond)},
		sustained: bucketSpec{capacity: q.Sustained.Capacity, interval: q.Sustained.Window.Duration / time.Duration(q.Sustained.Capacity)},
		window:    q.Sustained.Window.Duration,
	}
}

// Outcome is the class of an admission decision.
type Outcome int

// Outcomes.
const (
	Admitted          Outcome = iota
	RateLimited               // 429 rate_limited: the caller's own quota
	CapacityExhausted         // 503 capacity_exhausted: shared capacity or the limiter store
	Forbidden                 // 403: a ban answered 403 (Profile.Penalty)
)

// Rejection reasons. Only the caller's own facts: never another identity's.
const (
	ReasonBurst         = "burst"           // own burst bucket empty
	ReasonSustained     = "sustained"       // own sustained bucket empty
	ReasonTenantShare   = "tenant_share"    // own tenant used its share of the shard window
	ReasonShard         = "shared_capacity" // the authority's shard window is full
	ReasonStoreDown     = "limiter_unavailable"
	ReasonIdentityLimit = "identity_table_full"
)

// limitView is what the rate-limit headers say: the caller's own buckets
// and, when the authority has a shard, its own group's share of the shard
// window (a quota of the caller's own tenant, which refuses it with a 429
// like the buckets do, so it is announced like them).
type limitView struct {
	quota                 *quotaSpec
	burstLeft, sustLeft   int64
	burstReset, sustReset time.Duration
	// share is the group's slots per shard window, 0 when there is no
	// shard; shareLeft and shareReset are what remains of them and how long
	// until the window ends; shareWindow is the window.
	share, shareLeft        int64
	shareReset, shareWindow time.Duration
}

// decision is the result of one admission.
type decision struct {
	outcome Outcome
	reason  string
	// wait is how long this caller must wait before it can be admitted;
	// valid only when hasWait. Never derived from another identity.
	wait    time.Duration
	hasWait bool
	view    *limitView // nil when the store is down
	// retryAfter is the Retry-After header value sent, "" when absent.
	retryAfter string
	// hold is how long a tarpit holds the answer (0: none).
	hold time.Duration
	// early: the request came before a deadline its identity had been
	// told. toldUntil is the deadline this answer tells (a Retry-After, or
	// an exhausted rate-limit header's reset), zero when it tells none.
	early     bool
	toldUntil time.Time
}

// headerValue is one rate-limit header reading: the caller's binding
// quota (fewest requests left; on a tie the one that takes longer to reset).
type headerValue struct {
	policy           string // "burst", "sustained" or "tenant_share"
	limit, remaining int64
	reset            int64 // whole seconds, rounded up
}

func (v *limitView) header() headerValue {
	b := headerValue{policy: "burst", limit: v.quota.burst.capacity, remaining: v.burstLeft, reset: ceilSeconds(v.burstReset)}
	s := headerValue{policy: "sustained", limit: v.quota.sustained.capacity, remaining: v.sustLeft, reset: ceilSeconds(v.sustReset)}
	if b.remaining < s.remaining || (b.remaining == s.remaining && b.reset > s.reset) {
		s = b
	}
	if v.share > 0 {
		t := headerValue{policy: policyShare, limit: v.share, remaining: v.shareLeft, reset: ceilSeconds(v.shareReset)}
		if t.remaining < s.remaining || (t.remaining == s.remaining && t.reset > s.reset) {
			s = t
		}
	}
	return s
}

// policyShare names the tenant's share of the shard window in the
// rate-limit headers.
const policyShare = "tenant_share"

// caller is the identity a request is admitted under.
type caller struct {
	key   string // identity key (also the /stats label)
	group string // fair-share group: the tenant, or the anonymous identity itself
	kind  string // "authenticated" or "anonymous"
	quota *quotaSpec

	// For /stats only (operator-facing, never sent to a caller).
	tenant, principal, routeClass string
}

// identity is the limiter state and statistics of one caller key on one
// authority. Guarded by its shard's mutex.
type identity struct {
	c                caller
	burst, sustained bucket
	waitUntil        time.Time // the latest deadline this identity was told
	st               Counts
	early            int64
	gaps             gapStats
	pen              penaltyState
	leaky            limitreq.Bucket // limit_req profiles
	rate             rateState       // stick_table profiles
}

// Counts are requests and their outcomes.
type Counts struct {
	Requests          int64 `json:"requests"`
	Admitted          int64 `json:"admitted"`
	RateLimited       int64 `json:"rate_limited"`
	CapacityExhausted int64 `json:"capacity_exhausted"`
	// Forbidden counts 403 answers: bans answered 403 (Profile.Penalty).
	Forbidden int64 `json:"forbidden,omitempty"`
}

func (c *Counts) add(o Outcome) {
	c.Requests++
	switch o {
	case Admitted:
		c.Admitted++
	case RateLimited:
		c.RateLimited++
	case CapacityExhausted:
		c.CapacityExhausted++
	case Forbidden:
		c.Forbidden++
	}
}

// admitIdentityLocked decides for id at now. It checks the caller's own
// buckets first (their exhaustion is the caller's 429), then the tenant's
// share and the shard (503). Tokens are spent only on admission, in one
// critical section with the check, so concurrent requests never get extra
// tokens. s.mu must be held.
func (s *shard) admitIdentityLocked(id *identity, now time.Time) decision {
	if s.limitReq != nil || s.stick != nil {
		return s.admitProxyLocked(id, now)
	}
	q := id.c.quota
	bw := id.burst.wait(q.burst, now)
	sw := id.sustained.wait(q.sustained, now)
	if bw > 0 || sw > 0 {
		d := decision{outcome: RateLimited, reason: ReasonSustained, wait: max(bw, sw), hasWait: true}
		if bw > sw {
			d.reason = ReasonBurst
		}
		d.view = s.viewLocked(id, now)
		return d
	}
	if s.spec.Capacity > 0 {
		s.rollWindowLocked(now)
		end := s.windowEndLocked()
		if s.byGroup[id.c.group] >= s.slots {
			d := decision{outcome: RateLimited, reason: ReasonTenantShare, wait: end.Sub(now), hasWait: true}
			d.view = s.viewLocked(id, now)
			return d
		}
		if s.used >= s.spec.Capacity {
			// The shard reopens for everyone at the window's end and this
			// caller's own buckets already allow it: that is computable for
			// this caller and copies nobody's delay.
			d := decision{outcome: CapacityExhausted, reason: ReasonShard, wait: end.Sub(now), hasWait: true}
			d.view = s.viewLocked(id, now)
			return d
		}
		s.used++
		s.byGroup[id.c.group]++
	}
	id.burst.take(q.burst, now)
	id.sustained.take(q.sustained, now)
	return decision{outcome: Admitted, view: s.viewLocked(id, now)}
}

func (s *shard) viewLocked(id *identity, now time.Time) *limitView {
	q := id.c.quota
	v := &limitView{
		quota:      q,
		burstLeft:  id.burst.remaining(q.burst, now),
		sustLeft:   id.sustained.remaining(q.sustained, now),
		burstReset: id.burst.reset(q.burst, now),
		sustReset:  id.sustained.reset(q.sustained, now),
	}
	if s.spec.Capacity > 0 {
		s.rollWindowLocked(now)
		v.share, v.shareWindow = s.slots, s.spec.Window.Duration
		v.shareLeft = max(s.slots-s.byGroup[id.c.group], 0)
		v.shareReset = s.windowEndLocked().Sub(now)
	}
	return v
}

// rollWindowLocked starts a new fixed shard window when now has left the
// current one. Windows are aligned on the store clock's epoch.
func (s *shard) rollWindowLocked(now time.Time) {
	w := int64(s.spec.Window.Duration)
	idx := now.UnixNano() / w
	if now.UnixNano() < 0 && now.UnixNano()%w != 0 {
		idx--
	}
	if idx != s.window {
		s.window = idx
		s.used = 0
		clear(s.byGroup)
	}
}

func (s *shard) windowEndLocked() time.Time {
	return time.Unix(0, (s.window+1)*int64(s.spec.Window.Duration))
}

// ceilSeconds rounds d up to whole seconds.
func ceilSeconds(d time.Duration) int64 {
	if d <= 0 {
		return 0
	}
	return int64((d + time.Second - 1) / time.Second)
}
