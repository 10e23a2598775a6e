package worker

import (
	"context"
	"io"
	"os"
	"runtime"
	"strconv"
	"time"

	"github.com/mirrorworker/mirrorworker/clock"
	"github.com/mirrorworker/mirrorworker/fetch"
	"github.com/mirrorworker/mirrorworker/jobs"
	"github.com/mirrorworker/mirrorworker/mirror"
	"github.com/mirrorworker/mirrorworker/pacer"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
)

// This file is what a Worker is given: the interfaces of its collaborators
// (Deps) and its Options, with their defaults. Every other file of the
// package builds on it; it refers to none of them.

// Fetcher makes the upstream request of a job; *fetch.Client is one.
type Fetcher interface {
	Do(ctx context.Context, r fetch.Request, g fetch.Gate) (*fetch.Response, error)
}

// Target is where fetched objects are stored; *mirror.FileTarget is one.
// Probe tests, without storing an object, whether the target takes writes
// again after it failed (targethealth.go).
type Target interface {
	Stat(ctx context.Context, key string) (mirror.Meta, error)
	Put(ctx context.Context, key string, body io.Reader, want mirror.Expect, m mirror.Meta) (mirror.Meta, error)
	Probe(ctx context.Context) error
}

// Pacer decides when a request to an authority may start; *pacer.Pacer is
// one. Its contract is pacer.Permit's: Acquire grants, Confirm re-checks
// immediately before every request start (it may revoke the permit or move
// its Start later), Sent is told when the request was written to its
// connection (the worker reports every write it sees, from the fetch's
// net/http trace, so that the floor holds between the requests as the
// origin receives them: pacer.Options.AwaitSends), and Done is called
// exactly once per grant; Heard is told when a 2xx answer's headers are in
// (its Done follows its body). ReadyIn says,
// without side effects, how long until auth could take a request (parked
// jobs come back by it, and a stale hint is checked against it); Fence
// spaces the next start from at, when another pod may have started a
// request to auth as late as at (a partition taken over).
type Pacer interface {
	Acquire(now time.Time, auth string, maxWait time.Duration) (pacer.Permit, error)
	Confirm(now time.Time, pm pacer.Permit) (pacer.Permit, error)
	Sent(now time.Time, pm pacer.Permit)
	Heard(now time.Time, pm pacer.Permit, status int) bool
	Done(now time.Time, pm pacer.Permit, r pacer.Response) pacer.Verdict
	ReadyIn(now time.Time, auth string) (wait, spacing time.Duration, reason pacer.Reason)
	Fence(now time.Time, auth string, at time.Time)
	// Apply takes a fact about auth: the worker holds an authority whose
	// credential is refused (authfail.go) with a pause, and resumes it.
	Apply(now time.Time, ev pacer.Event)
	// PaceKey is the key auth is paced under: its politeness group's
	// ("group:NAME") or auth itself. An authority's jobs are served in the
	// partition of its pace key, so that one pod paces a whole group.
	PaceKey(auth string) string
	// Changed is closed by the next policy change: the queues waiting on
	// a refusal's timer ask again (a lowered floor shortens their waits).
	// A pacer whose policy never changes returns nil.
	Changed() <-chan struct{}
}

var _ Pacer = (*pacer.Pacer)(nil)

// Msg is the subset of jetstream.Msg the worker uses.
type Msg interface {
	Metadata() (*jetstream.MsgMetadata, error)
	Data() []byte
	// Headers may be nil: a job published without headers.
	Headers() nats.Header
	Subject() string
	// Reply is the subject its acks are sent to.
	Reply() string
	Ack() error
	DoubleAck(ctx context.Context) error
	Nak() error
	NakWithDelay(delay time.Duration) error
	InProgress() error
	TermWithReason(reason string) error
}

var _ Msg = (jetstream.Msg)(nil)

// Deps are the worker's collaborators. All are required, except Consumer
// and Owns, which depend on the mode: with Options.Partitions zero the
// worker pulls Consumer; otherwise partitions are added and removed while it
// runs (AddPartition, RemovePartition) and Owns says which it may serve.
type Deps struct {
	JS       jetstream.JetStream // dead letters, the attempts bucket, parking
	Consumer jetstream.Consumer  // the durable pull consumer (one-consumer mode)
	Fetcher  Fetcher
	Target   Target
	Pacer    Pacer
	// Owns reports whether this worker may start a request of partition p
	// now (cluster.Manager.Owns); partitioned mode only.
	Owns func(p int) bool
	// Legacy, if set (partitioned mode), is the single consumer of an
	// earlier version, narrowed to jobs stored without a partition token
	// (jobs.LegacyFilter): the worker serving partition 0 moves them into
	// their partitions.
	Legacy jetstream.Consumer
	// ReplayTarget, if set, opens the target of a replay job of run
	// (replayjob.go): one this pod may write, or an error (ErrReplayOver
	// when the run is over). Nil: replay jobs are dead-lettered.
	ReplayTarget func(ctx context.Context, run, target string) (Target, error)
}

// DefaultFailureBudget is the default of Options.FailureBudget and of the
// --failure-budget flag.
const DefaultFailureBudget = 10

// DefaultWorkerID is the default of Options.WorkerID (and, after a
// command's prefix, of the --worker-id flag): <hostname>-<pid>, with
// "mirrorworker" when the host has no name.
func DefaultWorkerID() string {
	host, _ := os.Hostname()
	if host == "" {
		host = "mirrorworker"
	}
	return host + "-" + strconv.Itoa(os.Getpid())
}

// DefaultConcurrency returns the default of Options.Concurrency (and of
// --concurrency): 16 fetch slots per CPU the Go runtime uses (GOMAXPROCS,
// which follows a container's CPU limit), at least 16 and at most 128. A
// slot mostly waits (on the origin, on the disk's fsync), so slots go well
// beyond the CPUs; against loopback origins, where a job costs only CPU,
// 16 to 64 slots on 2 CPUs ran within the noise of each other
// (BenchmarkThroughput). README "Sizing" says when to set it.
func DefaultConcurrency() int {
	return min(max(16*runtime.GOMAXPROCS(0), 16), 128)
}

// Defaults of Options: a zero field takes these, and the command's flags
// and their help read them, so that a default has one home.
const (
	// DefaultBackoffInitial and DefaultBackoffMax bound the delay of a
	// retry after a transient failure; it doubles from the first to the
	// second.
	DefaultBackoffInitial = time.Second
	DefaultBackoffMax     = 5 * time.Minute
	// DefaultHoldMax is the longest wait a job spends in memory for its
	// authority; a longer one goes back to the stream.
	DefaultHoldMax = 2 * time.Second
	// DefaultMaxHeld bounds the jobs held in memory; an authority's share
	// is a quarter of it.
	DefaultMaxHeld = 1000
	// DefaultShutdownGrace is the time in-flight fetches have to finish
	// after a stop is asked for (the --shutdown-grace flag's default). It
	// is short of Kubernetes' default terminationGracePeriodSeconds (30 s),
	// which must also cover handing the held jobs back and flushing acks.
	DefaultShutdownGrace = 20 * time.Second
	// DefaultAckBatch is how long a done job's plain ack may wait for
	// others (Options.AckBatch; the --ack-batch flag's default).
	DefaultAckBatch = 500 * time.Millisecond
	// DefaultDeferSpread is the horizon of the deferral calendar.
	DefaultDeferSpread = 5 * time.Minute
	// DefaultPullBatch and DefaultPullWait are one pull request's size and
	// expiry.
	DefaultPullBatch = 256
	DefaultPullWait  = time.Second
	// DefaultTargetProbeInitial and DefaultTargetProbeMax bound the delay
	// between probes of a failed mirror target.
	DefaultTargetProbeInitial = time.Second
	DefaultTargetProbeMax     = time.Minute
)

// Options tune a Worker. A nil *Options, and every zero field, means the
// default given on the field.
type Options struct {
	Concurrency    int           // fetch slots; DefaultConcurrency()
	FailureBudget  int           // failed attempts before a job is dead-lettered; DefaultFailureBudget
	BackoffInitial time.Duration // first retry delay; DefaultBackoffInitial
	BackoffMax     time.Duration // longest retry delay; DefaultBackoffMax
	// HoldMax: a job whose authority can take it within HoldMax waits in
	// memory; a longer wait defers it to the stream (NAK with delay).
	// DefaultHoldMax.
	HoldMax time.Duration
	// MaxHeld bounds the jobs held in memory (queued, waiting, fetching);
	// the worker pulls only below it. DefaultMaxHeld.
	MaxHeld int
	// MaxHeldPerAuthority bounds one authority's queue, so a hot authority
	// cannot take all of MaxHeld; past it jobs are deferred, unless the
	// authority serves its queue within ParkAfter (HoldMax if longer): then
	// they wait in memory and the intake of its partition pauses until the
	// queue is back under the bound, or until the authority makes no
	// progress for that long (docs/adr/0014). MaxHeld/4.
	MaxHeldPerAuthority int
	// AckWait must match the consumer's; held jobs get an in-progress ack
	// well before it runs out. jobs.DefaultAckWait.
	AckWait time.Duration
	// AckBatch is how long a done job's plain ack (a jobs stream of one
	// replica on the connected server, acks.go) may wait to go out with
	// the others done meanwhile: each partition consumer's state, which
	// nats-server rewrites at most every 100 ms while acks come in, then
	// changes in bursts, and is rewritten less often. A crash of the worker
	// loses at most this long's acks (those jobs come back after AckWait);
	// a stop sends them. 0: each ack at once. The command's default is
	// DefaultAckBatch.
	AckBatch time.Duration
	// ShutdownGrace is how long in-flight fetches may finish after Run's
	// context is cancelled before they are cancelled and handed back.
	// DefaultShutdownGrace.
	ShutdownGrace time.Duration
	// StopNow, when it closes during the grace (an operator's second
	// Ctrl-C), ends the grace at once: in-flight fetches are cancelled and
	// their jobs handed back for redelivery now. nil: the grace runs out.
	StopNow <-chan struct{}
	// DeferSpread is the horizon of the deferral calendar: no deferred job
	// is sent further than this past its authority's earliest start.
	// DefaultDeferSpread.
	DeferSpread time.Duration
	// PullBatch bounds one pull request; DefaultPullBatch. PullWait is its
	// expiry; DefaultPullWait.
	PullBatch int
	PullWait  time.Duration
	// Partitions > 0 selects partitioned mode (docs/adr/0007): jobs come
	// from the partitions added with AddPartition, and long waits are
	// parked in MIRROR_PARKED instead of holding the consumer.
	Partitions int
	// ParkAfter: a deferral longer than this parks the job (partitioned
	// mode); a shorter one is a NAK with delay. DefaultParkAfter.
	ParkAfter time.Duration
	// ParkShare: an authority with more jobs than this deferred by NAK (and
	// so holding ack-pending slots) parks the rest. DefaultParkShare.
	ParkShare int
	// LaneBacklog: when a job must wait longer than ParkAfter and its
	// partition consumer has at least this many jobs ahead (pending plus
	// ack pending), the authority's backlog moves to a lane instead of
	// being parked job by job, and the consumer skips it (lane.go).
	// DefaultLaneBacklog; negative: no lanes.
	LaneBacklog int
	// TargetProbeInitial is the first delay before the mirror target is
	// probed after it failed (full, read-only, broken: mirror.FailureCode),
	// and the delay of every job handed back meanwhile; the delay doubles
	// up to TargetProbeMax. DefaultTargetProbeInitial and
	// DefaultTargetProbeMax.
	TargetProbeInitial time.Duration
	TargetProbeMax     time.Duration
	WorkerID           string // in dead letters; DefaultWorkerID()
	// SkipCopies acks, without doing them, the copies the worker itself
	// wrote into MIRROR_JOBS (jobs.IsCopy): replay sets it, so that it does
	// each submitted job once.
	SkipCopies bool
	// Replay names the replay run this worker does its jobs for (a replay
	// that paces its own requests; a token, jobs.ValidReplayRun): their
	// failed attempts and failure budget are the run's, kept apart from
	// the live jobs' (attempts.go). Empty: a live worker.
	Replay string
	// FaultHook, if set, is called at named points of the parking protocol
	// ("parked-before-ack", "unparked-before-delete", "lane-before-reset"),
	// for crash tests.
	FaultHook func(point string)
	// OnOutcome, if set, is called with every outcome the worker counts in
	// mirrorworker_jobs_total (an Outcome* constant: once per deferral and
	// per retry, once per job for the final ones), on the goroutine that
	// settled the job: it must be safe for concurrent use and quick.
	// replay.Tally is one.
	OnOutcome func(outcome string)
	Clock     clock.Clock
	Logger    zerolog.Logger
	// Metrics, if set, is used as is; otherwise metrics are created on
	// Registerer (nil: a private registry).
	Metrics        *Metrics
	Registerer     prometheus.Registerer
	HostLabelLimit int      // distinct (host, port) label pairs; DefaultHostLabelLimit
	Auth           AuthRule // 401/403 handling (authfail.go); zero: the defaults
	// MaxDeletesPerMinute bounds the delete jobs this pod carries out in
	// any minute; past it, delete jobs wait in the stream (NAK with delay,
	// no failure) while fetches go on. 0: DefaultMaxDeletesPerMinute;
	// negative: no limit.
	MaxDeletesPerMinute int
}

func (o *Options) withDefaults() Options {
	var r Options
	if o != nil {
		r = *o
	}
	defInt := func(p *int, v int) {
		if *p <= 0 {
			*p = v
		}
	}
	defDur := func(p *time.Duration, v time.Duration) {
		if *p <= 0 {
			*p = v
		}
	}
	defInt(&r.Concurrency, DefaultConcurrency())
	defInt(&r.FailureBudget, DefaultFailureBudget)
	defDur(&r.BackoffInitial, DefaultBackoffInitial)
	defDur(&r.BackoffMax, DefaultBackoffMax)
	defDur(&r.HoldMax, DefaultHoldMax)
	defInt(&r.MaxHeld, DefaultMaxHeld)
	defInt(&r.MaxHeldPerAuthority, max(r.MaxHeld/4, 1))
	defDur(&r.AckWait, jobs.DefaultAckWait)
	defDur(&r.ShutdownGrace, DefaultShutdownGrace)
	defDur(&r.DeferSpread, DefaultDeferSpread)
	defInt(&r.PullBatch, DefaultPullBatch)
	defDur(&r.PullWait, DefaultPullWait)
	defDur(&r.ParkAfter, DefaultParkAfter)
	defInt(&r.ParkShare, DefaultParkShare)
	if r.LaneBacklog == 0 {
		r.LaneBacklog = DefaultLaneBacklog
	}
	defDur(&r.TargetProbeInitial, DefaultTargetProbeInitial)
	defDur(&r.TargetProbeMax, DefaultTargetProbeMax)
	r.TargetProbeMax = max(r.TargetProbeMax, r.TargetProbeInitial)
	defInt(&r.HostLabelLimit, DefaultHostLabelLimit)
	if r.MaxDeletesPerMinute == 0 {
		r.MaxDeletesPerMinute = DefaultMaxDeletesPerMinute
	}
	if r.WorkerID == "" {
		r.WorkerID = DefaultWorkerID()
	}
	if r.Clock == nil {
		r.Clock = clock.Real{}
	}
	r.Auth = r.Auth.withDefaults()
	return r
}

// DefaultParkAfter, DefaultParkShare and DefaultLaneBacklog are the defaults
// of Options.ParkAfter, Options.ParkShare and Options.LaneBacklog
// (docs/adr/0007).
const (
	DefaultParkAfter   = 10 * time.Second
	DefaultParkShare   = 1000
	DefaultLaneBacklog = 2000
)

// Defaults of AuthRule, the handling of 401 and 403 answers
// (docs/adr/0020-credentials-and-egress-proxies.md).
const (
	// DefaultAuthHold is an authority's first hold after it refused the
	// credential; each further hold doubles it (1, 2, 4 min by default),
	// so a rotation has 7 minutes to land before a job is dead-lettered.
	DefaultAuthHold = time.Minute
	// DefaultAuthHolds is the holds without a success in between after
	// which the credential is taken as wrong: every later 401/403 from the
	// authority dead-letters its job auth_failed at once.
	DefaultAuthHolds = 3
	// DefaultAuthStreak is the answers 401/403 in a row, with no success
	// between them, that hold the authority.
	DefaultAuthStreak = 2
	// DefaultAuthAttempts is the 401/403 answers one job may get, while
	// its authority otherwise works, before it is dead-lettered auth_failed
	// (an object the credential may not read).
	DefaultAuthAttempts = 3
)

// AuthRule is how the worker treats 401 and 403 answers (fetch.ClassAuthFailed;
// a 403 the pacer reads as a rate limit is a throttle instead). They say
// the credential is wrong, missing or being rotated, not that the job is
// bad, so the authority is held rather than its backlog dead-lettered:
//
//   - Streak answers 401/403 in a row from an authority hold it: the pacer
//     starts no request to it for Hold (doubling with each hold), its jobs
//     wait (deferred or parked, no failure budget used), and the job that
//     got the answer waits with them.
//   - A change of the authority's credential (a reload of the files that
//     changes its entry) ends the hold at once and starts the count again.
//   - After Holds holds with no success in between, the credential is
//     wrong: each later 401/403 dead-letters its job auth_failed, one
//     request per job. A success clears it all.
//   - A single 401/403 while the authority otherwise works is the object's:
//     the job is retried with backoff (counted in its failure budget) and
//     dead-lettered auth_failed at its Attempts-th such answer.
//
// The zero value, and every zero field, is the default given on the
// constants above.
type AuthRule struct {
	Hold     time.Duration
	Holds    int
	Streak   int
	Attempts int
}

func (r AuthRule) withDefaults() AuthRule {
	if r.Hold <= 0 {
		r.Hold = DefaultAuthHold
	}
	if r.Holds <= 0 {
		r.Holds = DefaultAuthHolds
	}
	if r.Streak <= 0 {
		r.Streak = DefaultAuthStreak
	}
	if r.Attempts <= 0 {
		r.Attempts = DefaultAuthAttempts
	}
	return r
}

// faultHook is Options.FaultHook as the parking lot and the lanes call it:
// at a named point of their protocol, for crash tests; nil does nothing.
type faultHook func(point string)

func (f faultHook) reached(point string) {
	if f != nil {
		f(point)
	}
}

// readyInFunc is Pacer.ReadyIn.
type readyInFunc func(now time.Time, auth string) (wait, spacing time.Duration, reason pacer.Reason)
