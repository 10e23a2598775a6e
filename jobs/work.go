package jobs

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// The cluster layout (docs/adr/0007): MIRROR_JOBS stores each job with its
// authority's partition as a fifth token (a subject transform at ingest:
// producers publish mirror.jobs.<tenant>.<akey>, the stream keeps
// mirror.jobs.<tenant>.<akey>.<partition>), so that every authority's jobs
// go to exactly one partition consumer and so to the one pod that holds
// that partition's lease. MIRROR_PARKED holds the jobs of authorities that
// cannot take them for a long while, outside any consumer. MIRROR_LEASES
// holds the partition leases and MIRROR_PODS one entry per live pod.
const (
	ParkStream   = "MIRROR_PARKED" // subjects mirror.parked.<partition>.<tenant>.<akey>
	LeasesBucket = "MIRROR_LEASES" // KV: partition -> owning pod, expiring
	PodsBucket   = "MIRROR_PODS"   // KV: pod id -> status, expiring

	ParkSubjectPrefix = "mirror.parked."

	// PartitionConsumerPrefix names the durable consumer of one partition
	// on MIRROR_JOBS: mirrorworker-p<NN>.
	PartitionConsumerPrefix = ConsumerName + "-p"
	// LaneConsumerPrefix names the durable consumer that holds one cooling
	// authority's backlog of one partition, skipped by the partition's
	// consumer: mirrorworker-lane-p<NN>-<hash of the authority key>.
	LaneConsumerPrefix = ConsumerName + "-lane-p"
	// CatchupConsumerPrefix names a durable consumer that serves the other
	// authorities' jobs a partition's consumer skipped along with its lanes'
	// backlogs: mirrorworker-catchup-p<NN>-<last sequence it covers>.
	CatchupConsumerPrefix = ConsumerName + "-catchup-p"
	// Metadata keys of lane and catch-up consumers.
	MetaAuthority = "mirrorworker-authority" // lane: the authority (host:port)
	MetaAkey      = "mirrorworker-akey"      // lane: the authority's subject token
	MetaUntil     = "mirrorworker-until"     // catch-up: the last stream sequence it covers
)

// Cluster defaults.
const (
	// DefaultPartitions is how many partitions MIRROR_JOBS spreads the
	// authorities over. It bounds how many pods can share the work (each
	// pod serves whole partitions) and is fixed once the stream has it.
	DefaultPartitions = 32
	MaxPartitions     = 1024
	// DefaultLeaseTTL is how long a partition lease lives without renewal;
	// a killed pod's partitions move after at most this long.
	DefaultLeaseTTL = 6 * time.Second
)

// Headers mirrorworker sets on messages it moves between its streams.
const (
	// HeaderDeliveries carries the deliveries a job had before it was
	// parked, so deliveries per job are counted across parking.
	HeaderDeliveries = "Mirror-Deliveries"
	// HeaderParkedAt is when a job was parked (RFC 3339), for diagnosis.
	HeaderParkedAt = "Mirror-Parked-At"
	// HeaderUnparked marks a copy of a job that the worker wrote into
	// MIRROR_JOBS itself: brought back from MIRROR_PARKED ("parked"), or moved
	// from an unpartitioned subject of an earlier version ("moved"). Replay
	// skips such copies: it sees each submitted job once.
	HeaderUnparked = "Mirror-Unparked"
	// HeaderPod names the pod that published a pacer fact, so that pods
	// following MIRROR_EVENTS skip their own.
	HeaderPod = "Mirror-Pod"
	// HeaderSeq is the MIRROR_JOBS sequence of a parked job, so that a
	// parked copy that a lane covers as well is dropped, not fetched twice.
	HeaderSeq = "Mirror-Seq"
	// HeaderContinues marks a continuation: the rest of a job's redirect
	// chain, queued in the hop authority's partition (worker/handoff.go).
	// It holds the job's original URL (without userinfo), which the stored
	// metadata keeps. Replay skips such copies (IsCopy).
	HeaderContinues = "Mirror-Continues"
	// HeaderHops is the redirects a continuation's fetch followed before
	// its URL: they count against the redirect limit.
	HeaderHops = "Mirror-Hops"
	// HeaderEnqueued is when the submitted job was stored in MIRROR_JOBS
	// (RFC 3339 with nanoseconds, the stream's own timestamp), carried by
	// every copy the workers make of it (parked, moved, continued,
	// replayed): the order of a key's fetches and deletes
	// (docs/adr/0033-deletes-ordered-by-enqueue-time-and-tombstones.md).
	HeaderEnqueued = "Mirror-Enqueued"
)

// EnqueuedOf returns the enqueue instant a copy carries (HeaderEnqueued),
// else stored, the delivered message's own stream timestamp.
func EnqueuedOf(h nats.Header, stored time.Time) time.Time {
	if h != nil {
		if t, err := time.Parse(time.RFC3339Nano, h.Get(HeaderEnqueued)); err == nil {
			return t
		}
	}
	return stored
}

// SetEnqueued sets HeaderEnqueued on a copy of a job enqueued at t (nothing
// for a zero t).
func SetEnqueued(h nats.Header, t time.Time) {
	if !t.IsZero() {
		h.Set(HeaderEnqueued, t.UTC().Format(time.RFC3339Nano))
	}
}

// IsCopy reports whether a MIRROR_JOBS message with headers h is a copy the
// workers wrote (a parked job brought back, a job moved into its
// partition, a redirect's continuation, a replay's copy handed to the pods)
// rather than a submitted job: replay skips such copies, so that it sees
// each submitted job once.
func IsCopy(h nats.Header) bool {
	return h.Get(HeaderUnparked) != "" || h.Get(HeaderContinues) != "" || h.Get(HeaderReplay) != ""
}

// MinServerVersion is the oldest nats-server the cluster layout works with:
// stream subject transforms with the partition() mapping.
const MinServerVersion = "2.10.0"

// Partition returns the partition of an authority key among n, the same
// value nats-server's {{partition(n,2)}} mapping gives the job's subject
// (FNV-1a 32 of the akey token, modulo n).
func Partition(akey string, n int) int {
	if n <= 1 {
		return 0
	}
	h := fnv.New32a()
	h.Write([]byte(akey))
	return int(h.Sum32() % uint32(n))
}

// PartitionedSubject returns mirror.jobs.<tenant>.<akey>.<p>, the subject a
// job is stored under in MIRROR_JOBS.
func PartitionedSubject(p int, tenant, akey string) string {
	return JobsSubjectPrefix + tenant + "." + akey + "." + strconv.Itoa(p)
}

// PartitionFilter returns the subject filter of partition p on MIRROR_JOBS.
func PartitionFilter(p int) string { return JobsSubjectPrefix + "*.*." + strconv.Itoa(p) }

// LegacyFilter selects the jobs stored without a partition token (by an
// earlier version, before MIRROR_JOBS had its subject transform).
const LegacyFilter = JobsSubjectPrefix + "*.*"

// ParkSubject returns mirror.parked.<p>.<tenant>.<akey>.
func ParkSubject(p int, tenant, akey string) string {
	return ParkSubjectPrefix + strconv.Itoa(p) + "." + tenant + "." + akey
}

// ParkFilter returns the filter of one authority's parked jobs of every
// tenant in partition p; an empty akey selects the whole partition.
func ParkFilter(p int, akey string) string {
	if akey == "" {
		return ParkSubjectPrefix + strconv.Itoa(p) + ".>"
	}
	return ParkSubjectPrefix + strconv.Itoa(p) + ".*." + akey
}

// PartitionConsumer returns the durable name of partition p's consumer.
func PartitionConsumer(p int) string { return fmt.Sprintf("%s%02d", PartitionConsumerPrefix, p) }

// HoldsJobs reports whether a consumer of MIRROR_JOBS is one of the
// workers' own that jobs wait in: a partition consumer, a lane or a
// catch-up consumer (not replay's, nor the single consumer of earlier
// versions).
func HoldsJobs(consumer string) bool {
	return strings.HasPrefix(consumer, PartitionConsumerPrefix) || strings.HasPrefix(consumer, LaneConsumerPrefix) ||
		strings.HasPrefix(consumer, CatchupConsumerPrefix)
}

// LaneConsumer returns the durable name of the lane of authority key akey
// in partition p.
func LaneConsumer(p int, akey string) string {
	h := fnv.New64a()
	h.Write([]byte(akey))
	return fmt.Sprintf("%s%016x", LanePrefix(p), h.Sum64())
}

// LanePrefix is the start of the name of every lane of partition p.
func LanePrefix(p int) string { return fmt.Sprintf("%s%02d-", LaneConsumerPrefix, p) }

// CatchupPrefix is the start of the name of every catch-up consumer of
// partition p.
func CatchupPrefix(p int) string { return fmt.Sprintf("%s%02d-", CatchupConsumerPrefix, p) }

// LaneFilter returns the filter of one authority's jobs of every tenant in
// partition p of MIRROR_JOBS.
func LaneFilter(p int, akey string) string {
	return JobsSubjectPrefix + "*." + akey + "." + strconv.Itoa(p)
}

// CatchupConsumer returns the durable name of partition p's catch-up
// consumer that covers the skipped jobs up to stream sequence until.
func CatchupConsumer(p int, until uint64) string {
	return CatchupPrefix(p) + strconv.FormatUint(until, 10)
}

// LeaseKey returns the MIRROR_LEASES key of partition p.
func LeaseKey(p int) string { return fmt.Sprintf("p%02d", p) }

// ParsePartitionSubject splits mirror.jobs.<tenant>.<akey>.<p> or
// mirror.parked.<p>.<tenant>.<akey>.
func ParsePartitionSubject(subject string) (p int, tenant, akey string, err error) {
	if rest, ok := strings.CutPrefix(subject, JobsSubjectPrefix); ok {
		tok := strings.Split(rest, ".")
		if len(tok) == 3 {
			if p, err := strconv.Atoi(tok[2]); err == nil && p >= 0 && ValidTenant(tok[0]) && validAkey(tok[1]) {
				return p, tok[0], tok[1], nil
			}
		}
		return 0, "", "", invalid("subject", "%q is not %s<tenant>.<akey>.<partition>", Truncate(subject, 300), JobsSubjectPrefix)
	}
	rest, ok := strings.CutPrefix(subject, ParkSubjectPrefix)
	if !ok {
		return 0, "", "", invalid("subject", "%q is not a partition subject", Truncate(subject, 300))
	}
	ps, rest, _ := strings.Cut(rest, ".")
	p, perr := strconv.Atoi(ps)
	tenant, akey, ok = strings.Cut(rest, ".")
	if perr != nil || p < 0 || !ok || !ValidTenant(tenant) || !validAkey(akey) {
		return 0, "", "", invalid("subject", "%q is not <prefix><partition>.<tenant>.<akey>", Truncate(subject, 300))
	}
	return p, tenant, akey, nil
}

// WorkOptions configure the cluster layout. Zero fields mean the defaults.
type WorkOptions struct {
	LeaseTTL time.Duration // DefaultLeaseTTL
	Replicas int           // of the parking stream and the buckets; 0 keeps what exists, else 1
	// Consumer configures every partition consumer (AckWait, MaxAckPending,
	// replicas).
	Consumer *ConsumerOptions
}

var partitionRE = regexp.MustCompile(`\{\{\s*[pP]artition\((\d+),\s*2\)\s*\}\}`)

// jobsTransformDest is MIRROR_JOBS's subject transform destination.
func jobsTransformDest(n int) string {
	return fmt.Sprintf("%s{{wildcard(1)}}.{{wildcard(2)}}.{{partition(%d,2)}}", JobsSubjectPrefix, n)
}

// ParkStreamConfig returns MIRROR_PARKED's configuration. It has no age or
// size limit: a parked job is a job, and leaves only when brought back.
func ParkStreamConfig(replicas int) jetstream.StreamConfig {
	return jetstream.StreamConfig{
		Name:        ParkStream,
		Description: "mirrorworker jobs parked while their authority cannot take them",
		Subjects:    []string{ParkSubjectPrefix + ">"},
		Retention:   jetstream.LimitsPolicy,
		Storage:     jetstream.FileStorage,
		MaxMsgs:     -1,
		MaxBytes:    -1,
		MaxMsgSize:  MaxJobLen + 4096,
		Discard:     jetstream.DiscardNew,
		AllowDirect: true,
		Replicas:    max(replicas, 1),
	}
}

// PartitionsOf reads the partition count from MIRROR_JOBS's subject
// transform.
func PartitionsOf(cfg jetstream.StreamConfig) (int, error) {
	if t := cfg.SubjectTransform; t != nil {
		if m := partitionRE.FindStringSubmatch(t.Destination); m != nil {
			return strconv.Atoi(m[1])
		}
	}
	return 0, fmt.Errorf("stream %s has no partition transform (start a current 'mirrorworker run' once)", cfg.Name)
}

// CheckServer returns an error naming the server's version when it is older
// than MinServerVersion.
func CheckServer(nc *nats.Conn) error {
	v := nc.ConnectedServerVersion()
	if v == "" {
		return nil // not connected yet: the first request will fail clearly
	}
	if !versionAtLeast(v, MinServerVersion) {
		return fmt.Errorf("nats-server %s is too old: mirrorworker needs %s or newer (stream sources with subject transforms)", v, MinServerVersion)
	}
	return nil
}

// LaneServerVersion is the oldest nats-server that can reset a consumer to
// a later sequence ($JS.API.CONSUMER.RESET, ADR-60), which lanes need to
// skip a cooling backlog; on an older server the backlog is parked job by
// job.
const LaneServerVersion = "2.14.0"

// CanSkip reports whether the connected server can reset a consumer
// (LaneServerVersion); false when not known.
func CanSkip(nc *nats.Conn) bool {
	v := nc.ConnectedServerVersion()
	return v != "" && versionAtLeast(v, LaneServerVersion)
}

func versionAtLeast(v, min string) bool {
	parse := func(s string) [3]int {
		var r [3]int
		s, _, _ = strings.Cut(strings.TrimPrefix(s, "v"), "-")
		for i, f := range strings.SplitN(s, ".", 3) {
			r[i], _ = strconv.Atoi(f)
		}
		return r
	}
	a, b := parse(v), parse(min)
	for i := range a {
		if a[i] != b[i] {
			return a[i] > b[i]
		}
	}
	return true
}

// EnsureWork makes the cluster layout ready on top of EnsureStreams (which
// gives MIRROR_JOBS its partition transform): MIRROR_PARKED, the two
// buckets and every partition's consumer. It returns the partition count.
// A partition consumer created on a stream that an earlier version's single
// consumer was reading starts after what that consumer had acked, so an
// upgrade neither loses nor redoes the backlog; jobs of that backlog stored
// without a partition token are moved by the worker (LegacyFilter).
func EnsureWork(ctx context.Context, js jetstream.JetStream, o *WorkOptions) (int, error) {
	var r WorkOptions
	if o != nil {
		r = *o
	}
	if r.LeaseTTL <= 0 {
		r.LeaseTTL = DefaultLeaseTTL
	}
	s, err := js.Stream(ctx, JobsStream)
	if err != nil {
		return 0, fmt.Errorf("stream %s: %w", JobsStream, err)
	}
	n, err := PartitionsOf(s.CachedInfo().Config)
	if err != nil {
		return 0, err
	}
	// Replicas unset keeps what an existing stream has (a flagless start
	// must not shrink an R3 deployment), as EnsureStreams does.
	replicas := func(stream string) int {
		if r.Replicas > 0 {
			return r.Replicas
		}
		if s, err := js.Stream(ctx, stream); err == nil {
			return s.CachedInfo().Config.Replicas
		}
		return 1
	}
	if _, err := js.CreateOrUpdateStream(ctx, ParkStreamConfig(replicas(ParkStream))); err != nil {
		return 0, fmt.Errorf("create or update stream %s: %w", ParkStream, err)
	}
	for _, kv := range []jetstream.KeyValueConfig{
		{Bucket: LeasesBucket, Description: "mirrorworker partition leases", History: 1, TTL: r.LeaseTTL, Storage: jetstream.FileStorage},
		PodsBucketConfig(r.LeaseTTL, 0),
	} {
		kv.Replicas = replicas("KV_" + kv.Bucket)
		if _, err := js.CreateOrUpdateKeyValue(ctx, kv); err != nil {
			return 0, fmt.Errorf("create or update bucket %s: %w", kv.Bucket, err)
		}
	}
	var start uint64
	legacy, err := js.Consumer(ctx, JobsStream, ConsumerName)
	if err == nil {
		start = legacy.CachedInfo().AckFloor.Stream + 1
		// From now on the single consumer sees only unpartitioned jobs, for
		// the worker to move into their partitions.
		cfg := legacy.CachedInfo().Config
		if cfg.FilterSubject != LegacyFilter {
			cfg.FilterSubject, cfg.FilterSubjects = LegacyFilter, nil
			if _, err := js.UpdateConsumer(ctx, JobsStream, cfg); err != nil {
				return 0, fmt.Errorf("narrow consumer %s to unpartitioned jobs: %w", ConsumerName, err)
			}
		}
	}
	for p := range n {
		if _, err := EnsurePartitionConsumer(ctx, js, p, r.Consumer, start); err != nil {
			return 0, err
		}
	}
	return n, nil
}

// PodsBucketConfig is the configuration of PodsBucket: entries live ttl
// without renewal (the lease TTL). A pod of the shared consumer (no
// partitions) creates it too, to announce itself (docs/adr/0025).
func PodsBucketConfig(ttl time.Duration, replicas int) jetstream.KeyValueConfig {
	if ttl <= 0 {
		ttl = DefaultLeaseTTL
	}
	return jetstream.KeyValueConfig{Bucket: PodsBucket, Description: "mirrorworker live pods and their status", History: 1, TTL: ttl,
		Storage: jetstream.FileStorage, Replicas: replicas}
}

// PartitionConsumerConfig returns the configuration of partition p's
// durable consumer on MIRROR_JOBS (the single consumer's settings, narrowed
// to the partition), starting at stream sequence start (0: the first).
func PartitionConsumerConfig(p int, o *ConsumerOptions, start uint64) jetstream.ConsumerConfig {
	var r ConsumerOptions
	if o != nil {
		r = *o
	}
	r.Durable = PartitionConsumer(p)
	r.FilterSubjects = []string{PartitionFilter(p)}
	cfg := ConsumerConfig(&r)
	cfg.Description = fmt.Sprintf("mirrorworker jobs of partition %d", p)
	if start > 1 {
		cfg.DeliverPolicy, cfg.OptStartSeq = jetstream.DeliverByStartSequencePolicy, start
	}
	return cfg
}

// EnsurePartitionConsumer creates partition p's consumer, or updates the
// settings of an existing one (keeping where it started).
func EnsurePartitionConsumer(ctx context.Context, js jetstream.JetStream, p int, o *ConsumerOptions, start uint64) (jetstream.Consumer, error) {
	cfg := PartitionConsumerConfig(p, o, start)
	if c, err := js.Consumer(ctx, JobsStream, cfg.Durable); err == nil {
		have := c.CachedInfo().Config
		cfg.DeliverPolicy, cfg.OptStartSeq = have.DeliverPolicy, have.OptStartSeq
		if cfg.AckWait == have.AckWait && cfg.MaxAckPending == have.MaxAckPending && (cfg.Replicas == 0 || cfg.Replicas == have.Replicas) {
			return c, nil
		}
		if c, err = js.UpdateConsumer(ctx, JobsStream, cfg); err != nil {
			return nil, fmt.Errorf("update consumer %s: %w", cfg.Durable, err)
		}
		return c, nil
	}
	c, err := js.CreateConsumer(ctx, JobsStream, cfg)
	if errors.Is(err, jetstream.ErrConsumerExists) {
		return js.Consumer(ctx, JobsStream, cfg.Durable)
	}
	if err != nil {
		return nil, fmt.Errorf("create consumer %s: %w", cfg.Durable, err)
	}
	return c, nil
}
