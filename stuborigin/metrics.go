package stuborigin

import (
	"fmt"
	"net/http"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
)

// collector exports the origin's counters as Prometheus metrics. It keeps
// no state of its own: every scrape reads the shards' counters, which the
// admission path keeps anyway for /stats, so admitting a request costs no
// extra metric update. It is safe for concurrent use.
type collector struct {
	og *Origin

	requests   *prometheus.Desc
	admissions *prometheus.Desc
	rejections *prometheus.Desc
	identities *prometheus.Desc
	budget     *prometheus.Desc

	// Penalties (Profile.Penalty), by authority and caller class.
	penalties, bans, bannedSecs, duringBans *prometheus.Desc
	tarpitted, tarpitSecs, extended         *prometheus.Desc
}

var _ prometheus.Collector = (*collector)(nil)

func newCollector(og *Origin) *collector {
	return &collector{
		og: og,
		requests: prometheus.NewDesc("mirrorworker_stub_requests_total",
			"Requests received, by authority and caller class (authenticated, anonymous).",
			[]string{"authority", "caller"}, nil),
		admissions: prometheus.NewDesc("mirrorworker_stub_admissions_total",
			"Requests admitted by the limiter, by authority and caller class.",
			[]string{"authority", "caller"}, nil),
		rejections: prometheus.NewDesc("mirrorworker_stub_rejections_total",
			"Requests refused, by authority, caller class, code (rate_limited: 429, capacity_exhausted: 503) and reason.",
			[]string{"authority", "caller", "code", "reason"}, nil),
		identities: prometheus.NewDesc("mirrorworker_stub_identities",
			"Caller identities tracked, by authority.",
			[]string{"authority"}, nil),
		budget: prometheus.NewDesc("mirrorworker_stub_capacity_error_budget",
			"Fraction of requests the profile allows to be refused with capacity_exhausted.",
			nil, nil),
		penalties: penaltyDesc("penalties_total", "Penalties started (ban, tarpit or growing Retry-After) for coming early, by authority and caller class."),
		bans:      penaltyDesc("bans_total", "Bans started, by authority and caller class."),
		bannedSecs: penaltyDesc("banned_seconds_total",
			"Time callers spent banned (an ongoing ban counts up to the scrape), by authority and caller class."),
		duringBans: penaltyDesc("requests_during_bans_total", "Requests answered with a ban (wasted), by authority and caller class."),
		tarpitted:  penaltyDesc("tarpitted_total", "Answers held by a tarpit, by authority and caller class."),
		tarpitSecs: penaltyDesc("tarpit_seconds_total", "Time answers were held by a tarpit, by authority and caller class."),
		extended:   penaltyDesc("retry_after_extended_total", "Early requests whose answer's wait grew (growing Retry-After), by authority and caller class."),
	}
}

func penaltyDesc(name, help string) *prometheus.Desc {
	return prometheus.NewDesc("mirrorworker_stub_"+name, help, []string{"authority", "caller"}, nil)
}

// Describe implements prometheus.Collector.
func (c *collector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.requests
	ch <- c.admissions
	ch <- c.rejections
	ch <- c.identities
	ch <- c.budget
	for _, d := range []*prometheus.Desc{c.penalties, c.bans, c.bannedSecs, c.duringBans, c.tarpitted, c.tarpitSecs, c.extended} {
		ch <- d
	}
}

// Collect implements prometheus.Collector. Each shard's counters are copied
// under its lock and sent after it is released, so that a slow scrape never
// holds up admission.
func (c *collector) Collect(ch chan<- prometheus.Metric) {
	for _, s := range c.og.shards {
		for _, m := range c.shardMetrics(s) {
			ch <- m
		}
	}
	ch <- prometheus.MustNewConstMetric(c.budget, prometheus.GaugeValue, c.og.profile.errorBudget())
}

func (c *collector) shardMetrics(s *shard) []prometheus.Metric {
	s.mu.Lock()
	defer s.mu.Unlock()
	var ms []prometheus.Metric
	for _, kind := range sortedKeys(s.byKind) {
		k := s.byKind[kind]
		ms = append(ms,
			prometheus.MustNewConstMetric(c.requests, prometheus.CounterValue, float64(k.requests), s.name, kind),
			prometheus.MustNewConstMetric(c.admissions, prometheus.CounterValue, float64(k.admitted), s.name, kind),
		)
		for _, reason := range sortedKeys(k.rejected) {
			ms = append(ms, prometheus.MustNewConstMetric(c.rejections, prometheus.CounterValue,
				float64(k.rejected[reason]), s.name, kind, s.rejectionCode(reason), reason))
		}
	}
	if s.penalty.enabled() {
		now := c.og.clk.Now()
		byKind := map[string]*PenaltyStats{}
		for _, id := range s.ids {
			p := byKind[id.c.kind]
			if p == nil {
				p = &PenaltyStats{}
				byKind[id.c.kind] = p
			}
			st, _ := id.pen.snapshot(s.start, now)
			p.addStats(st)
		}
		for _, kind := range sortedKeys(byKind) {
			p := byKind[kind]
			for _, m := range []struct {
				d *prometheus.Desc
				v float64
			}{
				{c.penalties, float64(p.Penalties)}, {c.bans, float64(p.Bans)}, {c.bannedSecs, p.BannedSeconds},
				{c.duringBans, float64(p.DuringBans)}, {c.tarpitted, float64(p.Tarpitted)},
				{c.tarpitSecs, p.TarpitSeconds}, {c.extended, float64(p.Extended)},
			} {
				ms = append(ms, prometheus.MustNewConstMetric(m.d, prometheus.CounterValue, m.v, s.name, kind))
			}
		}
	}
	return append(ms, prometheus.MustNewConstMetric(c.identities, prometheus.GaugeValue, float64(len(s.ids)), s.name))
}

// rejectionCode is the error code a refusal for reason is answered with:
// capacity_exhausted (503) for the provider's own capacity, rate_limited
// (429) for the caller's quota and 429 bans, forbidden or banned for a ban
// answered 403 (undisclosed or disclosed).
func (s *shard) rejectionCode(reason string) string {
	switch reason {
	case ReasonShard, ReasonStoreDown, ReasonIdentityLimit:
		return "capacity_exhausted"
	case ReasonForbidden:
		return "forbidden"
	case ReasonBanned:
		if s.penalty.banStatus() == http.StatusForbidden {
			return "banned"
		}
	}
	return "rate_limited"
}

// registerMetrics builds the origin's registry and registers its collector
// there and, when set, on extra.
func (og *Origin) registerMetrics(extra prometheus.Registerer) error {
	c := newCollector(og)
	og.reg = prometheus.NewRegistry()
	og.reg.MustRegister(c) // a fresh registry: cannot clash
	if extra != nil {
		if err := extra.Register(c); err != nil {
			return fmt.Errorf("register metrics: %w", err)
		}
	}
	return nil
}

// promLogger hands promhttp's errors to the origin's logger.
type promLogger struct{ l zerolog.Logger }

func (p promLogger) Println(v ...any) { p.l.Warn().Msg(fmt.Sprint(v...)) }
