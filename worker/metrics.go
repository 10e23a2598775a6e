package worker

import (
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/mirrorworker/mirrorworker/authority"
	"github.com/mirrorworker/mirrorworker/clock"
	"github.com/mirrorworker/mirrorworker/fetch"
	"github.com/mirrorworker/mirrorworker/jobs"
	"github.com/mirrorworker/mirrorworker/pacer"
	"github.com/prometheus/client_golang/prometheus"
)

// Job outcomes, the values of jobs_total{outcome}.
const (
	OutcomeStored       = "stored"
	OutcomeUnchanged    = "unchanged"
	OutcomeDeferred     = "deferred"
	OutcomeRetried      = "retried"
	OutcomeDeadLettered = "dead_lettered"
	// OutcomeHandedOff: a redirect to another pod's authority, whose
	// continuation that pod fetches (handoff.go).
	OutcomeHandedOff = "handed_off"
	// OutcomeMoved: a job moved into the partition of its authority's
	// politeness group (or back out of it), where it is served (handoff.go).
	OutcomeMoved = "moved"
	// OutcomeDeleted: a delete job removed its key (or found nothing to
	// remove) and left a tombstone (delete.go).
	OutcomeDeleted = "deleted"
	// OutcomeSuperseded: the job was acked undone because the key's state
	// comes from a job enqueued after it: a fetch whose key a later delete
	// removed (it would bring the key back), or a delete of a key a later
	// fetch stored (delete.go).
	OutcomeSuperseded = "superseded"
	// OutcomeCopied: a job whose sha256 the target held under another key,
	// stored by a copy within the target with no request to its origin
	// (copied.go).
	OutcomeCopied = "copied"
)

// DefaultHostLabelLimit is how many distinct (host, port) pairs get their
// own label values; the rest are counted as host and port OtherHost.
const DefaultHostLabelLimit = 500

// OtherHost is the host and port label of every authority past the limit.
const OtherHost = "other"

// Metrics are the worker's Prometheus metrics (docs/contract.md section 7), built from
// an injected Registerer. The worker and the facts.Sink share one Metrics so
// that one registry serves both. Safe for concurrent use.
type Metrics struct {
	UpstreamRequests *prometheus.CounterVec   // {host,port,kind,outcome}
	Jobs             *prometheus.CounterVec   // {outcome}
	JobDuration      *prometheus.HistogramVec // {outcome}
	FetchedBytes     prometheus.Counter
	PacerWait        prometheus.Histogram
	Inflight         prometheus.Gauge
	DeliveriesPerJob prometheus.Histogram
	HeldJobs         *prometheus.GaugeVec // {state}
	// held are HeldJobs' series by heldStates, looked up once: the
	// scheduler sets them at every change of its counts, several times a
	// job (ADR 0036, ninth pass).
	held          [len(heldStates)]prometheus.Gauge
	Cooldowns     *prometheus.CounterVec // {host,port,reason}
	EventsDropped prometheus.Counter
	Partitions    prometheus.Gauge       // partitions this pod serves
	ParkedJobs    *prometheus.GaugeVec   // {host,port}: jobs parked in MIRROR_PARKED
	Parks         *prometheus.CounterVec // {op}: parked, unparked, lane, skip
	// DeadLetters counts dead-letter records published, by reason code
	// (jobs.Reason*, http_NNN): a bounded set, so safe as a label.
	DeadLetters *prometheus.CounterVec // {reason}
	// BodyReadBytes is the body bytes read from origins per attempt,
	// stored or not, so that bytes fetched for nothing show.
	BodyReadBytes *prometheus.HistogramVec // {result}
	// TargetFailures counts writes and probes that failed because of the
	// mirror target itself, by mirror.FailureCode; TargetUp is 0 while it
	// fails (the worker pulls nothing then).
	TargetFailures *prometheus.CounterVec // {error}
	TargetUp       prometheus.Gauge
	// ClassRequests counts requests started by job class (live, replay):
	// a replay's share of an authority's pace (docs/adr/0025).
	ClassRequests *prometheus.CounterVec // {class}
	// Deletes counts delete jobs by result: deleted, superseded (a job
	// made moot by a later one of its key, fetches included), limited (a
	// delete sent back to wait by the delete limit). DeleteLimitReached is
	// 1 while the pod's delete limit holds deletes back (delete.go).
	Deletes            *prometheus.CounterVec // {result}
	DeleteLimitReached prometheus.Gauge
	// Resumes counts requests for the rest of a body kept from an earlier
	// attempt, by result (Resume* in resume.go); ResumedBytes the bytes
	// those kept starts spared the origin (206 answers only).
	Resumes      *prometheus.CounterVec // {result}
	ResumedBytes prometheus.Counter

	hosts hostLimiter
}

// NewMetrics creates the metrics and registers them with reg; a nil reg
// means a private registry. A collector that reg already holds (a second
// NewMetrics on one registry) is reused rather than refused, so a command
// may build the worker's and the event sink's metrics independently.
// hostLimit caps the distinct (host, port) label pairs (0: DefaultHostLabelLimit).
func NewMetrics(reg prometheus.Registerer, hostLimit int) (*Metrics, error) {
	if reg == nil {
		reg = prometheus.NewRegistry()
	}
	if hostLimit <= 0 {
		hostLimit = DefaultHostLabelLimit
	}
	const ns = "mirrorworker"
	m := &Metrics{hosts: hostLimiter{limit: hostLimit, seen: map[[2]string]bool{}}}
	var err error
	reg1 := func(c prometheus.Collector) prometheus.Collector {
		if err != nil {
			return c
		}
		var are prometheus.AlreadyRegisteredError
		if e := reg.Register(c); e != nil {
			if errors.As(e, &are) {
				return are.ExistingCollector
			}
			err = fmt.Errorf("register metrics: %w", e)
		}
		return c
	}
	m.UpstreamRequests = reg1(prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: ns, Name: "upstream_requests_total",
		Help: "Requests sent to origins (every redirect hop counts), by outcome.",
	}, []string{"host", "port", "kind", "outcome"})).(*prometheus.CounterVec)
	m.Jobs = reg1(prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: ns, Name: "jobs_total",
		Help: "Job outcomes: stored, unchanged, deferred, retried, dead_lettered.",
	}, []string{"outcome"})).(*prometheus.CounterVec)
	m.JobDuration = reg1(prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Namespace: ns, Name: "job_duration_seconds",
		Help:    "Time from a job's delivery to its final outcome in that delivery.",
		Buckets: prometheus.ExponentialBuckets(0.005, 2.5, 12),
	}, []string{"outcome"})).(*prometheus.HistogramVec)
	m.FetchedBytes = reg1(prometheus.NewCounter(prometheus.CounterOpts{
		Namespace: ns, Name: "fetched_bytes_total",
		Help: "Body bytes of 2xx answers received from origins, counted as they arrive (a long body moves it while it streams; body_read_bytes{result} tells bytes stored from bytes discarded).",
	})).(prometheus.Counter)
	m.PacerWait = reg1(prometheus.NewHistogram(prometheus.HistogramOpts{
		Namespace: ns, Name: "pacer_wait_seconds",
		Help:    "Time a held job waited in memory for its authority before its request started.",
		Buckets: prometheus.ExponentialBuckets(0.001, 3, 12),
	})).(prometheus.Histogram)
	m.Inflight = reg1(prometheus.NewGauge(prometheus.GaugeOpts{
		Namespace: ns, Name: "inflight",
		Help: "Fetch slots in use.",
	})).(prometheus.Gauge)
	m.DeliveriesPerJob = reg1(prometheus.NewHistogram(prometheus.HistogramOpts{
		Namespace: ns, Name: "deliveries_per_job",
		Help:    "Deliveries a job took (JetStream NumDelivered) when it reached its final outcome.",
		Buckets: []float64{1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 64},
	})).(prometheus.Histogram)
	m.HeldJobs = reg1(prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Namespace: ns, Name: "held_jobs",
		Help: "Jobs held in memory, by state (queued, waiting, fetching).",
	}, []string{"state"})).(*prometheus.GaugeVec)
	m.Partitions = reg1(prometheus.NewGauge(prometheus.GaugeOpts{
		Namespace: ns, Name: "partitions_owned",
		Help: "Partitions of MIRROR_JOBS this pod serves (partitioned mode).",
	})).(prometheus.Gauge)
	m.ParkedJobs = reg1(prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Namespace: ns, Name: "parked_jobs",
		Help: "Jobs waiting out a long cooldown for the authorities of the partitions this pod serves: parked in MIRROR_PARKED or held in a lane (host labels capped).",
	}, []string{"host", "port"})).(*prometheus.GaugeVec)
	m.Parks = reg1(prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: ns, Name: "parks_total",
		Help: "Parking operations: jobs moved into (parked) or out of (unparked) MIRROR_PARKED, lanes opened for a cooling authority's backlog (lane), partition consumers reset past such a backlog (skip).",
	}, []string{"op"})).(*prometheus.CounterVec)
	m.Cooldowns = reg1(prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: ns, Name: "cooldowns_total",
		Help: "Cooldowns entered or extended, by authority and reason.",
	}, []string{"host", "port", "reason"})).(*prometheus.CounterVec)
	m.EventsDropped = reg1(prometheus.NewCounter(prometheus.CounterOpts{
		Namespace: ns, Name: "events_dropped_total",
		Help: "Facts of the pacer not published because the buffer was full, or not stored before a stopping pod gave up.",
	})).(prometheus.Counter)
	m.DeadLetters = reg1(prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: ns, Name: "dead_letters_total",
		Help: "Dead-letter records published, by reason (invalid_job, budget_exhausted, http_404, ...).",
	}, []string{"reason"})).(*prometheus.CounterVec)
	m.BodyReadBytes = reg1(prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Namespace: ns, Name: "body_read_bytes",
		Help:    "Body bytes read from origins per attempt, by result (stored, discarded): _sum by result shows bytes fetched for nothing.",
		Buckets: prometheus.ExponentialBuckets(1024, 4, 12), // 1 KiB to 4 GiB
	}, []string{"result"})).(*prometheus.HistogramVec)
	m.TargetFailures = reg1(prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: ns, Name: "target_failures_total",
		Help: "Writes and probes that failed because of the mirror target itself (ENOSPC, EDQUOT, EROFS, EIO, unavailable); they cost jobs no budget.",
	}, []string{"error"})).(*prometheus.CounterVec)
	m.TargetUp = reg1(prometheus.NewGauge(prometheus.GaugeOpts{
		Namespace: ns, Name: "target_up",
		Help: "1 while the mirror target takes writes; 0 while it fails and the worker pulls no jobs.",
	})).(prometheus.Gauge)
	m.ClassRequests = reg1(prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: ns, Name: "requests_by_class_total",
		Help: "Requests started, by job class (live, replay): while live jobs wait, replay jobs get at most one request in four.",
	}, []string{"class"})).(*prometheus.CounterVec)
	m.Deletes = reg1(prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: ns, Name: "deletes_total",
		Help: "Delete jobs by result: deleted (the key removed, a tombstone left), superseded (a job, fetch or delete, acked undone because a later job of its key decided the key), limited (sent back to wait by --max-deletes-per-minute).",
	}, []string{"result"})).(*prometheus.CounterVec)
	m.DeleteLimitReached = reg1(prometheus.NewGauge(prometheus.GaugeOpts{
		Namespace: ns, Name: "delete_limit_reached",
		Help: "1 while the pod's --max-deletes-per-minute holds delete jobs back (they wait in the stream; fetches go on).",
	})).(prometheus.Gauge)
	m.Resumes = reg1(prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: ns, Name: "resumes_total",
		Help: "Requests for the rest of a body kept from a failed attempt (Range, If-Range), by result: resumed (206), whole (200: range ignored or object changed), unsatisfiable (416), range_mismatch, unchanged (304).",
	}, []string{"result"})).(*prometheus.CounterVec)
	m.ResumedBytes = reg1(prometheus.NewCounter(prometheus.CounterOpts{
		Namespace: ns, Name: "resumed_bytes_total",
		Help: "Body bytes not fetched again because a retry resumed after them (the kept start of each 206 answer).",
	})).(prometheus.Counter)
	if err != nil {
		return nil, err
	}
	m.TargetUp.Set(1)
	// The reasons alerts name exist from the start at 0, so that increase()
	// sees the first dead letter of each.
	for _, r := range alertedReasons {
		m.DeadLetters.WithLabelValues(r)
	}
	m.exportAtZero()
	return m, nil
}

// exportAtZero creates at 0 the series of every label set known up front
// that the dashboard or an alert reads (deploy/grafana, deploy/prometheus),
// so that a worker with nothing to report yet exports 0 rather than
// nothing: a panel then says 0, not "No data", and increase() sees the
// first event (as Prometheus' instrumentation guide asks). Series
// labelled by authority are created for OtherHost, whose series exist
// anyway once the host label limit is reached: the per-authority ones come
// with their first event. TestDashboardSeriesExportedAtStart holds the
// dashboard to it.
func (m *Metrics) exportAtZero() {
	for _, o := range []string{OutcomeStored, OutcomeUnchanged, OutcomeDeferred, OutcomeRetried, OutcomeDeadLettered, OutcomeHandedOff, OutcomeMoved, OutcomeDeleted, OutcomeSuperseded, OutcomeCopied} {
		m.Jobs.WithLabelValues(o)
		m.JobDuration.WithLabelValues(o)
	}
	for _, r := range []string{OutcomeDeleted, OutcomeSuperseded, "limited"} {
		m.Deletes.WithLabelValues(r)
	}
	for _, c := range []string{"live", "replay"} { // jobClass
		m.ClassRequests.WithLabelValues(c)
	}
	for _, o := range upstreamOutcomes {
		m.UpstreamRequests.WithLabelValues(OtherHost, OtherHost, jobs.DefaultKind, o)
	}
	for _, r := range []string{"429", "503", "403", "ratelimit"} { // pacer.Feedback.Reason
		m.Cooldowns.WithLabelValues(OtherHost, OtherHost, r)
	}
	m.ParkedJobs.WithLabelValues(OtherHost, OtherHost)
	for i, s := range heldStates {
		m.held[i] = m.HeldJobs.WithLabelValues(s)
	}
}

// alertedReasons are the dead-letter reasons exported at 0 before the
// first one happens.
var alertedReasons = []string{
	jobs.ReasonInvalidJob, jobs.ReasonBudgetExhausted, jobs.ReasonDestinationRefused,
	jobs.ReasonTooManyRedirects, jobs.ReasonBodyTooLarge,
}

// CountUpstreamRequest counts one request to an origin in
// upstream_requests_total, its host and port labels capped at the
// limit of distinct pairs (OtherHost past it).
func (m *Metrics) CountUpstreamRequest(host, port, kind, outcome string) {
	host, port = m.hosts.labels(host, port)
	m.UpstreamRequests.WithLabelValues(host, port, kind, outcome).Inc()
}

// CountCooldown counts one cooldown in cooldowns_total, its host and port
// labels capped as in CountUpstreamRequest.
func (m *Metrics) CountCooldown(host, port, reason string) {
	host, port = m.hosts.labels(host, port)
	m.Cooldowns.WithLabelValues(host, port, reason).Inc()
}

// hostPort returns the capped metric labels of an authority.
func (m *Metrics) hostPort(auth string) (string, string) {
	return m.hosts.labels(authority.Split(auth))
}

// HostLabels returns the host and port labels of an authority, capped as
// in CountUpstreamRequest, for metrics kept outside the worker (package
// bandwidth's).
func (m *Metrics) HostLabels(auth string) (host, port string) { return m.hostPort(auth) }

// CountEventDropped counts one pacer fact not published in
// events_dropped_total (package facts' Sink counts through it).
func (m *Metrics) CountEventDropped() { m.EventsDropped.Inc() }

func (m *Metrics) setHeld(counts [3]int, busy int) {
	for i, n := range counts {
		m.held[i].Set(float64(n))
	}
	m.Inflight.Set(float64(busy))
}

// hostLimiter caps label cardinality by (host, port) pair: a series is
// labelled by one pair, so capping hosts alone lets one host with many
// ports make a series per port. Safe for concurrent use.
type hostLimiter struct {
	mu    sync.Mutex
	limit int
	seen  map[[2]string]bool
}

// labels returns host and port while fewer than the limit of distinct
// pairs were seen (or this pair was), else OtherHost for both.
func (l *hostLimiter) labels(host, port string) (string, string) {
	k := [2]string{host, port}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.seen[k] {
		return host, port
	}
	if len(l.seen) >= l.limit {
		return OtherHost, OtherHost
	}
	l.seen[k] = true
	return host, port
}

// pacerCollector exports mirrorworker_pacer_authorities{state} from a
// function such as the pacer's Counts, read at scrape time. It is safe
// for concurrent use when counts is.
type pacerCollector struct {
	counts func(now time.Time) map[string]int
	clk    clock.Clock
	desc   *prometheus.Desc
}

var _ prometheus.Collector = (*pacerCollector)(nil)

// newPacerCollector returns the collector; a nil clk is the wall clock.
func newPacerCollector(counts func(now time.Time) map[string]int, clk clock.Clock) *pacerCollector {
	if clk == nil {
		clk = clock.Real{}
	}
	return &pacerCollector{counts: counts, clk: clk, desc: prometheus.NewDesc(
		"mirrorworker_pacer_authorities", "Authorities tracked by the pacer, by state.", []string{"state"}, nil)}
}

// RegisterPacerGauge registers the collector of
// mirrorworker_pacer_authorities{state} with reg.
func RegisterPacerGauge(reg prometheus.Registerer, counts func(now time.Time) map[string]int, clk clock.Clock) error {
	if err := reg.Register(newPacerCollector(counts, clk)); err != nil {
		return fmt.Errorf("register pacer gauge: %w", err)
	}
	return nil
}

// Describe implements prometheus.Collector.
func (c *pacerCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }

// Collect implements prometheus.Collector.
func (c *pacerCollector) Collect(ch chan<- prometheus.Metric) {
	for state, n := range c.counts(c.clk.Now()) {
		ch <- prometheus.MustNewConstMetric(c.desc, prometheus.GaugeValue, float64(n), state)
	}
}

// coolingCollector exports mirrorworker_pacer_longest_cooling_seconds: how
// long the authority that has been cooling longest (cooling, or probing
// between cooldowns, without a recovery in between) has been so, as far as
// this process saw. One cooldown is capped at 600 s, so a value past an
// hour means an origin that keeps refusing its probes. It reads the pacer's
// snapshot at scrape time and remembers only the authorities cooling now.
// Safe for concurrent use when snapshot is.
type coolingCollector struct {
	snapshot func(now time.Time) []pacer.State
	clk      clock.Clock
	desc     *prometheus.Desc

	mu    sync.Mutex
	since map[string]time.Time // authority -> first scrape that saw it cooling
}

var _ prometheus.Collector = (*coolingCollector)(nil)

// NewCoolingCollector returns the collector; a nil clk is the wall clock.
func NewCoolingCollector(snapshot func(now time.Time) []pacer.State, clk clock.Clock) prometheus.Collector {
	if clk == nil {
		clk = clock.Real{}
	}
	return &coolingCollector{snapshot: snapshot, clk: clk, since: map[string]time.Time{},
		desc: prometheus.NewDesc("mirrorworker_pacer_longest_cooling_seconds",
			"How long the authority cooling longest has been cooling or probing without recovering, as seen by this process (0: none cooling).",
			nil, nil)}
}

// Describe implements prometheus.Collector.
func (c *coolingCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }

// Collect implements prometheus.Collector.
func (c *coolingCollector) Collect(ch chan<- prometheus.Metric) {
	now := c.clk.Now()
	states := c.snapshot(now) // outside the lock: it takes the pacer's
	c.mu.Lock()
	defer c.mu.Unlock()
	cooling := make(map[string]bool, len(c.since))
	var longest time.Duration
	for _, s := range states {
		if s.State != pacer.StateCooling && s.State != pacer.StateProbing {
			continue
		}
		cooling[s.Authority] = true
		t, ok := c.since[s.Authority]
		if !ok {
			t = now
			c.since[s.Authority] = now
		}
		longest = max(longest, now.Sub(t))
	}
	for a := range c.since {
		if !cooling[a] {
			delete(c.since, a)
		}
	}
	ch <- prometheus.MustNewConstMetric(c.desc, prometheus.GaugeValue, longest.Seconds())
}

// heldStates are the values of mirrorworker_held_jobs' state label, in the
// order of the scheduler's counts (queued, waiting, fetching).
var heldStates = [...]string{"queued", "waiting", "fetching"}

// upstreamOutcomes are every value upstreamOutcome returns, the outcome
// label of upstream_requests_total (exported at 0 from the start).
var upstreamOutcomes = []string{"throttled", "error", "auth_failed", "not_modified", "ok", "redirect", "client_error", "server_error"}

func upstreamOutcome(r fetch.Result, v pacer.Verdict) string {
	switch {
	case v.Throttled:
		return "throttled"
	case r.Err != nil:
		return "error"
	case r.Status == 401, r.Status == 403:
		return "auth_failed"
	case r.Status == 304:
		return "not_modified"
	case r.Status >= 200 && r.Status < 300:
		return "ok"
	case r.Status >= 300 && r.Status < 400:
		return "redirect"
	case r.Status >= 400 && r.Status < 500:
		return "client_error"
	case r.Status >= 500:
		return "server_error"
	}
	return "error"
}
