package stuborigin

import (
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"
)

// Penalty is what the origin does to a caller identity that keeps coming
// early: after After trigger events (requests sent while told to wait, or
// 429 answers, as Count says) within Within, the identity is penalized for
// For, with one or more of a ban, a tarpit and a Retry-After that grows with
// each early request. It is on top of the admission rules (buckets, shard):
// a caller that never comes early is never penalized. The zero value (After
// 0) penalizes nobody. Durations are the origin's own time (its clock, like
// its quotas and the Retry-After it sends), not a load test's time scale.
type Penalty struct {
	// Count is the trigger event: "early" (a request sent before the
	// deadline the identity had been told; the default) or "429" (any
	// 429 answer, which also penalizes a caller that never reads them).
	Count string `json:"count,omitempty"`
	// After is how many events within Within start a penalty; 0: off.
	After  int      `json:"after"`
	Within Duration `json:"within"`
	// For is how long a penalty lasts (a ban, a tarpit, a grown wait).
	For Duration `json:"for"`
	// Ban, when set, refuses every request of the identity while it is
	// penalized.
	Ban *Ban `json:"ban,omitempty"`
	// Tarpit holds every answer to the identity for this long while it is
	// penalized (the caller's connection stays open meanwhile).
	Tarpit Duration `json:"tarpit,omitempty"`
	// RetryAfterStep, while the identity is penalized, lengthens the wait
	// of each early request's answer by this much beyond the deadline it
	// had been told (a ban's end, with a ban; else its last Retry-After),
	// up to RetryAfterMax from now (default For). Without a ban the grown
	// wait is enforced: a request before it is refused with 429 reason
	// "penalty".
	RetryAfterStep Duration `json:"retry_after_step,omitempty"`
	RetryAfterMax  Duration `json:"retry_after_max,omitempty"`
}

// Ban is how a banned identity is answered.
type Ban struct {
	// Status is 429 (default) or 403.
	Status int `json:"status,omitempty"`
	// Disclosed: the answer says it is a ban (reason "banned") and when it
	// ends (Retry-After: the time left). Otherwise it does not: a 403 says
	// only "forbidden" with no Retry-After, a 429 looks like ordinary
	// throttling with the caller's buckets' own short Retry-After, so the
	// caller cannot tell it was banned, as with many WAFs.
	Disclosed bool `json:"disclosed,omitempty"`
}

// Penalty trigger events.
const (
	CountEarly = "early"
	Count429   = "429"
)

// Penalty reasons, in answers and in /stats reasons.
const (
	ReasonBanned  = "banned"  // the identity is banned (a disclosed ban)
	ReasonPenalty = "penalty" // before a grown Retry-After (no ban)
	// ReasonForbidden counts undisclosed 403 bans (the answer names none).
	ReasonForbidden = "forbidden"
)

// enabled reports whether p penalizes anyone.
func (p *Penalty) enabled() bool { return p != nil && p.After > 0 }

func (p *Penalty) count() string {
	if p.Count == "" {
		return CountEarly
	}
	return p.Count
}

func (p *Penalty) banStatus() int {
	if p == nil || p.Ban == nil || p.Ban.Status == 0 {
		return http.StatusTooManyRequests
	}
	return p.Ban.Status
}

func (p *Penalty) stepMax() time.Duration {
	if p.RetryAfterMax.Duration > 0 {
		return p.RetryAfterMax.Duration
	}
	return p.For.Duration
}

func (p *Penalty) validate() error {
	if p == nil {
		return nil
	}
	var errs []error
	bad := func(field, format string, a ...any) {
		errs = append(errs, fmt.Errorf("penalty.%s: %s", field, fmt.Sprintf(format, a...)))
	}
	switch p.Count {
	case "", CountEarly, Count429:
	default:
		bad("count", "want %q or %q, got %q", CountEarly, Count429, p.Count)
	}
	if p.After < 0 || p.After > 1e6 {
		bad("after", "must be between 0 (off) and 1e6, got %d", p.After)
	}
	if p.After == 0 {
		return errors.Join(errs...)
	}
	if p.Within.Duration <= 0 || p.Within.Duration > 24*time.Hour {
		bad("within", "must be above 0 and at most 24h, got %v", p.Within.Duration)
	}
	if p.For.Duration <= 0 || p.For.Duration > 7*24*time.Hour {
		bad("for", "must be above 0 and at most 7 days, got %v", p.For.Duration)
	}
	if p.Ban == nil && p.Tarpit.Duration == 0 && p.RetryAfterStep.Duration == 0 {
		bad("ban", "a penalty needs a ban, a tarpit or a retry_after_step")
	}
	if b := p.Ban; b != nil && b.Status != 0 && b.Status != http.StatusTooManyRequests && b.Status != http.StatusForbidden {
		bad("ban.status", "want 429 or 403, got %d", b.Status)
	}
	if p.Tarpit.Duration < 0 || p.Tarpit.Duration > 10*time.Minute {
		bad("tarpit", "must be between 0 and 10m, got %v", p.Tarpit.Duration)
	}
	if p.RetryAfterStep.Duration < 0 || p.RetryAfterMax.Duration < 0 {
		bad("retry_after_step", "retry_after_step and retry_after_max must not be negative")
	}
	return errors.Join(errs...)
}

// penaltyState is one identity's penalty bookkeeping. Guarded by its
// shard's mutex.
type penaltyState struct {
	events     []time.Time // trigger events within the window, oldest first
	start, end time.Time   // the current (or last) penalty; zero: never
	banned     bool        // the current (or last) penalty is a ban
	periods    []Period    // bans, for /stats (start and end since origin start)
	pst        PenaltyStats
}

// PenaltyStats count what penalties did, per identity or authority.
type PenaltyStats struct {
	// Penalties counts penalties started; Bans those that were bans.
	Penalties int64 `json:"penalties_started"`
	Bans      int64 `json:"bans_started"`
	// BannedSeconds is the time spent banned, up to the snapshot.
	BannedSeconds float64 `json:"banned_seconds"`
	// DuringBans counts requests answered with a ban (wasted requests).
	DuringBans int64 `json:"requests_during_bans"`
	// Tarpitted counts answers held by a tarpit; TarpitSeconds the time
	// they were held in total.
	Tarpitted     int64   `json:"tarpitted"`
	TarpitSeconds float64 `json:"tarpit_seconds"`
	// Extended counts early requests whose answer's wait grew.
	Extended int64 `json:"retry_after_extended"`
}

func (a *PenaltyStats) addStats(b PenaltyStats) {
	a.Penalties += b.Penalties
	a.Bans += b.Bans
	a.BannedSeconds += b.BannedSeconds
	a.DuringBans += b.DuringBans
	a.Tarpitted += b.Tarpitted
	a.TarpitSeconds += b.TarpitSeconds
	a.Extended += b.Extended
}

// Period is a ban: from Start to End, in seconds since the origin started
// (store clock). End is the snapshot's instant while the ban lasts, and
// Ongoing says so.
type Period struct {
	Identity string  `json:"identity,omitempty"`
	Start    float64 `json:"start"`
	End      float64 `json:"end"`
	Ongoing  bool    `json:"ongoing,omitempty"`
}

// active reports whether a penalty is in force at now.
func (ps *penaltyState) active(now time.Time) bool {
	return !ps.end.IsZero() && now.Before(ps.end)
}

// eventLocked records a trigger event at now and reports whether it
// starts a penalty. s.mu must be held.
func (ps *penaltyState) eventLocked(p *Penalty, now time.Time) bool {
	cut := now.Add(-p.Within.Duration)
	i := 0
	for i < len(ps.events) && !ps.events[i].After(cut) {
		i++
	}
	ps.events = append(ps.events[:0], ps.events[i:]...)
	ps.events = append(ps.events, now)
	return len(ps.events) >= p.After
}

// startLocked begins a penalty at now. s.mu must be held.
func (ps *penaltyState) startLocked(p *Penalty, now time.Time) {
	ps.events = ps.events[:0]
	ps.start, ps.end = now, now.Add(p.For.Duration)
	ps.banned = p.Ban != nil
	ps.pst.Penalties++
	if ps.banned {
		ps.pst.Bans++
	}
}

// bannedUpTo adds up the time banned up to now, ongoing ban included.
func (ps *penaltyState) bannedUpTo(now time.Time) float64 {
	s := ps.pst.BannedSeconds
	if ps.banned && !ps.start.IsZero() {
		end := ps.end
		if now.Before(end) {
			end = now
		}
		s += end.Sub(ps.start).Seconds()
	}
	return s
}

// closeLocked moves a finished penalty's ban into the totals and periods,
// so that the state holds at most the current penalty. s.mu must be held.
func (ps *penaltyState) closeLocked(origin time.Time) {
	if ps.start.IsZero() {
		return
	}
	if ps.banned {
		ps.pst.BannedSeconds += ps.end.Sub(ps.start).Seconds()
		ps.periods = append(ps.periods, Period{Start: ps.start.Sub(origin).Seconds(), End: ps.end.Sub(origin).Seconds()})
	}
	ps.start, ps.end, ps.banned = time.Time{}, time.Time{}, false
}

// snapshot returns the stats and ban periods at now.
func (ps *penaltyState) snapshot(origin, now time.Time) (PenaltyStats, []Period) {
	st := ps.pst
	st.BannedSeconds = ps.bannedUpTo(now)
	periods := append([]Period(nil), ps.periods...)
	if ps.banned && !ps.start.IsZero() {
		p := Period{Start: ps.start.Sub(origin).Seconds(), End: ps.end.Sub(origin).Seconds()}
		if now.Before(ps.end) {
			p.End, p.Ongoing = now.Sub(origin).Seconds(), true
		}
		periods = append(periods, p)
	}
	return st, periods
}

// penalizeLocked applies the profile's penalty to id's request at now,
// before admission. early says whether the request came before its told
// deadline. It returns the decision when the penalty decides the answer
// (a ban, a grown wait), and whether it did; and the tarpit the answer is
// held for. s.mu must be held.
func (s *shard) penalizeLocked(id *identity, now time.Time, early bool) (d decision, decided bool, hold time.Duration) {
	p, ps := s.penalty, &id.pen
	if !ps.start.IsZero() && !ps.active(now) {
		ps.closeLocked(s.start)
	}
	if !ps.active(now) && early && p.count() == CountEarly && ps.eventLocked(p, now) {
		ps.startLocked(p, now)
	}
	if !ps.active(now) {
		return decision{}, false, 0
	}
	hold = p.Tarpit.Duration
	step := p.RetryAfterStep.Duration
	grow := func(from time.Time) time.Time {
		to := from.Add(step)
		if lim := now.Add(p.stepMax()); to.After(lim) {
			to = lim
		}
		return later(from, to)
	}
	if ps.banned {
		if early && step > 0 {
			ps.end = grow(ps.end)
			ps.pst.Extended++
		}
		ps.pst.DuringBans++
		return s.banDecisionLocked(id, now), true, hold
	}
	if step > 0 && now.Before(id.waitUntil) {
		at := id.waitUntil
		if early {
			at = grow(at)
			ps.pst.Extended++
		}
		return decision{outcome: RateLimited, reason: ReasonPenalty, wait: at.Sub(now), hasWait: true, view: s.viewLocked(id, now)}, true, hold
	}
	return decision{}, false, hold
}

// banDecisionLocked is the answer to a banned identity. s.mu must be held.
func (s *shard) banDecisionLocked(id *identity, now time.Time) decision {
	p, ps := s.penalty, &id.pen
	disclosed := p.Ban.Disclosed
	if p.banStatus() == http.StatusForbidden {
		d := decision{outcome: Forbidden, reason: ReasonForbidden}
		if disclosed {
			d.reason, d.wait, d.hasWait = ReasonBanned, ps.end.Sub(now), true
		}
		return d
	}
	if disclosed {
		return decision{outcome: RateLimited, reason: ReasonBanned, wait: ps.end.Sub(now), hasWait: true, view: s.viewLocked(id, now)}
	}
	// Looks like ordinary throttling: the buckets' own reason and wait.
	q := id.c.quota
	bw, sw := id.burst.wait(q.burst, now), id.sustained.wait(q.sustained, now)
	d := decision{outcome: RateLimited, reason: ReasonSustained, wait: max(bw, sw), hasWait: true, view: s.viewLocked(id, now)}
	if bw > sw {
		d.reason = ReasonBurst
	}
	return d
}

// afterAdmitLocked counts a 429 answer as a trigger event when the
// penalty counts 429s. s.mu must be held.
func (s *shard) afterAdmitLocked(id *identity, now time.Time, d decision) {
	p, ps := s.penalty, &id.pen
	if p.count() != Count429 || d.outcome != RateLimited || ps.active(now) {
		return
	}
	if ps.eventLocked(p, now) {
		ps.startLocked(p, now)
	}
}

// Describe says in one line what p does, for people ("off" when it
// penalizes nobody): "after 10 early requests within 10s: banned 30s
// (429, disclosed)".
func (p *Penalty) Describe() string {
	if !p.enabled() {
		return "off"
	}
	what := "early requests"
	if p.count() == Count429 {
		what = "429 answers"
	}
	var does []string
	if p.Ban != nil {
		how := "undisclosed"
		if p.Ban.Disclosed {
			how = "disclosed"
		}
		does = append(does, fmt.Sprintf("banned %v (%d, %s)", p.For.Duration, p.banStatus(), how))
	}
	if p.Tarpit.Duration > 0 {
		does = append(does, fmt.Sprintf("answers held %v for %v", p.Tarpit.Duration, p.For.Duration))
	}
	if p.RetryAfterStep.Duration > 0 {
		does = append(does, fmt.Sprintf("each early request waits %v more (up to %v)", p.RetryAfterStep.Duration, p.stepMax()))
	}
	return fmt.Sprintf("after %d %s within %v: %s", p.After, what, p.Within.Duration, strings.Join(does, "; "))
}
