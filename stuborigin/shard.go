package stuborigin

import (
	"net/http"
	"sort"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

// shard is one authority's limiter store and its statistics. Safe for
// concurrent use: every admission is one critical section under mu, which is
// what makes token spending atomic.
type shard struct {
	index   int
	spec    Shard
	slots   int64 // shard admissions one group may take per window
	start   time.Time
	floor   time.Duration
	maxIDs  int
	maxTL   int
	headers string
	penalty *Penalty // nil or off: nobody is penalized
	// limitReq or stick, when set, admit instead of the quotas and shard.
	limitReq *LimitReq
	stick    *StickTable

	served atomic.Uint64 // admitted object responses, for fault selection

	mu      sync.Mutex
	name    string
	url     string
	ids     map[string]*identity
	window  int64
	used    int64
	byGroup map[string]int64
	st      Counts
	early   int64
	gaps    gapStats
	reasons map[string]int64
	byKind  map[string]*kindCounts
	tl      []Second
	tlFull  bool
}

type kindCounts struct {
	requests, admitted int64
	rejected           map[string]int64 // by reason
}

// gapWindow is how many of the latest arrivals gapStats keeps to place an
// arrival whose handler ran after later ones': up to gapWindow-1 requests
// handled ahead of it. Beyond that it is measured against the oldest kept.
const gapWindow = 8

// gapStats counts the gaps between consecutive arrivals in the order the
// kernel received them. Arrivals are added in the order their handlers
// ran, which on a loaded machine is not always that order: a handler
// woken late can run after the next request's, and measuring from the
// latest handled then counts a negative gap as one below the floor. An
// arrival before the latest is put in its place among the recent ones: it
// splits the gap between its neighbours in two.
type gapStats struct {
	n          int64
	min        time.Duration
	belowFloor int64
	recent     []time.Time // the latest arrivals, oldest first, at most gapWindow
}

func (g *gapStats) add(at time.Time, floor time.Duration) {
	i := len(g.recent)
	for i > 0 && at.Before(g.recent[i-1]) {
		i--
	}
	if i > 0 && i < len(g.recent) {
		// The gap between the two neighbours was counted; it is two now.
		g.n--
		if floor > 0 && g.recent[i].Sub(g.recent[i-1]) < floor {
			g.belowFloor--
		}
		// min stays right: each half is shorter than the whole.
	}
	if i > 0 {
		g.count(at.Sub(g.recent[i-1]), floor)
	}
	if i < len(g.recent) {
		g.count(g.recent[i].Sub(at), floor)
	}
	g.recent = append(g.recent, time.Time{})
	copy(g.recent[i+1:], g.recent[i:])
	g.recent[i] = at
	if len(g.recent) > gapWindow {
		g.recent = append(g.recent[:0], g.recent[1:]...)
	}
}

func (g *gapStats) count(d, floor time.Duration) {
	if g.n == 0 || d < g.min {
		g.min = d
	}
	g.n++
	if floor > 0 && d < floor {
		g.belowFloor++
	}
}

// admit runs admission for c at now and records what the caller observed.
// arrived is when the request arrived, for the gaps between arrivals (the
// kernel's receive time where the origin has it; else now, which decides).
// raFormat is the Retry-After format in force; the returned decision carries
// the Retry-After header value ("" when absent), so that what /stats calls
// "told to wait" is exactly what was sent.
func (s *shard) admit(now, arrived time.Time, c caller, storeDown bool, raFormat string) decision {
	s.mu.Lock()
	defer s.mu.Unlock()
	id := s.ids[c.key]
	if id == nil && len(s.ids) >= s.maxIDs {
		// Forgetting an identity would hand it a fresh bucket: fail closed.
		d := decision{outcome: CapacityExhausted, reason: ReasonIdentityLimit}
		s.recordLocked(now, nil, c.kind, d)
		return d
	}
	if id == nil {
		id = &identity{c: c}
		s.ids[c.key] = id
	}
	early := now.Before(id.waitUntil)
	if early {
		id.early++
		s.early++
	}
	id.gaps.add(arrived, s.floor)
	s.gaps.add(arrived, s.floor)

	var (
		d       decision
		decided bool
		hold    time.Duration
	)
	penalize := s.penalty.enabled() && !storeDown
	if penalize {
		d, decided, hold = s.penalizeLocked(id, now, early)
	}
	switch {
	case decided:
	case storeDown:
		d = decision{outcome: CapacityExhausted, reason: ReasonStoreDown}
	default:
		d = s.admitIdentityLocked(id, now)
	}
	if d.outcome != Admitted && d.hasWait {
		switch raFormat {
		case RetryAfterSeconds, "":
			secs := max(ceilSeconds(d.wait), 1)
			d.retryAfter = strconv.FormatInt(secs, 10)
			d.toldUntil = now.Add(time.Duration(secs) * time.Second)
			id.waitUntil = later(id.waitUntil, d.toldUntil)
		case RetryAfterHTTPDate:
			at := now.Add(d.wait)
			if t := at.Truncate(time.Second); t.Before(at) {
				at = t.Add(time.Second)
			}
			d.retryAfter = at.UTC().Format(http.TimeFormat)
			d.toldUntil = at
			id.waitUntil = later(id.waitUntil, at)
		case RetryAfterMalformed:
			d.retryAfter = "soon-ish"
		}
	}
	if s.headers != HeadersNone && d.view != nil {
		if hv := d.view.header(); hv.remaining == 0 && hv.reset > 0 {
			d.toldUntil = later(d.toldUntil, now.Add(time.Duration(hv.reset)*time.Second))
			id.waitUntil = later(id.waitUntil, d.toldUntil)
		}
	}
	d.early = early
	if penalize {
		s.afterAdmitLocked(id, now, d)
	}
	if hold > 0 {
		d.hold = hold
		id.pen.pst.Tarpitted++
		id.pen.pst.TarpitSeconds += hold.Seconds()
	}
	s.recordLocked(now, id, c.kind, d)
	return d
}

func later(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

// recordLocked counts d for the authority, the identity (nil when none was
// created) and the timeline. s.mu must be held.
func (s *shard) recordLocked(now time.Time, id *identity, kind string, d decision) {
	s.st.add(d.outcome)
	if id != nil {
		id.st.add(d.outcome)
	}
	if d.outcome != Admitted {
		s.reasons[d.reason]++
	}
	k := s.byKind[kind]
	if k == nil {
		k = &kindCounts{rejected: map[string]int64{}}
		s.byKind[kind] = k
	}
	k.requests++
	if d.outcome == Admitted {
		k.admitted++
	} else {
		k.rejected[d.reason]++
	}
	sec := int(now.Sub(s.start) / time.Second)
	if sec < 0 {
		sec = 0
	}
	if sec >= s.maxTL {
		s.tlFull = true
		return
	}
	for len(s.tl) <= sec {
		s.tl = append(s.tl, Second{T: len(s.tl)})
	}
	s.tl[sec].add(d.outcome)
}

// Stats is a snapshot of what the origin saw, per authority. Its JSON form
// is served on the admin listener at /stats.
type Stats struct {
	Profile     string           `json:"profile"`
	Start       time.Time        `json:"start"`
	Now         time.Time        `json:"now"`
	Authorities []AuthorityStats `json:"authorities"`
}

// AuthorityStats is one authority (one listener, one limiter shard).
type AuthorityStats struct {
	Index     int    `json:"index"`
	Authority string `json:"authority"`
	URL       string `json:"url,omitempty"`
	Counts
	// Early counts requests that arrived before the deadline their identity
	// had been told (a Retry-After, or an exhausted rate-limit header with
	// its reset).
	Early int64 `json:"early"`
	Gaps
	// Reasons counts rejections by reason (burst, sustained, tenant_share,
	// shared_capacity, limiter_unavailable, identity_table_full).
	Reasons       map[string]int64 `json:"reasons"`
	IdentityCount int              `json:"identity_count"`
	// Penalty sums the identities' penalties (Profile.Penalty), and
	// BanPeriods lists their bans in order of start.
	Penalty    PenaltyStats `json:"penalty"`
	BanPeriods []Period     `json:"ban_periods,omitempty"`
	// Identities is sorted by identity; omitted on /stats?identities=0.
	Identities []IdentityStats `json:"identities,omitempty"`
	// Timeline has one entry per second since the origin started (store
	// clock), up to Options.MaxTimeline seconds.
	Timeline          []Second `json:"timeline"`
	TimelineTruncated bool     `json:"timeline_truncated,omitempty"`
}

// Gaps describes the spacing between consecutive arrivals. MinGap is
// meaningful only when Count > 0. BelowFloor counts gaps shorter than
// Options.GapFloor (0 when no floor was set).
type Gaps struct {
	GapCount   int64         `json:"gap_count"`
	MinGap     time.Duration `json:"min_gap_ns"`
	BelowFloor int64         `json:"gaps_below_floor"`
}

// IdentityStats is one caller identity on one authority. It is for the
// operator: the admin listener is the only place identities are named.
type IdentityStats struct {
	Identity   string `json:"identity"`
	Kind       string `json:"kind"` // authenticated or anonymous
	Tenant     string `json:"tenant,omitempty"`
	Principal  string `json:"principal,omitempty"`
	RouteClass string `json:"route_class"`
	Quota      string `json:"quota"`
	Counts
	Early int64 `json:"early"`
	Gaps
	Penalty PenaltyStats `json:"penalty"`
	// Banned: the identity is banned at the snapshot's instant.
	Banned bool `json:"banned,omitempty"`
}

// Second is one second of an authority's timeline.
type Second struct {
	T int `json:"t"` // seconds since start
	Counts
}

func (g gapStats) export() Gaps {
	return Gaps{GapCount: g.n, MinGap: g.min, BelowFloor: g.belowFloor}
}

func (s *shard) stats(withIdentities bool, now time.Time) AuthorityStats {
	s.mu.Lock()
	defer s.mu.Unlock()
	a := AuthorityStats{
		Index:             s.index,
		Authority:         s.name,
		URL:               s.url,
		Counts:            s.st,
		Early:             s.early,
		Gaps:              s.gaps.export(),
		Reasons:           make(map[string]int64, len(s.reasons)),
		IdentityCount:     len(s.ids),
		Timeline:          append([]Second(nil), s.tl...),
		TimelineTruncated: s.tlFull,
	}
	for k, v := range s.reasons {
		a.Reasons[k] = v
	}
	pens := make(map[string]PenaltyStats, len(s.ids))
	for key, id := range s.ids {
		pst, periods := id.pen.snapshot(s.start, now)
		pens[key] = pst
		a.Penalty.addStats(pst)
		for _, p := range periods {
			p.Identity = key
			a.BanPeriods = append(a.BanPeriods, p)
		}
	}
	sort.Slice(a.BanPeriods, func(i, j int) bool { return a.BanPeriods[i].Start < a.BanPeriods[j].Start })
	if withIdentities {
		a.Identities = make([]IdentityStats, 0, len(s.ids))
		for key, id := range s.ids {
			a.Identities = append(a.Identities, IdentityStats{
				Penalty:    pens[key],
				Banned:     id.pen.banned && id.pen.active(now),
				Identity:   id.c.key,
				Kind:       id.c.kind,
				Tenant:     id.c.tenant,
				Principal:  id.c.principal,
				RouteClass: id.c.routeClass,
				Quota:      id.c.quota.name,
				Counts:     id.st,
				Early:      id.early,
				Gaps:       id.gaps.export(),
			})
		}
		sort.Slice(a.Identities, func(i, j int) bool { return a.Identities[i].Identity < a.Identities[j].Identity })
	}
	return a
}

// Sum adds up every authority: counts, early, reasons, identities and the
// timeline second by second; MinGap is the smallest of the authorities'
// (each authority's gaps are between its own arrivals). Index is -1.
func (s Stats) Sum() AuthorityStats {
	t := AuthorityStats{Index: -1, Authority: "all", Reasons: map[string]int64{}}
	for _, a := range s.Authorities {
		t.Requests += a.Requests
		t.Admitted += a.Admitted
		t.RateLimited += a.RateLimited
		t.CapacityExhausted += a.CapacityExhausted
		t.Forbidden += a.Forbidden
		t.Early += a.Early
		t.Penalty.addStats(a.Penalty)
		t.BanPeriods = append(t.BanPeriods, a.BanPeriods...)
		if a.GapCount > 0 && (t.GapCount == 0 || a.MinGap < t.MinGap) {
			t.MinGap = a.MinGap
		}
		t.GapCount += a.GapCount
		t.BelowFloor += a.BelowFloor
		for k, v := range a.Reasons {
			t.Reasons[k] += v
		}
		t.IdentityCount += a.IdentityCount
		for len(t.Timeline) < len(a.Timeline) {
			t.Timeline = append(t.Timeline, Second{T: len(t.Timeline)})
		}
		for i, sec := range a.Timeline {
			t.Timeline[i].Requests += sec.Requests
			t.Timeline[i].Admitted += sec.Admitted
			t.Timeline[i].RateLimited += sec.RateLimited
			t.Timeline[i].CapacityExhausted += sec.CapacityExhausted
			t.Timeline[i].Forbidden += sec.Forbidden
		}
		t.TimelineTruncated = t.TimelineTruncated || a.TimelineTruncated
	}
	return t
}
